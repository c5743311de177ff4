//! One shard's link to the owner core: the questions it sends (jobs that
//! run on the owner) and their answers back, each direction batched, plus
//! the owner's feed of applied events to the shard's watchers.
//!
//! Must never: hold a question or an answer without a bound (a full link
//! makes callers wait for a slot), or wake the other core once per item
//! (what queues during a turn crosses as one message).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;

use futures_channel::oneshot;
use glommio::channels::shared_channel::{
    ConnectedReceiver, ConnectedSender, SharedReceiver, SharedSender,
};

use crate::error::{Result, ServerError};
use crate::read_view::ReadView;
use crate::watch::Feed;

/// Items one cross-core message carries at most.
pub(crate) const MAX_BATCH: usize = 256;
/// Questions a shard may have waiting for the owner's answers; callers
/// beyond it wait for a slot (the connection stops reading), so the
/// queues in both directions stay bounded by it.
pub(crate) const MAX_IN_FLIGHT: usize = 4096;
/// Messages (batches of up to [`MAX_BATCH`]) a link's channel holds.
pub(crate) const LINK_CAPACITY: usize = MAX_IN_FLIGHT / MAX_BATCH + 1;

/// A question for the owner `O`: run there, on the owner's core, it
/// produces its answer's [`Delivery`].
pub(crate) type Job<O> = Box<dyn FnOnce(Rc<O>) -> Pin<Box<dyn Future<Output = Delivery>>> + Send>;

/// An answer on its way back to the shard that asked. It is handed to the
/// asking task on that shard's core, where the task's waker lives: the
/// owner only moves it across.
pub(crate) struct Delivery(Box<dyn FnOnce() + Send>);

impl Delivery {
    fn deliver(self) {
        (self.0)()
    }
}

/// Both ends of one direction of a link, carrying batches of `T`.
type Channel<T> = (SharedSender<Vec<T>>, SharedReceiver<Vec<T>>);

/// The two channels of a link: questions out, answers back.
pub(crate) struct Link<O> {
    pub(crate) questions: Channel<Job<O>>,
    pub(crate) answers: Channel<Delivery>,
}

impl<O: 'static> Link<O> {
    pub(crate) fn new() -> Link<O> {
        use glommio::channels::shared_channel::new_bounded;
        Link {
            questions: new_bounded(LINK_CAPACITY),
            answers: new_bounded(LINK_CAPACITY),
        }
    }
}

/// One direction of a cross-core link: what tasks queue during an
/// executor turn crosses as one message (at most [`MAX_BATCH`] items),
/// sent by one task woken once per turn, not one message and one wake-up
/// per item.
pub(crate) struct Outbox<T> {
    pub(crate) queue: RefCell<Vec<T>>,
    ready: crate::notify::Notify,
    /// Messages sent (the link's tests count them).
    pub(crate) messages: Cell<u64>,
    /// The other side is gone: what is pushed is dropped at once (a
    /// question's asker then learns the owner stopped).
    closed: Cell<bool>,
    /// A feed queue collapsed once (logged the first time).
    overflowed: Cell<bool>,
}

