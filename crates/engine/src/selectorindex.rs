//! Things that select pods (policy rules, peer sets, Services), by the pods they can select:
//! the reverse of [`crate::labelindex`] (issue 10, "incremental stays incremental").
//!
//! When one pod changes, the engine must find the cached results that could change with it.
//! Testing every cached rule against the pod cost ~26,000 tests per pod event at 100,000 pods
//! and 20,000 policies (tens of milliseconds). Here each selector is filed under one
//! equality requirement of its namespace part and one of its pod part (`app=web` in namespaces
//! with `team=a`), and a pod looks up only the buckets its own labels and its namespace's
//! labels name: a few hash lookups, whatever the number of selectors. Like the label index,
//! this one only narrows: a candidate is still tested in full by the caller, and every
//! selector that can select the pod is among the candidates (`tests/properties.rs` checks it
//! against brute force on random clusters).
//!
//! Buckets depend only on the selectors, never on which namespaces exist or what they are
//! labelled: a namespace relabel needs no re-filing (the lookup reads the namespace's labels
//! as they are then).

use std::collections::HashMap;

use crate::model::{LabelSelector, Labels, Operator};
use crate::sorted::remove_sorted;

/// Where a selector looks for pods: the namespace part and the pod part.
#[derive(Debug, Clone, Copy)]
pub struct Reach<'a> {
    /// Without a namespace selector, the one namespace it looks in (a policy's own).
    pub namespace: &'a str,
    pub namespace_selector: Option<&'a LabelSelector>,
    /// `None` selects every pod (as an empty selector does).
    pub pod_selector: Option<&'a LabelSelector>,
}

/// One equality requirement a selector is filed under, or none (every value goes).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Labelled(String, String),
    Any,
}

/// The parts a selector is filed under: every value of its first equality requirement (one
/// for `matchLabels`, each value for `In`), or [`Part::Any`] without one. A label set that
/// the selector matches carries one of these parts (or the selector is filed under `Any`).
fn parts(selector: Option<&LabelSelector>) -> Vec<Part> {
    let Some(selector) = selector else {
        return vec![Part::Any];
    };
    if let Some((key, value)) = selector.match_labels.iter().next() {
        return vec![Part::Labelled(key.clone(), value.clone())];
    }
    let first_in = selector
        .match_expressions
        .iter()
        .find(|r| r.operator == Operator::In);
    match first_in {
        // `In` with no values matches nothing: filed nowhere.
        Some(requirement) => requirement
            .values
            .iter()
            .map(|v| Part::Labelled(requirement.key.clone(), v.clone()))
            .collect(),
        None => vec![Part::Any],
    }
}

/// Items by the pod part of their selectors.
#[derive(Debug, Clone)]
struct PodBuckets<T> {
    labelled: HashMap<String, HashMap<String, Vec<T>>>,
    any: Vec<T>,
}

impl<T> Default for PodBuckets<T> {
    fn default() -> Self {
        Self {
            labelled: HashMap::new(),
            any: Vec::new(),
        }
    }
}

impl<T: Ord + Clone> PodBuckets<T> {
    fn bucket(&mut self, part: &Part) -> &mut Vec<T> {
        match part {
            Part::Labelled(k, v) => self
                .labelled
                .entry(k.clone())
                .or_default()
                .entry(v.clone())
                .or_default(),
            Part::Any => &mut self.any,
        }
    }

    /// Removes one filing of `item` from the bucket of `part`.
    fn remove(&mut self, item: &T, part: &Part) {
        match part {
            Part::Labelled(k, v) => {
                if let Some(values) = self.labelled.get_mut(k) {
                    if let Some(items) = values.get_mut(v) {
                        remove_sorted(items, item);
                        if items.is_empty() {
                            values.remove(v);
                        }
                    }
                    if values.is_empty() {
                        self.labelled.remove(k);
                    }
                }
            }
            Part::Any => remove_sorted(&mut self.any, item),
        }
    }

    /// Removes one filing of `item` under each of `parts`; whether nothing is left at all.
    fn remove_all(&mut self, item: &T, parts: &[Part]) -> bool {
        for part in parts {
            self.remove(item, part);
        }
        self.labelled.is_empty() && self.any.is_empty()
    }

    fn collect<'a>(&'a self, pod_labels: &Labels, out: &mut Vec<&'a T>) {
        out.extend(&self.any);
        for (key, value) in pod_labels {
            if let Some(items) = self.labelled.get(key).and_then(|values| values.get(value)) {
                out.extend(items);
            }
        }
    }
}

/// The index: items filed by (namespace part, pod part).
#[derive(Debug, Clone)]
pub struct SelectorIndex<T> {
    /// Selectors without a namespace selector, by the namespace they look in.
    named: HashMap<String, PodBuckets<T>>,
    /// Namespace selectors with an equality requirement, by it.
    labelled: HashMap<String, HashMap<String, PodBuckets<T>>>,
    /// Namespace selectors without one (every namespace may match).
    any: PodBuckets<T>,
}

impl<T> Default for SelectorIndex<T> {
    fn default() -> Self {
        Self {
            named: HashMap::new(),
            labelled: HashMap::new(),
            any: PodBuckets::default(),
        }
    }
}

impl<T: Ord + Clone> SelectorIndex<T> {
    /// Files `item` as selecting through `reach` (an item may be filed several times, under
    /// several reaches; each is removed with the reach it was filed with).
    pub fn insert(&mut self, item: &T, reach: Reach<'_>) {
        let pod_parts = parts(reach.pod_selector);
        for namespace_part in self.namespace_parts(reach) {
            let buckets = match &namespace_part {
                None => self.named.entry(reach.namespace.to_string()).or_default(),
                Some(Part::Labelled(k, v)) => self
                    .labelled
                    .entry(k.clone())
                    .or_default()
                    .entry(v.clone())
                    .or_default(),
                Some(Part::Any) => &mut self.any,
            };
            for part in &pod_parts {
                // Sorted, duplicates kept: an item filed twice under one bucket (two peers
                // of one rule alike) is removed once per filing.
                let items = buckets.bucket(part);
                let at = items.partition_point(|x| x < item);
                items.insert(at, item.clone());
            }
        }
    }

