//! `netwarden promote NS/NAME` (or `Kind/NAME` for a cluster-scoped admin policy, SPEC 8):
//! switch one monitored policy to enforce, in a manifest file or in the cluster.
//!
//! In a file, only the values of the mode annotations of that one object change
//! (`netwarden.io/mode: monitor` → `enforce`, kube-router's `monitor`/`staged` `"true"` →
//! `"false"`); every other byte — comments, formatting, other documents — stays. There is no
//! YAML writer that keeps all of that, so the edit is found and then proven by the loader
//! itself:
//! 1. every place in the text where a mode key is followed by a value is a candidate;
//! 2. a candidate is the target's when changing its value alone changes the target policy's
//!    mode and nothing else the loader reads (a key in another object, in a comment or in a
//!    string changes something else, or nothing);
//! 3. with all the target's candidates changed, the file must load into exactly what it loaded
//!    into before, except the target's mode, now enforce — or nothing is written.
//!
//! In a cluster, the same change is one JSON merge patch of the annotations, with the
//! `resourceVersion` read as a precondition ([`netwarden_kube::merge_patch`]); an admin
//! policy's object is cluster-scoped (named without a namespace).
//!
//! A namespaced policy is `NS/NAME`, an admin policy `Kind/NAME` — as its would-deny events
//! and status records name it; a kind is never a namespace name, so the two cannot be taken
//! for one another.
//!
//! Pure functions decide ([`plan_text`], [`annotation_patch`], [`check_ready`]); around them,
//! [`plan_files`] and [`plan_cluster`] find the one file or object to change and build the
//! change, [`write_atomically`] and [`apply_cluster`] make it. The command (the binary) reads
//! the arguments and prints.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use netwarden_engine::{AdminKind, AdminRef, Mode, MonitoredRef, ObjectKey, Policy, PolicyKind};
use netwarden_manifest::{parse_str, Inventory, LoadOptions};
use netwarden_manifest::{KUBE_ROUTER_MONITOR, KUBE_ROUTER_STAGED, MODE};
use netwarden_monitor::{PolicyStatus, Report};
use serde_json::{json, Map, Value};

/// The mode annotation keys, each with the value that means enforce.
const MODE_KEYS: [(&str, &str); 3] = [
    (MODE, "enforce"),
    (KUBE_ROUTER_MONITOR, "false"),
    (KUBE_ROUTER_STAGED, "false"),
];

/// The policy kinds, as `kind:` names them.
const POLICY_KINDS: [PolicyKind; 3] = [
    PolicyKind::NetworkPolicy,
    PolicyKind::MultiNetworkPolicy,
    PolicyKind::DanmNetworkPolicy,
];

/// The policy kind that `kind:` names `name`, if `name` is one.
pub fn policy_kind(name: &str) -> Option<PolicyKind> {
    POLICY_KINDS.into_iter().find(|k| k.as_str() == name)
}

/// A kind `--kind` names: namespaced or admin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetKind {
    Namespaced(PolicyKind),
    Admin(AdminKind),
}

impl TargetKind {
    /// The kind `kind:` names `name`, if it is a policy kind.
    pub fn parse(name: &str) -> Option<TargetKind> {
        policy_kind(name)
            .map(TargetKind::Namespaced)
            .or_else(|| AdminKind::from_name(name).map(TargetKind::Admin))
    }
}

/// Which policy to promote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `NS/NAME`, of `kind` when given (`None`: any kind, as long as only one policy has this
    /// namespace and name).
    Namespaced {
        key: ObjectKey,
        kind: Option<PolicyKind>,
    },
    /// `Kind/NAME`: a cluster-scoped admin policy, whose kind is part of its name.
    Admin(AdminRef),
}

