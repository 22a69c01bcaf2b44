//! The shared-memory store on its own: zero-copy reads (in this process and
//! another), spilling and restoring, pinning, freeing, cleanup, and a
//! property test of its accounting.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, ArrayRef, BinaryArray, Int64Array, RecordBatch};
use streambatch::{ObjectStore, SharedStore, StoreConfig};
use streambatch_store::{PartitionRef, open_shared};

fn ints(lo: i64, n: i64) -> RecordBatch {
    RecordBatch::try_from_iter([(
        "x",
        Arc::new(Int64Array::from_iter_values(lo..lo + n)) as ArrayRef,
    )])
    .unwrap()
}

/// A partition of about `mib` MiB whose bytes are all `fill`.
fn blob(mib: usize, fill: u8) -> RecordBatch {
    let data: ArrayRef = Arc::new(BinaryArray::from_vec(vec![
        vec![fill; mib << 20].as_slice(),
    ]));
    RecordBatch::try_from_iter([("data", data)]).unwrap()
}

fn store(capacity: u64, dir: &std::path::Path, namespace: &str) -> SharedStore {
    let mut config = StoreConfig::new(capacity, dir);
    config.namespace = namespace.into();
    SharedStore::open(config).unwrap()
}

/// Every buffer of `batch` (and its children) lies inside `range`.
fn buffers_inside(batch: &RecordBatch, range: &std::ops::Range<usize>) -> bool {
    fn data_inside(data: &arrow_array::ArrayRef, range: &std::ops::Range<usize>) -> bool {
        let d = data.to_data();
        let bufs = d.buffers().iter().chain(d.nulls().map(|n| n.buffer()));
        bufs.into_iter().all(|b| {
            let start = b.as_ptr() as usize;
            range.contains(&start) && start + b.len() <= range.end
        })
    }
    batch.columns().iter().all(|c| data_inside(c, range))
}

#[test]
fn get_returns_buffers_inside_the_segment_mapping() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(64 << 20, dir.path(), "zerocopy");
    let batch = ints(0, 100_000);
    let part = store.put(batch.clone()).unwrap();
    let read = part.get().unwrap();
    assert_eq!(read, batch);
    let range = store.segment_range(part.id()).unwrap();
    assert!(
        buffers_inside(&read, &range),
        "a buffer of the result is outside the segment"
    );
}

#[test]
fn equal_partitions_fill_the_capacity_without_holes() {
    let dir = tempfile::tempdir().unwrap();
    let capacity = 300 << 20;
    let store = store(capacity, dir.path(), "packing");
    // A small partition first, as a job's source emits, maps a small segment.
    let mut held = vec![store.put(ints(0, 100)).unwrap()];
    let small = store.stats().used_bytes;
    let partition = blob(10, 7);
    while let Ok(part) = store.try_put(partition.clone()) {
        held.push(part);
    }
    let stored = (held.len() - 1) as u64;
    let each = (store.stats().used_bytes - small) / stored;
    // Only the small segment and the last partial partition are lost.
    assert!(
        stored * each >= capacity - (4 << 20) - each,
        "{stored} partitions of {each} bytes in a store of {capacity}"
    );
}

const CHILD: &str = "STREAMBATCH_STORE_TEST_CHILD";