    /// Removes one filing of `item` made with `reach`.
    pub fn remove(&mut self, item: &T, reach: Reach<'_>) {
        let pod_parts = parts(reach.pod_selector);
        for namespace_part in self.namespace_parts(reach) {
            match &namespace_part {
                None => {
                    if let Some(buckets) = self.named.get_mut(reach.namespace) {
                        if buckets.remove_all(item, &pod_parts) {
                            self.named.remove(reach.namespace);
                        }
                    }
                }
                Some(Part::Labelled(k, v)) => {
                    if let Some(values) = self.labelled.get_mut(k) {
                        if let Some(buckets) = values.get_mut(v) {
                            if buckets.remove_all(item, &pod_parts) {
                                values.remove(v);
                            }
                        }
                        if values.is_empty() {
                            self.labelled.remove(k);
                        }
                    }
                }
                Some(Part::Any) => {
                    self.any.remove_all(item, &pod_parts);
                }
            }
        }
    }

    /// The namespace parts of `reach`: `None` for "the one namespace named".
    fn namespace_parts(&self, reach: Reach<'_>) -> Vec<Option<Part>> {
        match reach.namespace_selector {
            None => vec![None],
            Some(selector) => parts(Some(selector)).into_iter().map(Some).collect(),
        }
    }

    /// Every item that can select a pod of `namespace` (labelled `namespace_labels`) with
    /// `pod_labels`, sorted, each once (a superset: the caller tests each).
    pub fn candidates(
        &self,
        namespace: &str,
        namespace_labels: &Labels,
        pod_labels: &Labels,
    ) -> Vec<&T> {
        let mut out = Vec::new();
        if let Some(buckets) = self.named.get(namespace) {
            buckets.collect(pod_labels, &mut out);
        }
        self.any.collect(pod_labels, &mut out);
        for (key, value) in namespace_labels {
            if let Some(buckets) = self.labelled.get(key).and_then(|values| values.get(value)) {
                buckets.collect(pod_labels, &mut out);
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Requirement;
    use crate::testing::labels;

    fn only(pairs: &[(&str, &str)]) -> LabelSelector {
        LabelSelector {
            match_labels: labels(pairs),
            match_expressions: vec![],
        }
    }

    #[test]
    fn a_pod_finds_the_selectors_that_can_select_it() {
        let mut index: SelectorIndex<u32> = SelectorIndex::default();
        let web = only(&[("app", "web")]);
        let team_a = only(&[("team", "a")]);
        let not_db = LabelSelector {
            match_labels: Labels::new(),
            match_expressions: vec![Requirement {
                key: "app".into(),
                operator: Operator::NotIn,
                values: vec!["db".into()],
            }],
        };
        let in_web_api = LabelSelector {
            match_labels: Labels::new(),
            match_expressions: vec![Requirement {
                key: "app".into(),
                operator: Operator::In,
                values: vec!["web".into(), "api".into()],
            }],
        };
        let reach = |namespace_selector, pod_selector| Reach {
            namespace: "ns1",
            namespace_selector,
            pod_selector,
        };
        index.insert(&1, reach(None, Some(&web)));
        index.insert(&2, reach(Some(&team_a), Some(&web)));
        index.insert(&3, reach(Some(&not_db), None));
        index.insert(&4, reach(None, Some(&in_web_api)));
        index.insert(&5, reach(None, None));
        let ns = |team: &str| labels(&[("team", team)]);
        let found = |namespace: &str, ns_labels: &Labels, pod: &[(&str, &str)]| {
            index
                .candidates(namespace, ns_labels, &labels(pod))
                .into_iter()
                .copied()
                .collect::<Vec<_>>()
        };
        assert_eq!(found("ns1", &ns("a"), &[("app", "web")]), [1, 2, 3, 4, 5]);
        assert_eq!(found("ns1", &ns("b"), &[("app", "api")]), [3, 4, 5]);
        assert_eq!(found("ns2", &ns("a"), &[("app", "web")]), [2, 3]);
        assert_eq!(found("ns2", &ns("b"), &[("app", "db")]), [3]);

        for (item, r) in [
            (1, reach(None, Some(&web))),
            (2, reach(Some(&team_a), Some(&web))),
            (3, reach(Some(&not_db), None)),
            (4, reach(None, Some(&in_web_api))),
            (5, reach(None, None)),
        ] {
            index.remove(&item, r);
        }
        assert!(
            index.named.is_empty() && index.labelled.is_empty(),
            "{index:?}"
        );
        assert!(index.any.labelled.is_empty() && index.any.any.is_empty());
    }

    #[test]
    fn an_item_filed_twice_stays_until_removed_twice() {
        let mut index: SelectorIndex<u32> = SelectorIndex::default();
        let web = only(&[("app", "web")]);
        let reach = Reach {
            namespace: "ns1",
            namespace_selector: None,
            pod_selector: Some(&web),
        };
        index.insert(&7, reach);
        index.insert(&7, reach);
        index.remove(&7, reach);
        let pod = labels(&[("app", "web")]);
        assert_eq!(index.candidates("ns1", &Labels::new(), &pod), [&7]);
        index.remove(&7, reach);
        assert!(index.candidates("ns1", &Labels::new(), &pod).is_empty());
    }
}