impl Target {
    /// The policy `policy` names: `NS/NAME`, or `Kind/NAME` for an admin policy (`NAME` alone
    /// when `kind` is an admin kind); of `kind` when given.
    pub fn parse(policy: &str, kind: Option<TargetKind>) -> Result<Target, PromoteError> {
        let bad = |why: &'static str| PromoteError::BadName {
            given: policy.to_owned(),
            why,
        };
        let admin = |kind: AdminKind, name: &str| {
            Target::Admin(AdminRef {
                kind,
                name: name.to_owned(),
            })
        };
        let split = policy
            .split_once('/')
            .filter(|(first, name)| !first.is_empty() && !name.is_empty() && !name.contains('/'));
        let named = split.and_then(|(first, name)| AdminKind::from_name(first).map(|k| (k, name)));
        match (kind, named, split) {
            (None, Some((named, name)), _) => Ok(admin(named, name)),
            (Some(TargetKind::Admin(given)), Some((named, name)), _) if named == given => {
                Ok(admin(named, name))
            }
            (Some(_), Some(_), _) => Err(bad("names another kind than --kind")),
            (Some(TargetKind::Admin(given)), None, _)
                if !policy.is_empty() && !policy.contains('/') =>
            {
                Ok(admin(given, policy))
            }
            (Some(TargetKind::Admin(_)), None, _) => Err(bad(
                "an admin policy is cluster-scoped: give it as NAME or Kind/NAME",
            )),
            (kind, None, Some((ns, name))) => Ok(Target::Namespaced {
                key: ObjectKey::new(ns, name),
                kind: match kind {
                    Some(TargetKind::Namespaced(k)) => Some(k),
                    _ => None,
                },
            }),
            (_, None, None) => Err(bad(
                "give the policy as NS/NAME, or an admin policy as Kind/NAME",
            )),
        }
    }

    fn matches(&self, p: &Policy) -> bool {
        match self {
            Target::Namespaced { key, kind } => p.key == *key && kind.is_none_or(|k| k == p.kind),
            Target::Admin(_) => false,
        }
    }

    /// Whether the policy may be of the kind `kind:` names `kind`.
    fn may_be(&self, kind: &str) -> bool {
        match self {
            Target::Namespaced { kind: want, .. } => {
                policy_kind(kind).is_some_and(|k| want.is_none_or(|w| w == k))
            }
            Target::Admin(r) => r.kind.as_str() == kind,
        }
    }

    /// Whether the kind was given (then a cluster not serving it is an error).
    fn kind_given(&self) -> bool {
        match self {
            Target::Namespaced { kind, .. } => kind.is_some(),
            Target::Admin(_) => true,
        }
    }

    /// The object's namespace (`None`: cluster-scoped) and name.
    fn object_name(&self) -> (Option<&str>, &str) {
        match self {
            Target::Namespaced { key, .. } => (Some(&key.namespace), &key.name),
            Target::Admin(r) => (None, &r.name),
        }
    }

    /// The policy as the events, the status records and `report` name it: `ns/name`, or
    /// `Kind/name` for an admin policy.
    pub fn event_name(&self) -> String {
        match self {
            Target::Namespaced { key, .. } => key.to_string(),
            Target::Admin(r) => r.to_string(),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Namespaced {
                key,
                kind: Some(kind),
            } => write!(f, "{kind} {key}"),
            Target::Namespaced { key, kind: None } => write!(f, "policy {key}"),
            Target::Admin(r) => write!(f, "{} {}", r.kind, r.name),
        }
    }
}

/// Why a policy cannot be promoted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PromoteError {
    #[error("{given:?}: {why}")]
    BadName { given: String, why: &'static str },
    #[error("{target}: not found in {place}")]
    NotFound { target: String, place: String },
    #[error("{target} is ambiguous: {found} (name it with --kind)")]
    Ambiguous { target: String, found: String },
    #[error("{target} is in several files: {files} (give only the one to edit)")]
    SeveralFiles { target: String, files: String },
    #[error("{target}: the events name no such policy")]
    NotInEvents { target: String },
    #[error("{target} is not ready to promote: {reason}")]
    NotReady { target: String, reason: String },
    #[error("{}: not monitored (its mode annotations say enforce)", .policy.object())]
    NotMonitored { policy: MonitoredRef },
    #[error("{} in {file}: no mode annotation in the text could be changed alone (written in a way this command does not edit); change it by hand", .policy.object())]
    NoEdit { policy: MonitoredRef, file: String },
    #[error("{} in {file}: the edited file would load differently beyond the mode of this policy; nothing written", .policy.object())]
    Unverified { policy: MonitoredRef, file: String },
    #[error("{}: still monitored after the patch", .policy.object())]
    StillMonitored { policy: MonitoredRef },
}

/// One replaced value: `range` of the original text becomes `new`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueEdit {
    pub range: Range<usize>,
    pub old: String,
    pub new: String,
}

/// The change to one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEdit {
    pub policy: MonitoredRef,
    pub edits: Vec<ValueEdit>,
    pub text: String,
}

/// Where a key's value stands in the text: plain, `'single'` or `"double"` quoted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quote {
    Plain,
    Single,
    Double,
}

