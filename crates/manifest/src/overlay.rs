//! "The base plus these changes": the objects of some files (the *changes*) laid over a base —
//! manifest files (`netwarden diff -f BASE --with CHANGED`) or the live cluster (`diff --kube
//! --with`, `reach --kube -f`).
//!
//! Each object of the changes replaces the base's object of the same kind, namespace and name
//! (one the base does not have is added); an object annotated [`DELETE`]` = "true"` deletes the
//! base's object instead, and is an error when the base has no such object (a typo in a
//! deletion must not pass for "nothing changes"). An object the changes name but cannot load
//! (rejected by an error) still hides the base's version: its author meant to replace it, and
//! analysing the old one would answer a question nobody asked.
//!
//! Both views come from one first pass per file ([`FileRead`]): the base's files are read once
//! and assembled twice, as they are and without the objects the changes name.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use crate::assemble::{assemble, Part};
use crate::read::{DeleteMarker, FileRead, ObjectId, Outcome, DELETE};
use crate::{files, Inventory, LoadOptions, Problem, Severity};

/// The two views `netwarden diff` compares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Layered {
    /// The base as it is.
    pub base: Inventory,
    /// The base with the changes laid over it. Its problems are the base's (those of the
    /// objects that remain) and the changes'.
    pub changed: Inventory,
    /// Deletions naming no object of the base (errors, also in `changed.problems`).
    pub unmatched_deletions: Vec<Problem>,
}

/// One input step, in load order: a file's first pass, or a problem about the paths.
#[derive(Debug)]
pub(crate) enum Step {
    Problem(Problem),
    File(FileRead),
}

impl Step {
    fn part(&self) -> Part<'_> {
        match self {
            Step::Problem(p) => Part::Problem(p),
            Step::File(f) => Part::File(f),
        }
    }
}

/// Reads files and directories as `-f` does, one step per file or path problem.
pub(crate) fn read_paths(paths: &[PathBuf]) -> Vec<Step> {
    files::list(paths)
        .into_iter()
        .map(|listed| match listed {
            files::Listed::File(p) => Step::File(files::read_file(&p)),
            files::Listed::Missing { problem, .. }
            | files::Listed::Unlistable { problem, .. }
            | files::Listed::Note(problem) => Step::Problem(problem),
        })
        .collect()
}

/// The identity of an entry the changes name (replace or delete), if it has one.
fn named(outcome: &Outcome) -> Option<&ObjectId> {
    match outcome {
        Outcome::Loaded(object) => Some(&object.id),
        Outcome::Rejected(id) => Some(id),
        Outcome::Delete(marker) => Some(&marker.id),
        Outcome::Skipped | Outcome::Unidentified => None,
    }
}

/// `read` without the entries (object and problems) whose identity is in `hidden`; borrowed
/// when it has none.
fn without<'a>(read: &'a FileRead, hidden: &BTreeSet<&ObjectId>) -> Cow<'a, FileRead> {
    let hides = |outcome: &Outcome| named(outcome).is_some_and(|id| hidden.contains(id));
    if !read.entries.iter().any(|e| hides(&e.outcome)) {
        return Cow::Borrowed(read);
    }
    let mut kept = read.clone();
    kept.entries.retain(|e| !hides(&e.outcome));
    Cow::Owned(kept)
}

/// `read` without its deletion markers (consumed by [`lay_over`]); borrowed when it has none.
fn without_markers(read: &FileRead) -> Cow<'_, FileRead> {
    let marker = |outcome: &Outcome| matches!(outcome, Outcome::Delete(_));
    if !read.entries.iter().any(|e| marker(&e.outcome)) {
        return Cow::Borrowed(read);
    }
    let mut kept = read.clone();
    kept.entries.retain(|e| !marker(&e.outcome));
    Cow::Owned(kept)
}