impl<T: Send + 'static> Outbox<T> {
    pub(crate) fn new() -> Rc<Outbox<T>> {
        Rc::new(Outbox {
            queue: RefCell::new(Vec::new()),
            ready: crate::notify::Notify::default(),
            messages: Cell::new(0),
            closed: Cell::new(false),
            overflowed: Cell::new(false),
        })
    }

    pub(crate) fn push(&self, item: T) {
        if self.closed.get() {
            return;
        }
        self.queue.borrow_mut().push(item);
        self.ready.notify();
    }

    /// The other side is gone: drops what is queued and whatever comes
    /// later, and ends the task that drains this outbox.
    fn close(&self) {
        self.closed.set(true);
        self.queue.borrow_mut().clear();
        self.ready.notify();
    }

    /// The oldest queued items, at most [`MAX_BATCH`].
    fn take_batch(&self) -> Vec<T> {
        let mut queue = self.queue.borrow_mut();
        let n = queue.len().min(MAX_BATCH);
        queue.drain(..n).collect()
    }

    /// The next batch: what is queued (at most [`MAX_BATCH`]), or, when
    /// nothing is, what the tasks of the turn that wakes it queued; `None`
    /// once closed.
    pub(crate) async fn next_batch(&self) -> Option<Vec<T>> {
        loop {
            if self.closed.get() {
                return None;
            }
            let batch = self.take_batch();
            if !batch.is_empty() {
                return Some(batch);
            }
            self.ready.notified().await;
        }
    }

    /// Moves queued items to `to` in batches until either side is gone,
    /// then drops what is queued and whatever comes later (and, with `to`,
    /// what the channel still holds). The task wakes after the tasks that
    /// queued, so a turn's items go in one message.
    pub(crate) async fn drain_into(self: Rc<Self>, to: ConnectedSender<Vec<T>>) {
        while let Some(batch) = self.next_batch().await {
            self.messages.set(self.messages.get() + 1);
            // A send waiting for room in a full channel whose other side is
            // gone never ends (glommio waits for room, not for the
            // receiver): the outbox closing ends it too, dropping the batch.
            let sent = futures_lite::future::or(async { to.send(batch).await.is_ok() }, async {
                self.closed().await;
                false
            })
            .await;
            if !sent {
                break;
            }
        }
        self.close();
    }

    /// Once [`Outbox::close`] has run.
    async fn closed(&self) {
        while !self.closed.get() {
            self.ready.notified().await;
        }
    }
}

impl Outbox<Feed> {
    /// Queues a feed item for a hub. The Raft loop never waits for a hub,
    /// so a hub that falls behind (its core busy, its fan-out slow) would
    /// let this queue grow with every write; at [`MAX_QUEUED_FEED`] items
    /// what is queued collapses into one `Restored` at its newest revision
    /// instead: the hub's watchers then re-read those events from history,
    /// as after a snapshot install (etcd's answer to watchers that cannot
    /// keep up), and a compaction past them cancels them with its revision.
    pub(crate) fn push_feed(&self, item: &Feed) {
        {
            let mut queue = self.queue.borrow_mut();
            if queue.len() >= MAX_QUEUED_FEED {
                if !self.overflowed.replace(true) {
                    eprintln!(
                        "metcd: a watch hub fell {} feed items behind; its watchers re-read \
                         from history (logged once per hub)",
                        queue.len()
                    );
                }
                collapse_feed(&mut queue);
            }
            queue.push(item.clone());
        }
        self.ready.notify();
    }
}

/// Feed items queued for one hub before they collapse into a resync.
pub(crate) const MAX_QUEUED_FEED: usize = 8192;

/// Replaces queued events by one `Restored` at the newest revision they
/// reach; a subscription's `Base` (its first item) stays in front.
fn collapse_feed(queue: &mut Vec<Feed>) {
    let revision = queue.iter().map(Feed::revision).max().unwrap_or(0);
    queue.retain(|item| matches!(item, Feed::Base { .. }));
    queue.push(Feed::Restored { revision });
}

/// A non-owner shard's end of its link to the owner `O`.
pub struct Remote<O> {
    pub(crate) to_owner: Rc<Outbox<Job<O>>>,
    /// The owner's published read view: ranges are read here.
    pub(crate) view: std::sync::Arc<ReadView>,
    /// Slots for questions waiting for an answer ([`MAX_IN_FLIGHT`]).
    pub(crate) in_flight: glommio::sync::Semaphore,
}

