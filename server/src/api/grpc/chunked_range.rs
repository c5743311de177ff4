//! A Range answer encoded while the client reads it: gRPC's, the JSON
//! gateway's and the seed HTTP API's.
//!
//! A range whose answer is in key order ([`crate::mvcc::ChunkedRange`]:
//! no sort by another field, no revision filter) is never held whole: the
//! member holds the answer's key revisions (16 bytes a key), its first
//! [`WHOLE_BELOW`] bytes, and then a window of [`CHUNK_BYTES`] chunks in a
//! channel of two (and the one its producer holds), which the connection
//! empties as flow control lets the client take them. (etcd 3.4 holds every value of the answer
//! and its whole encoding on top.)
//!
//! A gRPC message starts with its length, so such an answer is read twice
//! from the range's engine snapshot: a first pass sizes it, a second
//! encodes and sends it, both a slice at a time in the shard's reads
//! queue ([`crate::sched`]). An answer that fits in [`WHOLE_BELOW`] is
//! answered whole after the first pass, read once. The bytes sent are
//! those prost encodes for the whole message (tested below).
//!
//! How it reaches the wire: the router marks a gRPC Range request with
//! [`MayChunk`]; `KvService::range` then answers a placeholder message and
//! puts the real body ([`ChunkedBody`]) in the response's extensions; the
//! router sends that body instead of tonic's encoding of the placeholder.
//!
//! The JSON gateway's `/v3/kv/range` answers the same way ([`answer_json`])
//! but in one pass, as JSON needs no length up front: about
//! [`WHOLE_BELOW`] bytes of JSON are loaded, and an answer that ends there
//! is written whole by its caller; a larger one goes out in chunks
//! (HTTP/1.1's chunked encoding or HTTP/2 frames, as Go's server sends a
//! large answer), the first loaded ones first. The bytes are those of the
//! whole answer's JSON (tested below). A failure after the first chunk
//! fails the body, which hyper turns into a cut chunked body (HTTP/1.1) or
//! a reset stream (HTTP/2), so such a client never takes a cut answer for
//! a whole one (an HTTP/1.0 client sees the connection close, and JSON
//! that does not parse).
//!
//! Must never: send a message whose length differs from its prefix (the
//! second pass counts, and ends the call with an error instead), or load
//! values on the write path.

use std::sync::{Arc, Mutex, PoisonError};

use bytes::{BufMut, Bytes, BytesMut};
use futures_channel::mpsc;
use futures_lite::future::poll_fn;
use hyper::body::Frame;
use prost::Message;
use tonic::{Response, Status};

use super::convert::{self, HeaderInfo};
use super::pb::etcdserverpb as pb;
use super::pb::mvccpb;
use crate::error::ServerError;
use crate::mvcc::{self, ChunkedRange};
use crate::owner::{Snapshot, RANGE_LOAD_CHUNK};

/// Answers up to about this size (encoded key-values) go whole, read
/// once; larger ones send this much first, then chunks.
pub const WHOLE_BELOW: usize = 1 << 20;

/// The size of the chunks a large answer is sent in.
pub const CHUNK_BYTES: usize = 64 << 10;

/// `RangeResponse`'s field numbers.
const HEADER_FIELD: u32 = 1;
const KVS_FIELD: u32 = 2;

/// Marks a gRPC Range request whose answer may be chunked (the router's).
#[derive(Debug, Clone, Copy)]
pub struct MayChunk;

type Frames = mpsc::Receiver<Result<Frame<Bytes>, Status>>;

/// The body of a chunked answer, in the placeholder response's extensions
/// (which want `Clone + Sync`; the router takes it once).
#[derive(Clone)]
pub struct ChunkedBody(Arc<Mutex<Option<Frames>>>);

impl ChunkedBody {
    /// The body to send, the first time it is asked for.
    pub fn take(&self) -> Option<tonic::body::Body> {
        let frames = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()?;
        Some(tonic::body::Body::new(http_body_util::StreamBody::new(
            frames,
        )))
    }
}

