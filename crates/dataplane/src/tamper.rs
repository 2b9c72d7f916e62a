//! What tamper repair finds (SPEC 5, "Tamper repair"): the differences between what a
//! dataplane applied to a pod netns and what the kernel holds there now, in terms both
//! backends share.
//!
//! A pod with `CAP_NET_ADMIN` in its own netns can change netwarden's rules there. The agent
//! learns *that* something may have changed from the kernel's notifications
//! ([`crate::watch`]) or its periodic verification, asks the backend to compare
//! ([`crate::Dataplane::verify`]), and when the backend finds [`Difference`]s, has it put back
//! exactly what it computed ([`crate::Dataplane::repair`]) and reports them.

use std::collections::BTreeSet;
use std::fmt;

/// Which parts of a netns's rules to compare with the kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyScope {
    /// The table's objects and rules (cheap: no set elements).
    pub rules: bool,
    /// Peer sets whose elements to compare (each is a listing of its elements).
    pub sets: BTreeSet<String>,
    /// Everything, elements of every set included (a lost notification, a periodic check).
    pub all: bool,
}

impl VerifyScope {
    /// Everything.
    pub fn all() -> VerifyScope {
        VerifyScope {
            all: true,
            ..VerifyScope::default()
        }
    }

    /// The rules and objects, without set elements.
    pub fn rules() -> VerifyScope {
        VerifyScope {
            rules: true,
            ..VerifyScope::default()
        }
    }

    /// Whether nothing is to be compared.
    pub fn is_empty(&self) -> bool {
        !self.rules && !self.all && self.sets.is_empty()
    }

    /// Adds what `other` asks for.
    pub fn merge(&mut self, other: VerifyScope) {
        self.rules |= other.rules;
        self.all |= other.all;
        self.sets.extend(other.sets);
    }
}

/// One part of what netwarden owns in a netns.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Part {
    /// The nft table `inet netwarden`.
    Table,
    /// A chain (nft) or an iptables chain, by name; a base chain's hook, type, priority and
    /// policy belong to it.
    Chain(String),
    /// The rules of a chain, in order.
    Rules(String),
    /// A set (nft) or an ipset, by name: its declaration.
    Set(String),
    /// The elements of a set, by the set's name.
    Elements(String),
    /// A named counter or limit.
    Object(String),
    /// The jump from a built-in chain (iptables `INPUT`/`OUTPUT`) to netwarden's chain, first
    /// in that chain.
    Jump(String),
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Part::Table => write!(f, "table"),
            Part::Chain(name) => write!(f, "chain {name}"),
            Part::Rules(name) => write!(f, "rules of chain {name}"),
            Part::Set(name) => write!(f, "set {name}"),
            Part::Elements(name) => write!(f, "elements of set {name}"),
            Part::Object(name) => write!(f, "object {name}"),
            Part::Jump(name) => write!(f, "jump from {name}"),
        }
    }
}

/// How the kernel's content differs from what was applied.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Difference {
    /// Applied, not in the kernel any more.
    Missing(Part),
    /// In the kernel, not applied.
    Extra(Part),
    /// In both, not the same.
    Changed(Part),
    /// The kernel's rules could not be read or understood (why): what they let through is
    /// unknown, so they are treated as changed and put back (fail closed).
    Unreadable(String),
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Difference::Missing(part) => write!(f, "{part} missing"),
            Difference::Extra(part) => write!(f, "{part} added"),
            Difference::Changed(part) => write!(f, "{part} changed"),
            Difference::Unreadable(why) => write!(f, "rules unreadable ({why})"),
        }
    }
}

/// The differences as one line: `"chain in_0 missing; elements of set p4_… changed"`, at most
/// `max` of them named (a flushed ruleset differs everywhere).
pub fn summary(differences: &[Difference], max: usize) -> String {
    let mut out: Vec<String> = differences
        .iter()
        .take(max)
        .map(|d| d.to_string())
        .collect();
    if differences.len() > max {
        out.push(format!("and {} more", differences.len() - max));
    }
    out.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_merge_and_summaries_are_bounded() {
        let mut scope = VerifyScope::default();
        assert!(scope.is_empty());
        scope.merge(VerifyScope {
            sets: ["a".to_string()].into(),
            ..VerifyScope::default()
        });
        scope.merge(VerifyScope::rules());
        assert!(scope.rules && !scope.all && scope.sets.len() == 1);
        let d = vec![
            Difference::Missing(Part::Table),
            Difference::Extra(Part::Chain("sneaky".into())),
            Difference::Changed(Part::Elements("p4_1".into())),
        ];
        assert_eq!(
            summary(&d, 2),
            "table missing; chain sneaky added; and 1 more"
        );
        assert_eq!(summary(&d[2..], 5), "elements of set p4_1 changed");
    }
}