impl<O: 'static> Remote<O> {
    /// Connects this shard's ends of a link to the owner and starts the
    /// tasks that carry questions out and answers back.
    pub(crate) async fn start(
        questions: SharedSender<Vec<Job<O>>>,
        answers: SharedReceiver<Vec<Delivery>>,
        view: std::sync::Arc<ReadView>,
        max_in_flight: usize,
    ) -> Rc<Remote<O>> {
        let remote = Rc::new(Remote {
            to_owner: Outbox::new(),
            view,
            in_flight: glommio::sync::Semaphore::new(max_in_flight as u64),
        });
        let questions = questions.connect().await;
        glommio::spawn_local(remote.to_owner.clone().drain_into(questions)).detach();
        let answers = answers.connect().await;
        glommio::spawn_local(deliver_answers(answers, remote.to_owner.clone())).detach();
        remote
    }

    /// Runs `work` on the owner's core and answers what it returns;
    /// [`ServerError::Stopped`] if the owner is gone first. The caller may
    /// go away meanwhile (its connection closed): the work still runs, and
    /// its answer is dropped.
    pub(crate) async fn ask<T, F, Fut>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Rc<O>) -> Fut + Send + 'static,
        Fut: Future<Output = T> + 'static,
    {
        let Ok(_slot) = self.in_flight.acquire_permit(1).await else {
            return Err(ServerError::Stopped);
        };
        let (tx, rx) = oneshot::channel();
        self.to_owner.push(Box::new(move |owner: Rc<O>| {
            let run: Pin<Box<dyn Future<Output = Delivery>>> = Box::pin(async move {
                let answer = work(owner).await;
                Delivery(Box::new(move || {
                    let _ = tx.send(answer);
                }))
            });
            run
        }));
        rx.await.map_err(|_| ServerError::Stopped)
    }
}

/// Hands each answer that comes back to its asker, on this core. Once the
/// owner is gone, every question still unanswered (queued here or in the
/// channel) is dropped, so its asker learns the owner stopped.
async fn deliver_answers<O: 'static>(
    answers: ConnectedReceiver<Vec<Delivery>>,
    questions: Rc<Outbox<Job<O>>>,
) {
    while let Some(batch) = answers.recv().await {
        for answer in batch {
            answer.deliver();
        }
    }
    questions.close();
}

