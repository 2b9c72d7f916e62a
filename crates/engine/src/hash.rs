//! The project's one content hash: 64-bit FNV-1a, the same in every build and process. It
//! lives in the lowest crate so that every crate uses this one.
//!
//! Names derived from content outlive the process that chose them (nft sets `p4_<hash>`, ipsets
//! `nw4-<hash>`, NFLOG keys), so `std`'s `DefaultHasher`, whose output may change between Rust
//! releases, is not usable for them. The same hasher also fingerprints whole rulesets so an
//! unchanged one is not applied again.
//!
//! Not a cryptographic hash: every input is computed from objects netwarden already trusts to
//! describe themselves, and a collision is handled where it could matter (see `set_for` in the
//! nft renderer). Also used to notice that a manifest file's content changed.

use std::hash::{Hash, Hasher};

const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a, 64 bits, as a [`Hasher`] (for `#[derive(Hash)]` types).
#[derive(Debug, Clone, Copy)]
pub struct StableHasher(u64);

impl Default for StableHasher {
    fn default() -> Self {
        StableHasher(OFFSET)
    }
}

impl Hasher for StableHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(PRIME);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The hash of a byte string.
pub fn hash_bytes(bytes: &[u8]) -> u64 {
    let mut h = StableHasher::default();
    h.write(bytes);
    h.finish()
}

/// The hash of several byte strings, separated so that `("ab", "c")` and `("a", "bc")` differ.
pub fn hash_parts(parts: &[&[u8]]) -> u64 {
    let mut h = StableHasher::default();
    for part in parts {
        h.write(part);
        h.write(&[0xff]);
    }
    h.finish()
}

/// The hash of any hashable value (a whole ruleset, say).
pub fn content_hash<T: Hash + ?Sized>(value: &T) -> u64 {
    let mut h = StableHasher::default();
    value.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values_and_separation() {
        // Reference values of 64-bit FNV-1a.
        assert_eq!(hash_bytes(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(hash_bytes(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_ne!(hash_parts(&[b"ab", b"c"]), hash_parts(&[b"a", b"bc"]));
        assert_eq!(content_hash(&(1u8, "x")), content_hash(&(1u8, "x")));
        assert_ne!(content_hash(&(1u8, "x")), content_hash(&(2u8, "x")));
    }
}
