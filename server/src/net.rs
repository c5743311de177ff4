//! Listening sockets, bound one way for every listener of the process.
//!
//! Every listener sets SO_REUSEADDR: a member started right after another
//! process (a killed metcd, or an etcd member it replaces on the same host)
//! must not trip over that process's connections still in TIME_WAIT.
//! SO_REUSEPORT is only for the listeners every shard opens on one port.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How long a busy port is retried at start: a member killed a moment ago
/// can still hold its listener while io_uring tears its rings down.
pub const BUSY_PORT_RETRY: Duration = Duration::from_secs(5);

/// Runs `bind` until it does not fail with `AddrInUse`, for at most
/// [`BUSY_PORT_RETRY`]; its last answer.
pub fn retry_while_in_use<T>(mut bind: impl FnMut() -> std::io::Result<T>) -> std::io::Result<T> {
    let deadline = Instant::now() + BUSY_PORT_RETRY;
    loop {
        match bind() {
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            answer => return answer,
        }
    }
}

/// Whether other sockets of this process bind the same address too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortSharing {
    /// One listener per shard on the same port (SO_REUSEPORT).
    EveryShard,
    /// This listener alone.
    Exclusive,
}

/// A listening TCP socket on `addr` for the current glommio executor.
pub fn listen(
    addr: SocketAddr,
    sharing: PortSharing,
) -> std::io::Result<glommio::net::TcpListener> {
    use std::os::fd::IntoRawFd;
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    if sharing == PortSharing::EveryShard {
        socket.set_reuse_port(true)?;
    }
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    let fd = socket.into_raw_fd();
    // SAFETY: `fd` is a bound, listening TCP socket we own; ownership moves
    // into the glommio listener, which closes it.
    Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) })
}

/// Where one of etcd's client or peer URLs points: a TCP address, or a
/// Unix socket file. etcd names the file by the URL's host and path
/// (`unix://etcd.unix:1` is the file `etcd.unix:1` in the working
/// directory), and so do we.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl Endpoint {
    /// The TCP address, `None` for a Unix socket.
    pub fn tcp(&self) -> Option<SocketAddr> {
        match self {
            Endpoint::Tcp(addr) => Some(*addr),
            Endpoint::Unix(_) => None,
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Tcp(addr) => write!(f, "{addr}"),
            Endpoint::Unix(path) => write!(f, "unix://{}", path.display()),
        }
    }
}

/// A listening socket of the current glommio executor.
pub enum Listener {
    Tcp(glommio::net::TcpListener),
    Unix(glommio::net::UnixListener),
}

/// An accepted connection, before any TLS.
pub enum Accepted {
    Tcp(glommio::net::TcpStream),
    Unix(glommio::net::UnixStream),
}

impl Listener {
    /// Listens on `endpoint`. A Unix socket's file is replaced if it
    /// exists (a member killed before it could remove it leaves it
    /// behind; etcd removes it too), and only one listener of the
    /// process may take it, whatever `sharing` says.
    pub fn bind(endpoint: &Endpoint, sharing: PortSharing) -> std::io::Result<Listener> {
        match endpoint {
            Endpoint::Tcp(addr) => listen(*addr, sharing).map(Listener::Tcp),
            Endpoint::Unix(path) => {
                match std::fs::remove_file(path) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                    _ => {}
                }
                Ok(Listener::Unix(glommio::net::UnixListener::bind(path)?))
            }
        }
    }

    /// The next connection (TCP ones with Nagle's algorithm off: every
    /// protocol here writes whole messages and waits for answers).
    pub async fn accept(&self) -> std::io::Result<Accepted> {
        match self {
            Listener::Tcp(l) => {
                let stream = l.accept().await?;
                let _ = stream.set_nodelay(true);
                Ok(Accepted::Tcp(stream))
            }
            Listener::Unix(l) => Ok(Accepted::Unix(l.accept().await?)),
        }
    }
}
