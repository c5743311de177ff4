//! The engine crate's error type. I/O errors carry the operation and path.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A positional read, write or sync failed.
    #[error("{path} at offset {offset}: {source}")]
    IoAt {
        path: PathBuf,
        offset: u64,
        #[source]
        source: std::io::Error,
    },
    /// A record in the middle of the data failed its checksum or framing:
    /// this is corruption, not a torn tail, so we refuse to go on.
    #[error("corrupt {what} in {path} at offset {offset}: {reason}")]
    Corrupt {
        what: &'static str,
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    /// A previous fsync failed; the owner accepts no more writes (fsyncgate).
    #[error("storage poisoned by an earlier failed sync: {0}")]
    Poisoned(String),
    #[error("{0}")]
    Invalid(String),
}

impl Error {
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            op,
            path: path.into(),
            source,
        }
    }

    pub fn io_at(path: impl Into<PathBuf>, offset: u64, source: std::io::Error) -> Self {
        Error::IoAt {
            path: path.into(),
            offset,
            source,
        }
    }

    /// Converts glommio's error (which already names op and path) to ours.
    pub fn glommio(
        op: &'static str,
        path: impl Into<PathBuf>,
        e: glommio::GlommioError<()>,
    ) -> Self {
        Error::io(op, path, std::io::Error::other(e.to_string()))
    }
}