/// Answers `range`: whole when it fits in [`WHOLE_BELOW`], otherwise a
/// placeholder carrying a [`ChunkedBody`] whose producer runs in this
/// shard's reads queue.
pub async fn answer(
    mut range: ChunkedRange<Snapshot>,
    ids: HeaderInfo,
) -> Result<Response<pb::RangeResponse>, Status> {
    let mut first = Vec::new();
    let mut first_bytes = 0usize;
    let mut fits = true;
    let mut kvs_bytes = 0usize;
    loop {
        let done = range
            .load(RANGE_LOAD_CHUNK, |kv| {
                let mut kv = convert::key_value(kv);
                let len = prost::encoding::message::encoded_len(KVS_FIELD, &kv);
                kvs_bytes += len;
                fits = fits && first_bytes + len <= WHOLE_BELOW;
                if fits {
                    own_bare_key(&mut kv.key, &kv.value);
                    first.push(kv);
                    first_bytes += len;
                }
            })
            .map_err(|e| super::service::status_of(&ServerError::Mvcc(e)))?;
        if done {
            break;
        }
        crate::sched::end_of_slice().await;
    }
    let mut rest = pb::RangeResponse {
        header: ids.header(range.revision),
        kvs: Vec::new(),
        more: range.more,
        count: range.count,
    };
    if first.len() == range.len() {
        rest.kvs = first;
        return Ok(Response::new(rest));
    }
    let length = rest.encoded_len() + kvs_bytes;
    let Ok(length) = u32::try_from(length) else {
        // What grpc-go's server answers for a message over its limit.
        return Err(Status::resource_exhausted(format!(
            "grpc: trying to send message larger than max ({length} vs. {})",
            u32::MAX
        )));
    };
    range.seek(first.len());
    let (out, frames) = mpsc::channel(2);
    crate::sched::spawn_read(send(range, rest, first, length, out));
    let mut response = Response::new(pb::RangeResponse::default());
    response
        .extensions_mut()
        .insert(ChunkedBody(Arc::new(Mutex::new(Some(frames)))));
    Ok(response)
}

/// The second pass: the gRPC frame of `rest` with `first` and then the
/// rest of `range`'s key-values, `length` bytes, in chunks, then gRPC's
/// OK trailers. Stops when the client is gone.
async fn send(
    mut range: ChunkedRange<Snapshot>,
    rest: pb::RangeResponse,
    first: Vec<mvccpb::KeyValue>,
    length: u32,
    mut out: mpsc::Sender<Result<Frame<Bytes>, Status>>,
) {
    let mut buf = BytesMut::with_capacity(WHOLE_BELOW.min(length as usize) + 64);
    buf.put_u8(0);
    buf.put_u32(length);
    if let Some(header) = &rest.header {
        prost::encoding::message::encode(HEADER_FIELD, header, &mut buf);
    }
    for kv in &first {
        prost::encoding::message::encode(KVS_FIELD, kv, &mut buf);
    }
    drop(first);
    // Message bytes handed to the channel so far.
    let mut sent = 0usize;
    let mut frame_prefix = 5;
    loop {
        if buf.len() >= CHUNK_BYTES {
            sent += buf.len() - frame_prefix;
            frame_prefix = 0;
            if !put(&mut out, Frame::data(buf.split().freeze())).await {
                return;
            }
        }
        let loaded = load_slice(&mut range, CHUNK_BYTES, |kv| {
            prost::encoding::message::encode(KVS_FIELD, &convert::key_value(kv), &mut buf);
            Some(buf.len())
        });
        match loaded {
            Ok(true) => break,
            Ok(false) => crate::sched::end_of_slice().await,
            Err(e) => {
                let status = super::service::status_of(&ServerError::Mvcc(e));
                put(&mut out, trailers(&status)).await;
                return;
            }
        }
    }
    // The fields after the key-values: `more`, `count`.
    let tail = pb::RangeResponse {
        header: None,
        kvs: Vec::new(),
        more: rest.more,
        count: rest.count,
    };
    tail.encode_raw(&mut buf);
    sent += buf.len() - frame_prefix;
    if sent != length as usize {
        let status = Status::internal(format!(
            "etcdserver: range answer sized {length} bytes but encoded {sent}"
        ));
        put(&mut out, trailers(&status)).await;
        return;
    }
    if put(&mut out, Frame::data(buf.freeze())).await {
        put(&mut out, trailers(&Status::ok(""))).await;
    }
}

