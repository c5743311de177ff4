//! A minimal etcd v3 gRPC client on glommio: hyper's HTTP/2 client over
//! glommio sockets, prost messages. Unary calls ([`Conn::unary`]) and
//! bidirectional streams ([`Conn::open_stream`], for LeaseKeepAlive): the
//! request body is fed from a channel, the response body is read frame by
//! frame and gRPC's length-prefixed messages are decoded as they arrive.
//! Enough to load metcd and real etcd with the same code.
//!
//! The hyper/glommio glue repeats the server's few lines on purpose: the
//! bench is a client and must not link the server.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures_channel::mpsc;
use futures_lite::{AsyncRead, AsyncWrite};
use http_body_util::{BodyExt, Either, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::client::conn::http2::SendRequest;
use hyper::header::HeaderMap;
use hyper::Response;

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

/// The frames of a streaming request body.
type FrameSender = mpsc::UnboundedSender<Result<Frame<Bytes>, Infallible>>;
type FrameStream = StreamBody<mpsc::UnboundedReceiver<Result<Frame<Bytes>, Infallible>>>;
/// A request body: a whole unary message or a stream of messages.
type Body = Either<Full<Bytes>, FrameStream>;
type ResponseFuture = Pin<Box<dyn Future<Output = hyper::Result<Response<Incoming>>>>>;

/// One HTTP/2 connection; clones share it (requests multiplex as streams).
#[derive(Clone)]
pub struct Conn {
    send: SendRequest<Body>,
    authority: String,
}

/// `req` as one gRPC message: uncompressed flag, big-endian length, bytes.
fn encode_message<M: prost::Message>(req: &M) -> Result<Bytes, String> {
    let len = u32::try_from(req.encoded_len()).map_err(|_| "message too large".to_string())?;
    let mut body = BytesMut::with_capacity(5 + len as usize);
    body.put_u8(0);
    body.put_u32(len);
    req.encode(&mut body).map_err(|e| e.to_string())?;
    Ok(body.freeze())
}

/// Takes one whole gRPC message off the front of `buf`, if there is one.
fn decode_message<M: prost::Message + Default>(buf: &mut BytesMut) -> Result<Option<M>, String> {
    if buf.len() < 5 {
        return Ok(None);
    }
    if buf[0] != 0 {
        return Err("compressed gRPC message".into());
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if buf.len() < 5 + len {
        return Ok(None);
    }
    buf.advance(5);
    M::decode(buf.split_to(len))
        .map(Some)
        .map_err(|e| e.to_string())
}

/// The gRPC error in `trailers` (or in the headers of a trailers-only
/// response), if any.
fn grpc_error(trailers: Option<&HeaderMap>, headers: Option<&HeaderMap>) -> Option<String> {
    let get = |name: &str| {
        trailers
            .and_then(|t| t.get(name))
            .or_else(|| headers.and_then(|h| h.get(name)))
            .and_then(|v| v.to_str().ok())
    };
    match get("grpc-status") {
        None | Some("0") => None,
        Some(status) => Some(format!(
            "grpc status {status}: {}",
            get("grpc-message").unwrap_or("")
        )),
    }
}

/// A bidirectional gRPC stream: [`BidiStream::send`] queues a request
/// message, [`BidiStream::recv`] waits for the next response message.
/// Dropping it ends the request stream.
pub struct BidiStream<Req, Resp> {
    tx: FrameSender,
    response: Option<ResponseFuture>,
    body: Option<Incoming>,
    buf: BytesMut,
    _types: PhantomData<fn(Req) -> Resp>,
}

impl<Req: prost::Message, Resp: prost::Message + Default> BidiStream<Req, Resp> {
    pub fn send(&mut self, req: &Req) -> Result<(), String> {
        self.tx
            .unbounded_send(Ok(Frame::data(encode_message(req)?)))
            .map_err(|_| "stream closed".to_string())
    }

    pub async fn recv(&mut self) -> Result<Resp, String> {
        loop {
            if let Some(msg) = decode_message(&mut self.buf)? {
                return Ok(msg);
            }
            if let Some(response) = self.response.take() {
                let resp = response.await.map_err(|e| e.to_string())?;
                if let Some(e) = grpc_error(None, Some(resp.headers())) {
                    return Err(e);
                }
                self.body = Some(resp.into_body());
                continue;
            }
            let Some(body) = self.body.as_mut() else {
                return Err("stream closed".into());
            };
            match body.frame().await {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.buf.extend_from_slice(&data),
                    Err(frame) => {
                        self.body = None;
                        let trailers = frame.into_trailers().ok();
                        return Err(grpc_error(trailers.as_ref(), None)
                            .unwrap_or_else(|| "stream ended by the server".into()));
                    }
                },
                Some(Err(e)) => {
                    self.body = None;
                    return Err(e.to_string());
                }
                None => {
                    self.body = None;
                    return Err("stream ended by the server".into());
                }
            }
        }
    }
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

    fn request(&self, path: &str, body: Body) -> Result<hyper::Request<Body>, String> {
        hyper::Request::post(format!("http://{}{path}", self.authority))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(body)
            .map_err(|e| e.to_string())
    }

    /// Opens a bidirectional stream: `path` like
    /// `/etcdserverpb.Lease/LeaseKeepAlive`. The response headers are
    /// awaited by the first [`BidiStream::recv`], so a server that answers
    /// only after the first request message works too.
    pub async fn open_stream<Req, Resp>(
        &mut self,
        path: &str,
    ) -> Result<BidiStream<Req, Resp>, String> {
        let (tx, rx) = mpsc::unbounded();
        let request = self.request(path, Either::Right(StreamBody::new(rx)))?;
        self.send.ready().await.map_err(|e| e.to_string())?;
        let response: ResponseFuture = Box::pin(self.send.send_request(request));
        Ok(BidiStream {
            tx,
            response: Some(response),
            body: None,
            buf: BytesMut::new(),
            _types: PhantomData,
        })
    }

    /// A unary call: `path` like `/etcdserverpb.KV/Put`.
    pub async fn unary<Req: prost::Message, Resp: prost::Message + Default>(
        &mut self,
        path: &str,
        req: &Req,
    ) -> Result<Resp, String> {
        let request = self.request(path, Either::Left(Full::new(encode_message(req)?)))?;
        self.send.ready().await.map_err(|e| e.to_string())?;
        let resp = self
            .send
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        let (parts, body) = resp.into_parts();
        let collected = body.collect().await.map_err(|e| e.to_string())?;
        if let Some(e) = grpc_error(collected.trailers(), Some(&parts.headers)) {
            return Err(e);
        }
        let mut data = BytesMut::from(collected.to_bytes());
        match decode_message(&mut data)? {
            Some(msg) => Ok(msg),
            None => Err("short or truncated gRPC response".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::pb::etcdserverpb as pb;
    use super::*;

    #[test]
    fn messages_decode_as_they_arrive() {
        let a = pb::LeaseKeepAliveResponse {
            id: 7,
            ttl: 60,
            ..Default::default()
        };
        let b = pb::LeaseKeepAliveResponse {
            id: 8,
            ttl: 0,
            ..Default::default()
        };
        let mut wire = BytesMut::new();
        wire.extend_from_slice(&encode_message(&a).unwrap());
        wire.extend_from_slice(&encode_message(&b).unwrap());
        let wire = wire.freeze();
        // Fed one byte at a time, each message appears once it is whole.
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for byte in wire.iter() {
            buf.put_u8(*byte);
            while let Some(m) = decode_message::<pb::LeaseKeepAliveResponse>(&mut buf).unwrap() {
                got.push(m);
            }
        }
        assert_eq!(got, vec![a, b]);
        assert!(buf.is_empty());
    }

    #[test]
    fn grpc_status_zero_is_not_an_error() {
        let mut h = HeaderMap::new();
        h.insert("grpc-status", "0".parse().unwrap());
        assert_eq!(grpc_error(Some(&h), None), None);
        let mut t = HeaderMap::new();
        t.insert("grpc-status", "5".parse().unwrap());
        t.insert("grpc-message", "not found".parse().unwrap());
        assert_eq!(
            grpc_error(Some(&t), Some(&h)).as_deref(),
            Some("grpc status 5: not found")
        );
        assert_eq!(
            grpc_error(None, Some(&t)).as_deref(),
            Some("grpc status 5: not found")
        );
    }
}
