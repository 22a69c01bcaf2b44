//! A store is never larger than the shared memory that backs it: a
//! capacity /dev/shm cannot hold is cut to fit (the default) or refused
//! (a capacity the user asked for), and a segment that cannot be made is
//! reported as such, not as a full store.

use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch};
use streambatch_store::{ObjectStore, PutError, SharedStore, StoreConfig, StoreError};

/// Bytes free for an unprivileged user in /dev/shm now.
fn shm_available() -> u64 {
    let path = std::ffi::CString::new("/dev/shm").unwrap();
    // SAFETY: a valid C string and a zeroed struct for the kernel to fill.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(path.as_ptr(), &mut stat) }, 0);
    stat.f_bavail as u64 * stat.f_frsize as u64
}

fn ints() -> RecordBatch {
    let x: ArrayRef = Arc::new(Int64Array::from_iter_values(0..1000));
    RecordBatch::try_from_iter([("x", x)]).unwrap()
}

#[test]
fn a_default_capacity_larger_than_dev_shm_is_cut_to_fit() {
    let dir = tempfile::tempdir().unwrap();
    let asked = shm_available() + (64 << 30);
    let store = SharedStore::open(StoreConfig::new(asked, dir.path())).unwrap();
    let capacity = store.stats().capacity_bytes;
    assert!(capacity < asked, "{capacity} of {asked}");
    assert!(capacity <= shm_available() + (64 << 20), "{capacity}");
    let part = store.try_put(ints()).unwrap();
    assert_eq!(part.get().unwrap(), ints());
}

#[test]
fn an_explicit_capacity_larger_than_dev_shm_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let asked = shm_available() + (64 << 30);
    let mut config = StoreConfig::new(asked, dir.path());
    config.strict_capacity = true;
    let err = SharedStore::open(config)
        .err()
        .expect("more than /dev/shm holds");
    let message = err.to_string();
    assert!(matches!(err, StoreError::ShmTooSmall { .. }), "{message}");
    assert!(message.contains("/dev/shm"), "{message}");
}

#[test]
fn a_capacity_that_fits_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = StoreConfig::new(8 << 20, dir.path());
    config.strict_capacity = true;
    let store = SharedStore::open(config).unwrap();
    assert_eq!(store.stats().capacity_bytes, 8 << 20);
}

#[test]
fn a_segment_that_cannot_be_made_is_an_error_not_full() {
    let dir = tempfile::tempdir().unwrap();
    // Segment names longer than a file name can be: shm_open fails.
    let mut config = StoreConfig::new(8 << 20, dir.path());
    config.namespace = "n".repeat(300);
    let store = SharedStore::open(config).unwrap();
    match store.try_put(ints()) {
        Err(PutError::Store(StoreError::Segment { action, name, .. })) => {
            assert_eq!(action, "create");
            assert!(name.starts_with("sb-nnn"), "{name}");
        }
        Err(e) => panic!("a failed segment reported as: {e}"),
        Ok(_) => panic!("a segment with a 300-byte name was made"),
    }
    let err = store.put(ints()).unwrap_err();
    assert!(matches!(err, StoreError::Segment { .. }), "{err}");
    assert!(err.to_string().contains("cannot create segment"), "{err}");
}