/// What a range's answer says beside its key-values.
#[derive(Debug, Clone, Copy)]
pub struct RangeMeta {
    /// The store's revision the range was read at (the header's).
    pub revision: i64,
    pub more: bool,
    pub count: i64,
}

/// A JSON answer to a range ([`answer_json`]): `W` is what the caller
/// writes whole its own way (first the key-values and [`RangeMeta`]).
pub enum JsonAnswer<W> {
    /// Small enough to be written whole.
    Whole(W),
    /// The JSON, in chunks; an error ends it early (the body fails).
    Chunks(mpsc::Receiver<Result<Bytes, Status>>),
}

impl<W> JsonAnswer<W> {
    /// The same answer, what is written whole turned into `f`'s.
    pub fn map_whole<V>(self, f: impl FnOnce(W) -> V) -> JsonAnswer<V> {
        match self {
            JsonAnswer::Whole(whole) => JsonAnswer::Whole(f(whole)),
            JsonAnswer::Chunks(chunks) => JsonAnswer::Chunks(chunks),
        }
    }
}

/// The JSON before an answer's first key-value and after its last.
pub type HeadAndTail = (Vec<u8>, Vec<u8>);

/// How a JSON answer goes around its key-values: given the answer's
/// [`RangeMeta`], the bytes before the first key-value (up to and with
/// the array's `[`) and after the last (from its `]`); and how one
/// key-value is written.
pub struct JsonShape {
    pub around: Box<dyn FnOnce(RangeMeta) -> serde_json::Result<HeadAndTail> + Send>,
    pub write_kv: fn(&mut Vec<u8>, &mvcc::KeyValue) -> serde_json::Result<()>,
}

/// Answers `range` as JSON: the key-values whole when they end within
/// [`WHOLE_BELOW`] bytes, otherwise the JSON that `shape` describes, in
/// chunks, produced in this shard's reads queue as the client reads them.
/// The JSON gateway and the seed HTTP API both answer this way.
pub async fn answer_json(
    mut range: ChunkedRange<Snapshot>,
    shape: JsonShape,
) -> Result<JsonAnswer<(Vec<mvcc::KeyValue>, RangeMeta)>, ServerError> {
    let mut first = Vec::new();
    let mut first_bytes = 0usize;
    let meta = RangeMeta {
        revision: range.revision,
        more: range.more,
        count: range.count,
    };
    loop {
        let done = load_slice(&mut range, WHOLE_BELOW, |mut kv| {
            first_bytes += json_bytes(&kv);
            own_bare_key(&mut kv.key, &kv.value);
            first.push(kv);
            Some(first_bytes)
        })
        .map_err(ServerError::Mvcc)?;
        if done {
            return Ok(JsonAnswer::Whole((first, meta)));
        }
        if first_bytes >= WHOLE_BELOW {
            let (out, chunks) = mpsc::channel(2);
            crate::sched::spawn_read(send_json(range, meta, shape, first, out));
            return Ok(JsonAnswer::Chunks(chunks));
        }
        crate::sched::end_of_slice().await;
    }
}

/// About the size of `kv`'s JSON: base64 or escaped text, and the fields.
fn json_bytes(kv: &mvcc::KeyValue) -> usize {
    (kv.key.len() + kv.value.len()) * 4 / 3 + 100
}

/// For a key-value kept by a first pass: without a value (keys-only
/// answers) its key becomes a copy, as it may be a slice of the whole
/// record the engine read (a big value's), so that a kept key never keeps
/// its record.
fn own_bare_key(key: &mut Bytes, value: &[u8]) {
    if value.is_empty() {
        *key = Bytes::copy_from_slice(key);
    }
}

/// Loads a slice of `range`'s key-values a value at a time (values may be
/// up to --max-request-bytes each) into `take`, which answers how many
/// bytes are now buffered, or `None` to stop: until `bytes` are buffered
/// or [`RANGE_LOAD_CHUNK`] values are loaded. True once the last one was.
fn load_slice(
    range: &mut ChunkedRange<Snapshot>,
    bytes: usize,
    mut take: impl FnMut(mvcc::KeyValue) -> Option<usize>,
) -> Result<bool, mvcc::MvccError> {
    for _ in 0..RANGE_LOAD_CHUNK {
        let mut buffered = None;
        if range.load(1, |kv| buffered = take(kv))? {
            return Ok(true);
        }
        if buffered.is_none_or(|n| n >= bytes) {
            return Ok(false);
        }
    }
    Ok(false)
}