/// Every value following one of [`MODE_KEYS`] (`key: value`, the key optionally quoted, as in
/// YAML block and flow mappings and in JSON), with the value that means enforce, written in the
/// same quotes. Occurrences in a comment are skipped (the loader-based check would reject them
/// anyway: they change nothing).
fn candidates(text: &str) -> Vec<ValueEdit> {
    let mut out = Vec::new();
    for (key, enforce) in MODE_KEYS {
        for (at, _) in text.match_indices(key) {
            let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
            if text[line_start..at].contains('#') {
                continue;
            }
            let mut rest = at + key.len();
            let bytes = text.as_bytes();
            if matches!(bytes.get(rest), Some(b'"' | b'\'')) {
                rest += 1;
            }
            let after_key = &text[rest..];
            let Some(after_colon) = after_key.strip_prefix(':') else {
                continue;
            };
            let value_at =
                rest + 1 + (after_colon.len() - after_colon.trim_start_matches([' ', '\t']).len());
            let value_text = &text[value_at..];
            let (quote, len) = match value_text.as_bytes().first() {
                Some(b'"') => (Quote::Double, value_text[1..].find('"').map(|i| i + 2)),
                Some(b'\'') => (Quote::Single, value_text[1..].find('\'').map(|i| i + 2)),
                Some(_) => (
                    Quote::Plain,
                    Some(
                        value_text
                            .find([',', '}', '\n', '\r', '#', ' ', '\t'])
                            .unwrap_or(value_text.len()),
                    ),
                ),
                None => (Quote::Plain, None),
            };
            let Some(len) = len.filter(|&l| l > 0) else {
                continue;
            };
            let new = match (quote, key == MODE) {
                (Quote::Single, _) => format!("'{enforce}'"),
                // A plain `false` would be a YAML boolean, not the string the key needs.
                (Quote::Double, _) | (Quote::Plain, false) => format!("\"{enforce}\""),
                (Quote::Plain, true) => enforce.to_owned(),
            };
            out.push(ValueEdit {
                range: value_at..value_at + len,
                old: text[value_at..value_at + len].to_owned(),
                new,
            });
        }
    }
    out.sort_by_key(|e| e.range.start);
    out
}

/// `text` with `edits` (sorted, not overlapping) applied.
fn apply(text: &str, edits: &[&ValueEdit]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for e in edits {
        out.push_str(&text[at..e.range.start]);
        out.push_str(&e.new);
        at = e.range.end;
    }
    out.push_str(&text[at..]);
    out
}

/// `items` as a message lists them: `a, b, c`.
fn joined<T: fmt::Display>(items: impl Iterator<Item = T>) -> String {
    items.map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
}

/// The one policy of `inventory` that `target` names, with its mode.
fn find(
    inventory: &Inventory,
    target: &Target,
    place: &str,
) -> Result<(MonitoredRef, Mode), PromoteError> {
    let found: Vec<(MonitoredRef, Mode)> = match target {
        Target::Namespaced { .. } => inventory
            .policies
            .iter()
            .filter(|p| target.matches(p))
            .map(|p| (p.reference().into(), p.mode))
            .collect(),
        Target::Admin(r) => inventory
            .admin_policies
            .iter()
            .filter(|p| p.kind == r.kind && p.name == r.name)
            .map(|p| (p.reference().into(), p.mode))
            .collect(),
    };
    match found.as_slice() {
        [] => Err(PromoteError::NotFound {
            target: target.to_string(),
            place: place.to_owned(),
        }),
        [one] => Ok(one.clone()),
        many => Err(PromoteError::Ambiguous {
            target: target.to_string(),
            found: joined(many.iter().map(|(r, _)| r.object())),
        }),
    }
}

/// The one monitored policy of `inventory` that `target` names.
fn find_monitored(
    inventory: &Inventory,
    target: &Target,
    place: &str,
) -> Result<MonitoredRef, PromoteError> {
    let (policy, mode) = find(inventory, target, place)?;
    if mode != Mode::Monitor {
        return Err(PromoteError::NotMonitored { policy });
    }
    Ok(policy)
}

/// The mode and `replaces` of the policy `policy` of `inventory`, to read or change (both
/// scopes carry the same annotations).
fn annotations_mut<'a>(
    inventory: &'a mut Inventory,
    policy: &MonitoredRef,
) -> Option<(&'a mut Mode, &'a mut Option<String>)> {
    match policy {
        MonitoredRef::Namespaced(r) => inventory
            .policies
            .iter_mut()
            .find(|p| p.kind == r.kind && p.key == r.key)
            .map(|p| (&mut p.mode, &mut p.replaces)),
        MonitoredRef::Admin(r) => inventory
            .admin_policies
            .iter_mut()
            .find(|p| p.kind == r.kind && p.name == r.name)
            .map(|p| (&mut p.mode, &mut p.replaces)),
    }
}

/// `inventory` without `policy`, and without problems (an edit of the policy may change what
/// is said of it): what an edit of that policy alone must leave as it was.
fn others(inventory: &Inventory, policy: &MonitoredRef) -> Inventory {
    let mut rest = inventory.clone();
    match policy {
        MonitoredRef::Namespaced(r) => rest
            .policies
            .retain(|p| !(p.kind == r.kind && p.key == r.key)),
        MonitoredRef::Admin(r) => rest
            .admin_policies
            .retain(|p| !(p.kind == r.kind && p.name == r.name)),
    }
    rest.problems.clear();
    rest
}

/// Whether `problem` is about the object of `policy`.
fn about(problem: &netwarden_manifest::Problem, policy: &MonitoredRef) -> bool {
    let object = match policy {
        MonitoredRef::Namespaced(r) => r.key.to_string(),
        MonitoredRef::Admin(r) => r.name.clone(),
    };
    problem.kind == policy.kind_str() && problem.object == object
}

