//! Buffers aligned for direct I/O, without `unsafe`: a byte vector over-allocated by
//! one alignment unit, used from its first aligned byte.

/// What `O_DIRECT` asks of a write's buffer address, length and file offset on the
/// file systems and devices a store lives on (4 KiB covers 512-byte and 4 KiB
/// sectors, and the page size).
pub(crate) const DIRECT_ALIGN: usize = 4096;

/// A reusable byte buffer whose contents start at a [`DIRECT_ALIGN`]ed address.
#[derive(Default)]
pub(crate) struct AlignedBuf {
    /// Backing storage; the buffer is `raw[start..start + len]`. Never shrunk, so a
    /// buffer reused for writes of similar sizes allocates once.
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// Empties the buffer, keeping its memory.
    pub(crate) fn clear(&mut self) {
        self.len = 0;
    }

    /// Makes room for `additional` more bytes without moving again.
    pub(crate) fn reserve(&mut self, additional: usize) {
        let len = self.len;
        if self.start + len + additional > self.raw.len() {
            self.reallocate(len + additional);
        }
    }

    /// Appends `bytes`.
    pub(crate) fn extend_from_slice(&mut self, bytes: &[u8]) {
        let at = self.len;
        self.grow_to(at + bytes.len());
        self.as_mut_slice()[at..].copy_from_slice(bytes);
    }

    /// Appends zero bytes up to the next multiple of [`DIRECT_ALIGN`].
    pub(crate) fn pad_to_alignment(&mut self) {
        let to = self.len.next_multiple_of(DIRECT_ALIGN);
        let at = self.len;
        self.grow_to(to);
        self.as_mut_slice()[at..].fill(0);
    }

    /// Sets the length to `len`, keeping the contents (bytes past the old length are
    /// unspecified until written).
    fn grow_to(&mut self, len: usize) {
        if self.start + len > self.raw.len() {
            self.reallocate(len * 2);
        }
        self.len = len;
    }

    /// Moves the contents to an allocation with room for `capacity` bytes, aligned
    /// afresh (a new allocation's address has its own offset to the next aligned
    /// byte).
    fn reallocate(&mut self, capacity: usize) {
        let mut raw = vec![0u8; capacity.max(DIRECT_ALIGN) + DIRECT_ALIGN];
        let start = raw.as_ptr().align_offset(DIRECT_ALIGN);
        raw[start..start + self.len].copy_from_slice(&self.raw[self.start..][..self.len]);
        self.raw = raw;
        self.start = start;
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contents_stay_aligned_and_intact_across_growth() {
        let mut b = AlignedBuf::default();
        let mut model = Vec::new();
        for i in 0..40u32 {
            let chunk: Vec<u8> = (0..(i * 997) % 9000).map(|j| (i + j) as u8).collect();
            b.extend_from_slice(&chunk);
            model.extend_from_slice(&chunk);
            assert_eq!(b.as_slice(), &model[..]);
            if !model.is_empty() {
                assert_eq!(b.as_slice().as_ptr() as usize % DIRECT_ALIGN, 0);
            }
        }
        b.pad_to_alignment();
        assert_eq!(b.len() % DIRECT_ALIGN, 0);
        assert_eq!(&b.as_slice()[..model.len()], &model[..]);
        assert!(b.as_slice()[model.len()..].iter().all(|&x| x == 0));
        b.clear();
        assert_eq!(b.len(), 0);
        b.reserve(1 << 20);
        let raw = b.as_slice().as_ptr();
        b.extend_from_slice(&vec![7u8; 1 << 20]);
        assert_eq!(b.as_slice().as_ptr(), raw, "reserved: not moved");
        b.clear();
        b.extend_from_slice(b"abc");
        assert_eq!(b.as_slice(), b"abc");
    }
}