/// The gateway's JSON of a `RangeResponse` (pbjson writes the fields in
/// their order and leaves defaults out:
/// `{"header":..,"kvs":[..],"more":..,"count":..}`).
pub fn gateway_shape(ids: HeaderInfo) -> JsonShape {
    JsonShape {
        around: Box::new(move |meta: RangeMeta| {
            let mut head = b"{\"header\":".to_vec();
            serde_json::to_writer(&mut head, &ids.header(meta.revision))?;
            head.extend_from_slice(b",\"kvs\":[");
            // What the answer without its header and key-values writes:
            // `{}`, or `{"more":..}` whose fields follow the key-values.
            let rest = serde_json::to_vec(&pb::RangeResponse {
                header: None,
                kvs: Vec::new(),
                more: meta.more,
                count: meta.count,
            })?;
            let mut tail = b"]".to_vec();
            if rest.len() > 2 {
                tail.push(b',');
                tail.extend_from_slice(&rest[1..]);
            } else {
                tail.push(b'}');
            }
            Ok((head, tail))
        }),
        write_kv: |buf, kv| serde_json::to_writer(buf, &convert::key_value(kv.clone())),
    }
}

/// The gateway's whole answer, for a [`JsonAnswer::Whole`] of
/// [`answer_json`].
pub fn gateway_whole(
    ids: HeaderInfo,
    (kvs, meta): (Vec<mvcc::KeyValue>, RangeMeta),
) -> pb::RangeResponse {
    pb::RangeResponse {
        header: ids.header(meta.revision),
        kvs: kvs.into_iter().map(convert::key_value).collect(),
        more: meta.more,
        count: meta.count,
    }
}

/// Sends `head`, `first` and then the rest of `range`'s key-values, then
/// `tail` (both from `shape`), in chunks of about [`CHUNK_BYTES`]; stops
/// when the client is gone.
async fn send_json(
    mut range: ChunkedRange<Snapshot>,
    meta: RangeMeta,
    shape: JsonShape,
    first: Vec<mvcc::KeyValue>,
    mut out: mpsc::Sender<Result<Bytes, Status>>,
) {
    let failed = |e: serde_json::Error| Status::internal(format!("etcdserver: range as JSON: {e}"));
    let (head, tail) = match (shape.around)(meta) {
        Ok(around) => around,
        Err(e) => {
            put_json(&mut out, Err(failed(e))).await;
            return;
        }
    };
    let mut buf = Vec::with_capacity(2 * CHUNK_BYTES);
    buf.extend_from_slice(&head);
    let mut written = 0usize;
    let mut write_kv = |buf: &mut Vec<u8>, kv: &mvcc::KeyValue| {
        if written > 0 {
            buf.push(b',');
        }
        written += 1;
        (shape.write_kv)(buf, kv)
    };
    // The first pass's key-values, a chunk at a time, each freed once
    // written.
    for kv in first {
        if let Err(e) = write_kv(&mut buf, &kv) {
            put_json(&mut out, Err(failed(e))).await;
            return;
        }
        if buf.len() >= CHUNK_BYTES && !put_chunk(&mut out, &mut buf).await {
            return;
        }
    }
    loop {
        if buf.len() >= CHUNK_BYTES && !put_chunk(&mut out, &mut buf).await {
            return;
        }
        let mut encoded = Ok(());
        let loaded = load_slice(&mut range, CHUNK_BYTES, |kv| {
            match write_kv(&mut buf, &kv) {
                Ok(()) => Some(buf.len()),
                Err(e) => {
                    encoded = Err(e);
                    None
                }
            }
        });
        let loaded = match (loaded, encoded) {
            (Ok(done), Ok(())) => Ok(done),
            (Err(e), _) => Err(super::service::status_of(&ServerError::Mvcc(e))),
            (Ok(_), Err(e)) => Err(failed(e)),
        };
        match loaded {
            Ok(true) => break,
            Ok(false) => crate::sched::end_of_slice().await,
            Err(status) => {
                put_json(&mut out, Err(status)).await;
                return;
            }
        }
    }
    buf.extend_from_slice(&tail);
    put_json(&mut out, Ok(Bytes::from(buf))).await;
}

