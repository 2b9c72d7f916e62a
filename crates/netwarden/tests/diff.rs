//! `netwarden diff` (issue 9 item 3), the pure core: hand-computed cases (a policy added, a
//! pod moved to another address, a rule narrowed, a policy deleted through
//! `netwarden.io/delete`, a monitored replacement, a namespace relabel, a MultiNetworkPolicy on
//! a secondary network, dual-stack pods), and the property that only evaluating the pairs with
//! a touched end gives exactly what comparing two full `reach` runs gives.

use std::collections::{BTreeMap, HashMap};

use netwarden::diff::{default_ports, diff, Change, ChangeKind};
use netwarden::inventory::engine_from;
use netwarden::reach::{Reach, ReachQuery};
use netwarden_engine::fuzzing::{Change as Step, Scenario};
use netwarden_engine::{
    EngineOptions, Namespace, ObjectKey, Pod, PodKey, Policy, PolicyRef, Service,
};
use netwarden_manifest::{layer_paths, parse_str, Inventory, LoadOptions};
use netwarden_testing::TempDir;
use proptest::prelude::*;

const NS_X: &str = "
apiVersion: v1
kind: Namespace
metadata: {name: x, labels: {team: red}}
";

fn pod(name: &str, ips: &[&str]) -> String {
    let ips: Vec<String> = ips.iter().map(|ip| format!("{{ip: \"{ip}\"}}")).collect();
    format!(
        "
---
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: x, labels: {{app: {name}}}}}
status: {{podIPs: [{}]}}
",
        ips.join(", ")
    )
}

/// x/a, x/b, x/c on the cluster network, IPv4 only.
fn three_pods() -> String {
    format!(
        "{NS_X}{}{}{}",
        pod("a", &["10.0.0.1"]),
        pod("b", &["10.0.0.2"]),
        pod("c", &["10.0.0.3"])
    )
}

fn load(text: &str) -> Inventory {
    let inventory = parse_str("test", text, &LoadOptions::default());
    assert!(inventory.problems.is_empty(), "{:?}", inventory.problems);
    inventory
}

fn changes(base: &Inventory, changed: &Inventory, ports: &[&str]) -> Vec<Change> {
    let query = ReachQuery {
        ports: ports.iter().map(|p| p.parse().unwrap()).collect(),
        ..ReachQuery::default()
    };
    diff(base, changed, &EngineOptions::default(), &query)
}

/// A change as a line: `from -> to network port family kind before/after staged
/// policies`.
fn line(c: &Change) -> String {
    let policies: Vec<String> = c.policies.iter().map(ToString::to_string).collect();
    format!(
        "{} -> {} {} {}/{} {} {} {}/{} staged {}/{} [{}]",
        c.from,
        c.to,
        c.network,
        c.port,
        c.protocol,
        c.family.as_str(),
        c.kind.as_str(),
        c.before,
        c.after,
        c.staged_before,
        c.staged_after,
        policies.join(", ")
    )
}

fn lines(changes: &[Change]) -> Vec<String> {
    changes.iter().map(line).collect()
}

const B_FROM_A: &str = "
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-in, namespace: x}
spec:
  podSelector: {matchLabels: {app: b}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: a}}}]
    ports: [{port: 80}]
";

#[test]
fn a_policy_added_newly_isolates_a_pod() {
    let base = load(&three_pods());
    let changed = load(&format!("{}{B_FROM_A}", three_pods()));
    // a → b stays allowed, b → b is loopback; only c → b is denied now. 8080 is not a port
    // the rule names: a → b on it is denied too.
    assert_eq!(
        lines(&changes(&base, &changed, &["80/TCP", "8080/TCP"])),
        [
            "x/a -> x/b default 8080/TCP ipv4 newly-denied true/false staged true/false [x/b-in]",
            "x/c -> x/b default 80/TCP ipv4 newly-denied true/false staged true/false [x/b-in]",
            "x/c -> x/b default 8080/TCP ipv4 newly-denied true/false staged true/false [x/b-in]",
        ]
    );
    // The reverse: nothing changes from a view to itself.
    assert!(changes(&changed, &changed, &["80/TCP"]).is_empty());
    let reverse = changes(&changed, &base, &["80/TCP"]);
    assert_eq!(reverse.len(), 1);
    assert_eq!(reverse[0].kind, ChangeKind::NewlyAllowed);
}

/// Only the pairs whose touched end's side changes are evaluated in full; a pod that only
/// moved to another address keeps its (open) rules, yet its peers' verdicts follow the new
/// address: every pair with it must still be evaluated.
#[test]
fn a_pod_moved_to_an_address_a_peer_does_not_accept() {
    let b_from_block = "
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-in, namespace: x}
spec:
  podSelector: {matchLabels: {app: b}}
  ingress:
  - from: [{ipBlock: {cidr: 10.0.0.1/32}}]
