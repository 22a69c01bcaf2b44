//! Restart policies: how often a supervised child may fail, and how long
//! its supervisor waits before starting it again (docs/architecture.md,
//! "Supervision trees").

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How often a child may fail, and how long to wait before starting it
/// again: more than `max_restarts` failures within `window` and the
/// supervisor gives up (fails upward, or refuses work, naming the child).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RestartPolicy {
    /// Failures allowed within `window`.
    pub(crate) max_restarts: usize,
    /// How far back failures count.
    pub(crate) window: Duration,
    /// The wait before the first restart; it doubles with each failure in
    /// the window.
    pub(crate) first_backoff: Duration,
    /// The longest wait.
    pub(crate) max_backoff: Duration,
}

impl RestartPolicy {
    /// A worker (under its NodeManager): a panic is its task's fault, not
    /// the worker's, so it restarts at once; the task's own retries are
    /// bounded by `max_task_retries`. A hundred in ten seconds is a broken
    /// node, not bad luck.
    pub(crate) const WORKER: Self = Self {
        max_restarts: 100,
        window: Duration::from_secs(10),
        first_backoff: Duration::ZERO,
        max_backoff: Duration::ZERO,
    };

    /// The embedded node's NodeManager (under the Supervisor): three in a
    /// minute, after 100 ms, 200 ms, 400 ms.
    pub(crate) const NODE_MANAGER: Self = Self {
        max_restarts: 3,
        window: Duration::from_secs(60),
        first_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_secs(2),
    };
}

/// A child's recent failures, against its policy.
#[derive(Debug)]
pub(crate) struct Restarts {
    policy: RestartPolicy,
    recent: VecDeque<Instant>,
}

impl Restarts {
    pub(crate) fn new(policy: RestartPolicy) -> Self {
        Self {
            policy,
            recent: VecDeque::new(),
        }
    }

    /// A failure at `now`: how long to wait before the restart, or why
    /// not to restart.
    pub(crate) fn failed(&mut self, now: Instant) -> Result<Duration, String> {
        let policy = self.policy;
        self.recent.push_back(now);
        while self
            .recent
            .front()
            .is_some_and(|t| now.duration_since(*t) > policy.window)
        {
            self.recent.pop_front();
        }
        if self.recent.len() > policy.max_restarts {
            return Err(format!(
                "it failed {} times within {:?}",
                self.recent.len(),
                policy.window
            ));
        }
        let doublings = (self.recent.len() - 1).min(16) as u32;
        Ok((policy.first_backoff * 2u32.pow(doublings)).min(policy.max_backoff))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_back_off_doubling_up_to_the_cap_then_give_up() {
        let mut restarts = Restarts::new(RestartPolicy::NODE_MANAGER);
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(restarts.failed(t0), Ok(ms(100)));
        assert_eq!(restarts.failed(t0 + ms(1)), Ok(ms(200)));
        assert_eq!(restarts.failed(t0 + ms(2)), Ok(ms(400)));
        let gave_up = restarts.failed(t0 + ms(3)).unwrap_err();
        assert!(gave_up.contains("4 times within 60s"), "{gave_up}");

        let capped = RestartPolicy {
            max_restarts: 10,
            ..RestartPolicy::NODE_MANAGER
        };
        let mut restarts = Restarts::new(capped);
        let waits: Vec<_> = (0..7)
            .map(|i| restarts.failed(t0 + ms(i)).unwrap())
            .collect();
        assert_eq!(waits[4], ms(1600));
        assert_eq!(waits[5], Duration::from_secs(2));
        assert_eq!(waits[6], Duration::from_secs(2));
    }

    #[test]
    fn failures_older_than_the_window_are_forgiven() {
        let mut restarts = Restarts::new(RestartPolicy::NODE_MANAGER);
        let t0 = Instant::now();
        for i in 0..3 {
            restarts.failed(t0 + Duration::from_millis(i)).unwrap();
        }
        // A minute later the earlier three no longer count, nor double the wait.
        let later = t0 + Duration::from_secs(61);
        assert_eq!(restarts.failed(later), Ok(Duration::from_millis(100)));
    }

    #[test]
    fn workers_restart_at_once_a_hundred_times_in_ten_seconds() {
        let mut restarts = Restarts::new(RestartPolicy::WORKER);
        let t0 = Instant::now();
        for i in 0..100 {
            assert_eq!(
                restarts.failed(t0 + Duration::from_millis(i)),
                Ok(Duration::ZERO)
            );
        }
        assert!(restarts.failed(t0 + Duration::from_millis(100)).is_err());
    }
}
