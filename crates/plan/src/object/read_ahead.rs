//! The first bytes of tasks to come fetched while others run (issue 27).
//! A task reading a Parquet object otherwise fetches its first row group
//! once it has its CPU slot, and the slot idles for that request's round
//! trip and transfer. So as the embedded node starts a task over split
//! `i`, it starts fetching what the tasks over the next splits read first
//! ([`ReadAhead::start`]; splits start in order), which each takes when it
//! runs ([`ReadAhead::take`]) rather than fetching it. (A cluster node is
//! handed its splits one at a time, not in order: it does not read ahead.)
//!
//! What is fetched ahead is held outside the store, so it is bounded: at
//! most [`AHEAD_BYTES`] in all (a fetch that would pass it is not made)
//! and [`AHEAD_OBJECTS`] objects (the oldest dropped to make room), and a
//! job's are dropped as it ends ([`forget`]: a task cancelled before it
//! read, by a `limit` met or a failure, takes none). A fetch is taken only
//! for the version of the object its task reads (its tag), so a task never
//! mixes bytes of two versions.

use std::collections::VecDeque;
use std::future::Future;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use bytes::Bytes;
use tokio::task::JoinHandle;

use crate::object::runtime::{block_on, runtime};

/// The most bytes fetched ahead and not yet taken, in all.
const AHEAD_BYTES: u64 = 64 << 20;
/// The most objects fetched ahead and not yet taken.
const AHEAD_OBJECTS: usize = 64;

/// What a task reads first, fetched: of which version of the object
/// (its tag, where the store tags versions), which ranges, their bytes.
struct Fetched {
    e_tag: Option<String>,
    ranges: Vec<Range<u64>>,
    bytes: Vec<Bytes>,
    _reserved: Reserved,
}

/// Whose fetches ahead these are: a job's, dropped as it ends. Unique in
/// the process (job ids are not: each embedded node numbers its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadAheadOwner(u64);

