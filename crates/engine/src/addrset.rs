//! Sets of IP addresses as sorted, disjoint, non-adjacent inclusive ranges, one list per family.
//!
//! Peer sets are the bulk of a rule set: a `namespaceSelector: {}` peer can hold every pod
//! address of the cluster. Ranges keep `ipBlock` arithmetic (`cidr` minus `except`) exact and
//! render directly to nftables interval sets or to CIDR lists for ipset.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::model::IpBlock;

/// Inclusive range of addresses of one family, as integers.
pub type Range<T> = (T, T);

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct AddrSet {
    v4: Vec<Range<u32>>,
    v6: Vec<Range<u128>>,
}

fn normalize<T: Copy + Ord + num::Step>(mut ranges: Vec<Range<T>>) -> Vec<Range<T>> {
    ranges.sort_unstable();
    let mut out: Vec<Range<T>> = Vec::with_capacity(ranges.len());
    for (lo, hi) in ranges {
        if let Some(last) = out.last_mut() {
            if T::succ_or_max(last.1) >= lo {
                if hi > last.1 {
                    last.1 = hi;
                }
                continue;
            }
        }
        out.push((lo, hi));
    }
    out
}

/// `set` minus `cut`, both sorted, disjoint and non-adjacent: one pass over both (a cut range
/// that ends before the current set range is never looked at again).
fn subtract<T: Copy + Ord + num::Step>(set: &[Range<T>], cut: &[Range<T>]) -> Vec<Range<T>> {
    let mut out = Vec::with_capacity(set.len());
    let mut c = 0;
    for &(lo, hi) in set {
        while c < cut.len() && cut[c].1 < lo {
            c += 1;
        }
        let mut start = lo;
        let mut alive = true;
        let mut k = c;
        while k < cut.len() && cut[k].0 <= hi {
            let (clo, chi) = cut[k];
            if clo > start {
                out.push((start, T::pred(clo)));
            }
            if chi >= hi {
                alive = false;
                break;
            }
            start = T::succ_or_max(chi);
            k += 1;
        }
        if alive {
            out.push((start, hi));
        }
    }
    out
}

/// The union of two normalized range lists, normalized: a merge of two sorted lists.
fn merge<T: Copy + Ord + num::Step>(a: &[Range<T>], b: &[Range<T>]) -> Vec<Range<T>> {
    let mut out: Vec<Range<T>> = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        let next = if j >= b.len() || (i < a.len() && a[i] <= b[j]) {
            i += 1;
            a[i - 1]
        } else {
            j += 1;
            b[j - 1]
        };
        match out.last_mut() {
            Some(last) if T::succ_or_max(last.1) >= next.0 => {
                if next.1 > last.1 {
                    last.1 = next.1;
                }
            }
            _ => out.push(next),
        }
    }
    out
}

fn contains<T: Copy + Ord>(set: &[Range<T>], x: T) -> bool {
    set.binary_search_by(|&(lo, hi)| {
        if hi < x {
            std::cmp::Ordering::Less
        } else if lo > x {
            std::cmp::Ordering::Greater
        } else {
            std::cmp::Ordering::Equal
        }
    })
    .is_ok()
}

/// Minimal integer helpers so the range code serves both families.
mod num {
    pub trait Step: Sized {
        fn succ_or_max(self) -> Self;
        fn pred(self) -> Self;
    }
    impl Step for u32 {
        fn succ_or_max(self) -> Self {
            self.saturating_add(1)
        }
        fn pred(self) -> Self {
            self - 1
        }
    }
    impl Step for u128 {
        fn succ_or_max(self) -> Self {
            self.saturating_add(1)
        }
        fn pred(self) -> Self {
            self - 1
        }
    }
}

fn v4_range(n: &Ipv4Net) -> Range<u32> {
    (u32::from(n.network()), u32::from(n.broadcast()))
}

fn v6_range(n: &Ipv6Net) -> Range<u128> {
    (u128::from(n.network()), u128::from(n.broadcast()))
}

/// Last address of the block of `2^k` addresses starting at the aligned `start`.
fn block_last(start: u128, k: u32) -> u128 {
    if k >= 128 {
        u128::MAX
    } else {
        start + ((1u128 << k) - 1)
    }
}

/// Splits an inclusive range into the fewest aligned CIDR blocks (`bits` = 32 or 128).
fn range_to_prefixes(lo: u128, hi: u128, bits: u32) -> Vec<(u128, u8)> {
    let mut out = Vec::new();
    let mut start = lo;
    loop {
        let mut k = if start == 0 {
            bits
        } else {
            start.trailing_zeros().min(bits)
        };
        while k > 0 && block_last(start, k) > hi {
            k -= 1;
        }
        out.push((start, (bits - k) as u8));
        let last = block_last(start, k);
        if last >= hi {
            break;
        }
        start = last + 1;
    }
    out
}

