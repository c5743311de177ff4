//! Auto-compaction scheduling (`--auto-compaction-mode/-retention`), as
//! etcd 3.4 does it, as a pure state machine over (now, current revision).
//!
//! It decides *when* and *to which revision* to compact; the Raft loop
//! proposes the compaction, so every member applies it at the same log
//! position. It never touches the store or a clock itself.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::config::AutoCompaction;

/// etcd's revision mode checks every 5 minutes.
pub const REVISION_CHECK_INTERVAL: Duration = Duration::from_secs(300);
const PERIODIC_DIVISOR: u32 = 10;

pub struct Compactor {
    policy: AutoCompaction,
    started: Option<Instant>,
    last_check: Option<Instant>,
    /// Periodic mode: (time, revision) samples, oldest first.
    samples: VecDeque<(Instant, i64)>,
    last_compacted: i64,
    revision_check_interval: Duration,
}

impl Compactor {
    pub fn new(policy: AutoCompaction) -> Self {
        Self {
            policy,
            started: None,
            last_check: None,
            samples: VecDeque::new(),
            last_compacted: 0,
            revision_check_interval: REVISION_CHECK_INTERVAL,
        }
    }

    /// Shortens revision mode's check interval (tests, simulations).
    pub fn with_revision_check_interval(mut self, every: Duration) -> Self {
        self.revision_check_interval = every;
        self
    }

    pub fn policy(&self) -> AutoCompaction {
        self.policy
    }

    /// How often the caller should call [`Compactor::tick`].
    pub fn tick_interval(&self) -> Duration {
        match self.policy {
            AutoCompaction::Off => Duration::from_secs(3600),
            AutoCompaction::Periodic(p) => sample_interval(p).min(Duration::from_secs(1)),
            AutoCompaction::Revision(_) => self.revision_check_interval.min(Duration::from_secs(1)),
        }
    }

    /// Returns the revision to compact to, if it is time.
    /// `compacted` is the store's current compact revision.
    pub fn tick(&mut self, now: Instant, current: i64, compacted: i64) -> Option<i64> {
        self.last_compacted = self.last_compacted.max(compacted);
        let started = *self.started.get_or_insert(now);
        match self.policy {
            AutoCompaction::Off => None,
            AutoCompaction::Revision(keep) => {
                let due = self
                    .last_check
                    .is_none_or(|t| now.duration_since(t) >= self.revision_check_interval);
                if !due || now.duration_since(started) < self.revision_check_interval {
                    return None;
                }
                self.last_check = Some(now);
                let target = current - keep;
                (target > self.last_compacted && target > 0).then(|| {
                    self.last_compacted = target;
                    target
                })
            }
            AutoCompaction::Periodic(retention) => {
                let every = sample_interval(retention);
                if self
                    .samples
                    .back()
                    .is_none_or(|(t, _)| now.duration_since(*t) >= every)
                {
                    self.samples.push_back((now, current));
                }
                // The newest sample that is at least `retention` old; older
                // ones are no longer needed (it stays as the next floor).
                let idx = self
                    .samples
                    .iter()
                    .rposition(|(t, _)| now.duration_since(*t) >= retention)?;
                let rev = self.samples[idx].1;
                self.samples.drain(..idx);
                (rev > self.last_compacted).then(|| {
                    self.last_compacted = rev;
                    rev
                })
            }
        }
    }
}

/// etcd samples every retention/10, at most every 6 minutes (1h/10).
fn sample_interval(retention: Duration) -> Duration {
    retention.min(Duration::from_secs(3600)) / PERIODIC_DIVISOR
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_never_compacts() {
        let mut c = Compactor::new(AutoCompaction::Off);
        let t0 = Instant::now();
        for i in 0..100 {
            assert_eq!(
                c.tick(t0 + Duration::from_secs(i * 1000), i as i64 * 100, 0),
                None
            );
        }
    }

    #[test]
    fn revision_mode_keeps_the_last_n() {
        let every = Duration::from_secs(10);
        let mut c =
            Compactor::new(AutoCompaction::Revision(100)).with_revision_check_interval(every);
        let t0 = Instant::now();
        assert_eq!(c.tick(t0, 50, 0), None);
        // Not due yet.
        assert_eq!(c.tick(t0 + Duration::from_secs(5), 500, 0), None);
        assert_eq!(c.tick(t0 + every, 500, 0), Some(400));
        // Nothing new to compact.
        assert_eq!(c.tick(t0 + every * 2, 450, 400), None);
        assert_eq!(c.tick(t0 + every * 3, 1000, 400), Some(900));
    }

    #[test]
    fn periodic_mode_compacts_to_the_revision_from_one_retention_ago() {
        let retention = Duration::from_secs(100);
        let mut c = Compactor::new(AutoCompaction::Periodic(retention));
        let t0 = Instant::now();
        let mut compactions = Vec::new();
        // One revision per second for 300 seconds.
        for s in 0..=300u64 {
            let now = t0 + Duration::from_secs(s);
            if let Some(rev) = c.tick(now, s as i64 + 1, compactions.last().copied().unwrap_or(0)) {
                compactions.push(rev);
                // Whatever it compacts to was current at least `retention` ago.
                assert!(rev <= (s as i64 + 1) - 100, "at {s}s compacted to {rev}");
                // ... and not much older than that (one sample interval).
                assert!(
                    rev >= (s as i64 + 1) - 100 - 10,
                    "at {s}s compacted to {rev}"
                );
            }
        }
        assert!(compactions.len() >= 10, "{compactions:?}");
        assert!(compactions.windows(2).all(|w| w[0] < w[1]));
    }
}
