//! Stable hashes (the same on every platform and Rust version, unlike
//! std's hasher) for what must not change between runs: seeded choices
//! per row or per file.

/// FNV-1a of `bytes`.
///
/// ```
/// assert_eq!(streambatch_core::fnv1a(b""), 0xcbf2_9ce4_8422_2325);
/// assert_ne!(streambatch_core::fnv1a(b"a"), streambatch_core::fnv1a(b"b"));
/// ```
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// SplitMix64's finaliser: every input bit moves every output bit.
pub fn mix64(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