/// Sends what `buf` holds as a chunk and starts a new one; false if the
/// client is gone.
async fn put_chunk(out: &mut mpsc::Sender<Result<Bytes, Status>>, buf: &mut Vec<u8>) -> bool {
    let chunk = std::mem::replace(buf, Vec::with_capacity(2 * CHUNK_BYTES));
    put_json(out, Ok(Bytes::from(chunk))).await
}

/// Sends one chunk (or the error that ends the answer) once the channel
/// has room; false if the client is gone.
async fn put_json(
    out: &mut mpsc::Sender<Result<Bytes, Status>>,
    chunk: Result<Bytes, Status>,
) -> bool {
    poll_fn(|cx| out.poll_ready(cx)).await.is_ok() && out.start_send(chunk).is_ok()
}

/// gRPC's trailers for `status`.
fn trailers(status: &Status) -> Frame<Bytes> {
    let mut map = hyper::HeaderMap::new();
    if status.add_header(&mut map).is_err() {
        map.insert("grpc-status", hyper::header::HeaderValue::from_static("13"));
    }
    Frame::trailers(map)
}

/// Sends one frame once the channel has room; false if the client is
/// gone.
async fn put(out: &mut mpsc::Sender<Result<Frame<Bytes>, Status>>, frame: Frame<Bytes>) -> bool {
    poll_fn(|cx| out.poll_ready(cx)).await.is_ok() && out.start_send(Ok(frame)).is_ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;
    use crate::mvcc::{self, MvccStore, RangeStart};
    use bytes::Buf;
    use engine::any::AnyEngine;
    use http_body_util::BodyExt;

    const IDS: HeaderInfo = HeaderInfo {
        cluster_id: 7,
        member_id: 9,
        raft_term: 3,
    };

    /// A store with `sizes.len()` keys `k/000000`.., key i's value
    /// `sizes[i]` bytes long, and a key outside the ranges below.
    fn store(sizes: &[usize]) -> MvccStore<AnyEngine> {
        let mut store = MvccStore::open(AnyEngine::Memory(engine::MemoryEngine::new())).unwrap();
        let mut index = 0;
        let mut put = |store: &mut MvccStore<AnyEngine>, key: String, len: usize| {
            index += 1;
            let value: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let req = mvcc::Request::Put(mvcc::PutRequest {
                key: key.into(),
                value: value.into(),
                ..Default::default()
            });
            store.apply(index, &req).unwrap();
        };
        for (i, len) in sizes.iter().enumerate() {
            put(&mut store, format!("k/{i:06}"), *len);
        }
        put(&mut store, "z".into(), 10);
        store
    }

    fn plan(store: &MvccStore<AnyEngine>, req: &mvcc::RangeRequest) -> mvcc::RangePlan<Snapshot> {
        let reader = store.reader();
        let mut walk = reader.begin_range(req.clone()).unwrap();
        while !reader.walk_range(&mut walk, 1000).unwrap() {}
        match walk.finish() {
            RangeStart::Plan(plan) => plan,
            RangeStart::Done(done) => panic!("no values to load: {done:?}"),
        }
    }

    /// `req`'s plan after its ordering pass (what the read path does before
    /// it chunks an answer), in slices of 100 keys.
    fn ordered_plan(
        store: &MvccStore<AnyEngine>,
        req: &mvcc::RangeRequest,
    ) -> mvcc::RangePlan<Snapshot> {
        let mut plan = plan(store, req);
        while !plan.order(100).unwrap() {}
        plan
    }

    fn chunked_plan(
        store: &MvccStore<AnyEngine>,
        req: &mvcc::RangeRequest,
    ) -> ChunkedRange<Snapshot> {
        let mvcc::Chunking::Chunked(chunked) = ordered_plan(store, req).into_chunked() else {
            panic!("not chunked: {req:?}");
        };
        chunked
    }

    /// 3000 values of 1000 bytes under `k/` whose mod revisions, versions
    /// and create revisions are not in key order: every third key is put
    /// again, last key first; every fifth is deleted and created again.
    fn reshuffled_store() -> MvccStore<AnyEngine> {
        let mut store = store(&vec![1000; 3000]);
        let mut index = 3001;
        let mut apply = |store: &mut MvccStore<AnyEngine>, req: mvcc::Request| {
            index += 1;
            store.apply(index, &req).unwrap();
        };
        let value = bytes::Bytes::from(vec![7u8; 1000]);
        for i in (0..3000).rev().filter(|i| i % 3 == 0) {
            let key = bytes::Bytes::from(format!("k/{i:06}"));
            let put = mvcc::PutRequest {
                key,
                value: value.clone(),
                ..Default::default()
            };
            apply(&mut store, mvcc::Request::Put(put));
        }
        for i in (0..3000).filter(|i| i % 5 == 0) {
            let key = bytes::Bytes::from(format!("k/{i:06}"));
            let delete = mvcc::DeleteRangeRequest {
                key: key.clone(),
                ..Default::default()
            };
            apply(&mut store, mvcc::Request::DeleteRange(delete));
            let put = mvcc::PutRequest {
                key,
                value: value.clone(),
                ..Default::default()
            };
            apply(&mut store, mvcc::Request::Put(put));
        }
        store
    }

    /// Runs `work` on an executor of its own (the answers spawn their
    /// senders in the reads queue).
    fn on_executor<T>(work: impl std::future::Future<Output = T>) -> T {
        glommio::LocalExecutorBuilder::default()
            .make()
            .unwrap()
            .run(work)
    }

    /// What goes on the wire for `req` through [`answer`] (the gRPC data
    /// and the trailers' status), and whether it went in chunks.
    fn wire(store: &MvccStore<AnyEngine>, req: &mvcc::RangeRequest) -> (Vec<u8>, String, bool) {
        let chunked = chunked_plan(store, req);
        on_executor(async move {
            let response = answer(chunked, IDS).await.unwrap();
            let Some(body) = response.extensions().get::<ChunkedBody>() else {
                let message = response.into_inner().encode_to_vec();
                let mut data = vec![0];
                data.extend_from_slice(&(message.len() as u32).to_be_bytes());
                data.extend_from_slice(&message);
                return (data, "0".to_string(), false);
            };
            let mut body = body.take().unwrap();
            let (mut data, mut status) = (Vec::new(), String::new());
            while let Some(frame) = body.frame().await {
                let frame = frame.unwrap();
                if let Some(chunk) = frame.data_ref() {
                    assert!(status.is_empty(), "data after the trailers");
                    data.extend_from_slice(chunk);
                } else if let Some(trailers) = frame.trailers_ref() {
                    status = trailers["grpc-status"].to_str().unwrap().to_string();
                }
            }
            (data, status, true)
        })
    }

    /// The whole answer as the unchunked path builds it, framed for gRPC.
    fn expected(store: &MvccStore<AnyEngine>, req: &mvcc::RangeRequest) -> Vec<u8> {
        let whole = plan(store, req).finish().unwrap();
        let message = convert::range_response(whole, &IDS).encode_to_vec();
        let mut data = vec![0];
        data.extend_from_slice(&(message.len() as u32).to_be_bytes());
        data.extend_from_slice(&message);
        data
    }

    fn range(limit: i64, order: mvcc::SortOrder, keys_only: bool) -> mvcc::RangeRequest {
        mvcc::RangeRequest {
            key: bytes::Bytes::from_static(b"k/"),
            range_end: bytes::Bytes::from_static(b"k0"),
            limit,
            sort_order: order,
            keys_only,
            ..Default::default()
        }
    }

    /// The stores the byte-for-byte tests read: `big` (3000 values of 1000
    /// bytes, ~3 MB, over WHOLE_BELOW), `huge_first` (one value bigger than
    /// WHOLE_BELOW first, then small ones), `small`, and `reshuffled` (as
    /// `big`, its revisions and versions out of key order).
    struct Stores {
        big: MvccStore<AnyEngine>,
        huge_first: MvccStore<AnyEngine>,
        small: MvccStore<AnyEngine>,
        reshuffled: MvccStore<AnyEngine>,
    }

    fn stores() -> Stores {
        let mut sizes = vec![WHOLE_BELOW + 10];
        sizes.extend([5; 100]);
        Stores {
            big: store(&vec![1000; 3000]),
            huge_first: store(&sizes),
            small: store(&[10, 20, 30]),
            reshuffled: reshuffled_store(),
        }
    }

    /// `range(limit, order, keys_only)` sorted by `target`.
    fn sorted(
        target: mvcc::SortTarget,
        limit: i64,
        order: mvcc::SortOrder,
        keys_only: bool,
    ) -> mvcc::RangeRequest {
        mvcc::RangeRequest {
            sort_target: target,
            ..range(limit, order, keys_only)
        }
    }

    /// `range(limit, order, false)` with revision filters: mod revisions
    /// in `[min_mod, max_mod]`, create revisions in `[min_create,
    /// max_create]` (0: no bound).
    fn filtered(
        limit: i64,
        order: mvcc::SortOrder,
        (min_mod, max_mod): (i64, i64),
        (min_create, max_create): (i64, i64),
    ) -> mvcc::RangeRequest {
        mvcc::RangeRequest {
            min_mod_revision: min_mod,
            max_mod_revision: max_mod,
            min_create_revision: min_create,
            max_create_revision: max_create,
            ..range(limit, order, false)
        }
    }

    /// The cases: a store, a range of it, and whether gRPC's and the JSON
    /// answers go in chunks.
    fn cases(s: &Stores) -> Vec<(&MvccStore<AnyEngine>, mvcc::RangeRequest, bool, bool)> {
        use mvcc::SortOrder::{Ascend, Descend, None as Unsorted};
        use mvcc::SortTarget::{Create, Key, Mod, Version};
        vec![
            (&s.big, range(0, Unsorted, false), true, true),
            (&s.big, range(0, Ascend, false), true, true),
            (&s.big, range(0, Descend, false), true, true),
            (&s.big, range(2500, Unsorted, false), true, true),
            (&s.big, range(2500, Descend, false), true, true),
            (&s.big, range(500, Unsorted, false), false, false),
            (&s.big, range(0, Unsorted, true), false, false),
            (&s.huge_first, range(0, Unsorted, false), true, true),
            // Nothing fits whole for gRPC; JSON loads in one pass, where the
            // big value, last here, ends the answer, which then goes whole.
            (&s.huge_first, range(0, Descend, false), true, false),
            (&s.small, range(0, Unsorted, false), false, false),
            (&s.small, range(2, Descend, false), false, false),
            // Sorted by a field other than the key, and revision filters:
            // in the answer's order once the records were read.
            (&s.reshuffled, sorted(Mod, 0, Unsorted, false), true, true),
            (&s.reshuffled, sorted(Mod, 0, Descend, false), true, true),
            (&s.reshuffled, sorted(Create, 0, Ascend, false), true, true),
            (
                &s.reshuffled,
                sorted(Create, 2000, Descend, false),
                true,
                true,
            ),
            (
                &s.reshuffled,
                sorted(Version, 0, Descend, false),
                true,
                true,
            ),
            (
                &s.reshuffled,
                sorted(Version, 0, Ascend, true),
                false,
                false,
            ),
            (
                &s.reshuffled,
                sorted(Version, 10, Descend, false),
                false,
                false,
            ),
            (&s.reshuffled, sorted(Key, 0, Descend, false), true, true),
            (
                &s.reshuffled,
                filtered(0, Unsorted, (2000, 0), (0, 0)),
                true,
                true,
            ),
            (
                &s.reshuffled,
                filtered(0, Descend, (0, 3500), (1500, 0)),
                true,
                true,
            ),
            (
                &s.reshuffled,
                filtered(700, Ascend, (0, 0), (0, 3001)),
                false,
                false,
            ),
            (
                &s.reshuffled,
                filtered(0, Unsorted, (5000, 0), (0, 0)),
                false,
                false,
            ),
            (
                &s.reshuffled,
                mvcc::RangeRequest {
                    min_mod_revision: 1000,
                    ..sorted(Create, 0, Descend, false)
                },
                true,
                true,
            ),
        ]
    }

    /// Whatever the answer's size, order, limit and values, the bytes sent
    /// are prost's encoding of the whole answer, in one gRPC message,
    /// followed by an OK status; only answers over WHOLE_BELOW go in chunks.
    #[test]
    fn a_chunked_answer_is_byte_for_byte_the_whole_answer() {
        let stores = stores();
        for (i, (store, req, in_chunks, _)) in cases(&stores).into_iter().enumerate() {
            let (data, status, chunked) = wire(store, &req);
            assert_eq!(status, "0", "case {i}");
            assert_eq!(chunked, in_chunks, "case {i}: chunked");
            let want = expected(store, &req);
            assert_eq!(data.len(), want.len(), "case {i}: length");
            assert!(data == want, "case {i}: bytes differ");
            // And it decodes as the answer a client reads.
            let mut body = &data[5..];
            let decoded = pb::RangeResponse::decode(&mut body).unwrap();
            assert!(!body.has_remaining());
            assert_eq!(decoded.header.unwrap().revision, store.current_revision());
        }
    }

    /// What the JSON gateway writes for `req` through [`answer_json`], and
    /// whether it went in chunks.
    fn wire_json(store: &MvccStore<AnyEngine>, req: &mvcc::RangeRequest) -> (Vec<u8>, bool) {
        let chunked = chunked_plan(store, req);
        on_executor(async move {
            match answer_json(chunked, gateway_shape(IDS)).await.unwrap() {
                JsonAnswer::Whole(whole) => {
                    let response = gateway_whole(IDS, whole);
                    (serde_json::to_vec(&response).unwrap(), false)
                }
                JsonAnswer::Chunks(mut chunks) => {
                    let mut data = Vec::new();
                    let mut largest = 0;
                    while let Some(chunk) = futures_lite::StreamExt::next(&mut chunks).await {
                        let chunk = chunk.unwrap();
                        largest = largest.max(chunk.len());
                        data.extend_from_slice(&chunk);
                    }
                    // Chunks stay near CHUNK_BYTES, the first pass's
                    // key-values too (a value may pass it alone).
                    assert!(largest <= 2 * WHOLE_BELOW + 2 * CHUNK_BYTES, "{largest}");
                    (data, true)
                }
            }
        })
    }

    /// Whatever the answer's size, order, limit and values, the gateway's
    /// JSON is the whole answer's, byte for byte; only answers over
    /// WHOLE_BELOW go in chunks.
    #[test]
    fn a_chunked_json_answer_is_byte_for_byte_the_whole_answer() {
        let stores = stores();
        for (i, (store, req, _, in_chunks)) in cases(&stores).into_iter().enumerate() {
            let (data, chunked) = wire_json(store, &req);
            assert_eq!(chunked, in_chunks, "case {i}: chunked");
            let whole = plan(store, &req).finish().unwrap();
            let want = serde_json::to_vec(&convert::range_response(whole, &IDS)).unwrap();
            assert_eq!(data.len(), want.len(), "case {i}: length");
            assert!(data == want, "case {i}: bytes differ");
            let decoded: pb::RangeResponse = serde_json::from_slice(&data).unwrap();
            assert_eq!(decoded.header.unwrap().revision, store.current_revision());
        }
    }

    /// A sort by value needs every value before the first can be sent:
    /// such a plan stays whole. A sort by revisions or version, or a
    /// revision filter, is chunked only once its ordering pass has read
    /// every key (before, it would send keys it has not checked).
    #[test]
    fn only_value_sorts_and_unordered_plans_stay_whole() {
        let store = store(&[10, 20, 30]);
        let whole = |plan: mvcc::RangePlan<Snapshot>| {
            matches!(plan.into_chunked(), mvcc::Chunking::Whole(_))
        };
        let by_value = sorted(mvcc::SortTarget::Value, 0, mvcc::SortOrder::Ascend, false);
        assert!(whole(ordered_plan(&store, &by_value)));
        let by_mod = sorted(mvcc::SortTarget::Mod, 0, mvcc::SortOrder::Ascend, false);
        let min_mod = filtered(0, mvcc::SortOrder::None, (2, 0), (0, 0));
        for req in [&by_mod, &min_mod] {
            assert!(whole(plan(&store, req)), "{req:?}");
            let mut part = plan(&store, req);
            assert!(!part.order(1).unwrap());
            assert!(whole(part), "{req:?}");
            assert!(!whole(ordered_plan(&store, req)), "{req:?}");
        }
    }
}
