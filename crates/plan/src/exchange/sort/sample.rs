//! A sort's map output's keys as the executor sees them (see
//! `key_range.rs`): `arrow-row` bytes, compared, never decoded. A module of
//! its own so that the cut (`partition.rs`) and the ranges can both name it.

/// Keys of a sorted map output, as `arrow-row` bytes: the first key of
/// each chunk, then the output's last key (one more than the chunks; none
/// for an output with no rows).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeySample {
    bytes: Vec<u8>,
    /// Where each key ends in `bytes`.
    ends: Vec<u32>,
}

impl KeySample {
    /// A sample from its parts as [`into_parts`](Self::into_parts) gave
    /// them (from a peer: checked, since each key is sliced by `ends`).
    pub fn from_parts(bytes: Vec<u8>, ends: Vec<u32>) -> std::result::Result<Self, String> {
        let ascending = ends.windows(2).all(|w| w[0] <= w[1]);
        let whole = ends.last().map_or(0, |&e| e as usize) == bytes.len();
        if !ascending || !whole {
            return Err(format!(
                "a sort's key sample of {} bytes does not end its {} keys in order",
                bytes.len(),
                ends.len()
            ));
        }
        Ok(Self { bytes, ends })
    }

    /// The keys' bytes and where each ends.
    pub fn into_parts(self) -> (Vec<u8>, Vec<u32>) {
        (self.bytes, self.ends)
    }

    /// How many keys.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// True when there is no key.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// A hash of the keys: a map output made again must have the same
    /// (the reducers' ranges were taken from the first).
    pub fn fingerprint(&self) -> u64 {
        let ends: Vec<u8> = self.ends.iter().flat_map(|e| e.to_le_bytes()).collect();
        let (bytes, ends) = (
            streambatch_core::fnv1a(&self.bytes),
            streambatch_core::fnv1a(&ends),
        );
        streambatch_core::mix64(bytes ^ ends.rotate_left(1))
    }

    /// Bytes of the keys alone.
    pub(crate) fn key_bytes(&self) -> usize {
        self.bytes.len()
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes.len() + 4 * self.ends.len()
    }

    /// The `i`-th key.
    pub fn key(&self, i: usize) -> &[u8] {
        let start = match i {
            0 => 0,
            _ => self.ends[i - 1] as usize,
        };
        &self.bytes[start..self.ends[i] as usize]
    }

    pub(crate) fn push(&mut self, key: &[u8]) {
        self.bytes.extend_from_slice(key);
        self.ends.push(self.bytes.len() as u32);
    }
}