#[test]
fn a_second_process_reads_a_partition_zero_copy() {
    if let Ok(role) = std::env::var(CHILD) {
        // The reader: open by name, check values and that buffers are in the mapping.
        let (name, expected_sum) = role
            .strip_prefix("read:")
            .unwrap()
            .rsplit_once('/')
            .unwrap();
        let shared = open_shared(name).unwrap();
        let sum: i64 = shared
            .batch
            .column(0)
            .as_primitive::<Int64Type>()
            .values()
            .iter()
            .sum();
        assert_eq!(sum.to_string(), expected_sum);
        assert!(
            buffers_inside(&shared.batch, &shared.mapping),
            "the reader copied"
        );
        println!("reader-ok");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let store = store(64 << 20, dir.path(), "crossproc");
    let part = store.put(ints(7, 50_000)).unwrap();
    let _pin = store.pin(part.id()).unwrap();
    let name = store.shared_name(&part).unwrap();
    let expected: i64 = (7..50_007).sum();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_second_process_reads_a_partition_zero_copy",
            "--nocapture",
        ])
        .env(CHILD, format!("read:{name}/{expected}"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("reader-ok"),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn least_recently_used_partitions_spill_and_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(16 << 20, dir.path(), "spill");
    let parts: Vec<PartitionRef> = (0..6).map(|i| store.put(blob(4, i)).unwrap()).collect();
    let stats = store.stats();
    assert!(stats.used_bytes <= 16 << 20);
    assert!(stats.spilled_bytes > 0);
    // The oldest went to disk first.
    assert!(store.spill_path(parts[0].id()).is_some());
    assert!(store.spill_path(parts[5].id()).is_none());
    for (i, p) in parts.iter().enumerate() {
        let b = p.get().unwrap();
        let data = b.column(0).as_binary::<i32>();
        assert_eq!(data.value(0).len(), 4 << 20);
        assert!(
            data.value(0).iter().all(|&x| x == i as u8),
            "partition {i} changed"
        );
    }
    assert!(store.stats().restored_bytes > 0);
}

#[test]
fn a_pinned_partition_never_spills() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(16 << 20, dir.path(), "pin");
    let first = store.put(blob(4, 1)).unwrap();
    let pin = store.pin(first.id()).unwrap();
    let others: Vec<_> = (0..8).map(|i| store.put(blob(4, i + 2)).unwrap()).collect();
    assert!(
        store.spill_path(first.id()).is_none(),
        "a pinned partition spilled"
    );
    assert!(others.iter().any(|p| store.spill_path(p.id()).is_some()));
    drop(pin);
    // Unpinned, it can go when room is needed.
    let _more: Vec<_> = (0..4).map(|i| store.put(blob(4, i)).unwrap()).collect();
    assert!(store.spill_path(first.id()).is_some());
    // Pinning a spilled partition brings it back.
    let _pin = store.pin(first.id()).unwrap();
    assert!(store.spill_path(first.id()).is_none());
    assert!(
        first
            .get()
            .unwrap()
            .column(0)
            .as_binary::<i32>()
            .value(0)
            .iter()
            .all(|&x| x == 1)
    );
}

#[test]
fn a_partition_is_freed_with_its_last_reference_and_reader() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(16 << 20, dir.path(), "free");
    let a = store.put(blob(4, 1)).unwrap();
    let read = a.get().unwrap();
    let copy = a.clone();
    drop(a);
    assert!(store.stats().used_bytes > 0, "still referenced");
    drop(copy);
    assert!(store.stats().used_bytes > 0, "still being read");
    assert!(
        read.column(0)
            .as_binary::<i32>()
            .value(0)
            .iter()
            .all(|&x| x == 1)
    );
    drop(read);
    assert_eq!(store.stats().used_bytes, 0);
    // A spilled partition's file goes with it.
    let parts: Vec<_> = (0..6).map(|i| store.put(blob(4, i)).unwrap()).collect();
    let path = store.spill_path(parts[0].id()).unwrap();
    assert!(path.exists());
    drop(parts);
    // Removed by the store's remover thread: waited for here.
    store.settle_disk();
    assert!(!path.exists());
    assert_eq!((store.stats().used_bytes, store.stats().partitions), (0, 0));
}

#[test]
fn nothing_remains_after_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(16 << 20, dir.path(), "shutdown");
    let parts: Vec<_> = (0..6).map(|i| store.put(blob(4, i)).unwrap()).collect();
    let segments = store.segment_names();
    let spill_dir = store.spill_dir().to_path_buf();
    assert!(!segments.is_empty() && spill_dir.exists());
    drop(parts);
    drop(store);
    for name in segments {
        assert!(
            !std::path::Path::new("/dev/shm").join(&name).exists(),
            "segment {name} remains"
        );
    }
    assert!(!spill_dir.exists(), "spill files remain");
}

