//! Loads Kubernetes manifests (YAML, multi-document, or JSON; `kind: List` too) into the
//! engine's model types, validating as it goes and reporting **every** problem with file, kind,
//! object, field and reason, while the rest of the input is still loaded (SPEC sections 1, 2, 7).
//!
//! What is read (other projects' kinds, e.g. Deployments or Calico's NetworkPolicy, and unknown
//! fields are ignored; near misses of our kinds are not, see below):
//!
//! | kind (apiVersion) | fields |
//! | --- | --- |
//! | `Namespace` (v1) | name, labels (`kubernetes.io/metadata.name` is always added) |
//! | `Pod` (v1) | namespace, name, labels, `spec.hostNetwork`, `spec.nodeName`, `spec.{initC,c}ontainers[].ports[]`, `status.podIPs` / `status.podIP`, annotations `k8s.v1.cni.cncf.io/network-status` (or `networks-status`) and `netwarden.io/netns` |
//! | `DanmEp` (danm.k8s.io/v1) | `spec.Pod`, `spec.NetworkName` (or `NetworkID`), `spec.apiType`, `spec.Interface.{Name,Address,AddressIPv6}`, `spec.netns`: adds an interface to its pod |
//! | `NetworkPolicy` (networking.k8s.io/v1) | the whole spec; scope = primary interface |
//! | `DanmNetworkPolicy` (danm.k8s.io/v1) | the spec plus `networkSelector` in peers; scope = all interfaces |
//! | `MultiNetworkPolicy` (k8s.cni.cncf.io/v1beta1 or v1beta2) | the spec; scope = networks of annotation `k8s.v1.cni.cncf.io/policy-for` |
//! | `Service` (v1) | `spec.clusterIPs` / `clusterIP`, `spec.selector`, `spec.ports[]` |
//! | `EndpointSlice` (discovery.k8s.io/v1) | label `kubernetes.io/service-name`, `endpoints[].addresses`, `endpoints[].conditions.ready` |
//! | `ClusterNetworkPolicy` (policy.networking.k8s.io/v1alpha2) | `spec.tier`, `priority`, `subject`, `ingress[].{name,action,from[],protocols[]}`, `egress[].{name,action,to[],protocols[]}` (peers `namespaces`, `pods`, `nodes`, `networks`, `domainNames`); scope = primary interface, or the networks of `policy-for` (`ns/name` only) |
//! | `AdminNetworkPolicy` (policy.networking.k8s.io/v1alpha1) | `spec.priority`, `subject`, `ingress[].{name,action,from[],ports[]}`, `egress[].{name,action,to[],ports[]}` (`portNumber`, `portRange`, `namedPort`); Admin tier; scope as above |
//! | `BaselineAdminNetworkPolicy` (policy.networking.k8s.io/v1alpha1) | as AdminNetworkPolicy without priority or Pass; Baseline tier; only `default` |
//! | `Node` (v1) | name, labels, `status.addresses[].address` that are IP addresses (for `nodes` peers) |
//!
//! Policy annotations: `netwarden.io/mode`, `kube-router.io/network-policy.monitor`,
//! `kube-router.io/network-policy.staged` (monitor phase; bad or conflicting values fail closed to
//! enforce), `netwarden.io/replaces`, `netwarden.io/log`. Any object of these kinds annotated
//! `netwarden.io/delete: "true"` is a deletion marker for `netwarden diff --with`
//! ([`overlay`]), ignored with a warning elsewhere.
//!
//! # Problems
//!
//! Errors mean something was dropped or not applied as written (`netwarden validate` exits 1);
//! warnings mean it loaded but probably does not do what its author expects (exit 0).
//!
//! | problem | severity | what happens |
//! | --- | --- | --- |
//! | a file cannot be read, is not UTF-8, a document is not valid YAML/JSON (duplicate YAML keys included) | error | that file / document is skipped; the file's other documents load |
//! | a document without `kind`, or not an object | error | skipped |
//! | a misspelled kind (`Networkpolicy`, `NetworkPolicies`, `DanmNetworkpolicy`: other case, plural, or edit distance ≤ 2, ≤ 1 for names of at most 4 letters) unless its group is clearly another project's | error, naming the intended kind | object ignored |
//! | a kind we read with a missing, non-string or wrong apiVersion (`networking.k8s.io/v2`, `extensions/v1beta1`, a typo of our groups) | error, naming the right apiVersion | object ignored |
//! | a missing, invalid or unreadable name or namespace | error | object ignored (never moved to `default`) |
//! | a field of the wrong type anywhere in an object (`namespace: y` read by YAML 1.1 as a boolean, a number where a string belongs, a list for an object) | error, with a quoting hint for booleans and numbers | object ignored |
//! | an invalid label (syntax) on an object, or in a Service selector | error | object ignored (a pod missing a label would leave the policies that select it) |
//! | a `policyTypes` entry other than Ingress/Egress | error | policy ignored |
//! | an invalid value in a rule (CIDR, port, protocol, selector, networkSelector) | error | the peer or port is dropped; a rule left with none is dropped whole (a warning says so) |
//! | an invalid `podSelector` | error | policy ignored |
//! | an interface name Linux refuses (network-status `interface`, DanmEp `spec.Interface.Name`) | error | interface dropped |
//! | a network-status annotation that is not JSON, not a list, or has a field of the wrong type | error | interfaces taken from `status.podIPs` |
//! | a duplicate object (same kind, namespace, name) | error | the later one is ignored |
//! | bad monitor/log/replaces annotations | error | policy enforced / not logging / not replacing |
//! | an input directory without manifest files; paths that yield no object at all | warning | — |
//! | a key written twice in a JSON object (the path is reported) | warning | the last value is used, as by the API server |
//! | a container port name used twice in a pod | warning, saying which port wins | named ports resolve to the first port with that name and protocol |
//! | two pods (not hostNetwork) with one address on one network | warning, naming both | rules allowing one of them allow both |
//! | `policy-for` naming no valid network (`",,,"`), or missing | warning | the MultiNetworkPolicy applies nowhere |
//! | hostNetwork pods, orphan DanmEps and EndpointSlices, host bits in a CIDR, lower-case protocols | warning | loaded as described |
//! | an admin policy whose `tier`, `priority` (0–1000) or `subject` (exactly one of `namespaces`, `pods`) is missing or invalid; a BaselineAdminNetworkPolicy not named `default` | error | policy ignored |
//! | an admin rule the CRD refuses or netwarden cannot implement: no peer, a peer without exactly one field (or one its direction and kind do not have), an invalid selector, CIDR or domain name, more than 25 CIDRs or domain names (or peers and ports above the CRD's maximum), an unknown action, Pass outside the Admin tier, domainNames outside Accept/Allow, a named port with networks/nodes/domainNames peers, a port out of 1–65535 or a range with start ≥ end, `tcp: {}` without `destinationPort`, a field of the wrong type | error | the rule fails closed in place (upstream's rule): an Accept/Allow matches nothing; a Deny or Pass denies what it covers, every address and port where its peers or ports cannot be read; a direction that is not a list denies everything |
//! | more admin rules than the CRD allows, a rule name over 100 characters | error | read as written (the name dropped) |
//! | an unqualified network in an admin policy's `policy-for` | error | entry ignored |
//! | two admin policies of one tier with one priority and rules of different actions | warning | evaluated by kind, then name |
//! | `domainNames` peers | warning | they match nothing until netwarden resolves names |
//! | a Node `InternalIP`/`ExternalIP` that is not an IP address | error | address ignored |
//!
//! Invalid values never widen a policy: an invalid peer or port is dropped, and a rule whose
//! peers (or ports) were all invalid is dropped as a whole rather than read as "all peers". An
//! object with an invalid name is dropped, because names reach rule comments and log prefixes.
//!
//! # Structure
//!
//! Loading happens in two passes. The first (`read`) reduces each document of a file on its
//! own (the readers in `pod`, `policy`, `admin`, `service`, over the field accessors of `ctx` and the
//! metadata of `meta`, below `read`, which dispatches to them); the
//! second (`assemble`) refuses duplicates, pairs DanmEps with pods and EndpointSlices with
//! Services, adds the namespaces that objects refer to but the input does not declare, and
//! reports shared addresses. [`load_paths`] and [`parse_str`] do both at once; [`ManifestSet`]
//! keeps each file's first pass and re-reads only changed files, keeping the last good version
//! of a file while it is broken (for the agent); [`ClusterSet`] keeps each watched object's
//! first pass the same way and assembles them alike (for `run --kube`). `fuzzing` (feature
//! `fuzzing`) states the loader's invariants for fuzzers and property tests.
#![forbid(unsafe_code)]

