//! `netwarden promote NS/NAME`: switch one monitored policy to enforce, in a manifest file or in
//! the cluster.
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
//! `resourceVersion` read as a precondition ([`netwarden_kube::merge_patch`]).
//!
//! Pure functions decide ([`plan_text`], [`annotation_patch`], [`check_ready`]); around them,
//! [`plan_files`] and [`plan_cluster`] find the one file or object to change and build the
//! change, [`write_atomically`] and [`apply_cluster`] make it. The command (the binary) reads
//! the arguments and prints.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use netwarden_engine::{Mode, ObjectKey, Policy, PolicyKind};
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

/// Which policy to promote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub key: ObjectKey,
    /// `None`: any kind, as long as only one policy has this namespace and name.
    pub kind: Option<PolicyKind>,
}

impl Target {
    /// The policy `policy` names as `NS/NAME`, of `kind` when given.
    pub fn parse(policy: &str, kind: Option<PolicyKind>) -> Result<Target, PromoteError> {
        let (ns, name) = policy
            .split_once('/')
            .filter(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains('/'))
            .ok_or_else(|| PromoteError::BadName {
                given: policy.to_owned(),
            })?;
        Ok(Target {
            key: ObjectKey::new(ns, name),
            kind,
        })
    }

    fn matches(&self, p: &Policy) -> bool {
        p.key == self.key && self.kind.is_none_or(|k| k == p.kind)
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            Some(kind) => write!(f, "{kind} {}", self.key),
            None => write!(f, "policy {}", self.key),
        }
    }
}

/// Why a policy cannot be promoted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PromoteError {
    #[error("{given:?}: give the policy as NS/NAME")]
    BadName { given: String },
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
    #[error("{kind} {key}: not monitored (its mode annotations say enforce)")]
    NotMonitored { kind: PolicyKind, key: ObjectKey },
    #[error("{kind} {key} in {file}: no mode annotation in the text could be changed alone (written in a way this command does not edit); change it by hand")]
    NoEdit {
        kind: PolicyKind,
        key: ObjectKey,
        file: String,
    },
    #[error("{kind} {key} in {file}: the edited file would load differently beyond the mode of this policy; nothing written")]
    Unverified {
        kind: PolicyKind,
        key: ObjectKey,
        file: String,
    },
    #[error("{kind} {key}: still monitored after the patch")]
    StillMonitored { kind: PolicyKind, key: ObjectKey },
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
    pub kind: PolicyKind,
    pub key: ObjectKey,
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

/// The one policy of `inventory` that `target` names.
fn find<'a>(
    inventory: &'a Inventory,
    target: &Target,
    place: &str,
) -> Result<&'a Policy, PromoteError> {
    let found: Vec<&Policy> = inventory
        .policies
        .iter()
        .filter(|p| target.matches(p))
        .collect();
    match found.as_slice() {
        [] => Err(PromoteError::NotFound {
            target: target.to_string(),
            place: place.to_owned(),
        }),
        [one] => Ok(one),
        many => Err(PromoteError::Ambiguous {
            target: target.to_string(),
            found: joined(many.iter().map(|p| format!("{} {}", p.kind, p.key))),
        }),
    }
}

/// What `inventory` should become once `policy` is promoted.
fn promoted(inventory: &Inventory, policy: &Policy) -> Inventory {
    let mut expected = inventory.clone();
    for p in &mut expected.policies {
        if p.kind == policy.kind && p.key == policy.key {
            p.mode = Mode::Enforce;
        }
    }
    expected
}