/// The owner's end of one remote shard's link: each question runs as a
/// task of its own; answers go back batched.
pub(crate) async fn serve_remote<O: 'static>(
    owner: Rc<O>,
    questions: ConnectedReceiver<Vec<Job<O>>>,
    answers: ConnectedSender<Vec<Delivery>>,
) {
    let outbox = Outbox::new();
    glommio::spawn_local(outbox.clone().drain_into(answers)).detach();
    while let Some(batch) = questions.recv().await {
        for job in batch {
            let run = job(owner.clone());
            let outbox = outbox.clone();
            glommio::spawn_local(async move {
                let answer = run.await;
                outbox.push(answer);
            })
            .detach();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;
    use crate::mvcc;
    use glommio::{LocalExecutorBuilder, Placement};
    use std::time::Duration;

    fn events_at(revision: i64) -> Feed {
        let event = mvcc::Event {
            kind: mvcc::EventKind::Put,
            kv: mvcc::KeyValue {
                key: bytes::Bytes::from_static(b"k"),
                mod_revision: revision,
                ..Default::default()
            },
            prev_kv: None,
            prev_kv_unread: false,
        };
        Feed::Events(std::sync::Arc::from(vec![event]))
    }

    fn revision_of(item: &Feed) -> (char, i64) {
        match item {
            Feed::Events(batch) => ('e', batch[0].kv.mod_revision),
            Feed::Restored { revision } => ('r', *revision),
            Feed::Base { revision } => ('b', *revision),
        }
    }

    /// A hub that stops taking its feed holds at most MAX_QUEUED_FEED
    /// items: the oldest collapse into one resync at the newest revision
    /// they reached, the subscription's base stays first, and what comes
    /// after follows in order.
    #[test]
    fn a_stalled_feed_collapses_into_a_resync_instead_of_growing() {
        let outbox: Rc<Outbox<Feed>> = Outbox::new();
        outbox.push_feed(&Feed::Base { revision: 1 });
        let mut longest = 0;
        for revision in 2..(2 * MAX_QUEUED_FEED as i64 + 100) {
            outbox.push_feed(&events_at(revision));
            longest = longest.max(outbox.queue.borrow().len());
        }
        assert!(longest <= MAX_QUEUED_FEED + 1, "{longest}");
        let queue: Vec<(char, i64)> = outbox.queue.borrow().iter().map(revision_of).collect();
        assert_eq!(queue[0], ('b', 1));
        // Collapsed twice; the second resync covers everything before it.
        let (kind, through) = queue[1];
        assert_eq!(kind, 'r');
        let live: Vec<i64> = queue[2..]
            .iter()
            .map(|(k, r)| {
                assert_eq!(*k, 'e');
                *r
            })
            .collect();
        assert_eq!(live.first(), Some(&(through + 1)));
        assert_eq!(live.last(), Some(&(2 * MAX_QUEUED_FEED as i64 + 99)));
        assert!(live.windows(2).all(|w| w[1] == w[0] + 1));
    }

    /// What the fake owner's jobs are run with: the answer it gives.
    struct FakeOwner(u64);

    /// A fake owner on an executor of its own: counts the question
    /// messages and items it gets until `answer_until` items (running each
    /// batch's jobs and sending their answers back as one batch), or, with
    /// `None`, answers nothing (holding the questions) and counts until
    /// nothing came for 300 ms.
    fn fake_owner(
        questions: SharedReceiver<Vec<Job<FakeOwner>>>,
        answers: SharedSender<Vec<Delivery>>,
        answer_until: Option<usize>,
    ) -> glommio::ExecutorJoinHandle<(usize, usize)> {
        LocalExecutorBuilder::new(Placement::Unbound)
            .spawn(move || async move {
                let questions = questions.connect().await;
                let answers = answers.connect().await;
                let owner = Rc::new(FakeOwner(7));
                let (mut messages, mut items) = (0, 0);
                let mut held = Vec::new();
                let quiet = Duration::from_millis(300);
                while let Ok(Some(batch)) =
                    glommio::timer::timeout(quiet, async { Ok(questions.recv().await) }).await
                {
                    messages += 1;
                    items += batch.len();
                    let Some(until) = answer_until else {
                        held.extend(batch);
                        continue;
                    };
                    let mut delivered = Vec::new();
                    for job in batch {
                        delivered.push(job(owner.clone()).await);
                    }
                    answers.send(delivered).await.unwrap();
                    if items >= until {
                        break;
                    }
                }
                (messages, items)
            })
            .unwrap()
    }

    /// Runs `body` on a shard of its own (an executor on this thread) with
    /// its end of `link`, allowed `bound` questions in flight.
    fn on_a_shard<T, Fut>(
        questions: SharedSender<Vec<Job<FakeOwner>>>,
        answers: SharedReceiver<Vec<Delivery>>,
        bound: usize,
        body: impl FnOnce(Rc<Remote<FakeOwner>>) -> Fut,
    ) -> T
    where
        Fut: Future<Output = T>,
    {
        LocalExecutorBuilder::new(Placement::Unbound)
            .make()
            .unwrap()
            .run(async move {
                let view = std::sync::Arc::new(ReadView::new(Default::default()));
                body(Remote::start(questions, answers, view, bound).await).await
            })
    }

    /// A burst of questions from a shard crosses to the owner in far fewer
    /// messages than questions, and every caller gets its own answer.
    #[test]
    fn a_burst_of_requests_crosses_in_few_messages() {
        const BURST: usize = 2_000;
        let link = Link::<FakeOwner>::new();
        let owner = fake_owner(link.questions.1, link.answers.0, Some(BURST));
        let (sent_messages, answered) = on_a_shard(
            link.questions.0,
            link.answers.1,
            MAX_IN_FLIGHT,
            |remote| async move {
                let calls: Vec<_> = (0..BURST as u64)
                    .map(|i| {
                        let remote = remote.clone();
                        glommio::spawn_local(async move {
                            remote.ask(move |owner| async move { owner.0 + i }).await
                        })
                    })
                    .collect();
                let mut answered = 0;
                for (i, call) in calls.into_iter().enumerate() {
                    if call.await.unwrap() == 7 + i as u64 {
                        answered += 1;
                    }
                }
                (remote.to_owner.messages.get(), answered)
            },
        );
        let (messages, items) = owner.join().unwrap();
        assert_eq!(answered, BURST);
        assert_eq!(items, BURST);
        assert_eq!(messages as u64, sent_messages);
        // 2,000 requests queued in one turn: ceil(2000 / MAX_BATCH) = 8.
        assert!(
            messages <= BURST.div_ceil(MAX_BATCH) + 2,
            "{messages} messages"
        );
    }

    /// Once the owner is gone, a question, whether it was already on its
    /// way (in the link's channel, never taken by the owner, or waiting for
    /// room in it) or is asked later, is answered `Stopped` instead of
    /// waiting forever.
    #[test]
    fn questions_to_an_owner_that_is_gone_are_answered_stopped() {
        const ON_THE_WAY: usize = 3 * LINK_CAPACITY;
        let link = Link::<FakeOwner>::new();
        let (questions, answers) = (link.questions.1, link.answers.0);
        // Answers its first batch, then takes nothing for a while and ends.
        let owner = LocalExecutorBuilder::new(Placement::Unbound)
            .spawn(move || async move {
                let questions = questions.connect().await;
                let answers = answers.connect().await;
                let owner = Rc::new(FakeOwner(7));
                let batch = questions.recv().await.unwrap();
                let mut delivered = Vec::new();
                for job in batch {
                    delivered.push(job(owner.clone()).await);
                }
                answers.send(delivered).await.unwrap();
                glommio::timer::sleep(Duration::from_millis(200)).await;
            })
            .unwrap();
        let answers = on_a_shard(
            link.questions.0,
            link.answers.1,
            MAX_IN_FLIGHT,
            |remote| async move {
                let first = remote.ask(|owner| async move { owner.0 }).await;
                // Asked over many turns, so they cross in more batches than
                // the channel holds: its sender ends up waiting for room.
                let mut on_the_way = Vec::new();
                for _ in 0..ON_THE_WAY {
                    let remote = remote.clone();
                    on_the_way.push(glommio::spawn_local(async move {
                        let asked = remote.ask(|owner| async move { owner.0 });
                        glommio::timer::timeout(Duration::from_secs(10), async { Ok(asked.await) })
                            .await
                    }));
                    glommio::timer::sleep(Duration::from_millis(2)).await;
                }
                let mut answers = vec![Ok(first)];
                for asked in on_the_way {
                    answers.push(asked.await);
                }
                let later = remote.ask(|owner| async move { owner.0 }).await;
                answers.push(Ok(later));
                answers
            },
        );
        owner.join().unwrap();
        assert!(matches!(answers[0], Ok(Ok(7))));
        for answer in &answers[1..] {
            assert!(
                matches!(answer, Ok(Err(ServerError::Stopped))),
                "a question to a gone owner hung or was answered: {:?}",
                answer.as_ref().map(|a| a.as_ref().ok())
            );
        }
    }

    /// An owner that answers nothing holds at most the link's bound of a
    /// shard's questions: later callers wait for a slot, nothing piles up.
    #[test]
    fn a_slow_owner_makes_callers_wait_and_the_link_stays_bounded() {
        const BOUND: usize = 64;
        const CALLERS: usize = 3 * BOUND;
        let link = Link::<FakeOwner>::new();
        let owner = fake_owner(link.questions.1, link.answers.0, None);
        let (finished, queued, slots_left) = on_a_shard(
            link.questions.0,
            link.answers.1,
            BOUND,
            |remote| async move {
                let finished = Rc::new(Cell::new(0usize));
                let calls: Vec<_> = (0..CALLERS)
                    .map(|_| {
                        let (remote, finished) = (remote.clone(), finished.clone());
                        glommio::spawn_local(async move {
                            let _ = remote.ask(|owner| async move { owner.0 }).await;
                            finished.set(finished.get() + 1);
                        })
                    })
                    .collect();
                // Let every caller run and the outbox drain (bounded).
                for _ in 0..50 {
                    glommio::timer::sleep(Duration::from_millis(2)).await;
                }
                let seen = (
                    finished.get(),
                    remote.to_owner.queue.borrow().len(),
                    remote.in_flight.available(),
                );
                drop(calls);
                seen
            },
        );
        let (_, items) = owner.join().unwrap();
        assert_eq!(items, BOUND, "the owner got exactly the bound");
        assert_eq!(
            finished, 0,
            "every caller still waits: for its answer or a slot"
        );
        assert_eq!(queued, 0);
        assert_eq!(slots_left, 0);
    }
}
