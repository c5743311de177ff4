//! Which work runs ahead of which on a shard executor.
//!
//! Every shard runs three glommio task queues:
//!
//! - the executor's default queue, the **write path**: the Raft loop, WAL
//!   completions, apply, connection I/O, every small request and every
//!   reply. It has glommio's default 1000 shares.
//! - **`metcd-watch`**, watch fan-out: matching applied events against
//!   this shard's watchers and queueing their responses. Its own queue so
//!   that the Raft loop only enqueues events (however many watchers there
//!   are) and ranges cannot starve watchers; 1000 shares, as the write
//!   path's, so fan-out keeps up with the writes it follows.
//! - **`metcd-reads`**, the expensive reads: ranges (the key-index walk,
//!   loading the values, building and encoding the response) and
//!   watchers' history. It has `--range-cpu-shares` (default 250), so
//!   while the write path alone has work besides, it gets 4/5 of the core,
//!   and reads take what the write path leaves idle (waiting for the disk
//!   or the network). Read work ends every slice with [`end_of_slice`], so
//!   a put that becomes ready waits for at most one slice, not a whole
//!   scan.
//!
//! glommio reaps network and disk completions only between two passes of
//! its task queues, so a slice ends with a timer wait that parks the range
//! until the next pass ([`end_of_slice`]): a put whose bytes arrived while
//! a range ran is seen after that slice. (A short executor-wide preempt
//! timer does the same at a cost: 250 us took 8 % off idle puts, and made
//! an idle owner of two shards spin at 100 % CPU.)
//!
//! An executor with nothing to do sleeps in `io_uring_enter` until a
//! completion, a timer or another core's wake-up (an eventfd write) comes.
//! That wake-up has been seen lost here (glommio 0.9 on Linux 6.18: once a
//! checkpoint executor slept 15 minutes with its write completed; once a
//! remote shard held a watch event for over 10 s until the next request
//! woke it). So every shard also runs a timer every [`MAX_SLEEP`]: a lost
//! wake-up costs at most that long, never a stall, at the price of 10 idle
//! wake-ups per second per shard (one costs ~0.1 ms of CPU here: glommio
//! re-arms its timers and runs a process-wide barrier on every sleep, so
//! a 10 ms bound cost 1-2 % of an idle core per shard).
//!
//! Must never: hold a `RefCell` borrow or anything the write path needs
//! across a slice boundary; be required for correctness (without a
//! reads queue, e.g. in tests, work runs inline in the caller's queue).

use std::cell::Cell;
use std::future::Future;
use std::time::Duration;

use glommio::{Latency, Shares, TaskQueueHandle};

/// The shares of the write path's queue (glommio's default queue).
pub const WRITE_PATH_SHARES: usize = 1000;

/// The shares of the watch fan-out queue.
pub const WATCH_FANOUT_SHARES: usize = WRITE_PATH_SHARES;

thread_local! {
    static READS: Cell<Option<TaskQueueHandle>> = const { Cell::new(None) };
    static WATCH: Cell<Option<TaskQueueHandle>> = const { Cell::new(None) };
}

/// Creates this executor's reads queue with `range_shares` (1..=1000) and
/// its watch fan-out queue. Call once per shard, on its executor.
pub fn install(range_shares: usize) {
    let executor = glommio::executor();
    let reads = executor.create_task_queue(
        Shares::Static(range_shares.clamp(1, WRITE_PATH_SHARES)),
        Latency::NotImportant,
        "metcd-reads",
    );
    READS.with(|r| r.set(Some(reads)));
    let watch = executor.create_task_queue(
        Shares::Static(WATCH_FANOUT_SHARES),
        Latency::NotImportant,
        "metcd-watch",
    );
    WATCH.with(|w| w.set(Some(watch)));
    glommio::spawn_local(async {
        loop {
            glommio::timer::sleep(MAX_SLEEP).await;
        }
    })
    .detach();
}

/// The longest a shard's executor sleeps before it looks at its rings and
/// its cross-core channels again (see the module docs).
pub const MAX_SLEEP: Duration = Duration::from_millis(100);

/// Runs `work` in this shard's reads queue and waits for it; inline when
/// there is none or the caller already runs there. Dropping the returned
/// future (the client went away) cancels the work. `None` only if the
/// queue could not take it (a handle of another executor: never ours).
pub async fn off_the_write_path<T: 'static>(work: impl Future<Output = T> + 'static) -> Option<T> {
    let Some(reads) = READS.with(Cell::get) else {
        return Some(work.await);
    };
    if glommio::executor().current_task_queue() == reads {
        return Some(work.await);
    }
    Some(glommio::spawn_local_into(work, reads).ok()?.await)
}

/// Spawns `work` (detached) in this shard's reads queue, or in the
/// caller's when there is none.
pub fn spawn_read(work: impl Future<Output = ()> + 'static) {
    spawn_into(&READS, work);
}

/// Spawns `work` (detached) in this shard's watch fan-out queue, or in the
/// caller's when there is none.
pub fn spawn_watch_fanout(work: impl Future<Output = ()> + 'static) {
    spawn_into(&WATCH, work);
}

fn spawn_into(
    queue: &'static std::thread::LocalKey<Cell<Option<TaskQueueHandle>>>,
    work: impl Future<Output = ()> + 'static,
) {
    let task = match queue.with(Cell::get) {
        Some(handle) => glommio::spawn_local_into(work, handle).ok(),
        None => Some(glommio::spawn_local(work)),
    };
    if let Some(task) = task {
        task.detach();
    }
}

/// Ends one slice of range work: lets the write path run if it has work,
/// then goes on.
///
/// Not a plain yield: glommio reaps network and disk completions only when
/// no queue has a runnable task (or its preempt timer fires, 100 ms by
/// default), so a range that merely yielded would run slice after slice
/// while the puts whose bytes have arrived stay unseen. A timer of the
/// shortest length parks the task until the executor's next pass over the
/// rings, which reaps those completions first.
pub async fn end_of_slice() {
    glommio::timer::sleep(RING_PASS).await;
}

/// Shorter than any pass over the rings: a slice's sleep always ends at
/// the next one.
const RING_PASS: Duration = Duration::from_micros(1);
