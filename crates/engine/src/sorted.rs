//! Sorted `Vec`s as small sets: the indexes keyed by address or unit hold one item almost
//! always, where a `BTreeSet` costs a node of eleven slots (~700 bytes) per key.

/// Adds `item` to the sorted `list` unless it is there.
pub fn insert_sorted<T: Ord>(list: &mut Vec<T>, item: T) {
    if let Err(at) = list.binary_search(&item) {
        list.insert(at, item);
    }
}

/// Removes `item` from the sorted `list` if it is there.
pub fn remove_sorted<T: Ord>(list: &mut Vec<T>, item: &T) {
    if let Ok(at) = list.binary_search(item) {
        list.remove(at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sorted_vec_behaves_as_a_set() {
        let mut v = Vec::new();
        for x in [3, 1, 2, 3, 1] {
            insert_sorted(&mut v, x);
        }
        assert_eq!(v, [1, 2, 3]);
        remove_sorted(&mut v, &2);
        remove_sorted(&mut v, &9);
        assert_eq!(v, [1, 3]);
    }
}