#[test]
fn a_restarted_store_removes_what_a_killed_process_left() {
    if let Ok(role) = std::env::var(CHILD) {
        let dir = role.strip_prefix("hold:").unwrap();
        let store = store(16 << 20, std::path::Path::new(dir), "killed");
        let parts: Vec<_> = (0..6).map(|i| store.put(blob(4, i)).unwrap()).collect();
        println!("segments={}", store.segment_names().join(","));
        println!("spill={}", store.spill_dir().display());
        println!("ready");
        std::thread::sleep(std::time::Duration::from_secs(120));
        drop(parts);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_restarted_store_removes_what_a_killed_process_left",
            "--nocapture",
        ])
        .env(CHILD, format!("hold:{}", dir.path().display()))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut segments = Vec::new();
    let mut spill = None;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(s) = line.strip_prefix("segments=") {
            segments = s.split(',').map(str::to_string).collect();
        } else if let Some(s) = line.strip_prefix("spill=") {
            spill = Some(std::path::PathBuf::from(s));
        } else if line == "ready" {
            break;
        }
    }
    let spill = spill.unwrap();
    assert!(!segments.is_empty() && spill.exists());
    child.kill().unwrap(); // SIGKILL: no destructor runs
    child.wait().unwrap();
    assert!(
        std::path::Path::new("/dev/shm").join(&segments[0]).exists(),
        "the kill left the segments"
    );
    let _restarted = store(16 << 20, dir.path(), "killed");
    for name in &segments {
        assert!(
            !std::path::Path::new("/dev/shm").join(name).exists(),
            "segment {name} of the dead process remains"
        );
    }
    assert!(!spill.exists(), "spill files of the dead process remain");
}

#[test]
fn a_corrupt_or_missing_spill_file_names_the_partition() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(16 << 20, dir.path(), "corrupt");
    let parts: Vec<_> = (0..6).map(|i| store.put(blob(4, i)).unwrap()).collect();
    let (a, b) = (&parts[0], &parts[1]);
    let path = store.spill_path(a.id()).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[1000] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();
    let err = a.get().unwrap_err().to_string();
    assert!(
        err.contains(&a.id().to_string()) && err.contains("corrupt"),
        "{err}"
    );
    std::fs::remove_file(store.spill_path(b.id()).unwrap()).unwrap();
    let err = b.get().unwrap_err().to_string();
    assert!(err.contains(&b.id().to_string()), "{err}");
}

/// The shared name of a partition of one string column whose value is
/// `marker`, kept in memory while `part` lives.
fn shared_string(store: &SharedStore, marker: &str) -> (PartitionRef, String) {
    let col: ArrayRef = Arc::new(arrow_array::StringArray::from(vec![marker; 3]));
    let part = store
        .put(RecordBatch::try_from_iter([("s", col)]).unwrap())
        .unwrap();
    let name = store.shared_name(&part).unwrap();
    (part, name)
}

#[test]
fn open_shared_rejects_an_offset_and_length_that_overflow() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(16 << 20, dir.path(), "overflow");
    let (_part, name) = shared_string(&store, "abc");
    let segment = name.split_once('@').unwrap().0;
    for (offset, len) in [(u64::MAX - 7, 16), (1, u64::MAX), (u64::MAX, u64::MAX)] {
        let bad = format!("{segment}@{offset}+{len}");
        let result = std::panic::catch_unwind(|| open_shared(&bad).map(|_| ()));
        let err = result
            .unwrap_or_else(|_| panic!("open_shared({bad}) panicked"))
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(segment)
                && text.contains(&offset.to_string())
                && text.contains("outside"),
            "{text}"
        );
    }
}

#[test]
fn open_shared_rejects_a_region_past_the_segment_end() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(16 << 20, dir.path(), "pastend");
    let (_part, name) = shared_string(&store, "abc");
    let segment = name.split_once('@').unwrap().0;
    let size = std::fs::metadata(std::path::Path::new("/dev/shm").join(segment))
        .unwrap()
        .len();
    let bad = format!("{segment}@{}+64", size - 8);
    let err = open_shared(&bad).map(|_| ()).unwrap_err().to_string();
    assert!(
        err.contains("outside") && err.contains(&size.to_string()),
        "{err}"
    );
    let err = open_shared(&format!("{segment}@12"))
        .map(|_| ())
        .unwrap_err();
    assert!(err.to_string().contains("not a partition name"), "{err}");
}