mod admin;
mod assemble;
pub mod cluster;
mod ctx;
pub mod delta;
mod documents;
pub mod feed;
mod files;
// Fuzzing and its CI replays only (feature `fuzzing`): not compiled into the netwarden binary.
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod json;
mod kinds;
mod meta;
pub mod overlay;
mod pod;
mod policy;
mod read;
mod service;
pub mod set;
mod stream;
pub mod validate;

#[cfg(test)]
mod tests;

use std::fmt;
use std::path::PathBuf;

use netwarden_engine::{AdminPolicy, Namespace, Node, Pod, Policy, Service};
use serde_json::Value;

use crate::assemble::{assemble_owned, OwnedPart};
pub use crate::cluster::{ClusterKey, ClusterSet, CLUSTER_SOURCE};
pub use crate::delta::InventoryDelta;
pub use crate::overlay::{layer_paths, Layered};
use crate::read::FileRead;
pub use crate::read::DELETE;
pub use crate::set::{Change, FileChange, ManifestSet};

/// Annotation and label keys the loader reads.
pub use crate::pod::{NETNS, NETWORKS_STATUS_OLD, NETWORK_STATUS};
pub use crate::policy::{KUBE_ROUTER_MONITOR, KUBE_ROUTER_STAGED, LOG, MODE, POLICY_FOR, REPLACES};
pub use crate::service::SERVICE_NAME_LABEL;

