//! Which work runs ahead of which on a shard executor.
//!
//! Every shard runs two glommio task queues:
//!
//! - the executor's default queue, the **write path**: the Raft loop, WAL
//!   completions, apply, connection I/O, every small request and every
//!   reply. It has glommio's default 1000 shares.
//! - **`metcd-reads`**, the expensive halves of ranges: the owner's
//!   key-index walk, loading the values, building and encoding the
//!   response. It has `--range-cpu-shares` (default 250), so while both
//!   have work the write path gets 4/5 of the core, and reads take what
//!   the write path leaves idle (waiting for the disk or the network).
//!   Range work ends every slice with [`end_of_slice`], so a put that
//!   becomes ready waits for at most one slice, not a whole scan.
//!
//! glommio reaps network and disk completions only between two passes of
//! its task queues, so a slice ends with a timer wait that parks the range
//! until the next pass ([`end_of_slice`]): a put whose bytes arrived while
//! a range ran is seen after that slice. (A short executor-wide preempt
//! timer does the same at a cost: 250 us took 8 % off idle puts, and made
//! an idle owner of two shards spin at 100 % CPU.)
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

thread_local! {
    static READS: Cell<Option<TaskQueueHandle>> = const { Cell::new(None) };
}

/// Creates this executor's reads queue with `shares` (1..=1000). Call once
/// per shard, on its executor.
pub fn install(shares: usize) {
    let shares = shares.clamp(1, WRITE_PATH_SHARES);
    let handle = glommio::executor().create_task_queue(
        Shares::Static(shares),
        Latency::NotImportant,
        "metcd-reads",
    );
    READS.with(|r| r.set(Some(handle)));
}

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
    let task = match READS.with(Cell::get) {
        Some(reads) => glommio::spawn_local_into(work, reads).ok(),
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
