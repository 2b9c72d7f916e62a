//! [`Labels`]: an object's labels (or a selector's `matchLabels`) as one sorted vector.
//!
//! Objects carry a handful of labels, and a node agent holds every pod of the cluster: a
//! `BTreeMap` gives each non-empty map a node of eleven key and value slots (544 bytes), which
//! was most of what a pod's labels cost. A sorted vector holds what is there (48 bytes a label,
//! one allocation) and answers the same questions: lookup by binary search, iteration in key
//! order (so output stays deterministic, and order, equality and hashing are those of the map
//! it replaces).

use std::borrow::Borrow;
use std::fmt;

use serde::ser::{Serialize, SerializeMap, Serializer};

/// Label key → value, sorted by key, each key once.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Labels(Vec<(String, String)>);

/// Iterates a [`Labels`] in key order.
pub type Iter<'a> = std::iter::Map<
    std::slice::Iter<'a, (String, String)>,
    fn(&'a (String, String)) -> (&'a String, &'a String),
>;

impl Labels {
    pub const fn new() -> Self {
        Labels(Vec::new())
    }

    fn position<Q>(&self, key: &Q) -> Result<usize, usize>
    where
        String: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.0.binary_search_by(|(k, _)| k.borrow().cmp(key))
    }

    pub fn get<Q>(&self, key: &Q) -> Option<&String>
    where
        String: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.position(key).ok().map(|i| &self.0[i].1)
    }

    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        String: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.position(key).is_ok()
    }

    /// Sets `key` to `value`; the value it had, if any.
    pub fn insert(&mut self, key: String, value: String) -> Option<String> {
        match self.position(&key) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, value)),
            Err(i) => {
                self.0.insert(i, (key, value));
                None
            }
        }
    }

    pub fn remove<Q>(&mut self, key: &Q) -> Option<String>
    where
        String: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.position(key).ok().map(|i| self.0.remove(i).1)
    }

    /// Gives back the room a map built label by label grew beyond its labels (a node agent
    /// holds one map per pod of the cluster).
    pub fn shrink_to_fit(&mut self) {
        self.0.shrink_to_fit();
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> Iter<'_> {
        fn pair((k, v): &(String, String)) -> (&String, &String) {
            (k, v)
        }
        self.0
            .iter()
            .map(pair as fn(&(String, String)) -> (&String, &String))
    }

    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &String> + ExactSizeIterator {
        self.0.iter().map(|(k, _)| k)
    }
}

impl<Q> std::ops::Index<&Q> for Labels
where
    String: Borrow<Q>,
    Q: Ord + ?Sized,
{
    type Output = String;

    /// The value of `key`; panics when there is none, as a map does.
    fn index(&self, key: &Q) -> &String {
        self.get(key).expect("no label with this key")
    }
}

impl FromIterator<(String, String)> for Labels {
    /// Like a map: a key given twice keeps its last value.
    fn from_iter<I: IntoIterator<Item = (String, String)>>(iter: I) -> Self {
        let mut labels = Labels::new();
        labels.extend(iter);
        labels
    }
}

impl Extend<(String, String)> for Labels {
    fn extend<I: IntoIterator<Item = (String, String)>>(&mut self, iter: I) {
        for (k, v) in iter {
            self.insert(k, v);
        }
        self.0.shrink_to_fit();
    }
}

impl<const N: usize> From<[(String, String); N]> for Labels {
    fn from(pairs: [(String, String); N]) -> Self {
        pairs.into_iter().collect()
    }
}

impl<'a> IntoIterator for &'a Labels {
    type Item = (&'a String, &'a String);
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl IntoIterator for Labels {
    type Item = (String, String);
    type IntoIter = std::vec::IntoIter<(String, String)>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl fmt::Debug for Labels {
    /// As the map it stands for: `{"app": "web"}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl Serialize for Labels {
    /// As a map, in key order.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.len()))?;
        for (k, v) in self {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn behaves_as_the_map_it_replaces() {
        let input = pairs(&[("tier", "db"), ("app", "web"), ("tier", "api"), ("b", "")]);
        let labels: Labels = input.clone().into_iter().collect();
        let map: BTreeMap<String, String> = input.into_iter().collect();
        assert_eq!(labels.len(), map.len());
        assert!(labels.iter().eq(map.iter()), "same pairs, same order");
        assert_eq!(labels.get("tier"), map.get("tier"));
        assert_eq!(labels.get("none"), None);
        assert!(labels.contains_key(&"app".to_string()));
        assert_eq!(
            serde_json::to_string(&labels).unwrap(),
            serde_json::to_string(&map).unwrap()
        );
        assert_eq!(format!("{labels:?}"), format!("{map:?}"));
        let mut changed = labels.clone();
        assert_eq!(changed.insert("app".into(), "x".into()), Some("web".into()));
        assert_eq!(changed.insert("a".into(), "1".into()), None);
        assert_eq!(
            changed.keys().collect::<Vec<_>>(),
            ["a", "app", "b", "tier"]
        );
        assert_eq!(changed.remove("b"), Some(String::new()));
        assert_eq!(changed.remove("b"), None);
    }

    #[test]
    fn order_and_equality_follow_the_pairs() {
        let a: Labels = pairs(&[("app", "a")]).into_iter().collect();
        let b: Labels = pairs(&[("app", "b")]).into_iter().collect();
        let ma: BTreeMap<String, String> = pairs(&[("app", "a")]).into_iter().collect();
        let mb: BTreeMap<String, String> = pairs(&[("app", "b")]).into_iter().collect();
        assert_eq!(a.cmp(&b), ma.cmp(&mb));
        assert_eq!(Labels::new().cmp(&a), BTreeMap::new().cmp(&ma));
        assert_ne!(a, b);
    }
}