/// The label Kubernetes puts on every namespace (used by namespaceSelectors on its name).
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// How bad a problem is. Errors mean something in the input was dropped or not applied as
/// written; warnings mean it was loaded but probably does not do what its author expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        })
    }
}

/// One problem found in the input.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Problem {
    /// The file (as given, or as found under a directory), or the label passed to [`parse_str`].
    pub file: String,
    /// The object's kind (`Pod`, `NetworkPolicy`, ...); empty for file-level problems.
    pub kind: String,
    /// `ns/name`, `name` (Namespace), or `#N` (1-based document index) if the object is unnamed.
    pub object: String,
    /// Path of the offending field, e.g. `spec.ingress[0].from[1].ipBlock.cidr`; may be empty.
    pub field: String,
    pub reason: String,
    pub severity: Severity,
}

impl Problem {
    /// A problem not tied to one object's kind (a file, a document, a listing).
    pub fn untyped(
        severity: Severity,
        file: impl Into<String>,
        object: impl Into<String>,
        field: impl Into<String>,
        reason: impl Into<String>,
    ) -> Problem {
        Problem {
            file: file.into(),
            kind: String::new(),
            object: object.into(),
            field: field.into(),
            reason: reason.into(),
            severity,
        }
    }
}

impl fmt::Display for Problem {
    /// `file: Kind ns/name: field: reason`, leaving out the parts that are empty.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.file)?;
        let what = match (self.kind.is_empty(), self.object.is_empty()) {
            (false, false) => format!("{} {}", self.kind, self.object),
            (false, true) => self.kind.clone(),
            (true, false) => self.object.clone(),
            (true, true) => String::new(),
        };
        if !what.is_empty() {
            write!(f, " {what}:")?;
        }
        if !self.field.is_empty() {
            write!(f, " {}:", self.field)?;
        }
        if self.severity == Severity::Warning {
            write!(f, " warning:")?;
        }
        write!(f, " {}", self.reason)
    }
}

/// Everything loaded, plus every problem found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    pub namespaces: Vec<Namespace>,
    pub pods: Vec<Pod>,
    pub policies: Vec<Policy>,
    /// ClusterNetworkPolicy, AdminNetworkPolicy, BaselineAdminNetworkPolicy (SPEC 8).
    pub admin_policies: Vec<AdminPolicy>,
    /// Nodes, for the `nodes` peers of admin policies.
    pub nodes: Vec<Node>,
    pub services: Vec<Service>,
    pub problems: Vec<Problem>,
}

impl Inventory {
    /// The problems of severity [`Severity::Error`].
    pub fn errors(&self) -> impl Iterator<Item = &Problem> {
        self.problems
            .iter()
            .filter(|p| p.severity == Severity::Error)
    }

    pub fn has_errors(&self) -> bool {
        self.errors().next().is_some()
    }
}

/// Loader switches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadOptions {
    /// When false, `NetworkPolicy` objects are read (and checked) but not returned: for clusters
    /// where another component already enforces the standard API.
    pub network_policy_enabled: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            network_policy_enabled: true,
        }
    }
}

