//! The byte cursor the fuzzing modules of netwarden's libraries (`fuzzing`, behind each
//! library's `fuzzing` feature) decode their inputs with: the cargo-fuzz targets in `fuzz/`
//! and the `tests/fuzz_*.rs` replays of their committed seed corpora hand it arbitrary bytes.
//!
//! One cursor, not one per crate, so that a byte means the same kind of choice everywhere.
//! Not the `arbitrary` crate: the committed seeds (`fuzz/seeds/<target>`, reproducers of past
//! findings included) were found through this exact reading — one byte per choice, `%` for a
//! range, zeros past the end — and must keep decoding to the same inputs.
//!
//! A crate of its own because `netwarden-cri` fuzzes too and depends on no other netwarden
//! crate, and because the libraries may not depend on `netwarden-testing` (which depends on
//! them, to turn their `fuzzing` features on for tests).
#![forbid(unsafe_code)]

/// A cursor over the fuzzer's bytes. Reading past the end gives zeros, so every input decodes,
/// and a short input decodes to a small value (zero is every decoder's smallest choice).
#[derive(Debug, Clone)]
pub struct Bytes<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Bytes { data, at: 0 }
    }

    /// The next byte, or 0 past the end (counted as read all the same: see [`Self::overran`]).
    pub fn u8(&mut self) -> u8 {
        let b = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }

    /// The next two bytes, big-endian.
    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }

    /// The next four bytes, big-endian.
    pub fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    /// The next eight bytes, big-endian.
    pub fn u64(&mut self) -> u64 {
        (u64::from(self.u32()) << 32) | u64::from(self.u32())
    }

    /// The low bit of the next byte.
    pub fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    /// A number below `n` from one byte (so at most 255, whatever `n`); 0 when `n` is 0, rather
    /// than a panic, so a decoder choosing from an empty list gets a chance to notice.
    pub fn below(&mut self, n: usize) -> usize {
        usize::from(self.u8()) % n.max(1)
    }

    /// True with probability 1/n.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    /// One of `items` (which must not be empty), from one byte.
    pub fn pick<'s, T>(&mut self, items: &'s [T]) -> &'s T {
        &items[self.below(items.len())]
    }

    /// The next `n` bytes (zeros past the end).
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.u8()).collect()
    }

    /// Every byte has been read: a decoder reading a sequence of unbounded length stops here.
    pub fn done(&self) -> bool {
        self.at >= self.data.len()
    }

    /// A read went past the end (it got a zero that is not in the input): a decoder looping
    /// until the bytes give something new stops here, since zeros never will.
    pub fn overran(&self) -> bool {
        self.at > self.data.len()
    }
}

#[cfg(test)]
mod tests {
    use super::Bytes;

    #[test]
    fn reads_in_order_then_zeros() {
        let mut b = Bytes::new(&[1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(b.u8(), 1);
        assert_eq!(b.u16(), 0x0203);
        assert!(!b.done());
        assert_eq!(b.u32(), 0x0405_0607);
        assert!(b.done() && !b.overran());
        assert_eq!(b.u64(), 0);
        assert!(b.overran());
        assert_eq!(b.bytes(3), vec![0, 0, 0]);
    }

    #[test]
    fn choices_from_one_byte() {
        let mut b = Bytes::new(&[7, 7, 3, 2, 0]);
        assert_eq!(b.below(5), 2);
        assert_eq!(b.below(0), 0);
        assert!(b.bool());
        assert_eq!(b.pick(&["a", "b"]), &"a");
        assert!(b.one_in(3));
        assert!(b.one_in(3), "past the end: zero");
    }
}