/// Whether `text` holds the policy `target` names (any mode).
pub fn holds(file: &str, text: &str, target: &Target, opts: &LoadOptions) -> bool {
    parse_str(file, text, opts)
        .policies
        .iter()
        .any(|p| target.matches(p))
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
    let policy = find(&before, target, file)?;
    if policy.mode != Mode::Monitor {
        return Err(PromoteError::NotMonitored {
            kind: policy.kind,
            key: policy.key.clone(),
        });
    }
    let expected = promoted(&before, policy);
    let others = |inv: &Inventory| -> Vec<Policy> {
        inv.policies
            .iter()
            .filter(|p| !(p.kind == policy.kind && p.key == policy.key))
            .cloned()
            .collect()
    };
    let others_before = others(&before);
    let all = candidates(text);
    let mine: Vec<&ValueEdit> = all
        .iter()
        .filter(|edit| {
            let after = parse_str(file, &apply(text, &[*edit]), opts);
            let target_mode = after
                .policies
                .iter()
                .find(|p| p.kind == policy.kind && p.key == policy.key)
                .map(|p| p.mode);
            target_mode == Some(Mode::Enforce)
                && others(&after) == others_before
                && after.pods == before.pods
                && after.namespaces == before.namespaces
                && after.services == before.services
        })
        .collect();
    let error_ctx = (policy.kind, policy.key.clone(), file.to_owned());
    if mine.is_empty() {
        return Err(PromoteError::NoEdit {
            kind: error_ctx.0,
            key: error_ctx.1,
            file: error_ctx.2,
        });
    }
    let new_text = apply(text, &mine);
    // `replaces` only means something on a monitored policy: the loader may drop it (and say
    // so) once the policy is enforced. Everything else must load exactly as before.
    let normalize = |mut inv: Inventory| {
        for p in &mut inv.policies {
            if p.kind == policy.kind && p.key == policy.key {
                p.replaces = None;
            }
        }
        let named = policy.key.to_string();
        inv.problems.retain(|p| !p.to_string().contains(&named));
        inv
    };
    if normalize(parse_str(file, &new_text, opts)) != normalize(expected) {
        return Err(PromoteError::Unverified {
            kind: error_ctx.0,
            key: error_ctx.1,
            file: error_ctx.2,
        });
    }
    Ok(FileEdit {
        kind: policy.kind,
        key: policy.key.clone(),
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
) -> Result<Policy, PromoteError> {
    let mut loader = netwarden_manifest::Loader::new(opts.clone());
    loader.add_value("cluster", "cluster", object);
    let inventory = loader.finish();
    let policy = find(&inventory, target, "the cluster")?;
    if policy.mode != Mode::Monitor {
        return Err(PromoteError::NotMonitored {
            kind: policy.kind,
            key: policy.key.clone(),
        });
    }
    Ok(policy.clone())
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
    let policy = target.key.to_string();
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
    pub policy: Policy,
    pub patch: Value,
}

/// Plans the promotion of `target` in the cluster reached with `kubeconfig` (`None`: as kubectl
/// finds it): the one policy object of that namespace and name among the policy kinds (those
/// the cluster does not serve hold none, unless `target` names the kind), checked monitored.
pub fn plan_cluster(
    kubeconfig: Option<&Path>,
    request_timeout: Duration,
    target: &Target,
    opts: &LoadOptions,
) -> anyhow::Result<ClusterPromotion> {
    let kinds = netwarden_kube::WATCHED_KINDS
        .iter()
        .filter(|k| policy_kind(k.kind).is_some())
        .filter(|k| target.kind.is_none_or(|want| want.as_str() == k.kind));
    let mut found = Vec::new();
    for kind in kinds {
        match netwarden_kube::get_object(
            kubeconfig,
            request_timeout,
            kind,
            &target.key.namespace,
            &target.key.name,
        ) {
            Ok(Some(object)) => found.push((kind, object)),
            Ok(None) => {}
            // A kind the cluster does not serve holds no such policy.
            Err(netwarden_kube::KubeError::NotServed { .. }) if target.kind.is_none() => {}
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
    let after = netwarden_kube::merge_patch(
        kubeconfig,
        request_timeout,
        promotion.kind,
        &target.key.namespace,
        &target.key.name,
        &promotion.patch,
    )?;
    match check_served(&after, target, opts) {
        Err(PromoteError::NotMonitored { .. }) => Ok(()),
        Ok(_) => Err(PromoteError::StillMonitored {
            kind: promotion.policy.kind,
            key: promotion.policy.key.clone(),
        }
        .into()),
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
        Target {
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
        let kinded = Target {
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
}