/// Errors of the file stage, turned into [`Problem`]s (the loader itself never fails).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read: {0}")]
    Io(#[from] std::io::Error),
    #[error("invalid YAML: {0}")]
    Yaml(String),
    #[error("invalid JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// Loads files and directories (recursively: `*.yaml`, `*.yml`, `*.json`, in sorted order; a
/// file named explicitly is read whatever its extension). IO errors become problems; a
/// directory without manifest files, and paths that yield no object at all, are warned about.
pub fn load_paths(paths: &[PathBuf], opts: &LoadOptions) -> Inventory {
    let mut loader = Loader::new(opts.clone());
    for path in paths {
        loader.add_path(path);
    }
    let mut inventory = loader.finish();
    warn_if_nothing_loaded(paths, &mut inventory);
    inventory
}

/// Loads one file's text (YAML, possibly multi-document, or JSON); `file_label` names it in
/// problems. Pure: no I/O.
pub fn parse_str(file_label: &str, text: &str, opts: &LoadOptions) -> Inventory {
    let mut loader = Loader::new(opts.clone());
    loader.add_str(file_label, text);
    loader.finish()
}

/// When paths were given but nothing was loaded and nothing was reported either, says so: a
/// wrong path should not look like an empty cluster.
pub(crate) fn warn_if_nothing_loaded(paths: &[PathBuf], inventory: &mut Inventory) {
    let nothing = inventory.namespaces.is_empty()
        && inventory.pods.is_empty()
        && inventory.policies.is_empty()
        && inventory.admin_policies.is_empty()
        && inventory.nodes.is_empty()
        && inventory.services.is_empty();
    if paths.is_empty() || !nothing || !inventory.problems.is_empty() {
        return;
    }
    let kinds: Vec<&str> = kinds::KINDS.iter().map(|k| k.kind).collect();
    inventory.problems.push(Problem {
        file: paths
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" "),
        kind: String::new(),
        object: String::new(),
        field: String::new(),
        reason: format!(
            "no object that netwarden reads ({}) in these paths",
            kinds.join(", ")
        ),
        severity: Severity::Warning,
    });
}

/// Where an object was read, for problems the second pass finds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Source {
    pub file: String,
    /// `ns/name`, as problems name the object.
    pub label: String,
}

/// A pod as read, plus what the second pass needs to know about where its interfaces came from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PodRecord {
    /// Shared with what the second pass hands on (see [`assemble::Assembly`]): a pod a
    /// DanmEp changes is copied first.
    pub pod: std::sync::Arc<Pod>,
    pub pod_ips: Vec<std::net::IpAddr>,
    /// Parallel to `pod.interfaces`: whether the interface came from a DanmEp.
    pub from_danmep: Vec<bool>,
    pub source: Source,
}

/// One input step kept by a [`Loader`] until [`Loader::finish`].
#[derive(Debug)]
enum Step {
    Problem(Problem),
    File(FileRead),
}

/// Incremental loader: add files, texts or documents, then [`Loader::finish`].
#[derive(Debug)]
pub struct Loader {
    opts: LoadOptions,
    steps: Vec<Step>,
}

impl Loader {
    pub fn new(opts: LoadOptions) -> Self {
        Self {
            opts,
            steps: Vec::new(),
        }
    }

    /// Reads a file, or every manifest under a directory.
    pub fn add_path(&mut self, path: &std::path::Path) {
        for listed in files::list(&[path.to_path_buf()]) {
            self.steps.push(match listed {
                files::Listed::File(p) => Step::File(files::read_file(&p)),
                files::Listed::Missing { problem, .. }
                | files::Listed::Unlistable { problem, .. }
                | files::Listed::Note(problem) => Step::Problem(problem),
            });
        }
    }

    /// Reads one file's text.
    pub fn add_str(&mut self, file: &str, text: &str) {
        self.steps
            .push(Step::File(crate::stream::read_text(file, text)));
    }

    /// Reads one already parsed document (an object or a List); `label` names it while it has
    /// no name (e.g. `#3`).
    pub fn add_value(&mut self, file: &str, label: &str, doc: &Value) {
        let mut read = FileRead::default();
        read.add_value(file, label, doc);
        self.steps.push(Step::File(read));
    }

    /// The second pass: refuses duplicates, pairs DanmEps with pods and EndpointSlices with
    /// Services, completes the namespaces, and returns everything.
    pub fn finish(self) -> Inventory {
        // Nothing keeps the files' first passes: their objects move into the inventory.
        let parts = self.steps.into_iter().map(|step| match step {
            Step::Problem(p) => OwnedPart::Problem(p),
            Step::File(f) => OwnedPart::File(f),
        });
        assemble_owned(parts, &self.opts)
    }
}
