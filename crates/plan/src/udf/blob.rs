//! Bytes a recipe refers to by their SHA-256 (a model file): on a cluster
//! the driver serves each on its fetch streams and every node pulls it once
//! per job before rebuilding the operators, checking the hash, so an
//! operator needs no file every node can read.
//!
//! A blob is known to this process as long as something holds it: the
//! table below keeps weak references, so a blob lives exactly as long as
//! the operators (and the plans) that use it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use sha2::{Digest, Sha256};

/// Bytes known by their SHA-256.
///
/// ```
/// use streambatch_plan::Blob;
///
/// let blob = Blob::new(b"weights".to_vec().into());
/// assert_eq!(blob.sha256().len(), 64);
/// assert_eq!(Blob::find(blob.sha256()).unwrap().bytes()[..], b"weights"[..]);
/// assert!(Blob::find_id(blob.id()).is_some());
/// let sha256 = blob.sha256().to_string();
/// drop(blob);
/// assert!(Blob::find(&sha256).is_none(), "held by no one, known no more");
/// ```
#[derive(Clone, Debug)]
pub struct Blob {
    sha256: Arc<str>,
    bytes: Arc<[u8]>,
}

/// Every blob this process holds, by the id it is served under: its hash
/// and its bytes while anyone holds them.
type Table = Mutex<HashMap<u64, (Arc<str>, Weak<[u8]>)>>;

fn table() -> &'static Table {
    static TABLE: OnceLock<Table> = OnceLock::new();
    TABLE.get_or_init(Mutex::default)
}

impl Blob {
    /// `bytes`, hashed and made known to this process (and so served to
    /// nodes, where this process drives a job).
    pub fn new(bytes: Arc<[u8]>) -> Self {
        let sha256: Arc<str> = hex(&Sha256::digest(&bytes)).into();
        let id = Self::id_of(&sha256);
        let mut table = table().lock().unwrap_or_else(|p| p.into_inner());
        // A copy already held is the one kept, so that one process holds
        // the bytes once.
        if let Some(held) = table.get(&id).and_then(|(_, weak)| weak.upgrade()) {
            return Self {
                sha256,
                bytes: held,
            };
        }
        table.retain(|_, (_, weak)| weak.strong_count() > 0);
        table.insert(id, (sha256.clone(), Arc::downgrade(&bytes)));
        Self { sha256, bytes }
    }

    /// The blob of hash `sha256` (lowercase hex), where this process holds it.
    pub fn find(sha256: &str) -> Option<Self> {
        Self::find_id(Self::id_of(sha256)).filter(|b| &*b.sha256 == sha256)
    }

    /// The blob served under `id` (see [`Blob::id`]), where this process
    /// holds it.
    pub fn find_id(id: u64) -> Option<Self> {
        let table = table().lock().unwrap_or_else(|p| p.into_inner());
        let (sha256, weak) = table.get(&id)?;
        Some(Self {
            sha256: sha256.clone(),
            bytes: weak.upgrade()?,
        })
    }

    /// Its SHA-256, as lowercase hex.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// The bytes.
    pub fn bytes(&self) -> &Arc<[u8]> {
        &self.bytes
    }

    /// The id a driver serves it under on its fetch streams: the hash's
    /// first eight bytes (a node checks the whole hash of what arrives).
    pub fn id(&self) -> u64 {
        Self::id_of(&self.sha256)
    }

    /// The id of the blob of hash `sha256` (0 for what is not a hash).
    pub fn id_of(sha256: &str) -> u64 {
        sha256
            .get(..16)
            .and_then(|head| u64::from_str_radix(head, 16).ok())
            .unwrap_or(0)
    }
}

/// `bytes` as lowercase hex.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