";
    let base = load(&format!("{}{b_from_block}", three_pods()));
    let moved = format!(
        "{NS_X}{}{}{}{b_from_block}",
        pod("a", &["10.0.0.9"]),
        pod("b", &["10.0.0.2"]),
        pod("c", &["10.0.0.3"])
    );
    assert_eq!(
        lines(&changes(&base, &load(&moved), &["80/TCP"])),
        ["x/a -> x/b default 80/TCP ipv4 newly-denied true/false staged true/false [x/b-in]"]
    );
}

#[test]
fn a_rule_narrowed() {
    let wide = B_FROM_A.replace(
        "podSelector: {matchLabels: {app: a}}",
        "podSelector: {matchExpressions: [{key: app, operator: In, values: [a, c]}]}",
    );
    let base = load(&format!("{}{wide}", three_pods()));
    let changed = load(&format!("{}{B_FROM_A}", three_pods()));
    assert_eq!(
        lines(&changes(&base, &changed, &["80/TCP"])),
        ["x/c -> x/b default 80/TCP ipv4 newly-denied true/false staged true/false [x/b-in]"]
    );
}

#[test]
fn a_policy_deleted_through_the_delete_annotation() {
    let dir = TempDir::new("diff-delete");
    dir.write("base.yaml", &format!("{}{B_FROM_A}", three_pods()));
    dir.write(
        "delete.yaml",
        "apiVersion: v1
kind: List
items:
- apiVersion: networking.k8s.io/v1
  kind: NetworkPolicy
  metadata: {name: b-in, namespace: x, annotations: {netwarden.io/delete: \"true\"}}
",
    );
    let layered = layer_paths(
        &[dir.path.join("base.yaml")],
        &[dir.path.join("delete.yaml")],
        &LoadOptions::default(),
    );
    assert!(layered.unmatched_deletions.is_empty());
    assert!(layered.changed.policies.is_empty());
    assert_eq!(
        lines(&changes(&layered.base, &layered.changed, &["80/TCP"])),
        ["x/c -> x/b default 80/TCP ipv4 newly-allowed false/true staged false/true [x/b-in]"]
    );
}

#[test]
fn a_monitored_replacement_changes_the_staged_view_only() {
    let open = "
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-open, namespace: x}
spec:
  podSelector: {matchLabels: {app: b}}
  ingress: [{ports: [{port: 80}]}]
";
    let narrow = "
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: b-narrow
  namespace: x
  annotations: {netwarden.io/mode: monitor, netwarden.io/replaces: b-open}
spec:
  podSelector: {matchLabels: {app: b}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: a}}}]
    ports: [{port: 80}]
";
    let base = load(&format!("{}{open}", three_pods()));
    let changed = load(&format!("{}{open}{narrow}", three_pods()));
    // Enforcement is unchanged; once the replacement is enforced, c → b is denied: the
    // replaced policy and its replacement are both named.
    assert_eq!(
        lines(&changes(&base, &changed, &["80/TCP"])),
        ["x/c -> x/b default 80/TCP ipv4 staged-view true/true staged true/false [x/b-narrow, x/b-open]"]
    );

    // A replacement selecting other pods than the policy it replaces: b leaves the staged
    // view of b-open without the replacement isolating it — the replacement is still named.
    let elsewhere = narrow.replace("{matchLabels: {app: b}}", "{matchLabels: {app: c}}");
    let changed = load(&format!("{}{open}{elsewhere}", three_pods()));
    let found = lines(&changes(&base, &changed, &["8080/TCP"]));
    assert!(
        found.contains(
            &"x/a -> x/b default 8080/TCP ipv4 staged-view false/false staged false/true [x/b-narrow, x/b-open]"
                .to_string()
        ),
        "{found:#?}"
    );
}