/// Whether `text` holds the policy `target` names (any mode).
pub fn holds(file: &str, text: &str, target: &Target, opts: &LoadOptions) -> bool {
    matches!(
        find(&parse_str(file, text, opts), target, file),
        Ok(_) | Err(PromoteError::Ambiguous { .. })
    )
}

/// Plans the promotion of `target` in the file `file` whose content is `text` (see the module
/// doc): the edits and the new text, proven by loading it again.
pub fn plan_text(
    file: &str,
    text: &str,
    target: &Target,
    opts: &LoadOptions,
) -> Result<FileEdit, PromoteError> {
    let before = parse_str(file, text, opts);
    let policy = find_monitored(&before, target, file)?;
    let mut expected = before.clone();
    if let Some((mode, _)) = annotations_mut(&mut expected, &policy) {
        *mode = Mode::Enforce;
    }
    let others_before = others(&before, &policy);
    let all = candidates(text);
    let mine: Vec<&ValueEdit> = all
        .iter()
        .filter(|edit| {
            let mut after = parse_str(file, &apply(text, &[*edit]), opts);
            let target_mode = annotations_mut(&mut after, &policy).map(|(mode, _)| *mode);
            target_mode == Some(Mode::Enforce) && others(&after, &policy) == others_before
        })
        .collect();
    if mine.is_empty() {
        return Err(PromoteError::NoEdit {
            policy,
            file: file.to_owned(),
        });
    }
    let new_text = apply(text, &mine);
    // `replaces` only means something on a monitored policy: the loader may drop it (and say
    // so) once the policy is enforced. Everything else must load exactly as before.
    let normalize = |mut inv: Inventory| {
        if let Some((_, replaces)) = annotations_mut(&mut inv, &policy) {
            *replaces = None;
        }
        inv.problems.retain(|p| !about(p, &policy));
        inv
    };
    if normalize(parse_str(file, &new_text, opts)) != normalize(expected) {
        return Err(PromoteError::Unverified {
            policy,
            file: file.to_owned(),
        });
    }
    Ok(FileEdit {
        policy,
        edits: mine.into_iter().cloned().collect(),
        text: new_text,
    })
}

/// A line-by-line view of `edit` for `--dry-run`: `file:line: - old` / `+ new`.
pub fn describe(file: &str, original: &str, edit: &FileEdit) -> String {
    let mut out = String::new();
    let mut done_lines = Vec::new();
    for e in &edit.edits {
        let line_no = original[..e.range.start].matches('\n').count() + 1;
        if done_lines.contains(&line_no) {
            continue;
        }
        done_lines.push(line_no);
        let old_line = original.lines().nth(line_no - 1).unwrap_or("");
        let new_line = edit.text.lines().nth(line_no - 1).unwrap_or("");
        out.push_str(&format!(
            "{file}:{line_no}: - {old_line}\n{file}:{line_no}: + {new_line}\n"
        ));
    }
    out
}

/// The JSON merge patch promoting a policy whose object is `object` (as the API server returns
/// it): every mode key it carries set to its enforce value, with the object's
/// `resourceVersion` as a precondition.
pub fn annotation_patch(object: &Value) -> Value {
    let annotations = object["metadata"]["annotations"].as_object();
    let mut patch = Map::new();
    for (key, enforce) in MODE_KEYS {
        if annotations.is_some_and(|a| a.contains_key(key)) {
            patch.insert(key.to_owned(), json!(enforce));
        }
    }
    let mut metadata = json!({ "annotations": patch });
    if let Some(rv) = object["metadata"]["resourceVersion"].as_str() {
        metadata["resourceVersion"] = json!(rv);
    }
    json!({ "metadata": metadata })
}

/// Reduces one served object (JSON) the way the agent would, to check it is the monitored
/// policy `target` names.
pub fn check_served(
    object: &Value,
    target: &Target,
    opts: &LoadOptions,
) -> Result<MonitoredRef, PromoteError> {
    let mut loader = netwarden_manifest::Loader::new(opts.clone());
    loader.add_value("cluster", "cluster", object);
    find_monitored(&loader.finish(), target, "the cluster")
}

/// Files named on the command line that hold `target`, with their text.
pub fn files_holding(
    paths: &[PathBuf],
    target: &Target,
    opts: &LoadOptions,
) -> anyhow::Result<Vec<(PathBuf, String)>> {
    let mut found = Vec::new();
    for path in paths {
        if path.is_dir() {
            anyhow::bail!(
                "{}: a directory; promote edits files: name the file that holds the policy",
                path.display()
            );
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        if holds(&path.display().to_string(), &text, target, opts) {
            found.push((path.clone(), text));
        }
    }
    Ok(found)
}

/// `--require-ready`: the reason `report` gives for `target` being ready to promote, or why it
/// is not (the report was made with `target` among the monitored policies).
pub fn check_ready<'r>(report: &'r Report, target: &Target) -> Result<&'r str, PromoteError> {
    let policy = target.event_name();
    let row = report
        .policies
        .iter()
        .find(|p| p.policy == policy)
        .ok_or_else(|| PromoteError::NotInEvents {
            target: target.to_string(),
        })?;
    if row.status != PolicyStatus::ReadyToPromote {
        return Err(PromoteError::NotReady {
            target: target.to_string(),
            reason: row.reason.clone(),
        });
    }
    Ok(&row.reason)
}