impl ReadAheadOwner {
    /// A new owner, unlike any other of this process.
    pub fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        Self(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

impl Default for ReadAheadOwner {
    fn default() -> Self {
        Self::new()
    }
}

/// A fetch started ahead for `job`, of what a task over `url` reads first.
struct Ahead {
    job: ReadAheadOwner,
    url: String,
    fetch: JoinHandle<Option<Fetched>>,
}

/// Bytes counted against the limit until dropped.
struct Reserved {
    bytes: u64,
    held: &'static AtomicU64,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.held.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// What `plan` gives: the ranges to fetch, of which version, and the fetch.
type Plan<F> = Option<(Vec<Range<u64>>, Option<String>, F)>;

/// Fetches started ahead, oldest first.
pub(crate) struct ReadAhead {
    limit: u64,
    held: AtomicU64,
    started: Mutex<VecDeque<Ahead>>,
}

impl ReadAhead {
    fn new(limit: u64) -> Self {
        Self {
            limit,
            held: AtomicU64::new(0),
            started: Mutex::default(),
        }
    }

    /// This process's.
    pub(crate) fn global() -> &'static Self {
        static GLOBAL: OnceLock<ReadAhead> = OnceLock::new();
        GLOBAL.get_or_init(|| Self::new(AHEAD_BYTES))
    }

    /// Starts for `job`, on the object stores' runtime, `plan` (off the
    /// caller's thread: it may read a footer), then the fetch it gives,
    /// unless a fetch for `url` was started already or its ranges would
    /// take the bytes held past the limit. `plan` gives `None` for nothing
    /// to fetch.
    pub(crate) fn start<P, F>(&'static self, job: ReadAheadOwner, url: &str, plan: P)
    where
        P: FnOnce() -> Plan<F> + Send + 'static,
        F: Future<Output = object_store::Result<Vec<Bytes>>> + Send + 'static,
    {
        let mut started = self.started.lock().unwrap_or_else(|p| p.into_inner());
        if started.iter().any(|a| a.url == url) {
            return;
        }
        if started.len() >= AHEAD_OBJECTS
            && let Some(oldest) = started.pop_front()
        {
            oldest.fetch.abort();
        }
        let fetch = runtime().spawn_blocking(move || {
            let (ranges, e_tag, fetch) = plan()?;
            let reserved = self.reserve(ranges.iter().map(|r| r.end - r.start).sum())?;
            let bytes = tokio::runtime::Handle::current().block_on(fetch).ok()?;
            Some(Fetched {
                e_tag,
                ranges,
                bytes,
                _reserved: reserved,
            })
        });
        started.push_back(Ahead {
            job,
            url: url.to_string(),
            fetch,
        });
    }

    /// Drops the fetches started for `job`: its tasks will not run.
    pub(crate) fn forget(&self, job: ReadAheadOwner) {
        let mut started = self.started.lock().unwrap_or_else(|p| p.into_inner());
        started.retain(|ahead| {
            let keep = ahead.job != job;
            if !keep {
                ahead.fetch.abort();
            }
            keep
        });
    }

    /// `bytes` counted as held, unless that passes the limit.
    fn reserve(&'static self, bytes: u64) -> Option<Reserved> {
        let held = &self.held;
        held.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
            (now + bytes <= self.limit).then_some(now + bytes)
        })
        .ok()?;
        Some(Reserved { bytes, held })
    }

    /// The bytes of `ranges` of version `e_tag` of `url` when a fetch of
    /// them was started ahead (waiting for it to end); `None` when none
    /// was, of other ranges or another version, or it failed, so that the
    /// caller fetches them itself (as of its version) and names what
    /// fails.
    pub(crate) fn take(
        &self,
        url: &str,
        e_tag: Option<&str>,
        ranges: &[Range<u64>],
    ) -> Option<Vec<Bytes>> {
        let ahead = {
            let mut started = self.started.lock().unwrap_or_else(|p| p.into_inner());
            let i = started.iter().position(|a| a.url == url)?;
            started.remove(i)?
        };
        let fetched = block_on(ahead.fetch).ok()??;
        let same = fetched.ranges == ranges && fetched.e_tag.as_deref() == e_tag;
        TAKEN.fetch_add(u64::from(same), Ordering::Relaxed);
        same.then_some(fetched.bytes)
    }
}

/// Drops what was read ahead for `job`'s tasks: called as it ends, when
/// some may not have run.
pub fn forget(job: ReadAheadOwner) {
    ReadAhead::global().forget(job);
}

/// Reads this process's tasks found fetched ahead.
static TAKEN: AtomicU64 = AtomicU64::new(0);

/// How many tasks of this process so far found what they read first
/// fetched ahead.
pub fn taken() -> u64 {
    TAKEN.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    fn read_ahead(limit: u64) -> &'static ReadAhead {
        Box::leak(Box::new(ReadAhead::new(limit)))
    }

    type Ready = futures::future::Ready<object_store::Result<Vec<Bytes>>>;

    const JOB: ReadAheadOwner = ReadAheadOwner(u64::MAX);
    const TAG: Option<&str> = Some("v1");

