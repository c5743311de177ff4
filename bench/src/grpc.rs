//! A minimal etcd v3 gRPC client on glommio: hyper's HTTP/2 client over
//! glommio sockets, prost messages, unary calls only. Enough to load metcd
//! and real etcd with the same code.
//!
//! The hyper/glommio glue repeats the server's few lines on purpose: the
//! bench is a client and must not link the server.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures_lite::{AsyncRead, AsyncWrite};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::SendRequest;

pub mod pb {
    #![allow(dead_code, clippy::all, clippy::pedantic, clippy::nursery)]
    pub mod mvccpb {
        include!(concat!(env!("OUT_DIR"), "/mvccpb.rs"));
    }
    pub mod authpb {
        include!(concat!(env!("OUT_DIR"), "/authpb.rs"));
    }
    pub mod etcdserverpb {
        include!(concat!(env!("OUT_DIR"), "/etcdserverpb.rs"));
    }
}

struct Stream(glommio::net::TcpStream);

impl hyper::rt::Read for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        // SAFETY: the slice is zeroed before use (so initialised) and the
        // cursor advances by exactly the bytes read.
        let uninit = unsafe { buf.as_mut() };
        for b in uninit.iter_mut() {
            b.write(0);
        }
        // SAFETY: every element was initialised just above.
        let slice = unsafe { &mut *(uninit as *mut [std::mem::MaybeUninit<u8>] as *mut [u8]) };
        match Pin::new(&mut self.get_mut().0).poll_read(cx, slice) {
            Poll::Ready(Ok(n)) => {
                // SAFETY: `n` bytes were just written.
                unsafe { buf.advance(n) };
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl hyper::rt::Write for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_close(cx)
    }
}

#[derive(Clone, Copy)]
struct Exec;

impl<F: Future + 'static> hyper::rt::Executor<F> for Exec {
    fn execute(&self, fut: F) {
        glommio::spawn_local(fut).detach();
    }
}

/// One HTTP/2 connection; clones share it (requests multiplex as streams).
#[derive(Clone)]
pub struct Conn {
    send: SendRequest<Full<Bytes>>,
    authority: String,
}

impl Conn {
    pub async fn connect(endpoint: &str) -> Result<Conn, String> {
        let tcp = glommio::net::TcpStream::connect(endpoint)
            .await
            .map_err(|e| format!("connect {endpoint}: {e}"))?;
        tcp.set_nodelay(true).map_err(|e| e.to_string())?;
        let (send, conn) = hyper::client::conn::http2::Builder::new(Exec)
            .initial_stream_window_size(1 << 20)
            .initial_connection_window_size(8 << 20)
            .handshake(Stream(tcp))
            .await
            .map_err(|e| format!("http2 handshake with {endpoint}: {e}"))?;
        glommio::spawn_local(async move {
            let _ = conn.await;
        })
        .detach();
        Ok(Conn {
            send,
            authority: endpoint.to_string(),
        })
    }

    /// A unary call: `path` like `/etcdserverpb.KV/Put`.
    pub async fn unary<Req: prost::Message, Resp: prost::Message + Default>(
        &mut self,
        path: &str,
        req: &Req,
    ) -> Result<Resp, String> {
        let mut body = BytesMut::with_capacity(5 + req.encoded_len());
        body.put_u8(0);
        body.put_u32(req.encoded_len() as u32);
        req.encode(&mut body).map_err(|e| e.to_string())?;
        let request = hyper::Request::post(format!("http://{}{path}", self.authority))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(Full::new(body.freeze()))
            .map_err(|e| e.to_string())?;
        self.send.ready().await.map_err(|e| e.to_string())?;
        let resp = self
            .send
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        let (parts, body) = resp.into_parts();
        let collected = body.collect().await.map_err(|e| e.to_string())?;
        let trailers = collected.trailers().cloned();
        let status = trailers
            .as_ref()
            .and_then(|t| t.get("grpc-status"))
            .or_else(|| parts.headers.get("grpc-status"))
            .and_then(|v| v.to_str().ok())
            .unwrap_or("0")
            .to_string();
        if status != "0" {
            let message = trailers
                .as_ref()
                .and_then(|t| t.get("grpc-message"))
                .or_else(|| parts.headers.get("grpc-message"))
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            return Err(format!("grpc status {status}: {message}"));
        }
        let mut data = collected.to_bytes();
        if data.len() < 5 {
            return Err("short gRPC response".into());
        }
        data.advance(1);
        let len = data.get_u32() as usize;
        if data.len() < len {
            return Err("truncated gRPC message".into());
        }
        Resp::decode(data.split_to(len)).map_err(|e| e.to_string())
    }
}