/// The error for a deletion that names nothing in the base.
fn unmatched(marker: &DeleteMarker) -> Problem {
    Problem {
        file: marker.file.clone(),
        kind: marker.id.kind.to_string(),
        object: marker.label.clone(),
        field: format!("metadata.annotations.{DELETE}"),
        reason: "deletes nothing: the base has no such object".into(),
        severity: Severity::Error,
    }
}

/// The changed view: every base read without the objects `changes` name, then `changes`
/// (their deletion markers consumed). Returns it with the deletions that named nothing.
pub(crate) fn lay_over<'a>(
    base: impl IntoIterator<Item = Part<'a>>,
    changes: &[Step],
    opts: &LoadOptions,
) -> (Inventory, Vec<Problem>) {
    let change_reads = || {
        changes.iter().filter_map(|s| match s {
            Step::File(f) => Some(f),
            Step::Problem(_) => None,
        })
    };
    let hidden: BTreeSet<&ObjectId> = change_reads()
        .flat_map(|f| f.entries.iter().filter_map(|e| named(&e.outcome)))
        .collect();
    let base: Vec<Part<'a>> = base.into_iter().collect();
    let base_ids: BTreeSet<&ObjectId> = base
        .iter()
        .filter_map(|p| match p {
            Part::File(f) => Some(*f),
            Part::Problem(_) => None,
        })
        .flat_map(|f| f.entries.iter())
        .filter_map(|e| match &e.outcome {
            // A base marker is not an object of the base.
            Outcome::Delete(_) => None,
            other => named(other),
        })
        .collect();
    // One problem per marker (the first of duplicates), in the changes' order.
    let mut unmatched_deletions: BTreeMap<&ObjectId, Problem> = BTreeMap::new();
    let mut order = Vec::new();
    for entry in change_reads().flat_map(|f| &f.entries) {
        if let Outcome::Delete(marker) = &entry.outcome {
            if !base_ids.contains(&marker.id) && !unmatched_deletions.contains_key(&marker.id) {
                unmatched_deletions.insert(&marker.id, unmatched(marker));
                order.push(&marker.id);
            }
        }
    }
    let unmatched_deletions: Vec<Problem> = order
        .into_iter()
        .filter_map(|id| unmatched_deletions.remove(id))
        .collect();

    let kept: Vec<Cow<'_, FileRead>> = base
        .iter()
        .filter_map(|p| match p {
            Part::File(f) => Some(without(f, &hidden)),
            Part::Problem(_) => None,
        })
        .collect();
    let added: Vec<Cow<'_, FileRead>> = change_reads().map(without_markers).collect();
    let path_problems = base.iter().filter_map(|p| match p {
        Part::Problem(p) => Some(Part::Problem(p)),
        Part::File(_) => None,
    });
    let change_problems = changes.iter().filter_map(|s| match s {
        Step::Problem(p) => Some(Part::Problem(p)),
        Step::File(_) => None,
    });
    let parts = path_problems
        .chain(kept.iter().map(|f| Part::File(f)))
        .chain(change_problems)
        .chain(added.iter().map(|f| Part::File(f)))
        .chain(unmatched_deletions.iter().map(Part::Problem));
    (assemble(parts, opts), unmatched_deletions)
}

