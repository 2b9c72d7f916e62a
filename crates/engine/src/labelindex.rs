//! Pods by label, per namespace: how a pod selector finds its pods without testing every pod
//! of the namespaces it looks in (issue 10, "selectors through indexes").
//!
//! Resolving a policy's pod peers used to test the selector against every pod of every
//! namespace the namespace selector admits: with 20,000 policies whose peers look across tens
//! of namespaces, that was most of the time on a 100,000-pod cluster. Here each namespace keeps
//! `label key → value → pods`, and a selector's equality requirements (`matchLabels`, `In`)
//! name a small candidate list; the selector is still tested on each candidate (the index only
//! narrows, it never decides), so the result is exactly brute-force selection — which
//! `tests/properties.rs` checks on random clusters.
//!
//! A selector with no equality requirement (empty, or only `NotIn`/`Exists`/`DoesNotExist`)
//! has no candidate list: every pod of the namespace is tested, as before.
//!
//! The engine files its pods' numbers, not their keys: four labels per pod filed as
//! `namespace/name` copies cost ~40 MiB at 100,000 pods, and a candidate key had to be looked
//! up by name again.

use std::collections::HashMap;

use crate::model::{LabelSelector, Labels, Operator};
use crate::sorted::{insert_sorted, remove_sorted};

/// Where a selector's pods are to be found in one namespace.
#[derive(Debug, PartialEq, Eq)]
pub enum Candidates<'a, T> {
    /// Only among these pods (sorted, possibly empty).
    Among(Vec<&'a T>),
    /// Among every pod of the namespace.
    Everyone,
}

/// `label key → value → pods` of one namespace. Pods are sorted `Vec`s: a value's pods are
/// few (an app's replicas) or the whole index is small.
type ByLabel<T> = HashMap<String, HashMap<String, Vec<T>>>;

/// The index of every namespace; `T` names a pod (its key, or the engine's number for it).
#[derive(Debug, Clone)]
pub struct LabelIndex<T> {
    namespaces: HashMap<String, ByLabel<T>>,
}

impl<T> Default for LabelIndex<T> {
    fn default() -> Self {
        Self {
            namespaces: HashMap::new(),
        }
    }
}

impl<T: Ord + Clone> LabelIndex<T> {
    /// Indexes `pod` of `namespace` under each of its `labels`.
    pub fn insert(&mut self, namespace: &str, pod: &T, labels: &Labels) {
        let by_label = self.namespaces.entry(namespace.to_string()).or_default();
        for (key, value) in labels {
            let pods = by_label
                .entry(key.clone())
                .or_default()
                .entry(value.clone())
                .or_default();
            insert_sorted(pods, pod.clone());
        }
    }

    /// Removes `pod` of `namespace` from under each of `labels` (those it was inserted with).
    pub fn remove(&mut self, namespace: &str, pod: &T, labels: &Labels) {
        let Some(by_label) = self.namespaces.get_mut(namespace) else {
            return;
        };
        for (key, value) in labels {
            let Some(values) = by_label.get_mut(key) else {
                continue;
            };
            if let Some(pods) = values.get_mut(value) {
                remove_sorted(pods, pod);
                if pods.is_empty() {
                    values.remove(value);
                }
            }
            if values.is_empty() {
                by_label.remove(key);
            }
        }
        if by_label.is_empty() {
            self.namespaces.remove(namespace);
        }
    }

    /// The pods of `namespace` with `key` = `value`.
    fn with(&self, namespace: &str, key: &str, value: &str) -> &[T] {
        self.namespaces
            .get(namespace)
            .and_then(|by_label| by_label.get(key))
            .and_then(|values| values.get(value))
            .map_or(&[], Vec::as_slice)
    }

    /// The pods of `namespace` that can match `selector`: the smallest list one of its
    /// equality requirements names (an `In` requirement names the union of its values' pods).
    /// Every pod that matches is among them; not every one among them matches.
    pub fn candidates(&self, namespace: &str, selector: &LabelSelector) -> Candidates<'_, T> {
        fn keep_smaller<'a, T>(best: &mut Option<Vec<&'a T>>, list: Vec<&'a T>) {
            if best.as_ref().is_none_or(|b| list.len() < b.len()) {
                *best = Some(list);
            }
        }
        let mut best: Option<Vec<&T>> = None;
        for (key, value) in &selector.match_labels {
            keep_smaller(&mut best, self.with(namespace, key, value).iter().collect());
        }
        for requirement in &selector.match_expressions {
            if requirement.operator != Operator::In {
                continue;
            }
            let mut union: Vec<&T> = Vec::new();
            for value in &requirement.values {
                union.extend(self.with(namespace, &requirement.key, value));
            }
            union.sort_unstable();
            union.dedup();
            keep_smaller(&mut best, union);
        }
        match best {
            Some(list) => Candidates::Among(list),
            None => Candidates::Everyone,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{PodKey, Requirement};
    use crate::testing::labels;

    fn key(name: &str) -> PodKey {
        PodKey::new("ns", name)
    }

    #[test]
    fn equality_requirements_narrow_and_the_rest_do_not() {
        let mut index = LabelIndex::default();
        index.insert(
            "ns",
            &key("a"),
            &labels(&[("app", "web"), ("tier", "front")]),
        );
        index.insert(
            "ns",
            &key("b"),
            &labels(&[("app", "web"), ("tier", "back")]),
        );
        index.insert("ns", &key("c"), &labels(&[("app", "db"), ("tier", "back")]));
        let only = |pairs: &[(&str, &str)]| LabelSelector {
            match_labels: labels(pairs),
            match_expressions: vec![],
        };
        let names = |c: Candidates<PodKey>| match c {
            Candidates::Among(list) => list.iter().map(|k| k.name.clone()).collect::<Vec<_>>(),
            Candidates::Everyone => vec!["*".to_string()],
        };
        assert_eq!(
            names(index.candidates("ns", &only(&[("app", "web")]))),
            ["a", "b"]
        );
        // The smallest list wins.
        assert_eq!(
            names(index.candidates("ns", &only(&[("app", "web"), ("tier", "front")]))),
            ["a"]
        );
        assert_eq!(
            names(index.candidates("ns", &only(&[("app", "none")]))),
            Vec::<String>::new()
        );
        assert_eq!(
            names(index.candidates("other", &only(&[("app", "web")]))),
            Vec::<String>::new()
        );
        let expr = |operator, values: &[&str]| LabelSelector {
            match_labels: Labels::new(),
            match_expressions: vec![Requirement {
                key: "app".into(),
                operator,
                values: values.iter().map(|v| v.to_string()).collect(),
            }],
        };
        assert_eq!(
            names(index.candidates("ns", &expr(Operator::In, &["db", "web"]))),
            ["a", "b", "c"]
        );
        assert_eq!(
            names(index.candidates("ns", &expr(Operator::NotIn, &["db"]))),
            ["*"]
        );
        assert_eq!(
            names(index.candidates("ns", &LabelSelector::everything())),
            ["*"]
        );

        index.remove(
            "ns",
            &key("a"),
            &labels(&[("app", "web"), ("tier", "front")]),
        );
        assert_eq!(
            names(index.candidates("ns", &only(&[("app", "web")]))),
            ["b"]
        );
        index.remove(
            "ns",
            &key("b"),
            &labels(&[("app", "web"), ("tier", "back")]),
        );
        index.remove("ns", &key("c"), &labels(&[("app", "db"), ("tier", "back")]));
        assert!(index.namespaces.is_empty(), "{index:?}");
    }
}
