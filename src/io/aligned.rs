//! Buffers aligned for direct I/O: a growable byte buffer over [`Pages`], its own
//! page-aligned mapping (backed by huge pages once it is large, see `pages`).

use super::pages::Pages;

/// What `O_DIRECT` asks of a write's buffer address, length and file offset on the
/// file systems and devices a store lives on (4 KiB covers 512-byte and 4 KiB
/// sectors, and the page size).
pub(crate) const DIRECT_ALIGN: usize = 4096;

/// A reusable byte buffer whose contents start at a [`DIRECT_ALIGN`]ed address.
#[derive(Default)]
pub(crate) struct AlignedBuf {
    /// The contents, at the start of the mapping (page-aligned). Never shrunk, so a
    /// buffer reused for writes of similar sizes maps (and faults in) its memory
    /// once.
    raw: Pages,
}

impl AlignedBuf {
    /// Empties the buffer, keeping its memory.
    pub(crate) fn clear(&mut self) {
        self.raw.set_len(0);
    }

    /// Makes room for `additional` more bytes without moving again.
    pub(crate) fn reserve(&mut self, additional: usize) {
        let len = self.raw.len();
        if len + additional > self.raw.capacity() {
            self.reallocate(len + additional);
        }
    }

    /// Appends `bytes`.
    pub(crate) fn extend_from_slice(&mut self, bytes: &[u8]) {
        let at = self.raw.len();
        self.grow_to(at + bytes.len());
        self.raw[at..].copy_from_slice(bytes);
    }

    /// Appends zero bytes up to the next multiple of [`DIRECT_ALIGN`].
    pub(crate) fn pad_to_alignment(&mut self) {
        let at = self.raw.len();
        self.grow_to(at.next_multiple_of(DIRECT_ALIGN));
        self.raw[at..].fill(0);
    }

    /// Sets the length to `len`, keeping the contents (bytes past the old length are
    /// unspecified until written).
    fn grow_to(&mut self, len: usize) {
        if len > self.raw.capacity() {
            self.reallocate(len * 2);
        }
        self.raw.set_len(len);
    }

    /// Moves the contents to a mapping with room for `capacity` bytes.
    fn reallocate(&mut self, capacity: usize) {
        let mut raw = Pages::zeroed(capacity.max(DIRECT_ALIGN));
        let len = self.raw.len();
        raw[..len].copy_from_slice(&self.raw);
        raw.set_len(len);
        self.raw = raw;
    }

    /// Sets the length to `len`, keeping the contents up to it; bytes past the old
    /// length are unspecified (left from an earlier use, or zeroes) until written.
    pub(crate) fn resize(&mut self, len: usize) {
        self.grow_to(len);
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.raw
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.raw
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.raw.len()
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
