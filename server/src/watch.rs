//! Watchers of one shard, and the feed of applied events that reaches them.
//!
//! The owner core publishes every applied batch's events (an `Arc` slice,
//! shared, never copied) to the hub of every shard; each hub matches them
//! against its own watchers (gRPC Watch streams accepted on that shard) and
//! pushes responses into the streams' queues. Every hub, the owner's own
//! too, takes the feed in its shard's watch fan-out queue
//! ([`crate::sched`]), behind the owner's apply. A watcher with a past
//! `start_revision` first receives history, read on its shard from the
//! owner's published store ([`crate::read_view`]) in slices; live events
//! that arrive meanwhile are buffered and de-duplicated by revision, so it
//! sees every revision exactly once, in order. A progress notification
//! names a revision only once the hub's feed reached it, so every event up
//! to it went to the watchers in sync (after a snapshot install, those
//! still re-reading history may lag it, as in etcd 3.4).
//!
//! A client that does not read its stream does not make the member hold
//! its events: once the stream has [`MAX_QUEUED_RESPONSES`] responses
//! queued, its watchers stop sending and fall behind (etcd's slow
//! watchers, counted in `etcd_debugging_mvcc_slow_watcher_total`); their
//! events stay in the store's history. When the client has read the queue
//! down to [`CATCH_UP_AT`], they re-read what they missed from history as a
//! resync does, and go on live. A watcher whose missed revisions were
//! compacted meanwhile is cancelled with the compact revision, as etcd
//! cancels one.
//!
//! Must never: block the Raft loop (publishing only enqueues), or deliver an
//! event twice or out of revision order to one watcher.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_channel::mpsc::{UnboundedReceiver, UnboundedSender};

use crate::api::grpc::convert::key_value;
use crate::api::grpc::pb::{etcdserverpb as pb, mvccpb};
use crate::mvcc::{self, EventKind};

/// A batch of applied events, in revision order, shared by every shard.
pub type EventBatch = Arc<[mvcc::Event]>;

/// What the owner core feeds the hubs, in apply order.
#[derive(Debug, Clone)]
pub enum Feed {
    /// One applied entry's events.
    Events(EventBatch),
    /// The store was replaced by a leader's snapshot at `revision`: the
    /// events in between were never applied here one by one, so every
    /// watcher re-reads them from the new store ([`WatchHub::take_resync`]).
    Restored { revision: i64 },
    /// The first item of every subscription: the store's revision then.
    /// Events up to it are not fed (a watcher reads them as history).
    Base { revision: i64 },
}

impl Feed {
    /// The store revision the feed reached with this item.
    pub fn revision(&self) -> i64 {
        match self {
            Feed::Events(batch) => batch.last().map_or(0, |e| e.kv.mod_revision),
            Feed::Restored { revision } | Feed::Base { revision } => *revision,
        }
    }
}

/// Receives the feed; it must only enqueue, never wait.
pub type EventSubscriber = Box<dyn Fn(&Feed)>;

/// What a watcher asked for.
#[derive(Debug, Clone)]
pub struct WatchSpec {
    pub key: Bytes,
    pub range_end: Bytes,
    pub no_put: bool,
    pub no_delete: bool,
    pub prev_kv: bool,
    pub progress_notify: bool,
    /// Split responses larger than the request limit (`fragment`).
    pub fragment: bool,
}

impl WatchSpec {
    fn matches(&self, e: &mvcc::Event) -> bool {
        match e.kind {
            EventKind::Put if self.no_put => return false,
            EventKind::Delete if self.no_delete => return false,
            _ => {}
        }
        in_range(&e.kv.key, &self.key, &self.range_end)
    }
}

/// etcd's range rules: empty end = the key alone, "\0" = every key >= key.
pub fn in_range(k: &[u8], key: &[u8], range_end: &[u8]) -> bool {
    if range_end.is_empty() {
        return k == key;
    }
    if range_end == b"\0" {
        return k >= key;
    }
    k >= key && k < range_end
}

/// Watchers with `prev_kv` in this process, on every shard. The apply
/// path reads a put's previous value only while some exist. Only a hint:
/// it races with watchers being created on other cores, and a watcher
/// that meets an event whose previous value was not read
/// ([`mvcc::Event::prev_kv_unread`]) re-reads it from history. (Servers
/// started in one process, as in tests, share it: they read more, never
/// less.)
static PREV_KV_WATCHERS: AtomicUsize = AtomicUsize::new(0);

/// Whether the apply path should read previous values for watchers.
pub fn prev_kv_watched() -> bool {
    PREV_KV_WATCHERS.load(Ordering::Relaxed) > 0
}

/// Watchers in this process, on every shard (`/metrics`).
static WATCHERS: AtomicUsize = AtomicUsize::new(0);

/// Watchers on every shard of this process.
pub fn watchers_in_process() -> usize {
    WATCHERS.load(Ordering::Relaxed)
}

/// Watchers in this process that fell behind their client (see the module
/// docs).
static SLOW_WATCHERS: AtomicUsize = AtomicUsize::new(0);

/// Watchers of this process that fell behind a client that does not read
/// (`etcd_debugging_mvcc_slow_watcher_total`).
pub fn slow_watchers_in_process() -> usize {
    SLOW_WATCHERS.load(Ordering::Relaxed)
}

/// gRPC watch streams open in this process ([`StreamCount`]).
static WATCH_STREAMS: AtomicUsize = AtomicUsize::new(0);

/// Events this process sent to watchers, each once per watcher.
static EVENTS_SENT: AtomicU64 = AtomicU64::new(0);

/// Watch streams open in this process (`etcd_debugging_mvcc_watch_stream_total`).
pub fn watch_streams_in_process() -> usize {
    WATCH_STREAMS.load(Ordering::Relaxed)
}

/// Events sent to watchers (`etcd_debugging_mvcc_events_total`).
pub fn events_sent_in_process() -> u64 {
    EVENTS_SENT.load(Ordering::Relaxed)
}

/// Events in watch responses queued for their streams and not yet taken.
static PENDING_EVENTS: AtomicU64 = AtomicU64::new(0);

/// Events queued for watch clients, not yet sent
/// (`etcd_debugging_mvcc_pending_events_total`).
pub fn pending_events_in_process() -> u64 {
    PENDING_EVENTS.load(Ordering::Relaxed)
}