impl AddrSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// Every address of both families (`0.0.0.0/0` and `::/0`).
    pub fn everything() -> Self {
        Self {
            v4: vec![(0, u32::MAX)],
            v6: vec![(0, u128::MAX)],
        }
    }

    pub fn from_addrs<I: IntoIterator<Item = IpAddr>>(addrs: I) -> Self {
        let mut set = Self::new();
        for a in addrs {
            match a {
                IpAddr::V4(a) => set.v4.push((u32::from(a), u32::from(a))),
                IpAddr::V6(a) => set.v6.push((u128::from(a), u128::from(a))),
            }
        }
        set.v4 = normalize(std::mem::take(&mut set.v4));
        set.v6 = normalize(std::mem::take(&mut set.v6));
        set
    }

    pub fn from_net(net: &IpNet) -> Self {
        let mut set = Self::new();
        match net {
            IpNet::V4(n) => set.v4.push(v4_range(n)),
            IpNet::V6(n) => set.v6.push(v6_range(n)),
        }
        set
    }

    /// `cidr` minus every `except` (excepts of the other family are ignored). Linear in the
    /// number of excepts (after one sort).
    pub fn from_ip_block(block: &IpBlock) -> Self {
        let base = Self::from_net(&block.cidr);
        let cut = Self::union_of(block.except.iter().map(Self::from_net));
        base.difference(&cut)
    }

    /// The union of many sets at once. A few sets (a rule's peers) are merged pairwise, each
    /// merge linear in the ranges (they are sorted already); many (a rule with 40,000 ipBlock
    /// peers) are gathered, then sorted and merged once, not merged 40,000 times.
    pub fn union_of(sets: impl IntoIterator<Item = impl std::borrow::Borrow<AddrSet>>) -> AddrSet {
        /// Up to this many sets, pairwise linear merges beat one sort of everything.
        const MERGE_UP_TO: usize = 8;
        let sets: Vec<_> = sets.into_iter().collect();
        if sets.len() <= MERGE_UP_TO {
            let mut all = AddrSet::new();
            for s in &sets {
                all.union_with(s.borrow());
            }
            return all;
        }
        let mut all = AddrSet::new();
        for s in &sets {
            let s = s.borrow();
            all.v4.extend_from_slice(&s.v4);
            all.v6.extend_from_slice(&s.v6);
        }
        all.v4 = normalize(all.v4);
        all.v6 = normalize(all.v6);
        all
    }

    /// Adds `other` to this set (a linear merge of the two sorted range lists).
    pub fn union_with(&mut self, other: &AddrSet) {
        if other.is_empty() {
            return;
        }
        self.v4 = merge(&self.v4, &other.v4);
        self.v6 = merge(&self.v6, &other.v6);
    }

    pub fn difference(&self, other: &AddrSet) -> AddrSet {
        AddrSet {
            v4: subtract(&self.v4, &other.v4),
            v6: subtract(&self.v6, &other.v6),
        }
    }

    pub fn intersection(&self, other: &AddrSet) -> AddrSet {
        // A ∩ B = A − (A − B)
        self.difference(&self.difference(other))
    }

    pub fn contains(&self, addr: IpAddr) -> bool {
        match addr {
            IpAddr::V4(a) => contains(&self.v4, u32::from(a)),
            IpAddr::V6(a) => contains(&self.v6, u128::from(a)),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.v4.is_empty() && self.v6.is_empty()
    }

    pub fn has_v4(&self) -> bool {
        !self.v4.is_empty()
    }

    pub fn has_v6(&self) -> bool {
        !self.v6.is_empty()
    }

    /// IPv4 ranges, inclusive, for interval-set renderers.
    pub fn v4_ranges(&self) -> impl Iterator<Item = (Ipv4Addr, Ipv4Addr)> + '_ {
        self.v4
            .iter()
            .map(|&(lo, hi)| (Ipv4Addr::from(lo), Ipv4Addr::from(hi)))
    }

    /// IPv6 ranges, inclusive, for interval-set renderers.
    pub fn v6_ranges(&self) -> impl Iterator<Item = (Ipv6Addr, Ipv6Addr)> + '_ {
        self.v6
            .iter()
            .map(|&(lo, hi)| (Ipv6Addr::from(lo), Ipv6Addr::from(hi)))
    }

    /// The set as the fewest CIDR blocks of IPv4 (for ipset `hash:net`).
    pub fn v4_cidrs(&self) -> Vec<Ipv4Net> {
        self.v4
            .iter()
            .flat_map(|&(lo, hi)| range_to_prefixes(lo as u128, hi as u128, 32))
            .map(|(a, p)| Ipv4Net::new(Ipv4Addr::from(a as u32), p).expect("valid prefix"))
            .collect()
    }

    /// The set as the fewest CIDR blocks of IPv6.
    pub fn v6_cidrs(&self) -> Vec<Ipv6Net> {
        self.v6
            .iter()
            .flat_map(|&(lo, hi)| range_to_prefixes(lo, hi, 128))
            .map(|(a, p)| Ipv6Net::new(Ipv6Addr::from(a), p).expect("valid prefix"))
            .collect()
    }

    /// Number of ranges (a proxy for the size of the kernel set).
    pub fn range_count(&self) -> usize {
        self.v4.len() + self.v6.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn ip_block_except_is_exact() {
        let set = AddrSet::from_ip_block(&IpBlock {
            cidr: net("10.0.0.0/8"),
            except: vec![net("10.1.0.0/16"), net("10.0.0.5/32")],
        });
        assert!(set.contains("10.0.0.4".parse().unwrap()));
        assert!(!set.contains("10.0.0.5".parse().unwrap()));
        assert!(set.contains("10.0.0.6".parse().unwrap()));
        assert!(!set.contains("10.1.2.3".parse().unwrap()));
        assert!(set.contains("10.2.0.0".parse().unwrap()));
        assert!(!set.contains("11.0.0.0".parse().unwrap()));
        assert!(!set.contains("::1".parse().unwrap()));
        let cidrs: Vec<String> = set.v4_cidrs().iter().map(|c| c.to_string()).collect();
        assert!(cidrs.contains(&"10.0.0.6/31".to_string()), "{cidrs:?}");
        assert!(cidrs.contains(&"10.128.0.0/9".to_string()), "{cidrs:?}");
    }

    #[test]
    fn everything_to_cidrs() {
        let set = AddrSet::everything();
        assert_eq!(
            set.v4_cidrs(),
            vec!["0.0.0.0/0".parse::<Ipv4Net>().unwrap()]
        );
        assert_eq!(set.v6_cidrs(), vec!["::/0".parse::<Ipv6Net>().unwrap()]);
    }

    #[test]
    fn adjacent_addresses_merge() {
        let set = AddrSet::from_addrs(
            ["10.0.0.1", "10.0.0.2", "10.0.0.3", "fd00::1"]
                .iter()
                .map(|a| a.parse().unwrap()),
        );
        assert_eq!(set.range_count(), 2);
        assert_eq!(set.v4_cidrs().len(), 2); // .1/32 + .2/31
    }

    #[test]
    fn intersection_and_difference() {
        let a = AddrSet::from_net(&net("10.0.0.0/24"));
        let b = AddrSet::from_net(&net("10.0.0.128/25"));
        let i = a.intersection(&b);
        assert_eq!(i, b);
        let d = a.difference(&b);
        assert_eq!(d, AddrSet::from_net(&net("10.0.0.0/25")));
    }

    proptest::proptest! {
        #[test]
        fn cidrs_cover_exactly(lo in 0u32..=u32::MAX, len in 0u32..5000, probe in 0u32..=u32::MAX) {
            let hi = lo.saturating_add(len);
            let set = AddrSet { v4: vec![(lo, hi)], v6: vec![] };
            let cidrs = set.v4_cidrs();
            let inside = |x: u32| cidrs.iter().any(|c| c.contains(&Ipv4Addr::from(x)));
            for x in [lo, hi, probe, lo.saturating_sub(1), hi.saturating_add(1)] {
                proptest::prop_assert_eq!(inside(x), x >= lo && x <= hi);
            }
        }
    }

    /// The linear merge and subtraction agree with membership in a bitset, on a small universe
    /// where every address can be checked.
    mod algebra {
        use super::*;
        use proptest::prelude::*;

        fn arb_set() -> impl Strategy<Value = (AddrSet, [bool; 256])> {
            proptest::collection::vec((0u32..256, 0u32..16), 0..12).prop_map(|blocks| {
                let mut bits = [false; 256];
                let sets = blocks.iter().map(|&(lo, len)| {
                    let hi = (lo + len).min(255);
                    for b in &mut bits[lo as usize..=hi as usize] {
                        *b = true;
                    }
                    AddrSet {
                        v4: vec![(lo, hi)],
                        v6: vec![],
                    }
                });
                (AddrSet::union_of(sets.collect::<Vec<_>>()), bits)
            })
        }

        proptest! {
            #[test]
            fn union_and_difference_are_exact((a, abits) in arb_set(), (b, bbits) in arb_set()) {
                let mut u = a.clone();
                u.union_with(&b);
                let d = a.difference(&b);
                for x in 0u32..256 {
                    let addr = IpAddr::V4(Ipv4Addr::from(x));
                    let (ia, ib) = (abits[x as usize], bbits[x as usize]);
                    prop_assert_eq!(a.contains(addr), ia);
                    prop_assert_eq!(u.contains(addr), ia || ib);
                    prop_assert_eq!(d.contains(addr), ia && !ib);
                }
                // Normalized: sorted, disjoint, not adjacent.
                for w in u.v4.windows(2).chain(d.v4.windows(2)) {
                    prop_assert!(w[0].1.saturating_add(1) < w[1].0);
                }
            }
        }
    }
}
