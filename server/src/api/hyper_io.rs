//! Glue that lets hyper run on glommio: its I/O traits over glommio's
//! `TcpStream` (or a TLS stream over it). No tokio runtime is ever started.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_lite::{AsyncRead, AsyncWrite};
use glommio::net::TcpStream;

pub struct HyperStream<S = TcpStream> {
    stream: S,
    /// Bytes already read from `stream` (to tell protocols apart) that
    /// hyper must still see first.
    replay: Vec<u8>,
    replayed: usize,
}

impl<S> HyperStream<S> {
    pub fn new(stream: S) -> Self {
        HyperStream::with_replay(stream, Vec::new())
    }

    /// A stream whose first bytes, `replay`, were read already.
    pub fn with_replay(stream: S, replay: Vec<u8>) -> Self {
        HyperStream {
            stream,
            replay,
            replayed: 0,
        }
    }
}

impl<S: AsyncRead + Unpin> hyper::rt::Read for HyperStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.replayed < this.replay.len() {
            let rest = &this.replay[this.replayed..];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            this.replayed += n;
            return Poll::Ready(Ok(()));
        }
        // SAFETY: we only write initialised bytes into the cursor's memory
        // (zeroed first), and advance it by exactly the bytes read.
        let uninit = unsafe { buf.as_mut() };
        for b in uninit.iter_mut() {
            b.write(0);
        }
        // SAFETY: every element was initialised just above.
        let slice = unsafe { &mut *(uninit as *mut [std::mem::MaybeUninit<u8>] as *mut [u8]) };
        match Pin::new(&mut this.stream).poll_read(cx, slice) {
            Poll::Ready(Ok(n)) => {
                // SAFETY: `n` bytes were written by the read above.
                unsafe { buf.advance(n) };
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncWrite + Unpin> hyper::rt::Write for HyperStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_close(cx)
    }
}
