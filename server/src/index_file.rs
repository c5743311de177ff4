//! The key index checkpoint's file, `member/keyindex` (issue 20, restart
//! time): reading it at start-up, and writing it on a thread of its own
//! from a [`StoreReader`], never on a shard.
//!
//! It owns the file's life: a new checkpoint goes to `keyindex.tmp`, is
//! synced, renamed over the old one and the directory synced, so a crash
//! leaves the old checkpoint or the new one, never a mix (a torn file would
//! fail its checksum anyway). What the bytes mean is
//! [`crate::mvcc::index_checkpoint`]'s; whether a checkpoint can be used is
//! [`MvccStore::open_with_index_checkpoint`]'s decision. It must never make
//! a start-up fail: an unreadable file only costs the full rebuild.
//!
//! [`MvccStore::open_with_index_checkpoint`]: crate::mvcc::MvccStore::open_with_index_checkpoint

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use engine::any::AnyEngine;

use crate::mvcc::{CheckpointError, IndexCheckpointPlan, StoreReader};

const FILE: &str = "keyindex";
const TMP: &str = "keyindex.tmp";

/// Keys encoded per hold of the store's read lock: the owner's next apply
/// waits at most for one chunk (~0.2 ms).
const KEYS_PER_CHUNK: usize = 4096;

/// The checkpoint of the data dir rooted at `root`, if one was written; a
/// leftover `keyindex.tmp` of an interrupted write is removed.
pub fn read(root: &Path) -> Option<Vec<u8>> {
    let member = root.join("member");
    let _ = std::fs::remove_file(member.join(TMP));
    std::fs::read(member.join(FILE)).ok()
}

/// A checkpoint written.
#[derive(Debug)]
pub struct Written {
    pub plan: IndexCheckpointPlan,
    pub keys: u64,
    pub bytes: u64,
    pub took: Duration,
}

/// Why a checkpoint was not written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error(transparent)]
    Store(#[from] CheckpointError),
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io<'p>(what: &'static str, path: &'p Path) -> impl FnOnce(std::io::Error) -> WriteError + 'p {
    move |source| WriteError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Writes the checkpoint `plan` describes from `reader` (blocking: run it
/// on a thread of its own).
pub fn write(
    root: &Path,
    reader: &StoreReader<AnyEngine>,
    plan: IndexCheckpointPlan,
) -> Result<Written, WriteError> {
    let started = Instant::now();
    let member = root.join("member");
    let tmp = member.join(TMP);
    let result = write_tmp(&tmp, reader, plan);
    let (keys, bytes) = match result {
        Ok(written) => written,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    let path = member.join(FILE);
    std::fs::rename(&tmp, &path).map_err(io("rename", &tmp))?;
    std::fs::File::open(&member)
        .and_then(|d| d.sync_all())
        .map_err(io("sync", &member))?;
    Ok(Written {
        plan,
        keys,
        bytes,
        took: started.elapsed(),
    })
}

fn write_tmp(
    tmp: &Path,
    reader: &StoreReader<AnyEngine>,
    plan: IndexCheckpointPlan,
) -> Result<(u64, u64), WriteError> {
    let file = std::fs::File::create(tmp).map_err(io("create", tmp))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    let mut bytes = 0u64;
    let keys = reader.encode_index_checkpoint(plan, KEYS_PER_CHUNK, |chunk| {
        bytes += chunk.len() as u64;
        out.write_all(chunk).map_err(io("write", tmp))
    })?;
    let file = out.into_inner().map_err(|e| WriteError::Io {
        what: "write",
        path: tmp.to_path_buf(),
        source: e.into_error(),
    })?;
    file.sync_data().map_err(io("sync", tmp))?;
    Ok((keys, bytes))
}