/// The promotion of a policy in a manifest file: the file, its text before, and the edit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilePromotion {
    pub path: PathBuf,
    pub original: String,
    pub edit: FileEdit,
}

/// Plans the promotion of `target` in the one file of `paths` that holds it ([`plan_text`]).
pub fn plan_files(
    paths: &[PathBuf],
    target: &Target,
    opts: &LoadOptions,
) -> anyhow::Result<FilePromotion> {
    let mut found = files_holding(paths, target, opts)?;
    if found.len() > 1 {
        return Err(PromoteError::SeveralFiles {
            target: target.to_string(),
            files: joined(found.iter().map(|(p, _)| p.display())),
        }
        .into());
    }
    let Some((path, original)) = found.pop() else {
        return Err(PromoteError::NotFound {
            target: target.to_string(),
            place: joined(paths.iter().map(|p| p.display())),
        }
        .into());
    };
    let edit = plan_text(&path.display().to_string(), &original, target, opts)?;
    Ok(FilePromotion {
        path,
        original,
        edit,
    })
}

/// The promotion of a policy in the cluster: its kind's API, the policy as the agent reads the
/// served object, and the merge patch ([`annotation_patch`]).
#[derive(Debug, Clone)]
pub struct ClusterPromotion {
    pub kind: &'static netwarden_kube::WatchedKind,
    pub policy: MonitoredRef,
    pub patch: Value,
}

/// Plans the promotion of `target` in the cluster reached with `kubeconfig` (`None`: as kubectl
/// finds it): the one policy object of that namespace and name among the policy kinds (those
/// the cluster does not serve hold none, unless `target` names the kind), or the one
/// cluster-scoped object of an admin policy, checked monitored.
pub fn plan_cluster(
    kubeconfig: Option<&Path>,
    request_timeout: Duration,
    target: &Target,
    opts: &LoadOptions,
) -> anyhow::Result<ClusterPromotion> {
    let kinds = netwarden_kube::WATCHED_KINDS
        .iter()
        .filter(|k| target.may_be(k.kind));
    let (namespace, name) = target.object_name();
    let mut found = Vec::new();
    for kind in kinds {
        match netwarden_kube::get_object(kubeconfig, request_timeout, kind, namespace, name) {
            Ok(Some(object)) => found.push((kind, object)),
            Ok(None) => {}
            // A kind the cluster does not serve holds no such policy.
            Err(netwarden_kube::KubeError::NotServed { .. }) if !target.kind_given() => {}
            Err(e) => return Err(e.into()),
        }
    }
    if found.len() > 1 {
        return Err(PromoteError::Ambiguous {
            target: target.to_string(),
            found: joined(found.iter().map(|(k, _)| k.kind)),
        }
        .into());
    }
    let Some((kind, object)) = found.pop() else {
        return Err(PromoteError::NotFound {
            target: target.to_string(),
            place: "the cluster".into(),
        }
        .into());
    };
    let policy = check_served(&object, target, opts)?;
    Ok(ClusterPromotion {
        kind,
        policy,
        patch: annotation_patch(&object),
    })
}

/// Patches the cluster as `promotion` says, then checks that what it holds now reads as
/// enforced, as the agent will read it.
pub fn apply_cluster(
    kubeconfig: Option<&Path>,
    request_timeout: Duration,
    target: &Target,
    promotion: &ClusterPromotion,
    opts: &LoadOptions,
) -> anyhow::Result<()> {
    let (namespace, name) = target.object_name();
    let after = netwarden_kube::merge_patch(
        kubeconfig,
        request_timeout,
        promotion.kind,
        namespace,
        name,
        &promotion.patch,
    )?;
    match check_served(&after, target, opts) {
        Err(PromoteError::NotMonitored { .. }) => Ok(()),
        Ok(policy) => Err(PromoteError::StillMonitored { policy }.into()),
        Err(e) => Err(e.into()),
    }
}