    /// A plan of `range` of version "v1", whose fetch gives its length of `n`.
    fn plan(range: Range<u64>, n: u8) -> impl FnOnce() -> Plan<Ready> + Send + 'static {
        let bytes = vec![Bytes::from(vec![n; (range.end - range.start) as usize])];
        move || {
            Some((
                vec![range],
                TAG.map(str::to_string),
                futures::future::ready(Ok(bytes)),
            ))
        }
    }

    /// Ranges of one range.
    fn one(range: Range<u64>) -> Vec<Range<u64>> {
        std::iter::once(range).collect()
    }

    fn bytes(len: usize, n: u8) -> Option<Vec<Bytes>> {
        Some(vec![Bytes::from(vec![n; len])])
    }

    /// Waits until `ahead` holds `bytes`.
    fn holding(ahead: &ReadAhead, bytes: u64) {
        let started = Instant::now();
        while ahead.held.load(Ordering::Relaxed) != bytes {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "never held {bytes}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_fetch_started_ahead_is_taken_once_for_its_version_and_ranges() {
        let ahead = read_ahead(AHEAD_BYTES);
        let url = "s3://b/once.parquet";
        ahead.start(JOB, url, plan(0..4, 1));
        ahead.start(JOB, url, plan(0..4, 2)); // one per object
        assert_eq!(ahead.take("s3://b/other.parquet", TAG, &one(0..4)), None);
        assert_eq!(ahead.take(url, TAG, &one(0..4)), bytes(4, 1));
        assert_eq!(ahead.take(url, TAG, &one(0..4)), None, "taken already");
        holding(ahead, 0);
        // Other ranges than the task reads, or another version of the
        // object: the task fetches its own.
        ahead.start(JOB, url, plan(0..4, 3));
        assert_eq!(ahead.take(url, TAG, &one(0..5)), None);
        ahead.start(JOB, url, plan(0..4, 4));
        assert_eq!(ahead.take(url, Some("v2"), &one(0..4)), None);
        ahead.start(JOB, url, plan(0..4, 5));
        assert_eq!(ahead.take(url, None, &one(0..4)), None);
        holding(ahead, 0);
    }

    #[test]
    fn a_jobs_fetches_are_let_go_as_it_ends() {
        let ahead = read_ahead(AHEAD_BYTES);
        ahead.start(JOB, "s3://b/0", plan(0..4, 0));
        ahead.start(JOB, "s3://b/1", plan(0..4, 1));
        ahead.start(ReadAheadOwner::new(), "s3://b/2", plan(0..4, 2));
        holding(ahead, 12);
        ahead.forget(JOB);
        holding(ahead, 4);
        assert_eq!(ahead.take("s3://b/0", TAG, &one(0..4)), None);
        assert_eq!(ahead.take("s3://b/2", TAG, &one(0..4)), bytes(4, 2));
    }

    #[test]
    fn what_is_fetched_ahead_stays_within_its_bounds() {
        let ahead = read_ahead(8);
        ahead.start(JOB, "s3://b/0", plan(0..4, 0));
        ahead.start(JOB, "s3://b/1", plan(0..4, 1));
        holding(ahead, 8);
        ahead.start(JOB, "s3://b/2", plan(0..4, 2)); // past the limit: not fetched
        assert_eq!(ahead.take("s3://b/2", TAG, &one(0..4)), None);
        assert_eq!(ahead.take("s3://b/0", TAG, &one(0..4)), bytes(4, 0));
        holding(ahead, 4);
        ahead.start(JOB, "s3://b/3", plan(0..4, 3)); // room again
        assert_eq!(ahead.take("s3://b/3", TAG, &one(0..4)), bytes(4, 3));
        // At most AHEAD_OBJECTS objects: the oldest goes.
        let ahead = read_ahead(AHEAD_BYTES);
        for n in 0..=AHEAD_OBJECTS as u8 {
            ahead.start(JOB, &format!("s3://b/{n}"), plan(0..4, n));
        }
        assert_eq!(ahead.take("s3://b/0", TAG, &one(0..4)), None);
        let last = AHEAD_OBJECTS as u8;
        assert_eq!(
            ahead.take(&format!("s3://b/{last}"), TAG, &one(0..4)),
            bytes(4, last)
        );
    }

    #[test]
    fn a_failed_fetch_or_nothing_to_fetch_is_left_to_the_task() {
        let ahead = read_ahead(AHEAD_BYTES);
        let url = "s3://b/failed.parquet";
        ahead.start(JOB, url, || {
            let failed = object_store::Error::NotImplemented {
                operation: "get".into(),
                implementer: "test".into(),
            };
            Some((one(0..4), None, futures::future::ready(Err(failed))))
        });
        assert_eq!(ahead.take(url, None, &one(0..4)), None);
        ahead.start(JOB, url, || -> Plan<Ready> { None });
        assert_eq!(ahead.take(url, None, &one(0..4)), None);
        holding(ahead, 0);
    }
}
