//! A small deterministic random source (no randomness crate): the same seed gives the same
//! cases, kill points and churn on every run, so a failure can be replayed.

/// A 64-bit linear congruential generator (Knuth's MMIX constants).
pub struct Lcg(u64);

impl Lcg {
    pub fn new(seed: u64) -> Lcg {
        Lcg(seed)
    }

    fn step(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        ((self.step() >> 33) % n.max(1) as u64) as usize
    }

    /// `n` bytes, the top byte of each step.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| (self.step() >> 56) as u8).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::Lcg;

    #[test]
    fn the_same_seed_gives_the_same_numbers() {
        let (mut a, mut b) = (Lcg::new(7), Lcg::new(7));
        let xs: Vec<usize> = (0..20).map(|_| a.below(10)).collect();
        assert_eq!(xs, (0..20).map(|_| b.below(10)).collect::<Vec<_>>());
        assert!(xs.iter().all(|&x| x < 10));
        assert_eq!(Lcg::new(1).below(0), 0);
        assert_eq!(Lcg::new(3).bytes(4), Lcg::new(3).bytes(4));
    }
}