/// Writes `text` to `path` through a temporary file in the same directory and a rename, so a
/// reader (the agent's file watch) never sees half a file; the file's permissions are kept.
pub fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".{name}.netwarden-promote.{}", std::process::id()));
    std::fs::write(&tmp, text)?;
    let result = std::fs::metadata(path)
        .and_then(|m| std::fs::set_permissions(&tmp, m.permissions()))
        .and_then(|()| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(ns: &str, name: &str) -> Target {
        Target::Namespaced {
            key: ObjectKey::new(ns, name),
            kind: None,
        }
    }

    const FILE: &str = "# Policies of the shop.
# netwarden.io/mode: monitor   <- a comment, never edited
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: web
  namespace: shop
  annotations:
    netwarden.io/mode: monitor   # trial
    netwarden.io/log: \"true\"
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: db
  namespace: shop
  annotations: {\"netwarden.io/mode\": \"monitor\", kube-router.io/network-policy.staged: 'true'}
spec:
  podSelector: {matchLabels: {app: db}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: lock, namespace: shop}
spec:
  podSelector: {}
";

    #[test]
    fn block_style_edits_one_value() {
        let opts = LoadOptions::default();
        let edit = plan_text("f.yaml", FILE, &target("shop", "web"), &opts).unwrap();
        assert_eq!(edit.edits.len(), 1);
        assert_eq!(edit.edits[0].old, "monitor");
        assert_eq!(
            edit.text,
            FILE.replacen(
                "netwarden.io/mode: monitor   # trial",
                "netwarden.io/mode: enforce   # trial",
                1
            )
        );
        assert_eq!(
            describe("f.yaml", FILE, &edit),
            "f.yaml:9: -     netwarden.io/mode: monitor   # trial\n\
             f.yaml:9: +     netwarden.io/mode: enforce   # trial\n"
        );
    }

    #[test]
    fn flow_style_edits_every_mode_key_of_the_object() {
        let opts = LoadOptions::default();
        let edit = plan_text("f.yaml", FILE, &target("shop", "db"), &opts).unwrap();
        assert_eq!(edit.edits.len(), 2);
        assert_eq!(
            edit.text,
            FILE.replacen(
                "{\"netwarden.io/mode\": \"monitor\", kube-router.io/network-policy.staged: 'true'}",
                "{\"netwarden.io/mode\": \"enforce\", kube-router.io/network-policy.staged: 'false'}",
                1
            )
        );
        let after = parse_str("f.yaml", &edit.text, &opts);
        assert!(after.problems.is_empty(), "{:?}", after.problems);
        let modes: Vec<(&str, Mode)> = after
            .policies
            .iter()
            .map(|p| (p.key.name.as_str(), p.mode))
            .collect();
        assert!(modes.contains(&("db", Mode::Enforce)), "{modes:?}");
        assert!(modes.contains(&("web", Mode::Monitor)), "{modes:?}");
    }

    #[test]
    fn refusals_name_the_object() {
        let opts = LoadOptions::default();
        let err = plan_text("f.yaml", FILE, &target("shop", "lock"), &opts).unwrap_err();
        assert_eq!(
            err.to_string(),
            "NetworkPolicy shop/lock: not monitored (its mode annotations say enforce)"
        );
        let err = plan_text("f.yaml", FILE, &target("shop", "nope"), &opts).unwrap_err();
        assert_eq!(err.to_string(), "policy shop/nope: not found in f.yaml");
        let kinded = Target::Namespaced {
            key: ObjectKey::new("shop", "web"),
            kind: Some(PolicyKind::MultiNetworkPolicy),
        };
        assert!(matches!(
            plan_text("f.yaml", FILE, &kinded, &opts),
            Err(PromoteError::NotFound { .. })
        ));
        // Same namespace and name in two kinds.
        let both = format!(
            "{FILE}---
apiVersion: k8s.cni.cncf.io/v1beta1
kind: MultiNetworkPolicy
metadata:
  name: web
  namespace: shop
  annotations: {{k8s.v1.cni.cncf.io/policy-for: shop/storage, netwarden.io/mode: monitor}}
spec:
  podSelector: {{}}
"
        );
        let err = plan_text("f.yaml", &both, &target("shop", "web"), &opts).unwrap_err();
        assert!(matches!(err, PromoteError::Ambiguous { .. }), "{err}");
        // With the kind, the right one is edited and the other left alone.
        let edit = plan_text("f.yaml", &both, &kinded, &opts).unwrap();
        assert_eq!(edit.edits.len(), 1);
        assert!(edit.text.contains("netwarden.io/mode: monitor   # trial"));
        assert!(edit
            .text
            .contains("policy-for: shop/storage, netwarden.io/mode: enforce}"));
    }

    #[test]
    fn merge_patch_sets_every_present_key() {
        let object = json!({"metadata": {"name": "web", "namespace": "shop", "resourceVersion": "42",
            "annotations": {"netwarden.io/mode": "monitor", "kube-router.io/network-policy.monitor": "true", "x": "y"}}});
        assert_eq!(
            annotation_patch(&object),
            json!({"metadata": {"resourceVersion": "42", "annotations": {
                "netwarden.io/mode": "enforce", "kube-router.io/network-policy.monitor": "false"}}})
        );
    }

    /// A NetworkPolicy and a ClusterNetworkPolicy both named `web` (block style), an
    /// AdminNetworkPolicy on a secondary network replacing another (flow style), the baseline,
    /// and an enforced admin policy.
    const ADMIN_FILE: &str = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: web
  namespace: shop
  annotations:
    netwarden.io/mode: monitor
spec:
  podSelector: {}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata:
  name: web
  annotations:
    netwarden.io/mode: monitor    # trial of the guardrail
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {matchLabels: {team: shop}}}
  ingress:
  - {name: no-lab, action: Deny, from: [{namespaces: {matchLabels: {team: lab}}}]}
---
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: storage, annotations: {k8s.v1.cni.cncf.io/policy-for: shop/storage, \"netwarden.io/mode\": \"monitor\", netwarden.io/replaces: storage-old}}
spec: {priority: 5, subject: {namespaces: {}}, ingress: [{name: no-ops, action: Deny, from: [{namespaces: {matchLabels: {team: ops}}}]}]}
---
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: storage-old, annotations: {k8s.v1.cni.cncf.io/policy-for: shop/storage}}
spec: {priority: 6, subject: {namespaces: {}}, ingress: [{name: no-lab, action: Deny, from: [{namespaces: {matchLabels: {team: lab}}}]}]}
---
apiVersion: policy.networking.k8s.io/v1alpha1
kind: BaselineAdminNetworkPolicy
metadata:
  name: default
  annotations: {kube-router.io/network-policy.monitor: \"true\"}
spec:
  subject: {namespaces: {}}
  ingress:
  - {name: baseline-deny, action: Deny, from: [{namespaces: {}}]}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: lock}
spec:
  tier: Baseline
  priority: 3
  subject: {namespaces: {}}
  ingress:
  - {action: Deny, from: [{namespaces: {matchLabels: {team: lab}}}]}
";

    fn admin(kind: AdminKind, name: &str) -> Target {
        Target::Admin(AdminRef {
            kind,
            name: name.into(),
        })
    }

    #[test]
    fn admin_targets_parse_as_kind_and_name() {
        let parse = |p: &str, k: Option<&str>| {
            Target::parse(p, k.map(|k| TargetKind::parse(k).unwrap())).map_err(|e| e.to_string())
        };
        let cnp = admin(AdminKind::ClusterNetworkPolicy, "web");
        assert_eq!(parse("ClusterNetworkPolicy/web", None), Ok(cnp.clone()));
        assert_eq!(parse("web", Some("ClusterNetworkPolicy")), Ok(cnp.clone()));
        assert_eq!(
            parse("ClusterNetworkPolicy/web", Some("ClusterNetworkPolicy")),
            Ok(cnp)
        );
        assert_eq!(
            parse("BaselineAdminNetworkPolicy/default", None),
            Ok(admin(AdminKind::BaselineAdminNetworkPolicy, "default"))
        );
        assert_eq!(parse("shop/web", None), Ok(target("shop", "web")));
        assert_eq!(
            parse("ClusterNetworkPolicy/web", Some("AdminNetworkPolicy")),
            Err("\"ClusterNetworkPolicy/web\": names another kind than --kind".into())
        );
        assert_eq!(
            parse("ClusterNetworkPolicy/web", Some("NetworkPolicy")),
            Err("\"ClusterNetworkPolicy/web\": names another kind than --kind".into())
        );
        assert_eq!(
            parse("shop/web", Some("AdminNetworkPolicy")),
            Err(
                "\"shop/web\": an admin policy is cluster-scoped: give it as NAME or Kind/NAME"
                    .into()
            )
        );
        assert_eq!(
            parse("web", None),
            Err("\"web\": give the policy as NS/NAME, or an admin policy as Kind/NAME".into())
        );
        // The kind names are case-sensitive, as `kind:`: a lower-case one is a namespace.
        assert_eq!(
            parse("clusternetworkpolicy/web", None),
            Ok(target("clusternetworkpolicy", "web"))
        );
        let cnp = admin(AdminKind::ClusterNetworkPolicy, "web");
        assert_eq!(cnp.event_name(), "ClusterNetworkPolicy/web");
        assert_eq!(cnp.to_string(), "ClusterNetworkPolicy web");
    }

    #[test]
    fn admin_block_style_edits_its_own_value_not_the_namespaced_namesake() {
        let opts = LoadOptions::default();
        let before = parse_str("f.yaml", ADMIN_FILE, &opts);
        assert!(before.errors().next().is_none(), "{:?}", before.problems);
        let cnp = admin(AdminKind::ClusterNetworkPolicy, "web");
        let edit = plan_text("f.yaml", ADMIN_FILE, &cnp, &opts).unwrap();
        assert_eq!(edit.policy.to_string(), "ClusterNetworkPolicy/web");
        assert_eq!(edit.edits.len(), 1);
        assert_eq!(
            edit.text,
            ADMIN_FILE.replacen(
                "netwarden.io/mode: monitor    # trial",
                "netwarden.io/mode: enforce    # trial",
                1
            )
        );
        assert_eq!(
            describe("f.yaml", ADMIN_FILE, &edit),
            "f.yaml:16: -     netwarden.io/mode: monitor    # trial of the guardrail\n\
             f.yaml:16: +     netwarden.io/mode: enforce    # trial of the guardrail\n"
        );
        let after = parse_str("f.yaml", &edit.text, &opts);
        let mode = |kind: AdminKind, name: &str| {
            after
                .admin_policies
                .iter()
                .find(|p| p.kind == kind && p.name == name)
                .map(|p| p.mode)
        };
        assert_eq!(
            mode(AdminKind::ClusterNetworkPolicy, "web"),
            Some(Mode::Enforce)
        );
        assert_eq!(after.policies[0].mode, Mode::Monitor, "the namesake");

        // And the other way round: the NetworkPolicy alone.
        let edit = plan_text("f.yaml", ADMIN_FILE, &target("shop", "web"), &opts).unwrap();
        assert_eq!(edit.policy.to_string(), "shop/web");
        assert_eq!(
            edit.text,
            ADMIN_FILE.replacen(
                "    netwarden.io/mode: monitor\n",
                "    netwarden.io/mode: enforce\n",
                1
            )
        );
        assert!(edit.text.contains("netwarden.io/mode: monitor    # trial"));
    }

    #[test]
    fn admin_flow_style_keeps_replaces_and_policy_for() {
        let opts = LoadOptions::default();
        let anp = admin(AdminKind::AdminNetworkPolicy, "storage");
        let edit = plan_text("f.yaml", ADMIN_FILE, &anp, &opts).unwrap();
        assert_eq!(edit.edits.len(), 1);
        assert_eq!(
            edit.text,
            ADMIN_FILE.replacen(
                "policy-for: shop/storage, \"netwarden.io/mode\": \"monitor\"",
                "policy-for: shop/storage, \"netwarden.io/mode\": \"enforce\"",
                1
            )
        );
        let after = parse_str("f.yaml", &edit.text, &opts);
        let storage = after
            .admin_policies
            .iter()
            .find(|p| p.name == "storage")
            .unwrap();
        assert_eq!(storage.mode, Mode::Enforce);
        assert_eq!(storage.replaces.as_deref(), Some("storage-old"));

        // kube-router's key on the baseline, in its own quotes.
        let baseline = admin(AdminKind::BaselineAdminNetworkPolicy, "default");
        let edit = plan_text("f.yaml", ADMIN_FILE, &baseline, &opts).unwrap();
        assert_eq!(
            edit.text,
            ADMIN_FILE.replacen(
                "kube-router.io/network-policy.monitor: \"true\"",
                "kube-router.io/network-policy.monitor: \"false\"",
                1
            )
        );
    }

    #[test]
    fn admin_refusals_name_the_object() {
        let opts = LoadOptions::default();
        let err = |t: &Target| {
            plan_text("f.yaml", ADMIN_FILE, t, &opts)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            err(&admin(AdminKind::ClusterNetworkPolicy, "lock")),
            "ClusterNetworkPolicy lock: not monitored (its mode annotations say enforce)"
        );
        assert_eq!(
            err(&admin(AdminKind::ClusterNetworkPolicy, "nope")),
            "ClusterNetworkPolicy nope: not found in f.yaml"
        );
        // Same name, other kind: not the ClusterNetworkPolicy.
        assert_eq!(
            err(&admin(AdminKind::AdminNetworkPolicy, "web")),
            "AdminNetworkPolicy web: not found in f.yaml"
        );
        assert!(holds(
            "f.yaml",
            ADMIN_FILE,
            &admin(AdminKind::ClusterNetworkPolicy, "lock"),
            &opts
        ));
        assert!(!holds(
            "f.yaml",
            ADMIN_FILE,
            &admin(AdminKind::AdminNetworkPolicy, "web"),
            &opts
        ));
    }

    #[test]
    fn served_admin_objects_are_checked_as_the_agent_reads_them() {
        let opts = LoadOptions::default();
        let object = json!({"apiVersion": "policy.networking.k8s.io/v1alpha2",
            "kind": "ClusterNetworkPolicy",
            "metadata": {"name": "web", "resourceVersion": "7",
                "annotations": {"netwarden.io/mode": "monitor"}},
            "spec": {"tier": "Admin", "priority": 10, "subject": {"namespaces": {}},
                "ingress": [{"action": "Deny", "from": [{"namespaces": {}}]}]}});
        let cnp = admin(AdminKind::ClusterNetworkPolicy, "web");
        assert_eq!(
            check_served(&object, &cnp, &opts).unwrap().to_string(),
            "ClusterNetworkPolicy/web"
        );
        assert_eq!(
            annotation_patch(&object),
            json!({"metadata": {"resourceVersion": "7",
                "annotations": {"netwarden.io/mode": "enforce"}}})
        );
        assert!(matches!(
            check_served(&object, &admin(AdminKind::AdminNetworkPolicy, "web"), &opts),
            Err(PromoteError::NotFound { .. })
        ));
        assert_eq!(cnp.object_name(), (None, "web"));
    }
}