/// Counts one open watch stream in [`WATCH_STREAMS`] while it lives.
pub struct StreamCount(());

impl StreamCount {
    #[allow(clippy::new_without_default)]
    pub fn new() -> StreamCount {
        WATCH_STREAMS.fetch_add(1, Ordering::Relaxed);
        StreamCount(())
    }
}

impl Drop for StreamCount {
    fn drop(&mut self) {
        WATCH_STREAMS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counts one watcher in [`WATCHERS`], in [`PREV_KV_WATCHERS`] if it
/// wants `prev_kv`, and in [`SLOW_WATCHERS`] while it lags, while it
/// lives.
struct Counted {
    prev_kv: bool,
    lagging: bool,
}

impl Counted {
    fn new(prev_kv: bool) -> Self {
        WATCHERS.fetch_add(1, Ordering::Relaxed);
        if prev_kv {
            PREV_KV_WATCHERS.fetch_add(1, Ordering::Relaxed);
        }
        Counted {
            prev_kv,
            lagging: false,
        }
    }

    fn set_lagging(&mut self, lagging: bool) {
        if lagging != self.lagging {
            self.lagging = lagging;
            if lagging {
                SLOW_WATCHERS.fetch_add(1, Ordering::Relaxed);
            } else {
                SLOW_WATCHERS.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        WATCHERS.fetch_sub(1, Ordering::Relaxed);
        if self.prev_kv {
            PREV_KV_WATCHERS.fetch_sub(1, Ordering::Relaxed);
        }
        self.set_lagging(false);
    }
}

/// Responses a watch stream may have queued for its client before its
/// watchers stop sending and fall behind (see the module docs). etcd's
/// watch stream buffers 128 responses; metcd's fan-out sends one response
/// per applied batch and watcher, so it allows more.
pub const MAX_QUEUED_RESPONSES: usize = 1024;

/// A stream's watchers that fell behind catch up once its client has read
/// its queue down to this many responses.
pub const CATCH_UP_AT: usize = MAX_QUEUED_RESPONSES / 4;

/// What a stream's two ends share: its queue's length, and whether some
/// watcher of the stream waits for the queue to drain.
#[derive(Default)]
struct Queue {
    queued: Cell<usize>,
    lagging: Cell<bool>,
}

/// A watch stream's response queue, the hub's end: every watcher of the
/// stream (and the stream's own control responses) sends through it.
#[derive(Clone)]
pub struct WatchOut {
    tx: UnboundedSender<pb::WatchResponse>,
    queue: Rc<Queue>,
}

impl WatchOut {
    /// Queues `resp`; false if the client is gone.
    pub fn send(&self, resp: pb::WatchResponse) -> bool {
        let events = resp.events.len() as u64;
        if self.tx.unbounded_send(resp).is_err() {
            return false;
        }
        self.queue.queued.set(self.queue.queued.get() + 1);
        PENDING_EVENTS.fetch_add(events, Ordering::Relaxed);
        true
    }

    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    fn is_full(&self) -> bool {
        self.queue.queued.get() >= MAX_QUEUED_RESPONSES
    }
}

/// A watch stream's response queue, the client's end: taking responses
/// from it lets the stream's lagging watchers catch up
/// ([`WatchHub::catch_up`]).
pub struct WatchIn {
    rx: UnboundedReceiver<pb::WatchResponse>,
    queue: Rc<Queue>,
    hub: Weak<WatchHub>,
    stream: u64,
}

/// A response queue for watch stream `stream` of `hub`.
pub fn watch_channel(hub: &Rc<WatchHub>, stream: u64) -> (WatchOut, WatchIn) {
    let (tx, rx) = futures_channel::mpsc::unbounded();
    let queue = Rc::new(Queue::default());
    let out = WatchOut {
        tx,
        queue: queue.clone(),
    };
    let input = WatchIn {
        rx,
        queue,
        hub: Rc::downgrade(hub),
        stream,
    };
    (out, input)
}

impl WatchIn {
    /// The next queued response, if one is queued now.
    pub fn try_next(&mut self) -> Option<pb::WatchResponse> {
        let resp = self.rx.try_recv().ok()?;
        self.took(&resp);
        Some(resp)
    }

    fn took(&self, resp: &pb::WatchResponse) {
        PENDING_EVENTS.fetch_sub(resp.events.len() as u64, Ordering::Relaxed);
        let queued = self.queue.queued.get().saturating_sub(1);
        self.queue.queued.set(queued);
        if self.queue.lagging.get() && queued <= CATCH_UP_AT {
            self.queue.lagging.set(false);
            if let Some(hub) = self.hub.upgrade() {
                hub.catch_up(self.stream);
            }
        }
    }
}

impl futures_lite::Stream for WatchIn {
    type Item = pb::WatchResponse;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let polled = Pin::new(&mut self.rx).poll_next(cx);
        if let Poll::Ready(Some(resp)) = &polled {
            self.took(resp);
        }
        polled
    }
}

impl Drop for WatchIn {
    /// Responses the client will never take are no longer pending.
    fn drop(&mut self) {
        self.rx.close();
        while let Ok(resp) = self.rx.try_recv() {
            PENDING_EVENTS.fetch_sub(resp.events.len() as u64, Ordering::Relaxed);
        }
    }
}

struct Watcher {
    stream: u64,
    watch_id: i64,
    spec: WatchSpec,
    /// Events below this revision were delivered (or not wanted).
    next_rev: i64,
    /// While history is being read: live events held back.
    syncing: Option<Vec<mvcc::Event>>,
    /// A re-read of history is owed (a snapshot was installed, or a
    /// previous value was not read): live events stay held until the
    /// resync's history is delivered ([`WatchHub::finish_resync`]).
    needs_resync: bool,
    /// Counts the resyncs asked for: a resync finishes the hold only if no
    /// newer one was asked for while it read.
    resync_generation: u64,
    /// Its creator delivered its first history ([`WatchHub::finish_sync`]):
    /// only then may a resync read for it (its next revision means
    /// something, and its client knows it exists).
    created: bool,
    out: WatchOut,
    counted: Counted,
}

impl Watcher {
    /// Whether the watcher fell behind its client: it sends nothing, and
    /// its next revision waits in history until [`WatchHub::catch_up`].
    fn lagging(&self) -> bool {
        self.counted.lagging
    }

    /// Holds live events back until a re-read of history (queued by the
    /// caller) fills the gap before them.
    fn hold_for_resync(&mut self) {
        self.syncing.get_or_insert_with(Vec::new);
        self.needs_resync = true;
        self.resync_generation += 1;
    }
}

/// A watcher's resync taken by the resync task ([`WatchHub::take_resync`]):
/// read history from `from` on and hand it to [`WatchHub::finish_resync`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResyncClaim {
    pub id: (u64, i64),
    pub from: i64,
    generation: u64,
}

/// Identity for response headers.
#[derive(Debug, Clone, Copy, Default)]
pub struct HeaderIds {
    pub cluster_id: u64,
    pub member_id: u64,
}

#[derive(Default)]
pub struct WatchHub {
    watchers: RefCell<BTreeMap<(u64, i64), Watcher>>,
    next_stream: Cell<u64>,
    /// The newest revision this hub knows of (from the feed or from the
    /// owner): response headers carry it.
    revision: Cell<i64>,
    /// The revision of the last feed item this hub took: every event up
    /// to it went to the watchers that were in sync (fan-out runs behind
    /// the owner's apply, in its own queue).
    fed: Cell<i64>,
    /// Tasks waiting for [`WatchHub::fed_up_to`].
    fed_waiters: RefCell<Vec<std::task::Waker>>,
    term: Cell<u64>,
    ids: Cell<HeaderIds>,
    /// Largest fragment for watchers that asked for fragmentation
    /// (etcd uses --max-request-bytes).
    fragment_bytes: Cell<usize>,
    /// Watchers to re-read history for after a snapshot was installed.
    resync: RefCell<Vec<(u64, i64)>>,
    resync_ready: crate::notify::Notify,
    /// Streams whose progress request waits for their watchers to be in
    /// sync ([`WatchHub::request_progress`]).
    deferred_progress: RefCell<BTreeMap<u64, WatchOut>>,
}

/// The keys of `stream`'s watchers in [`WatchHub`]'s map.
fn of_stream(stream: u64) -> std::ops::RangeInclusive<(u64, i64)> {
    (stream, i64::MIN)..=(stream, i64::MAX)
}

/// A progress notification for a whole stream (watch id -1).
fn progress(header: Option<pb::ResponseHeader>) -> pb::WatchResponse {
    pb::WatchResponse {
        header,
        watch_id: -1,
        ..Default::default()
    }
}

impl WatchHub {
    pub fn new(ids: HeaderIds, fragment_bytes: usize) -> Rc<WatchHub> {
        let hub = WatchHub::default();
        hub.ids.set(ids);
        hub.fragment_bytes.set(fragment_bytes.max(1));
        Rc::new(hub)
    }

    pub fn new_stream(&self) -> u64 {
        let id = self.next_stream.get() + 1;
        self.next_stream.set(id);
        id
    }

    pub fn header(&self, revision: i64) -> Option<pb::ResponseHeader> {
        let ids = self.ids.get();
        Some(pb::ResponseHeader {
            cluster_id: ids.cluster_id,
            member_id: ids.member_id,
            revision,
            raft_term: self.term.get(),
        })
    }

    pub fn note_term(&self, term: u64) {
        self.term.set(term);
    }

    pub fn revision(&self) -> i64 {
        self.revision.get()
    }

    pub fn note_revision(&self, rev: i64) {
        if rev > self.revision.get() {
            self.revision.set(rev);
        }
    }

    pub fn contains(&self, stream: u64, watch_id: i64) -> bool {
        self.watchers.borrow().contains_key(&(stream, watch_id))
    }

    /// Registers a watcher that wants events from `start_rev` on. With
    /// `syncing`, live events are held back until [`WatchHub::finish_sync`].
    pub fn add(
        &self,
        stream: u64,
        watch_id: i64,
        spec: WatchSpec,
        start_rev: i64,
        syncing: bool,
        out: WatchOut,
    ) {
        self.watchers.borrow_mut().insert(
            (stream, watch_id),
            Watcher {
                stream,
                watch_id,
                counted: Counted::new(spec.prev_kv),
                spec,
                next_rev: start_rev,
                syncing: syncing.then(Vec::new),
                needs_resync: false,
                resync_generation: 0,
                created: !syncing,
                out,
            },
        );
    }

    pub fn remove(&self, stream: u64, watch_id: i64) -> bool {
        self.watchers
            .borrow_mut()
            .remove(&(stream, watch_id))
            .is_some()
    }

    pub fn remove_stream(&self, stream: u64) {
        self.watchers.borrow_mut().retain(|(s, _), _| *s != stream);
        self.deferred_progress.borrow_mut().remove(&stream);
    }

    /// Applies one item of the owner's feed.
    pub fn feed(&self, item: &Feed) {
        match item {
            Feed::Events(batch) => self.publish(batch),
            Feed::Restored { revision } => self.restored(*revision),
            Feed::Base { revision } => self.note_revision(*revision),
        }
        let revision = item.revision();
        if revision > self.fed.get() {
            self.fed.set(revision);
            for waker in self.fed_waiters.borrow_mut().drain(..) {
                waker.wake();
            }
        }
    }

    /// Waits until the feed reached `revision`: every event up to it went
    /// to this hub's watchers that were in sync (etcd's progress
    /// notification promises that).
    pub async fn fed_up_to(&self, revision: i64) {
        std::future::poll_fn(|cx| {
            if self.fed.get() >= revision {
                return std::task::Poll::Ready(());
            }
            self.fed_waiters.borrow_mut().push(cx.waker().clone());
            std::task::Poll::Pending
        })
        .await;
    }

    /// Every watcher holds live events from now on and owes a history
    /// read from the new store (also those creating right now: their
    /// history may come from the old store; their creator queues the
    /// resync once it delivered that, and delivery skips what they already
    /// got).
    fn restored(&self, revision: i64) {
        self.note_revision(revision);
        let mut watchers = self.watchers.borrow_mut();
        let mut resync = self.resync.borrow_mut();
        for (key, w) in watchers.iter_mut() {
            w.hold_for_resync();
            if w.created {
                resync.push(*key);
            }
        }
        drop((watchers, resync));
        self.resync_ready.notify();
    }

    /// Waits for watchers that owe a resync and returns them with the
    /// revision each needs history from; those gone are skipped.
    pub async fn take_resync(&self) -> Vec<ResyncClaim> {
        loop {
            let found = self.claim_resync();
            if !found.is_empty() {
                return found;
            }
            self.resync_ready.notified().await;
        }
    }

    fn claim_resync(&self) -> Vec<ResyncClaim> {
        let mut keys = std::mem::take(&mut *self.resync.borrow_mut());
        keys.sort_unstable();
        keys.dedup();
        let watchers = self.watchers.borrow();
        keys.into_iter()
            .filter_map(|id| {
                let w = watchers.get(&id)?;
                (w.created && w.needs_resync).then_some(ResyncClaim {
                    id,
                    from: w.next_rev.max(1),
                    generation: w.resync_generation,
                })
            })
            .collect()
    }

    /// Cancels a watcher whose next revision was compacted away (etcd's
    /// answer to a watcher that fell behind compaction).
    pub fn cancel_compacted(&self, stream: u64, watch_id: i64, compact_revision: i64) {
        let Some(w) = self.watchers.borrow_mut().remove(&(stream, watch_id)) else {
            return;
        };
        w.out.send(pb::WatchResponse {
            header: self.header(self.revision.get()),
            watch_id,
            canceled: true,
            compact_revision,
            ..Default::default()
        });
    }

    /// A new watcher's creator delivers its history (events up to `upto`,
    /// in order) and then whatever arrived live while it was read,
    /// skipping what the history covered.
    pub fn finish_sync(&self, stream: u64, watch_id: i64, history: &[mvcc::Event], upto: i64) {
        self.deliver_first_history(stream, watch_id, history, upto);
        self.answer_deferred_progress(stream);
    }

    fn deliver_first_history(
        &self,
        stream: u64,
        watch_id: i64,
        history: &[mvcc::Event],
        upto: i64,
    ) {
        let id = (stream, watch_id);
        let mut watchers = self.watchers.borrow_mut();
        let Some(w) = watchers.get_mut(&id) else {
            return;
        };
        w.created = true;
        let header_rev = self.deliver_history(w, history, upto);
        if w.needs_resync {
            // The store changed under this read: the held events may lie
            // past a gap only a resync's history fills.
            self.resync.borrow_mut().push(id);
            self.resync_ready.notify();
            return;
        }
        self.release_held(w, header_rev);
    }

    /// The resync task delivers `claim`'s history (up to `upto`), then,
    /// unless a newer resync was asked for meanwhile, the held events.
    pub fn finish_resync(&self, claim: &ResyncClaim, history: &[mvcc::Event], upto: i64) {
        self.deliver_resync(claim, history, upto);
        self.answer_deferred_progress(claim.id.0);
    }

    fn deliver_resync(&self, claim: &ResyncClaim, history: &[mvcc::Event], upto: i64) {
        let mut watchers = self.watchers.borrow_mut();
        let Some(w) = watchers.get_mut(&claim.id) else {
            return;
        };
        let header_rev = self.deliver_history(w, history, upto);
        if w.resync_generation != claim.generation {
            return;
        }
        w.needs_resync = false;
        self.release_held(w, header_rev);
    }

    /// Delivers a history read up to `upto` and moves the watcher past
    /// it; answers the revision for the response headers.
    fn deliver_history(&self, w: &mut Watcher, history: &[mvcc::Event], upto: i64) -> i64 {
        let header_rev = upto.max(self.revision.get());
        self.deliver(w, history.iter(), header_rev);
        if !w.lagging() {
            w.next_rev = w.next_rev.max(upto + 1);
        }
        header_rev
    }

    /// The lagging watchers of `stream` re-read what they missed from
    /// history, as a resync, now that its client reads again.
    pub fn catch_up(&self, stream: u64) {
        let mut watchers = self.watchers.borrow_mut();
        let mut resync = self.resync.borrow_mut();
        for (key, w) in watchers.range_mut(of_stream(stream)) {
            if w.lagging() {
                w.counted.set_lagging(false);
                w.hold_for_resync();
                if w.created {
                    resync.push(*key);
                }
            }
        }
        drop((watchers, resync));
        self.resync_ready.notify();
    }

    /// A client's progress request on `stream` (etcd 3.4+: one response
    /// for the stream, watch id -1), once the feed reached `revision`:
    /// answered now if every watcher of the stream is in sync, otherwise
    /// as soon as they are (etcd's deferred progress), at the revision the
    /// feed reached then.
    pub fn request_progress(&self, stream: u64, out: &WatchOut, revision: i64) {
        if self.stream_in_sync(stream) {
            out.send(progress(self.header(revision)));
        } else {
            self.deferred_progress
                .borrow_mut()
                .insert(stream, out.clone());
        }
    }

    /// Answers `stream`'s deferred progress request if it is in sync now.
    fn answer_deferred_progress(&self, stream: u64) {
        if !self.deferred_progress.borrow().contains_key(&stream) || !self.stream_in_sync(stream) {
            return;
        }
        if let Some(out) = self.deferred_progress.borrow_mut().remove(&stream) {
            // Every watcher of the stream delivered every event up to the
            // feed's revision (those in sync get each fed batch).
            out.send(progress(self.header(self.fed.get())));
        }
    }

    /// Whether every watcher of `stream` is in sync (none lags, none
    /// re-reads history): only then may a progress notification for the
    /// stream name the feed's revision.
    fn stream_in_sync(&self, stream: u64) -> bool {
        self.watchers
            .borrow()
            .range(of_stream(stream))
            .all(|(_, w)| !w.lagging() && w.syncing.is_none())
    }

    /// Ends the hold: delivers what arrived live meanwhile (skipping what
    /// the history covered), and live events from now on.
    fn release_held(&self, w: &mut Watcher, header_rev: i64) {
        let held = w.syncing.take().unwrap_or_default();
        self.deliver(w, held.iter(), header_rev);
    }

    /// Matches an applied batch against every watcher of this shard.
    pub fn publish(&self, batch: &[mvcc::Event]) {
        let Some(last) = batch.last() else {
            return;
        };
        self.note_revision(last.kv.mod_revision);
        let mut watchers = self.watchers.borrow_mut();
        let mut closed = Vec::new();
        for w in watchers.values_mut() {
            if w.lagging() {
                // Its next events stay in history (see `catch_up`).
                continue;
            }
            if let Some(held) = w.syncing.as_mut() {
                held.extend(batch.iter().filter(|e| w.spec.matches(e)).cloned());
                continue;
            }
            if !self.deliver(w, batch.iter(), last.kv.mod_revision) {
                closed.push((w.stream, w.watch_id));
            }
        }
        for key in closed {
            watchers.remove(&key);
        }
    }

    /// Sends the matching events at or after the watcher's next revision,
    /// one response per revision group as etcd does. False if the stream is
    /// gone.
    fn deliver<'a>(
        &self,
        w: &mut Watcher,
        events: impl Iterator<Item = &'a mvcc::Event>,
        header_rev: i64,
    ) -> bool {
        let mut out_events = Vec::new();
        let mut unread_at = None;
        for e in events {
            if e.kv.mod_revision < w.next_rev || !w.spec.matches(e) {
                continue;
            }
            if w.spec.prev_kv && e.prev_kv_unread {
                unread_at = Some(e.kv.mod_revision);
                break;
            }
            out_events.push(to_pb_event(e, w.spec.prev_kv));
        }
        if let Some(rev) = unread_at {
            // The previous value was not read when this was applied: the
            // watcher gets this revision (whole, as etcd groups it) and
            // everything after from history, which reads previous values.
            while out_events
                .last()
                .and_then(|e| e.kv.as_ref())
                .is_some_and(|kv| kv.mod_revision == rev)
            {
                out_events.pop();
            }
            w.hold_for_resync();
            self.resync.borrow_mut().push((w.stream, w.watch_id));
            self.resync_ready.notify();
        }
        let alive = self.send(w, out_events, header_rev);
        if let Some(rev) = unread_at {
            if !w.lagging() {
                w.next_rev = rev;
            }
        }
        alive
    }

    /// Sends `out_events` in one response (or fragments of it) and moves
    /// the watcher past them. False if the stream is gone.
    /// A watcher whose stream's queue is full sends nothing and lags
    /// instead: its next revision stays, for [`WatchHub::catch_up`].
    fn send(&self, w: &mut Watcher, out_events: Vec<mvccpb::Event>, header_rev: i64) -> bool {
        let Some(last) = out_events.last().and_then(|e| e.kv.as_ref()) else {
            return !w.out.is_closed();
        };
        if w.lagging() || w.out.is_full() {
            w.counted.set_lagging(true);
            w.out.queue.lagging.set(true);
            return !w.out.is_closed();
        }
        w.next_rev = last.mod_revision + 1;
        EVENTS_SENT.fetch_add(out_events.len() as u64, Ordering::Relaxed);
        for response in by_revisions(out_events) {
            let mut pieces = if w.spec.fragment {
                fragments(response, self.fragment_bytes.get())
            } else {
                vec![response]
            };
            let last = pieces.len() - 1;
            for (i, events) in pieces.drain(..).enumerate() {
                let resp = pb::WatchResponse {
                    header: self.header(header_rev),
                    watch_id: w.watch_id,
                    events,
                    // etcd: every piece but the last says more follow.
                    fragment: i < last,
                    ..Default::default()
                };
                if !w.out.send(resp) {
                    return false;
                }
            }
        }
        true
    }

    /// Progress notifications for watchers that asked for them
    /// (`--experimental-watch-progress-notify-interval`), each at the
    /// revision its events were delivered up to.
    pub fn notify_progress(&self) {
        let (fed, known) = (self.fed.get(), self.revision.get());
        for w in self.watchers.borrow().values() {
            if w.spec.progress_notify && w.syncing.is_none() && !w.lagging() {
                // A watcher's history may have run past the feed; one
                // that starts in the future has seen nothing past "now".
                let delivered = fed.max((w.next_rev - 1).min(known));
                w.out.send(pb::WatchResponse {
                    header: self.header(delivered),
                    watch_id: w.watch_id,
                    ..Default::default()
                });
            }
        }
    }

    pub fn watcher_count(&self) -> usize {
        self.watchers.borrow().len()
    }
}

/// Revisions one watch response carries at most (etcd's
/// `watchBatchMaxRevs`): a history read of many revisions goes out in
/// several responses.
const MAX_RESPONSE_REVISIONS: usize = 1000;

/// Encoded event bytes after which a response of several revisions ends:
/// a history of large values must not become one message over a
/// client's receive limit (4 MiB by default in tonic and grpc-go servers'
/// clients), nor be queued as one.
const MAX_RESPONSE_BYTES: usize = 1 << 20;

/// Splits events (in revision order) into responses of whole revisions,
/// each at most [`MAX_RESPONSE_REVISIONS`] revisions and, unless one
/// revision alone is larger, [`MAX_RESPONSE_BYTES`].
fn by_revisions(events: Vec<mvccpb::Event>) -> Vec<Vec<mvccpb::Event>> {
    use prost::Message;
    let rev = |e: &mvccpb::Event| e.kv.as_ref().map_or(0, |kv| kv.mod_revision);
    if events.first().map(rev) == events.last().map(rev) {
        // One revision (every live batch): one response.
        return vec![events];
    }
    let mut out: Vec<Vec<mvccpb::Event>> = Vec::new();
    let (mut bytes, mut revisions, mut current) = (0usize, 0usize, None);
    for e in events {
        if current != Some(rev(&e)) {
            current = Some(rev(&e));
            let full = bytes >= MAX_RESPONSE_BYTES || revisions >= MAX_RESPONSE_REVISIONS;
            if out.is_empty() || full {
                out.push(Vec::new());
                (bytes, revisions) = (0, 0);
            }
            revisions += 1;
        }
        bytes += e.encoded_len();
        if let Some(response) = out.last_mut() {
            response.push(e);
        }
    }
    out
}

/// Splits events into pieces of at most `limit` encoded bytes (a single
/// larger event stays whole), as etcd fragments watch responses.
fn fragments(events: Vec<mvccpb::Event>, limit: usize) -> Vec<Vec<mvccpb::Event>> {
    use prost::Message;
    let mut out = vec![Vec::new()];
    let mut size = 0usize;
    for e in events {
        let len = e.encoded_len();
        let current = out.last_mut().map_or(0, |v| v.len());
        if current > 0 && size + len > limit {
            out.push(Vec::new());
            size = 0;
        }
        size += len;
        if let Some(v) = out.last_mut() {
            v.push(e);
        }
    }
    out
}

pub fn to_pb_event(e: &mvcc::Event, with_prev: bool) -> mvccpb::Event {
    mvccpb::Event {
        r#type: match e.kind {
            EventKind::Put => mvccpb::event::EventType::Put as i32,
            EventKind::Delete => mvccpb::event::EventType::Delete as i32,
        },
        kv: Some(key_value(e.kv.clone())),
        prev_kv: if with_prev {
            e.prev_kv.clone().map(key_value)
        } else {
            None
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn put(key: &str, rev: i64) -> mvcc::Event {
        mvcc::Event {
            kind: EventKind::Put,
            kv: mvcc::KeyValue {
                key: Bytes::copy_from_slice(key.as_bytes()),
                mod_revision: rev,
                create_revision: rev,
                version: 1,
                value: Bytes::from_static(b"v"),
                lease: 0,
            },
            prev_kv: None,
            prev_kv_unread: false,
        }
    }

    fn spec(key: &str, end: &str) -> WatchSpec {
        WatchSpec {
            key: Bytes::copy_from_slice(key.as_bytes()),
            range_end: Bytes::copy_from_slice(end.as_bytes()),
            no_put: false,
            no_delete: false,
            prev_kv: false,
            progress_notify: false,
            fragment: false,
        }
    }

    fn revs(rx: &mut WatchIn) -> Vec<i64> {
        let mut out = Vec::new();
        while let Some(r) = rx.try_next() {
            out.extend(r.events.iter().map(|e| e.kv.as_ref().unwrap().mod_revision));
        }
        out
    }

    #[test]
    fn ranges_and_filters() {
        assert!(in_range(b"a", b"a", b""));
        assert!(!in_range(b"ab", b"a", b""));
        assert!(in_range(b"zz", b"b", b"\0"));
        assert!(in_range(b"b1", b"b", b"c"));
        assert!(!in_range(b"c", b"b", b"c"));
    }

    /// A history of many revisions goes out in responses of whole
    /// revisions, each at most MAX_RESPONSE_REVISIONS revisions and about
    /// MAX_RESPONSE_BYTES; one revision stays in one response.
    #[test]
    fn long_histories_go_out_in_responses_of_whole_revisions() {
        let hub = WatchHub::new(HeaderIds::default(), 1 << 20);
        let (tx, mut rx) = watch_channel(&hub, 1);
        hub.add(1, 0, spec("k", "l"), 1, true, tx);
        let big = |key: &str, rev: i64| {
            let mut e = put(key, rev);
            e.kv.value = Bytes::from(vec![b'v'; 100 << 10]);
            e
        };
        let mut history: Vec<_> = (1..=2500).map(|r| put("k", r)).collect();
        // Two events in one revision, then large values.
        history.push(put("k1", 2501));
        history.push(put("k2", 2501));
        history.extend((2502..=2531).map(|r| big("k", r)));
        hub.finish_sync(1, 0, &history, 2531);
        let (mut responses, mut sizes) = (Vec::new(), Vec::new());
        while let Some(r) = rx.try_next() {
            let revs: Vec<i64> = r
                .events
                .iter()
                .map(|e| e.kv.as_ref().unwrap().mod_revision)
                .collect();
            responses.push(revs);
            sizes.push(prost::Message::encoded_len(&r));
        }
        let all: Vec<i64> = responses.iter().flatten().copied().collect();
        let want: Vec<i64> = history.iter().map(|e| e.kv.mod_revision).collect();
        assert_eq!(all, want);
        for (i, revs) in responses.iter().enumerate() {
            let mut distinct = revs.clone();
            distinct.dedup();
            assert!(distinct.len() <= MAX_RESPONSE_REVISIONS, "response {i}");
            if let Some(next) = responses.get(i + 1) {
                assert_ne!(revs.last(), next.first(), "a revision split at {i}");
            }
        }
        assert_eq!(responses[0].len(), MAX_RESPONSE_REVISIONS);
        // The 30 values of 100 KiB: ~10 per response, none much over a MiB.
        assert_eq!(responses.len(), 5, "{sizes:?}");
        assert!(
            sizes.iter().all(|s| *s < MAX_RESPONSE_BYTES + (101 << 10)),
            "{sizes:?}"
        );
    }

    /// A client that does not read: once its stream has
    /// MAX_QUEUED_RESPONSES responses queued, the watcher stops sending (the
    /// queue stays bounded however many events come), and no progress
    /// notification goes out for the stream. Once the client read the queue
    /// down to CATCH_UP_AT, the watcher re-reads from history where it
    /// stopped: every revision arrives once, in order, and it goes on live.
    #[test]
    fn a_watcher_behind_its_client_stops_then_catches_up_from_history() {
        let hub = WatchHub::new(HeaderIds::default(), 1 << 20);
        let (tx, mut rx) = watch_channel(&hub, 1);
        hub.add(1, 0, spec("k", "l"), 1, false, tx);
        hub.finish_sync(1, 0, &[], 0);
        let total = 3 * MAX_QUEUED_RESPONSES as i64;
        for rev in 1..=total {
            hub.publish(&[put("k", rev)]);
        }
        assert_eq!(rx.queue.queued.get(), MAX_QUEUED_RESPONSES);
        assert!(!hub.stream_in_sync(1));
        assert!(
            hub.claim_resync().is_empty(),
            "no catch-up before the client reads"
        );
        // Reading the queue empty passes CATCH_UP_AT: the watcher asks for
        // its missed history, and holds what arrives meanwhile.
        let mut got = revs(&mut rx);
        hub.publish(&[put("k", total + 1)]);
        let claims = hub.claim_resync();
        assert_eq!(claims.len(), 1);
        assert_eq!(claims[0].from, MAX_QUEUED_RESPONSES as i64 + 1);
        let history: Vec<_> = (claims[0].from..=total).map(|r| put("k", r)).collect();
        hub.finish_resync(&claims[0], &history, total);
        got.extend(revs(&mut rx));
        hub.publish(&[put("k", total + 2)]);
        got.extend(revs(&mut rx));
        assert_eq!(got, (1..=total + 2).collect::<Vec<_>>());
        assert!(hub.stream_in_sync(1));
    }

    /// A progress request while a watcher of the stream is behind is
    /// answered once it caught up, after its events, never before.
    #[test]
    fn a_progress_request_waits_for_a_lagging_watcher() {
        let hub = WatchHub::new(HeaderIds::default(), 1 << 20);
        let (tx, mut rx) = watch_channel(&hub, 1);
        hub.add(1, 0, spec("k", "l"), 1, false, tx.clone());
        hub.finish_sync(1, 0, &[], 0);
        let total = MAX_QUEUED_RESPONSES as i64 + 10;
        for rev in 1..=total {
            hub.feed(&Feed::Events(Arc::from(vec![put("k", rev)])));
        }
        hub.request_progress(1, &tx, total);
        let mut responses = Vec::new();
        while let Some(r) = rx.try_next() {
            responses.push(r);
        }
        assert!(
            responses.iter().all(|r| r.watch_id != -1),
            "progress while behind"
        );
        let claim = hub.claim_resync().pop().unwrap();
        let history: Vec<_> = (claim.from..=total).map(|r| put("k", r)).collect();
        hub.finish_resync(&claim, &history, total);
        while let Some(r) = rx.try_next() {
            responses.push(r);
        }
        let last = responses.pop().unwrap();
        assert_eq!((last.watch_id, last.header.unwrap().revision), (-1, total));
        let revs: Vec<i64> = responses
            .iter()
            .flat_map(|r| r.events.iter().map(|e| e.kv.as_ref().unwrap().mod_revision))
            .collect();
        assert_eq!(revs, (1..=total).collect::<Vec<_>>());
        // In sync, a request is answered at once.
        hub.request_progress(1, &tx, total);
        assert_eq!(rx.try_next().unwrap().watch_id, -1);
    }

    #[test]
    fn history_then_held_live_events_each_revision_once_in_order() {
        let hub = WatchHub::new(HeaderIds::default(), 1 << 20);
        let (tx, mut rx) = watch_channel(&hub, 1);
        hub.add(1, 0, spec("k", "l"), 2, true, tx);
        // Live events arrive while history is read; 4 overlaps history.
        hub.publish(&[put("k4", 4)]);
        hub.publish(&[put("k5", 5), put("x", 5)]);
        assert!(revs(&mut rx).is_empty(), "nothing before the history");
        hub.finish_sync(1, 0, &[put("k2", 2), put("k3", 3), put("k4", 4)], 4);
        assert_eq!(revs(&mut rx), vec![2, 3, 4, 5]);
        hub.publish(&[put("k6", 6)]);
        assert_eq!(revs(&mut rx), vec![6]);
    }

    /// A snapshot install in the middle of a watcher's creation: the
    /// creation's history (from the old store) is delivered, but live
    /// events stay held until the resync's history fills the gap.
    #[test]
    fn a_restore_holds_live_events_until_the_resync_fills_the_gap() {
        let hub = WatchHub::new(HeaderIds::default(), 1 << 20);
        let (synced_tx, mut synced) = watch_channel(&hub, 1);
        let (creating_tx, mut creating) = watch_channel(&hub, 2);
        hub.add(1, 0, spec("k", "l"), 1, false, synced_tx);
        hub.publish(&[put("k2", 2)]);
        hub.add(2, 0, spec("k", "l"), 1, true, creating_tx);
        // The store jumps to revision 9 (3..=9 never published here).
        hub.feed(&Feed::Restored { revision: 9 });
        hub.publish(&[put("k10", 10)]);
        hub.finish_sync(2, 0, &[put("k2", 2)], 2);
        assert_eq!(revs(&mut synced), vec![2]);
        assert_eq!(
            revs(&mut creating),
            vec![2],
            "held events wait for the resync"
        );
        let pending = futures_lite::future::block_on(hub.take_resync());
        let claimed: Vec<_> = pending.iter().map(|c| (c.id, c.from)).collect();
        assert_eq!(claimed, vec![((1, 0), 3), ((2, 0), 3)]);
        let history = [put("k3", 3), put("x", 4), put("k9", 9)];
        for claim in &pending {
            hub.finish_resync(claim, &history, 9);
        }
        assert_eq!(revs(&mut synced), vec![3, 9, 10]);
        assert_eq!(revs(&mut creating), vec![3, 9, 10]);
        hub.cancel_compacted(1, 0, 11);
        let cancelled = synced.try_next().unwrap();
        assert!(cancelled.canceled);
        assert_eq!(cancelled.compact_revision, 11);
        assert_eq!(hub.watcher_count(), 1);
    }

    /// A snapshot install while a watcher's creator reads its history
    /// (now in slices, so the resync task may run first): the resync
    /// waits for the creator, the creator's old-store history never
    /// releases the held events, and a second install during a resync
    /// keeps them held until its own resync: no revision is skipped.
    #[test]
    fn a_restore_during_creation_waits_for_the_creator_and_skips_nothing() {
        use futures_lite::future::{block_on, poll_once};
        let hub = WatchHub::new(HeaderIds::default(), 1 << 20);
        let (tx, mut rx) = watch_channel(&hub, 1);
        hub.add(1, 0, spec("k", "l"), 0, true, tx);
        hub.feed(&Feed::Restored { revision: 9 });
        hub.publish(&[put("k10", 10)]);
        assert!(
            block_on(poll_once(hub.take_resync())).is_none(),
            "no resync before the creator delivered"
        );
        // The creator's history came from the old store, up to 5.
        hub.finish_sync(1, 0, &[put("k5", 5)], 5);
        assert_eq!(revs(&mut rx), vec![5], "held events wait for the resync");
        let pending = block_on(hub.take_resync());
        let claimed: Vec<_> = pending.iter().map(|c| (c.id, c.from)).collect();
        assert_eq!(claimed, vec![((1, 0), 6)]);
        // A second install while that resync reads.
        hub.feed(&Feed::Restored { revision: 20 });
        hub.publish(&[put("k21", 21)]);
        hub.finish_resync(&pending[0], &[put("k7", 7), put("k9", 9)], 9);
        assert_eq!(revs(&mut rx), vec![7, 9], "the second resync owes 11..=20");
        let pending = block_on(hub.take_resync());
        assert_eq!(pending[0].from, 10);
        hub.finish_resync(&pending[0], &[put("k10", 10), put("k15", 15)], 20);
        assert_eq!(revs(&mut rx), vec![10, 15, 21]);
    }

    /// A put applied without reading its previous value reaches a
    /// `prev_kv` watcher through history instead, that revision whole;
    /// watchers without `prev_kv` take it as it is.
    #[test]
    fn an_unread_prev_kv_is_read_from_history() {
        let hub = WatchHub::new(HeaderIds::default(), 1 << 20);
        let (plain_tx, mut plain) = watch_channel(&hub, 1);
        let (prev_tx, mut prev) = watch_channel(&hub, 2);
        hub.add(1, 0, spec("k", "l"), 1, false, plain_tx);
        let mut with_prev = spec("k", "l");
        with_prev.prev_kv = true;
        hub.add(2, 0, with_prev, 1, false, prev_tx);
        assert!(prev_kv_watched());
        let unread = |key, rev| {
            let mut e = put(key, rev);
            e.kv.create_revision = 2;
            e.kv.version = 2;
            e.prev_kv_unread = true;
            e
        };
        hub.publish(&[put("k2", 2)]);
        // Revision 3 is a txn: a create (read) and a replacement (unread).
        hub.publish(&[put("k3", 3), unread("k2", 3)]);
        hub.publish(&[put("k4", 4)]);
        assert_eq!(revs(&mut plain), vec![2, 3, 3, 4]);
        assert_eq!(revs(&mut prev), vec![2], "revision 3 waits, whole");
        let pending = futures_lite::future::block_on(hub.take_resync());
        let claimed: Vec<_> = pending.iter().map(|c| (c.id, c.from)).collect();
        assert_eq!(claimed, vec![((2, 0), 3)]);
        let mut replaced = put("k2", 3);
        replaced.prev_kv = Some(put("k2", 2).kv);
        hub.finish_resync(&pending[0], &[put("k3", 3), replaced, put("k4", 4)], 4);
        let got: Vec<_> = std::iter::from_fn(|| prev.try_next())
            .flat_map(|r| r.events)
            .map(|e| {
                (
                    e.kv.unwrap().mod_revision,
                    e.prev_kv.map(|p| p.mod_revision),
                )
            })
            .collect();
        assert_eq!(got, vec![(3, None), (3, Some(2)), (4, None)]);
    }

    #[test]
    fn fragments_split_big_batches_and_flag_all_but_the_last() {
        let hub = WatchHub::new(HeaderIds::default(), 300);
        let (tx, mut rx) = watch_channel(&hub, 1);
        let mut s = spec("k", "l");
        s.fragment = true;
        hub.add(1, 0, s, 1, false, tx);
        let big = |k: &str, rev| {
            let mut e = put(k, rev);
            e.kv.value = Bytes::from(vec![b'x'; 120]);
            e
        };
        hub.publish(&[
            big("k1", 2),
            big("k2", 2),
            big("k3", 2),
            big("k4", 2),
            big("k5", 2),
        ]);
        let mut pieces = Vec::new();
        while let Some(r) = rx.try_next() {
            pieces.push((r.events.len(), r.fragment));
        }
        assert!(pieces.len() > 1, "{pieces:?}");
        assert_eq!(pieces.iter().map(|p| p.0).sum::<usize>(), 5);
        assert!(pieces[..pieces.len() - 1].iter().all(|p| p.1));
        assert!(!pieces.last().unwrap().1);
        // Without fragment: one response.
        let (tx, mut rx) = watch_channel(&hub, 2);
        hub.add(2, 0, spec("k", "l"), 1, false, tx);
        hub.publish(&[big("k6", 3), big("k7", 3), big("k8", 3)]);
        assert_eq!(rx.try_next().unwrap().events.len(), 3);
    }

    /// Fan-out runs behind apply: a progress answer waits until the feed
    /// reached its revision, and a periodic one names what each watcher
    /// was delivered up to (never a revision still queued for it, never
    /// one that does not exist yet).
    #[test]
    fn progress_names_only_delivered_revisions() {
        use futures_lite::future::{block_on, poll_once};
        let hub = WatchHub::new(HeaderIds::default(), 1 << 20);
        hub.feed(&Feed::Base { revision: 5 });
        block_on(hub.fed_up_to(5));
        let mut waiting = Box::pin(hub.fed_up_to(7));
        assert!(block_on(poll_once(waiting.as_mut())).is_none());
        hub.feed(&Feed::Events(Arc::from(vec![put("k6", 6)])));
        assert!(block_on(poll_once(waiting.as_mut())).is_none());
        hub.feed(&Feed::Events(Arc::from(vec![put("k7", 7)])));
        assert!(block_on(poll_once(waiting.as_mut())).is_some());

        let with_progress = |key| {
            let mut s = spec(key, "");
            s.progress_notify = true;
            s
        };
        let (caught_up_tx, mut caught_up) = watch_channel(&hub, 1);
        let (future_tx, mut future) = watch_channel(&hub, 2);
        hub.add(1, 0, with_progress("a"), 1, true, caught_up_tx);
        hub.add(2, 0, with_progress("b"), 100, false, future_tx);
        // The first watcher's history ran to 9, past the feed (7).
        hub.note_revision(9);
        hub.finish_sync(1, 0, &[], 9);
        hub.notify_progress();
        let header_rev = |r: pb::WatchResponse| r.header.unwrap().revision;
        assert_eq!(header_rev(caught_up.try_next().unwrap()), 9);
        assert_eq!(header_rev(future.try_next().unwrap()), 9);
        hub.feed(&Feed::Events(Arc::from(vec![put("c", 10)])));
        hub.notify_progress();
        assert_eq!(header_rev(caught_up.try_next().unwrap()), 10);
        assert_eq!(header_rev(future.try_next().unwrap()), 10);
    }

    #[test]
    fn closed_streams_are_dropped() {
        let hub = WatchHub::new(HeaderIds::default(), 1 << 20);
        let (tx, rx) = watch_channel(&hub, 1);
        hub.add(1, 0, spec("k", ""), 1, false, tx);
        drop(rx);
        hub.publish(&[put("k", 2)]);
        assert_eq!(hub.watcher_count(), 0);
    }
}
