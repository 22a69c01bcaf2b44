//! A first-fit allocator of regions within one segment, coalescing freed
//! neighbours (the role of dlmalloc in Ray's plasma store).

use std::collections::BTreeMap;

/// Every region starts on a 64-byte boundary, as Arrow prefers.
pub const ALIGN: usize = 64;

/// Free regions of one segment, by offset.
#[derive(Debug)]
pub struct Allocator {
    free: BTreeMap<usize, usize>,
    free_bytes: usize,
    len: usize,
}

/// Rounds `len` up to the alignment.
pub fn aligned(len: usize) -> usize {
    len.div_ceil(ALIGN).max(1) * ALIGN
}

impl Allocator {
    /// All of `len` bytes free.
    pub fn new(len: usize) -> Self {
        let len = len / ALIGN * ALIGN;
        Self {
            free: BTreeMap::from([(0, len)]),
            free_bytes: len,
            len,
        }
    }

    /// The offset of a region of `len` bytes (rounded up), or `None`.
    pub fn alloc(&mut self, len: usize) -> Option<usize> {
        let len = aligned(len);
        let (&offset, &size) = self.free.iter().find(|&(_, &size)| size >= len)?;
        self.free.remove(&offset);
        if size > len {
            self.free.insert(offset + len, size - len);
        }
        self.free_bytes -= len;
        Some(offset)
    }

    /// Returns the region at `offset` of `len` bytes (as given to `alloc`).
    pub fn free(&mut self, offset: usize, len: usize) {
        let mut len = aligned(len);
        let mut offset = offset;
        self.free_bytes += len;
        if let Some((&next, &next_len)) = self.free.range(offset + len..).next()
            && next == offset + len
        {
            self.free.remove(&next);
            len += next_len;
        }
        if let Some((&prev, &prev_len)) = self.free.range(..offset).next_back()
            && prev + prev_len == offset
        {
            self.free.remove(&prev);
            offset = prev;
            len += prev_len;
        }
        self.free.insert(offset, len);
    }

    /// True when nothing is allocated.
    pub fn is_empty(&self) -> bool {
        self.free_bytes == self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_neighbours_coalesce() {
        let mut a = Allocator::new(1024);
        let x = a.alloc(100).unwrap();
        let y = a.alloc(100).unwrap();
        let z = a.alloc(100).unwrap();
        assert_eq!((x, y, z), (0, 128, 256));
        a.free(y, 100);
        a.free(x, 100);
        a.free(z, 100);
        assert!(a.is_empty());
        assert_eq!(a.alloc(1024), Some(0));
    }

    proptest::proptest! {
        #[test]
        fn regions_never_overlap(ops in proptest::collection::vec((1usize..300, proptest::bool::ANY), 1..100)) {
            let mut a = Allocator::new(4096);
            let mut live: Vec<(usize, usize)> = Vec::new();
            for (len, free) in ops {
                if free && !live.is_empty() {
                    let (o, l) = live.remove(len % live.len());
                    a.free(o, l);
                } else if let Some(o) = a.alloc(len) {
                    for &(p, q) in &live {
                        proptest::prop_assert!(o + aligned(len) <= p || p + aligned(q) <= o);
                    }
                    proptest::prop_assert!(o + aligned(len) <= 4096 && o % ALIGN == 0);
                    live.push((o, len));
                }
            }
            for (o, l) in live { a.free(o, l); }
            proptest::prop_assert!(a.is_empty());
        }
    }
}
