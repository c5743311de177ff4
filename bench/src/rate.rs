//! `--rate`: the cap on requests per second summed over all the clients of
//! a run. An interval limiter (a token bucket of depth one): every request
//! reserves the next free send slot, slots are `1/rate` apart, and a slot is
//! never in the past, so an idle period does not build up a burst.
//!
//! The limiter only computes send times from the `now` it is given; the
//! caller sleeps until the slot. That keeps it testable without clocks.

use std::time::{Duration, Instant};

pub struct RateLimiter {
    /// None: unlimited.
    interval: Option<Duration>,
    /// The earliest time the next request may be sent.
    next: Option<Instant>,
}

impl RateLimiter {
    /// At most `per_sec` requests per second; 0 means unlimited.
    pub fn new(per_sec: u64) -> RateLimiter {
        let interval = match per_sec {
            0 => None,
            r => Some(Duration::from_nanos((1_000_000_000 / r).max(1))),
        };
        RateLimiter {
            interval,
            next: None,
        }
    }

    /// Reserves the send slot of one request asked for at `now`: the time
    /// the request may go out. None when that slot is at or past
    /// `deadline`; nothing is reserved then.
    pub fn reserve(&mut self, now: Instant, deadline: Instant) -> Option<Instant> {
        let slot = match self.next {
            Some(next) if next > now => next,
            _ => now,
        };
        if slot >= deadline {
            return None;
        }
        if let Some(interval) = self.interval {
            self.next = Some(slot + interval);
        }
        Some(slot)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn unlimited_sends_at_once() {
        let t0 = Instant::now();
        let end = t0 + ms(1000);
        let mut r = RateLimiter::new(0);
        for _ in 0..100 {
            assert_eq!(r.reserve(t0, end), Some(t0));
        }
        assert_eq!(r.reserve(end, end), None);
    }

    #[test]
    fn slots_are_one_interval_apart() {
        let t0 = Instant::now();
        let end = t0 + ms(10_000);
        let mut r = RateLimiter::new(10);
        // Ten clients asking at the same instant are spread 100 ms apart.
        let slots: Vec<Instant> = (0..10).map(|_| r.reserve(t0, end).unwrap()).collect();
        for (i, s) in slots.iter().enumerate() {
            assert_eq!(*s, t0 + ms(100 * i as u64));
        }
        // Asking later than the next slot: sent at once, no catch-up burst.
        let late = t0 + ms(5000);
        assert_eq!(r.reserve(late, end), Some(late));
        assert_eq!(r.reserve(late, end), Some(late + ms(100)));
        // Asking early waits for the slot.
        assert_eq!(r.reserve(late + ms(150), end), Some(late + ms(200)));
    }

    #[test]
    fn no_slot_at_or_past_the_deadline() {
        let t0 = Instant::now();
        let end = t0 + ms(250);
        let mut r = RateLimiter::new(10);
        assert_eq!(r.reserve(t0, end), Some(t0));
        assert_eq!(r.reserve(t0, end), Some(t0 + ms(100)));
        assert_eq!(r.reserve(t0, end), Some(t0 + ms(200)));
        assert_eq!(r.reserve(t0, end), None);
        // A refused reservation takes nothing: a later deadline gets the slot.
        assert_eq!(r.reserve(t0, t0 + ms(1000)), Some(t0 + ms(300)));
    }

    #[test]
    fn rate_over_a_second_of_slots() {
        let t0 = Instant::now();
        let end = t0 + ms(1000);
        let mut r = RateLimiter::new(1000);
        let mut n = 0;
        while r.reserve(t0, end).is_some() {
            n += 1;
        }
        assert_eq!(n, 1000);
    }
}