#[test]
fn open_shared_rejects_corrupt_bytes_in_the_segment() {
    use std::io::{Seek, SeekFrom, Write};
    let dir = tempfile::tempdir().unwrap();
    let store = store(16 << 20, dir.path(), "corruptshm");
    let marker = "streambatch-marker-value";
    let (_part, name) = shared_string(&store, marker);
    assert_eq!(
        open_shared(&name)
            .unwrap()
            .batch
            .column(0)
            .as_string::<i32>()
            .value(0),
        marker
    );
    // Another process scribbles over the values: invalid UTF-8.
    let (segment, rest) = name.split_once('@').unwrap();
    let (offset, len) = rest.split_once('+').unwrap();
    let (offset, len): (usize, usize) = (offset.parse().unwrap(), len.parse().unwrap());
    let path = std::path::Path::new("/dev/shm").join(segment);
    let bytes = std::fs::read(&path).unwrap();
    let at = offset
        + bytes[offset..offset + len]
            .windows(marker.len())
            .position(|w| w == marker.as_bytes())
            .expect("the value is in the segment");
    let mut file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.seek(SeekFrom::Start(at as u64)).unwrap();
    file.write_all(&[0xff; 4]).unwrap();
    drop(file);
    let err = open_shared(&name).map(|_| ()).unwrap_err();
    assert!(err.to_string().contains(segment), "{err}");
    assert!(
        std::error::Error::source(&err).is_some(),
        "the arrow error is the source"
    );
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Put(u8, usize),
        Get(usize),
        Pin(usize),
        Unpin(usize),
        Drop(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (any::<u8>(), 1usize..3000).prop_map(|(f, kib)| Op::Put(f, kib)),
            3 => any::<usize>().prop_map(Op::Get),
            1 => any::<usize>().prop_map(Op::Pin),
            1 => any::<usize>().prop_map(Op::Unpin),
            2 => any::<usize>().prop_map(Op::Drop),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
        #[test]
        fn memory_stays_within_capacity_and_every_partition_reads_back(ops in proptest::collection::vec(op(), 1..60)) {
            let dir = tempfile::tempdir().unwrap();
            let capacity = 8 << 20;
            let store = store(capacity, dir.path(), "prop");
            let mut live: Vec<(PartitionRef, u8, usize, Vec<streambatch_store::PinGuard>)> = Vec::new();
            for op in ops {
                match op {
                    Op::Put(fill, kib) => {
                        let data: ArrayRef = Arc::new(BinaryArray::from_vec(vec![vec![fill; kib << 10].as_slice()]));
                        let batch = RecordBatch::try_from_iter([("d", data)]).unwrap();
                        if let Ok(p) = store.put(batch) {
                            live.push((p, fill, kib << 10, Vec::new()));
                        }
                    }
                    Op::Get(i) if !live.is_empty() => {
                        let (p, fill, len, _) = &live[i % live.len()];
                        let b = p.get().unwrap();
                        let v = b.column(0).as_binary::<i32>().value(0);
                        prop_assert!(v.len() == *len && v.iter().all(|x| x == fill));
                    }
                    Op::Pin(i) if !live.is_empty() => {
                        let n = live.len();
                        let entry = &mut live[i % n];
                        if let Ok(g) = store.pin(entry.0.id()) {
                            entry.3.push(g);
                        }
                    }
                    Op::Unpin(i) if !live.is_empty() => {
                        let n = live.len();
                        live[i % n].3.pop();
                    }
                    Op::Drop(i) if !live.is_empty() => {
                        let n = live.len();
                        live.remove(i % n);
                    }
                    _ => {}
                }
                prop_assert!(store.stats().used_bytes <= capacity);
            }
            for (p, fill, len, _) in &live {
                let b = p.get().unwrap();
                let v = b.column(0).as_binary::<i32>().value(0);
                prop_assert!(v.len() == *len && v.iter().all(|x| x == fill));
            }
            drop(live);
            prop_assert_eq!(store.stats().used_bytes, 0);
        }
    }
}
