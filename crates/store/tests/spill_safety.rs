//! Spill directories and files are the node's own: a directory another
//! user owns or can enter is refused, a link planted where a spill file
//! goes is not followed, and a spill file changed after it was written is
//! refused when read back (never a panic or a batch of garbage).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use arrow_array::{ArrayRef, BinaryArray, RecordBatch, StringArray};
use streambatch_core::PartitionId;
use streambatch_store::{ObjectStore, SharedStore, SpillError, StoreConfig, StoreError};

fn open(capacity: u64, spill_dir: &Path) -> Result<SharedStore, StoreError> {
    let mut config = StoreConfig::new(capacity, spill_dir);
    config.namespace = "spillsafety".into();
    SharedStore::open(config)
}

fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// About `n` × 8 bytes of strings, each `hello-…`.
fn strings(n: usize) -> RecordBatch {
    let values: StringArray = (0..n).map(|i| Some(format!("hello-{i:02}"))).collect();
    RecordBatch::try_from_iter([("s", Arc::new(values) as ArrayRef)]).unwrap()
}

/// A store spilling to `spill`, whose own directory in it was made
/// ahead of it with `mode` (and given to `owner`): the name is predictable.
fn store_with_dir_made_ahead(spill: &Path, mode: u32, owner: Option<u32>) -> SharedStore {
    std::fs::create_dir(spill).unwrap();
    set_mode(spill, 0o700);
    let store = open(64 << 10, spill).unwrap();
    std::fs::create_dir(store.spill_dir()).unwrap();
    set_mode(store.spill_dir(), mode);
    if let Some(uid) = owner {
        // The tests run as root, which may give a directory away.
        std::os::unix::fs::chown(store.spill_dir(), Some(uid), Some(uid)).unwrap();
    }
    store
}

fn assert_spill_dir_refused(err: StoreError, dir: &Path, says: &str) {
    let message = err.to_string();
    assert!(matches!(err, StoreError::SpillDir { .. }), "{message}");
    assert!(message.contains(&dir.display().to_string()), "{message}");
    assert!(message.contains(says), "{message}");
}

#[test]
fn a_store_directory_other_users_can_enter_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_dir_made_ahead(&dir.path().join("spill"), 0o755, None);
    // Too large for memory: it must go to a spill file.
    let err = store.put(strings(20_000)).unwrap_err();
    assert_spill_dir_refused(err, store.spill_dir(), "chmod 700");
    // Made private, it is used.
    set_mode(store.spill_dir(), 0o700);
    let part = store.put(strings(20_000)).unwrap();
    assert_eq!(part.get().unwrap(), strings(20_000));
}

#[test]
fn a_store_directory_of_another_user_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_dir_made_ahead(&dir.path().join("spill"), 0o700, Some(65534));
    let err = store.put(strings(20_000)).unwrap_err();
    assert_spill_dir_refused(err, store.spill_dir(), "uid 65534");
}

#[test]
fn a_spill_directory_of_another_user_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let spill = dir.path().join("spill");
    std::fs::create_dir(&spill).unwrap();
    set_mode(&spill, 0o700);
    std::os::unix::fs::chown(&spill, Some(65534), Some(65534)).unwrap();
    let err = open(8 << 20, &spill)
        .err()
        .expect("another user's directory");
    assert_spill_dir_refused(err, &spill, "uid 65534");
}

#[test]
fn a_spill_directory_anyone_may_write_is_refused_unless_sticky() {
    let dir = tempfile::tempdir().unwrap();
    let spill = dir.path().join("spill");
    std::fs::create_dir(&spill).unwrap();
    set_mode(&spill, 0o777);
    let err = open(8 << 20, &spill).err().expect("a 0777 spill directory");
    assert_spill_dir_refused(err, &spill, "chmod 700");
    // As /tmp is: nobody may move another's entries.
    set_mode(&spill, 0o1777);
    open(8 << 20, &spill).unwrap();
}

#[test]
fn a_missing_spill_directory_is_made_private() {
    let dir = tempfile::tempdir().unwrap();
    let spill = dir.path().join("a").join("spill");
    let store = open(64 << 10, &spill).unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&spill), 0o700);
    assert_eq!(mode(&dir.path().join("a")), 0o700);
    let part = store.put(strings(20_000)).unwrap();
    let file = store.spill_path(part.id()).expect("spilled");
    assert_eq!(mode(file.parent().unwrap()), 0o700);
}

#[test]
fn a_link_planted_at_a_spill_file_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let spill = dir.path().join("spill");
    std::fs::create_dir(&spill).unwrap();
    set_mode(&spill, 0o700);
    let store = open(64 << 10, &spill).unwrap();
    // The store's own directory, made ahead of it, with a link where its
    // first partition's file goes.
    std::fs::create_dir(store.spill_dir()).unwrap();
    set_mode(store.spill_dir(), 0o700);
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    let link = store.spill_dir().join(format!("{}.arrows", PartitionId(1)));
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    // Too large for memory: it goes straight to its spill file.
    let result = store.put(strings(20_000));
    let victim_now = std::fs::read(&victim).unwrap();
    assert!(
        victim_now == b"precious",
        "the spill was written through the link"
    );
    if let Ok(part) = result {
        // Written elsewhere, under a fresh name, and readable.
        let path = store.spill_path(part.id()).expect("spilled");
        assert_ne!(path, link);
        assert_eq!(part.get().unwrap(), strings(20_000));
    }
    // A dangling link is not followed either.
    let target = dir.path().join("made-through-link");
    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let _ = store.put(strings(20_000));
    assert!(!target.exists());
}