/// `netwarden diff -f BASE --with CHANGES`: the base files as they are, and with the changes
/// laid over them (see the [module documentation](self)). The base files are read once.
pub fn layer_paths(base: &[PathBuf], changes: &[PathBuf], opts: &LoadOptions) -> Layered {
    let base_steps = read_paths(base);
    let change_steps = read_paths(changes);
    let mut base_view = assemble(base_steps.iter().map(Step::part), opts);
    crate::warn_if_nothing_loaded(base, &mut base_view);
    let (changed, unmatched_deletions) =
        lay_over(base_steps.iter().map(Step::part), &change_steps, opts);
    Layered {
        base: base_view,
        changed,
        unmatched_deletions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::fs;

    fn write(dir: &std::path::Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        fs::write(&path, text).unwrap();
        path
    }

    const BASE: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: x, labels: {app: a}}
status: {podIPs: [{ip: 10.0.0.1}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: keep, namespace: x}
spec: {podSelector: {}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: gone, namespace: x}
spec: {podSelector: {}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: edit, namespace: x}
spec: {podSelector: {}}
"#;

    const CHANGES: &str = r#"
apiVersion: v1
kind: List
items:
- apiVersion: networking.k8s.io/v1
  kind: NetworkPolicy
  metadata: {name: gone, namespace: x, annotations: {netwarden.io/delete: "true"}}
- apiVersion: networking.k8s.io/v1
  kind: NetworkPolicy
  metadata: {name: typo, namespace: x, annotations: {netwarden.io/delete: "true"}}
- apiVersion: networking.k8s.io/v1
  kind: NetworkPolicy
  metadata: {name: edit, namespace: x}
  spec: {podSelector: {matchLabels: {app: a}}}
- apiVersion: networking.k8s.io/v1
  kind: NetworkPolicy
  metadata: {name: new, namespace: x}
  spec: {podSelector: {}}
"#;

    fn names(inv: &Inventory) -> Vec<String> {
        let mut names: Vec<String> = inv.policies.iter().map(|p| p.key.to_string()).collect();
        names.sort();
        names
    }

    #[test]
    fn changes_replace_add_and_delete() {
        let dir = netwarden_testing::TempDir::new("overlay");
        let base = write(&dir.path, "base.yaml", BASE);
        let changes = write(&dir.path, "changes.yaml", CHANGES);
        let layered = layer_paths(&[base], &[changes], &LoadOptions::default());
        assert_eq!(names(&layered.base), ["x/edit", "x/gone", "x/keep"]);
        assert_eq!(names(&layered.changed), ["x/edit", "x/keep", "x/new"]);
        let edited = layered
            .changed
            .policies
            .iter()
            .find(|p| p.key.name == "edit")
            .unwrap();
        assert!(!edited.pod_selector.is_empty(), "the changed version");
        // The typo is an error naming the object, in the changed view's problems too.
        assert_eq!(layered.unmatched_deletions.len(), 1);
        let problem = &layered.unmatched_deletions[0];
        assert_eq!(
            problem.to_string(),
            format!(
                "{}: NetworkPolicy x/typo: metadata.annotations.netwarden.io/delete: deletes \
                 nothing: the base has no such object",
                dir.path.join("changes.yaml").display()
            )
        );
        assert_eq!(problem.severity, Severity::Error);
        assert!(layered.changed.problems.contains(problem));
        assert!(
            layered.base.problems.is_empty(),
            "{:?}",
            layered.base.problems
        );
    }

    #[test]
    fn a_marker_outside_the_changes_is_ignored_with_a_warning() {
        let inv = crate::parse_str("f", CHANGES, &LoadOptions::default());
        assert_eq!(names(&inv), ["x/edit", "x/new"]);
        let warnings: Vec<String> = inv.problems.iter().map(|p| p.to_string()).collect();
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].starts_with(
            "f: NetworkPolicy x/gone: metadata.annotations.netwarden.io/delete: warning: \
             a deletion means something only"
        ));
    }

    #[test]
    fn a_bad_marker_value_is_an_error_and_loads_nothing() {
        let text = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: x, annotations: {netwarden.io/delete: "yes"}}
spec: {podSelector: {}}
"#;
        let inv = crate::parse_str("f", text, &LoadOptions::default());
        assert!(inv.policies.is_empty());
        assert_eq!(
            inv.problems[0].to_string(),
            "f: NetworkPolicy x/p: metadata.annotations.netwarden.io/delete: expected \"true\" \
             or \"false\", found \"yes\"; object ignored"
        );
        // "false" is no marker at all.
        let kept = crate::parse_str("f", &text.replace("yes", "false"), &LoadOptions::default());
        assert_eq!(names(&kept), ["x/p"]);
        assert!(kept.problems.is_empty());
    }
}
