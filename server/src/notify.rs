//! A single-consumer wake-up flag for tasks on one executor.
//!
//! `notify` sets the flag and wakes the waiter; `notified().await` returns at
//! once if the flag is set and clears it. Wake-ups coalesce, which is what a
//! batching loop wants. Never shared across threads.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

#[derive(Default)]
pub struct Notify {
    flagged: Cell<bool>,
    waiter: RefCell<Option<Waker>>,
}

impl Notify {
    pub fn notify(&self) {
        self.flagged.set(true);
        if let Some(w) = self.waiter.borrow_mut().take() {
            w.wake();
        }
    }

    pub fn notified(&self) -> Notified<'_> {
        Notified { notify: self }
    }
}

pub struct Notified<'a> {
    notify: &'a Notify,
}

impl Future for Notified<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.notify.flagged.replace(false) {
            return Poll::Ready(());
        }
        *self.notify.waiter.borrow_mut() = Some(cx.waker().clone());
        Poll::Pending
    }
}