/// Rewrites a one-stream spill file's CRC-32s (the stream's, in the index,
/// and the index's, in the trailer) to match its (changed) contents. The
/// file: the stream, padding, an index entry (offset u64, length u64,
/// CRC-32 u32, 4 bytes) and the trailer (count u64, CRC-32 u32, magic).
fn fix_crc(bytes: &mut [u8]) {
    let (entry, trailer) = (bytes.len() - 20 - 24, bytes.len() - 20);
    let word = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap()) as usize;
    let (at, len) = (word(bytes, entry), word(bytes, entry + 8));
    let crc = crc32fast::hash(&bytes[at..at + len]);
    bytes[entry + 16..entry + 20].copy_from_slice(&crc.to_le_bytes());
    let crc = crc32fast::hash(&bytes[entry..trailer]);
    bytes[trailer + 8..trailer + 12].copy_from_slice(&crc.to_le_bytes());
}

/// Makes the first `hello` in the file invalid UTF-8, with a valid CRC.
fn tamper(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let at = bytes
        .windows(5)
        .position(|w| w == b"hello")
        .expect("the strings are in the file");
    bytes[at] = 0xff;
    fix_crc(&mut bytes);
    std::fs::write(path, &bytes).unwrap();
}

fn assert_refused(result: Result<impl std::fmt::Debug, StoreError>) {
    match result {
        Err(StoreError::Spill {
            source: SpillError::Decode { .. },
            ..
        }) => {}
        other => panic!("a tampered spill file was not refused: {other:?}"),
    }
}

#[test]
fn a_spill_file_tampered_with_a_valid_crc_is_refused_when_read() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(64 << 10, &dir.path().join("spill")).unwrap();
    let part = store.put(strings(20_000)).unwrap();
    let path = store.spill_path(part.id()).expect("too large for memory");
    tamper(&path);
    assert_refused(part.get());
}

#[test]
fn a_spill_file_tampered_with_a_valid_crc_is_refused_when_restored() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(4 << 20, &dir.path().join("spill")).unwrap();
    let part = store.put(strings(20_000)).unwrap();
    // A partition that needs all the memory spills the first one.
    let data: ArrayRef = Arc::new(BinaryArray::from_vec(vec![
        vec![1u8; (4 << 20) - (64 << 10)].as_slice(),
    ]));
    let big = store
        .put(RecordBatch::try_from_iter([("data", data)]).unwrap())
        .unwrap();
    let path = store.spill_path(part.id()).expect("spilled");
    drop(big);
    tamper(&path);
    assert_refused(store.pin(part.id()).map(drop));
    // Nothing half-restored: a read still refuses it.
    assert_refused(part.get());
}

/// A dead process that had this process's pid (a reused pid, a container's
/// pid 1) left its stores' spill directories behind, with files in them:
/// a new store never makes its files among them, and spills.
#[test]
fn leftovers_of_a_dead_process_with_this_pid_do_not_stop_a_spill() {
    let dir = tempfile::tempdir().unwrap();
    let spill = dir.path().join("spill");
    std::fs::create_dir(&spill).unwrap();
    set_mode(&spill, 0o700);
    let pid = std::process::id();
    // The names its stores had (the count of stores this process opened
    // so far stays below 64 here).
    for n in 0..64 {
        let old = spill.join(format!("sb-spillsafety-{pid}-{n}"));
        std::fs::create_dir(&old).unwrap();
        set_mode(&old, 0o700);
        for id in 1..4 {
            std::fs::write(old.join(format!("p{id}.arrows")), b"old").unwrap();
        }
    }
    let store = open(64 << 10, &spill).unwrap();
    let part = store.put(strings(20_000)).unwrap();
    assert!(store.stats().spilled_bytes > 0, "the test means to spill");
    assert_eq!(part.get().unwrap(), strings(20_000));
    // And the store that opened removed them: their mark is not this
    // process's.
    let left = (0..64)
        .filter(|n| spill.join(format!("sb-spillsafety-{pid}-{n}")).exists())
        .count();
    assert_eq!(left, 0, "leftovers of a dead process with this pid stay");
}

/// Stores of a process in another pid namespace (a container sharing the
/// spill disk): its pid means nothing here, so neither the same pid with
/// another start time nor a pid absent from this /proc makes it dead.
#[test]
fn a_store_of_another_pid_namespace_is_never_taken_for_dead() {
    let dir = tempfile::tempdir().unwrap();
    let spill = dir.path().join("spill");
    std::fs::create_dir(&spill).unwrap();
    set_mode(&spill, 0o700);
    let pid = std::process::id();
    let theirs = [
        format!("sb-pidns-{pid}-1n1-0"),
        format!("sb-pidns-{}-1n1-0", u32::MAX - 1),
    ];
    // And one of this namespace whose process is dead: it goes.
    let here = std::fs::read_link("/proc/self/ns/pid").unwrap();
    let ns: u64 = here.to_string_lossy()[5..]
        .trim_end_matches(']')
        .parse()
        .unwrap();
    let dead_here = format!("sb-pidns-{}-1n{ns:x}-0", u32::MAX - 1);
    for name in theirs.iter().chain([&dead_here]) {
        std::fs::create_dir(spill.join(name)).unwrap();
        set_mode(&spill.join(name), 0o700);
    }
    let mut config = StoreConfig::new(64 << 10, &spill);
    config.namespace = "pidns".into();
    let store = SharedStore::open(config).unwrap();
    for name in &theirs {
        assert!(
            spill.join(name).exists(),
            "{name}: a live store of another namespace was removed"
        );
    }
    assert!(
        !spill.join(&dead_here).exists(),
        "a dead store of this namespace stays"
    );
    drop(store);
}