#[test]
fn a_namespace_relabel_changes_a_namespace_selector_match() {
    let base_text = format!(
        "{NS_X}{}
---
apiVersion: v1
kind: Pod
metadata: {{name: b, namespace: w, labels: {{app: b}}}}
status: {{podIPs: [{{ip: 10.0.1.2}}]}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {{name: from-red, namespace: w}}
spec:
  podSelector: {{}}
  ingress:
  - from: [{{namespaceSelector: {{matchLabels: {{team: red}}}}}}]
",
        pod("a", &["10.0.0.1"])
    );
    let base = load(&base_text);
    let changed = load(&base_text.replace("team: red}}\n", "team: blue}}\n"));
    assert_eq!(
        changed
            .namespaces
            .iter()
            .find(|n| n.name == "x")
            .unwrap()
            .labels["team"],
        "blue"
    );
    // No policy changed: the one whose match did is responsible.
    assert_eq!(
        lines(&changes(&base, &changed, &["80/TCP"])),
        ["x/a -> w/b default 80/TCP ipv4 newly-denied true/false staged true/false [w/from-red]"]
    );
}

#[test]
fn a_multi_network_policy_changes_only_its_network() {
    let attached = |name: &str, ip: &str, net_ip: &str| {
        format!(
            "
---
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: x
  labels: {{app: {name}}}
  annotations:
    k8s.v1.cni.cncf.io/network-status: '[{{\"name\": \"cbr0\", \"interface\": \"eth0\", \"ips\": [\"{ip}\"], \"default\": true}}, {{\"name\": \"x/net1\", \"interface\": \"net1\", \"ips\": [\"{net_ip}\"]}}]'
status: {{podIPs: [{{ip: \"{ip}\"}}]}}
"
        )
    };
    let pods = format!(
        "{NS_X}{}{}",
        attached("a", "10.0.0.1", "192.168.0.1"),
        attached("b", "10.0.0.2", "192.168.0.2")
    );
    let policy = "
---
apiVersion: k8s.cni.cncf.io/v1beta1
kind: MultiNetworkPolicy
metadata:
  name: b-net1
  namespace: x
  annotations: {k8s.v1.cni.cncf.io/policy-for: net1}
spec:
  podSelector: {matchLabels: {app: b}}
  policyTypes: [Ingress]
";
    let base = load(&pods);
    let changed = load(&format!("{pods}{policy}"));
    assert_eq!(
        lines(&changes(&base, &changed, &["80/TCP"])),
        ["x/a -> x/b x/net1 80/TCP ipv4 newly-denied true/false staged true/false [x/b-net1]"]
    );
    let change = &changes(&base, &changed, &["80/TCP"])[0];
    assert_eq!(
        (change.from_interface.as_str(), change.to_interface.as_str()),
        ("net1", "net1")
    );
    assert_eq!(change.dst.to_string(), "192.168.0.2");
}

#[test]
fn dual_stack_pods_give_one_change_per_family() {
    let pods = format!(
        "{NS_X}{}{}",
        pod("a", &["10.0.0.1", "fd00::1"]),
        pod("b", &["10.0.0.2", "fd00::2"])
    );
    let deny_b = "
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-closed, namespace: x}
spec: {podSelector: {matchLabels: {app: b}}, policyTypes: [Ingress]}
";
    let base = load(&pods);
    let changed = load(&format!("{pods}{deny_b}"));
    assert_eq!(
        lines(&changes(&base, &changed, &["80/TCP"])),
        [
            "x/a -> x/b default 80/TCP ipv4 newly-denied true/false staged true/false [x/b-closed]",
            "x/a -> x/b default 80/TCP ipv6 newly-denied true/false staged true/false [x/b-closed]",
        ]
    );
    let json = serde_json::to_value(&changes(&base, &changed, &["80/TCP"])[1]).unwrap();
    assert_eq!(json["family"], "ipv6");
    assert_eq!(json["kind"], "newly-denied");
    assert_eq!(json["policies"], serde_json::json!(["x/b-closed"]));
}

// ----- the property ----------------------------------------------------------------------

/// Objects keyed as the engine keys them (a later object replaces an earlier one).
#[derive(Default, Clone)]
struct State {
    namespaces: BTreeMap<String, Namespace>,
    pods: BTreeMap<PodKey, Pod>,
    policies: BTreeMap<PolicyRef, Policy>,
    services: BTreeMap<ObjectKey, Service>,
}

impl State {
    fn apply(&mut self, step: &Step) {
        match step.clone() {
            Step::SetNamespace(n) => {
                self.namespaces.insert(n.name.clone(), n);
            }
            Step::RemoveNamespace(name) => {
                self.namespaces.remove(&name);
            }
            Step::SetPod(p) => {
                self.pods.insert(p.key.clone(), p);
            }
            Step::RemovePod(key) => {
                self.pods.remove(&key);
            }
            Step::SetPolicy(p) => {
                self.policies.insert(p.reference(), p);
            }
            Step::RemovePolicy(reference) => {
                self.policies.remove(&reference);
            }
            Step::SetService(s) => {
                self.services.insert(s.key.clone(), s);
            }
            Step::RemoveService(key) => {
                self.services.remove(&key);
            }
            // An `Inventory` holds no admin policies or Nodes yet: this property leaves the
            // scenario's admin objects out, in the base and in the changes alike.
            Step::SetAdminPolicy(_)
            | Step::RemoveAdminPolicy(_)
            | Step::SetNode(_)
            | Step::RemoveNode(_) => {}
        }
    }

    fn inventory(&self) -> Inventory {
        Inventory {
            namespaces: self.namespaces.values().cloned().collect(),
            pods: self.pods.values().cloned().collect(),
            policies: self.policies.values().cloned().collect(),
            services: self.services.values().cloned().collect(),
            ..Inventory::default()
        }
    }
}

/// The naive answer: `reach` on both views, every pair, compared probe by probe (in the
/// changed view's order), as lines without the policies.
fn naive(
    base: &Inventory,
    changed: &Inventory,
    options: &EngineOptions,
    query: &ReachQuery,
) -> Vec<String> {
    let mut before_engine = engine_from(base, options.clone());
    let before_rules = before_engine.all_pod_rules();
    let before: HashMap<_, (bool, bool)> = Reach::new(&before_engine, &before_rules, query)
        .probes()
        .map(|p| {
            let key = (
                p.from.clone(),
                p.from_interface.clone(),
                p.to.clone(),
                p.to_interface.clone(),
                p.network.clone(),
                p.port,
                p.protocol,
                p.family,
            );
            (key, (p.allowed, p.staged_allowed))
        })
        .collect();
    let mut after_engine = engine_from(changed, options.clone());
    let after_rules = after_engine.all_pod_rules();
    let out: Vec<String> = Reach::new(&after_engine, &after_rules, query)
        .probes()
        .filter_map(|p| {
            let key = (
                p.from.clone(),
                p.from_interface.clone(),
                p.to.clone(),
                p.to_interface.clone(),
                p.network.clone(),
                p.port,
                p.protocol,
                p.family,
            );
            let (was, staged_was) = *before.get(&key)?;
            (was != p.allowed || staged_was != p.staged_allowed).then(|| {
                format!(
                    "{} {} -> {} {} {} {}/{} {} {}/{} staged {}/{}",
                    p.from,
                    p.from_interface,
                    p.to,
                    p.to_interface,
                    p.network,
                    p.port,
                    p.protocol,
                    p.family.as_str(),
                    was,
                    p.allowed,
                    staged_was,
                    p.staged_allowed
                )
            })
        })
        .collect();
    out
}

fn without_policies(c: &Change) -> String {
    format!(
        "{} {} -> {} {} {} {}/{} {} {}/{} staged {}/{}",
        c.from,
        c.from_interface,
        c.to,
        c.to_interface,
        c.network,
        c.port,
        c.protocol,
        c.family.as_str(),
        c.before,
        c.after,
        c.staged_before,
        c.staged_after
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Random small clusters (every kind of policy, monitored and replacing policies,
    /// secondary networks, dual-stack and host-network pods, Services) and random changes to
    /// them: `diff` equals the naive comparison, in the same order, and names at least one
    /// policy for every change.
    #[test]
    fn diff_equals_comparing_two_full_reach_runs(
        bytes in proptest::collection::vec(any::<u8>(), 0..600)
    ) {
        let scenario = Scenario::from_bytes(&bytes);
        let mut state = State::default();
        for n in &scenario.namespaces {
            state.apply(&Step::SetNamespace(n.clone()));
        }
        for p in &scenario.pods {
            state.apply(&Step::SetPod(p.clone()));
        }
        for p in &scenario.policies {
            state.apply(&Step::SetPolicy(p.clone()));
        }
        for s in &scenario.services {
            state.apply(&Step::SetService(s.clone()));
        }
        let base = state.inventory();
        for step in &scenario.changes {
            state.apply(step);
        }
        let changed = state.inventory();
        let mut ports = default_ports(&base, &changed);
        ports.push("53/UDP".parse().unwrap());
        let query = ReachQuery { ports, ..ReachQuery::default() };
        let found = diff(&base, &changed, &scenario.options, &query);
        let expected = naive(&base, &changed, &scenario.options, &query);
        let got: Vec<String> = found.iter().map(without_policies).collect();
        prop_assert_eq!(got, expected);
        for change in &found {
            prop_assert!(!change.policies.is_empty(), "no policy named for {}", line(change));
            prop_assert_eq!(
                change.kind,
                match (change.before, change.after) {
                    (true, false) => ChangeKind::NewlyDenied,
                    (false, true) => ChangeKind::NewlyAllowed,
                    _ => ChangeKind::StagedView,
                }
            );
        }
    }
}
