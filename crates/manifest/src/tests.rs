//! Table-driven tests of the loader on small inline manifests.

use std::net::IpAddr;

use netwarden_engine::{
    IpBlock, LabelSelector, Labels, Mode, NetworkId, NetworkSelectorEntry, NetworkType, Operator,
    Peer, Policy, PolicyKind, PolicyPort, PolicyScope, PortRef, Protocol,
};

use crate::*;

fn load(text: &str) -> Inventory {
    parse_str("t.yaml", text, &LoadOptions::default())
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// (kind, object, field) of every error, for exact comparisons.
fn errors(inv: &Inventory) -> Vec<Where> {
    inv.errors()
        .map(|p| (p.kind.clone(), p.object.clone(), p.field.clone()))
        .collect()
}

fn warnings(inv: &Inventory) -> Vec<Where> {
    inv.problems
        .iter()
        .filter(|p| p.severity == Severity::Warning)
        .map(|p| (p.kind.clone(), p.object.clone(), p.field.clone()))
        .collect()
}

/// (kind, object, field) of a problem.
type Where = (String, String, String);

fn e(kind: &str, object: &str, field: &str) -> Where {
    (kind.into(), object.into(), field.into())
}

/// The directions a policy isolates, when it allows nothing in any of them (its fail-closed
/// form, SPEC 7); `None` when there is no such policy.
fn fail_closed_directions(inv: &Inventory, name: &str) -> Option<(bool, bool)> {
    let p = inv.policies.iter().find(|p| p.key.name == name)?;
    let empty = |rules: &Option<Vec<netwarden_engine::PolicyRule>>| {
        rules.as_ref().is_none_or(|r| r.is_empty())
    };
    assert!(empty(&p.ingress) && empty(&p.egress), "{p:?}");
    Some((p.ingress.is_some(), p.egress.is_some()))
}

/// Whether the inventory says a policy cannot be read and fails closed.
fn says_fail_closed(inv: &Inventory) -> bool {
    inv.errors()
        .any(|p| p.reason.contains("cannot be read") && p.reason.contains("fail closed"))
}

fn policy<'a>(inv: &'a Inventory, name: &str) -> &'a Policy {
    inv.policies
        .iter()
        .find(|p| p.key.name == name)
        .unwrap_or_else(|| panic!("no policy {name}"))
}

fn pod<'a>(inv: &'a Inventory, name: &str) -> &'a netwarden_engine::Pod {
    inv.pods
        .iter()
        .find(|p| p.key.name == name)
        .unwrap_or_else(|| panic!("no pod {name}"))
}

const GOOD_POD: &str = r#"
---
apiVersion: v1
kind: Pod
metadata: {name: good, namespace: ns1, labels: {app: good}}
status: {podIPs: [{ip: 10.0.0.9}]}
"#;

// ---------------------------------------------------------------------------------------
// Documents, Lists, JSON

#[test]
fn multi_document_list_and_empty_documents() {
    let inv = load(
        r#"
# header comment
---
apiVersion: v1
kind: Namespace
metadata: {name: ns1, labels: {team: a}}
---
---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Pod
  metadata: {name: p1, namespace: ns1}
  status: {podIP: 10.0.0.1}
- apiVersion: apps/v1
  kind: Deployment
  metadata: {name: ignored}
- apiVersion: v1
  kind: List
  items:
  - {apiVersion: v1, kind: Pod, metadata: {name: p2}}
...
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np, namespace: ns1}
spec: {podSelector: {}}
"#,
    );
    assert_eq!(inv.problems, vec![]);
    assert_eq!(inv.pods.len(), 2);
    assert_eq!(pod(&inv, "p2").key.namespace, "default");
    assert_eq!(
        pod(&inv, "p2").interfaces,
        vec![],
        "a pod without IPs has no interfaces"
    );
    assert_eq!(pod(&inv, "p1").primary().unwrap().ips, vec![ip("10.0.0.1")]);
    assert_eq!(inv.policies.len(), 1);
    // ns1 declared; "default" implicit.
    let names: Vec<_> = inv.namespaces.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["ns1", "default"]);
}

#[test]
fn json_object_list_and_stream() {
    let one = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","namespace":"x"},
                 "status":{"podIPs":[{"ip":"fd00::1"}]}}"#;
    let inv = parse_str("a.json", one, &LoadOptions::default());
    assert_eq!(inv.problems, vec![]);
    let a = pod(&inv, "a");
    assert_eq!(a.primary().unwrap().ips, vec![ip("fd00::1")]);
    assert_eq!(a.primary().unwrap().prefix_lens, vec![64]);

    let list = r#"{"apiVersion":"v1","kind":"List","items":[
        {"apiVersion":"v1","kind":"Namespace","metadata":{"name":"x"}},
        {"apiVersion":"v1","kind":"Pod","metadata":{"name":"b","namespace":"x"}}]}
        {"apiVersion":"v1","kind":"Pod","metadata":{"name":"c","namespace":"x"}}"#;
    let inv = parse_str("b.json", list, &LoadOptions::default());
    assert_eq!(inv.problems, vec![]);
    assert_eq!(inv.pods.len(), 2);
    assert_eq!(inv.namespaces.len(), 1);

    // A typed list as the API returns it: items carry no kind.
    let typed = r#"{"apiVersion":"v1","kind":"PodList","items":[{"metadata":{"name":"d"}}]}"#;
    let inv = parse_str("c.json", typed, &LoadOptions::default());
    assert_eq!(inv.problems, vec![]);
    assert_eq!(inv.pods[0].key.name, "d");

    let broken = parse_str("d.json", r#"{"kind": "Pod", "#, &LoadOptions::default());
    assert_eq!(broken.problems.len(), 1);
    assert!(
        broken.problems[0].reason.starts_with("invalid JSON"),
        "{}",
        broken.problems[0]
    );
}

#[test]
fn broken_document_does_not_lose_the_others() {
    let inv = load(
        r#"
apiVersion: v1
kind: Pod
metadata: {name: a}
---
apiVersion: v1
kind: Pod
metadata: {name: [unclosed
---
apiVersion: v1
kind: Pod
metadata: {name: c}
"#,
    );
    assert_eq!(
        inv.pods
            .iter()
            .map(|p| p.key.name.as_str())
            .collect::<Vec<_>>(),
        ["a", "c"]
    );
    assert_eq!(errors(&inv), vec![e("", "#2", "")]);
    assert!(inv.problems[0].reason.starts_with("invalid YAML"));
}

#[test]
fn hostile_yaml_is_refused_not_fatal() {
    let deep = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: a, labels: {}x{}}}\n",
        "[".repeat(5000),
        "]".repeat(5000)
    );
    let bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\ne: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\ng: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]\nh: [*g, *g, *g, *g, *g, *g, *g, *g, *g, *g]\n";
    let deep_json = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    for (label, text) in [
        ("deep.yaml", deep.as_str()),
        ("bomb.yaml", bomb),
        ("deep.json", deep_json.as_str()),
    ] {
        let inv = parse_str(label, &format!("{text}{GOOD_POD}"), &LoadOptions::default());
        assert!(inv.has_errors(), "{label}");
        let inv = parse_str(label, text, &LoadOptions::default());
        assert!(inv.pods.is_empty() && inv.has_errors(), "{label}");
    }
}

#[test]
fn a_large_list_loads() {
    let items: Vec<String> = (0..5000)
        .map(|i| format!("- {{apiVersion: v1, kind: Pod, metadata: {{name: p{i}, labels: {{app: a, i: \"{i}\"}}}}, status: {{podIPs: [{{ip: 10.1.{}.{}}}]}}}}", i / 250, i % 250))
        .collect();
    let inv = load(&format!(
        "apiVersion: v1\nkind: List\nitems:\n{}\n",
        items.join("\n")
    ));
    assert_eq!(inv.problems, vec![]);
    assert_eq!(inv.pods.len(), 5000);
}

#[test]
fn document_problems() {
    let inv = load(
        r#"
metadata: {name: nokind}
---
kind: 42
---
- a
- b
---
apiVersion: example.com/v1
kind: Whatever
"#,
    );
    assert_eq!(
        errors(&inv),
        vec![e("", "#1", "kind"), e("", "#2", "kind"), e("", "#3", "")]
    );
}

#[test]
fn calico_network_policy_is_not_ours() {
    let inv = load(
        "apiVersion: crd.projectcalico.org/v1\nkind: NetworkPolicy\nmetadata: {name: c}\nspec: {}\n",
    );
    assert_eq!(inv.problems, vec![]);
    assert!(inv.policies.is_empty());
}

// ---------------------------------------------------------------------------------------
// Namespaces, names, duplicates

#[test]
fn namespaces_always_carry_their_name_label() {
    let inv = load(
        r#"
apiVersion: v1
kind: Namespace
metadata: {name: a, labels: {kubernetes.io/metadata.name: wrong, x: z}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: b}
---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: c}
"#,
    );
    assert_eq!(inv.problems, vec![]);
    let got: Vec<_> = inv
        .namespaces
        .iter()
        .map(|n| (n.name.as_str(), n.labels.clone()))
        .collect();
    let labels = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<Labels>()
    };
    assert_eq!(
        got,
        vec![
            (
                "a",
                labels(&[("kubernetes.io/metadata.name", "a"), ("x", "z")])
            ),
            ("b", labels(&[("kubernetes.io/metadata.name", "b")])),
            ("c", labels(&[("kubernetes.io/metadata.name", "c")])),
        ]
    );
}

#[test]
fn invalid_names_drop_the_object() {
    let inv = load(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: "x; drop table", namespace: ns1}}
---
apiVersion: v1
kind: Pod
metadata: {{name: ok, namespace: "Bad_NS"}}
---
apiVersion: v1
kind: Namespace
metadata: {{name: a.b}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {{namespace: ns1}}
{GOOD_POD}"#
    ));
    assert_eq!(
        errors(&inv),
        vec![
            e("Pod", "ns1/x; drop table", "metadata.name"),
            e("Pod", "Bad_NS/ok", "metadata.namespace"),
            e("Namespace", "a.b", "metadata.name"),
            e("NetworkPolicy", "#4", "metadata.name"),
        ]
    );
    assert_eq!(inv.pods.len(), 1);
    assert!(inv.policies.is_empty());
}

#[test]
fn invalid_labels_reject_the_object() {
    // A pod missing a label would leave (or enter) the policies that select it: it is not
    // loaded at all, and each bad label is reported.
    let inv = load(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: p, labels: {{"bad key": v, ok: "bad value!", n: 5, fine: yes-ok}}}}
---
apiVersion: v1
kind: Namespace
metadata: {{name: ns2, labels: {{team: "a b"}}}}
{GOOD_POD}"#
    ));
    assert_eq!(
        errors(&inv),
        vec![
            e("Pod", "default/p", "metadata.labels[\"bad key\"]"),
            e("Pod", "default/p", "metadata.labels[\"n\"]"),
            e("Pod", "default/p", "metadata.labels[\"ok\"]"),
            e("Namespace", "ns2", "metadata.labels[\"team\"]"),
        ]
    );
    assert!(
        inv.errors().all(|p| p.reason.ends_with("object ignored")),
        "{:#?}",
        inv.problems
    );
    let names: Vec<_> = inv.pods.iter().map(|p| p.key.name.as_str()).collect();
    assert_eq!(names, ["good"]);
    assert!(inv.namespaces.iter().all(|n| n.name != "ns2"));
}

// ---------------------------------------------------------------------------------------
// SPEC section 7: each invalid object yields exactly its problem; the rest still loads.

#[test]
fn spec7_invalid_objects() {
    let np = |name: &str, spec: &str| {
        format!(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: {name}, namespace: ns1}}\nspec:\n{spec}\n"
        )
    };
    // (case, document, expected error (kind, object, field), reason fragment)
    let cases: Vec<(&str, String, Where, &str)> = vec![
        (
            "bad CIDR",
            np("p", "  ingress:\n  - from:\n    - ipBlock: {cidr: 10.0.0.0/33}\n    - podSelector: {}"),
            e("NetworkPolicy", "ns1/p", "spec.ingress[0].from[0].ipBlock.cidr"),
            "invalid CIDR \"10.0.0.0/33\"",
        ),
        (
            "port out of range",
            np("p", "  ingress:\n  - ports:\n    - port: 70000\n    - port: 80"),
            e("NetworkPolicy", "ns1/p", "spec.ingress[0].ports[0].port"),
            "port 70000 is out of range 1-65535",
        ),
        (
            "port zero",
            np("p", "  egress:\n  - ports:\n    - port: 0\n    - port: 80"),
            e("NetworkPolicy", "ns1/p", "spec.egress[0].ports[0].port"),
            "port 0 is out of range",
        ),
        (
            "endPort without port",
            np("p", "  ingress:\n  - ports:\n    - endPort: 90\n    - port: 80"),
            e("NetworkPolicy", "ns1/p", "spec.ingress[0].ports[0].endPort"),
            "endPort needs a numeric port",
        ),
        (
            "endPort below port",
            np("p", "  ingress:\n  - ports:\n    - {port: 90, endPort: 80}\n    - port: 80"),
            e("NetworkPolicy", "ns1/p", "spec.ingress[0].ports[0].endPort"),
            "endPort 80 is below port 90",
        ),
        (
            "endPort with named port",
            np("p", "  ingress:\n  - ports:\n    - {port: http, endPort: 80}\n    - port: 80"),
            e("NetworkPolicy", "ns1/p", "spec.ingress[0].ports[0].endPort"),
            "endPort needs a numeric port, not a named one",
        ),
        (
            "unknown protocol",
            np("p", "  ingress:\n  - ports:\n    - {protocol: ICMP, port: 1}\n    - port: 80"),
            e("NetworkPolicy", "ns1/p", "spec.ingress[0].ports[0].protocol"),
            "unknown protocol \"ICMP\"",
        ),
        (
            "bad selector operator",
            np(
                "p",
                "  ingress:\n  - from:\n    - podSelector: {matchExpressions: [{key: a, operator: Equals, values: [b]}]}\n    - podSelector: {}",
            ),
            e("NetworkPolicy", "ns1/p", "spec.ingress[0].from[0].podSelector.matchExpressions[0].operator"),
            "unknown operator \"Equals\"",
        ),
        (
            "malformed annotation",
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  namespace: ns1\n  annotations:\n    k8s.v1.cni.cncf.io/network-status: '[{\"name\": '\nstatus: {podIPs: [{ip: 10.0.0.5}]}\n".to_string(),
            e("Pod", "ns1/p", "metadata.annotations[\"k8s.v1.cni.cncf.io/network-status\"]"),
            "malformed JSON",
        ),
        (
            "duplicate object",
            format!("{}---\n{}", np("p", "  podSelector: {}"), np("p", "  podSelector: {}")),
            e("NetworkPolicy", "ns1/p", "metadata.name"),
            "duplicate object (first defined in t.yaml)",
        ),
        (
            "bad mode annotation",
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: p\n  namespace: ns1\n  annotations: {netwarden.io/mode: staged}\n".to_string(),
            e("NetworkPolicy", "ns1/p", "metadata.annotations[\"netwarden.io/mode\"]"),
            "policy stays enforced",
        ),
    ];
    for (case, doc, want, reason) in cases {
        let inv = load(&format!("{doc}{GOOD_POD}"));
        assert_eq!(errors(&inv), vec![want], "{case}: {:#?}", inv.problems);
        let p = inv.errors().next().unwrap();
        assert!(
            p.reason.contains(reason),
            "{case}: reason {:?} lacks {reason:?}",
            p.reason
        );
        assert!(
            inv.pods.iter().any(|p| p.key.name == "good"),
            "{case}: the good pod still loads"
        );
        // The object survives with its valid parts (policies) or at all (pods).
        let loaded = inv.policies.iter().any(|p| p.key.name == "p")
            || inv.pods.iter().any(|p| p.key.name == "p");
        assert!(loaded, "{case}: the object keeps its valid parts");
    }
}

#[test]
fn spec7_partial_drops_narrow_the_rule() {
    let inv = load(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: ns1}
spec:
  ingress:
  - from:
    - ipBlock: {cidr: 10.0.0.0/33}
    - podSelector: {matchLabels: {app: a}}
    ports:
    - port: 70000
    - {protocol: UDP, port: 53}
"#,
    );
    let rules = policy(&inv, "p").ingress.as_ref().unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].peers.len(), 1);
    assert_eq!(
        rules[0].ports,
        vec![PolicyPort {
            protocol: Protocol::Udp,
            port: Some(PortRef::Number(53)),
            end_port: None
        }]
    );
}

#[test]
fn rules_whose_peers_or_ports_are_all_invalid_are_dropped() {
    let inv = load(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: ns1}
spec:
  policyTypes: [Ingress, Egress]
  ingress:
  - from:
    - ipBlock: {cidr: nonsense}
  - ports:
    - {protocol: TCP, port: 99999}
  - from:
    - podSelector: {matchLabels: {app: ok}}
  egress:
  - to:
    - ipBlock: {cidr: 10.0.0.0/8, except: [11.0.0.0/16]}
"#,
    );
    let p = policy(&inv, "p");
    let ingress = p.ingress.as_ref().unwrap();
    assert_eq!(
        ingress.len(),
        1,
        "only the valid rule is left; the others never mean 'all'"
    );
    assert!(
        matches!(&ingress[0].peers[0], Peer::Pods { pod_selector: Some(s), .. } if s.match_labels["app"] == "ok")
    );
    assert_eq!(
        p.egress,
        Some(vec![]),
        "egress isolated with no rule left: deny"
    );
    assert_eq!(
        errors(&inv),
        vec![
            e(
                "NetworkPolicy",
                "ns1/p",
                "spec.ingress[0].from[0].ipBlock.cidr"
            ),
            e("NetworkPolicy", "ns1/p", "spec.ingress[1].ports[0].port"),
            e(
                "NetworkPolicy",
                "ns1/p",
                "spec.egress[0].to[0].ipBlock.except[0]"
            ),
        ]
    );
    let w = warnings(&inv);
    assert!(
        w.contains(&e("NetworkPolicy", "ns1/p", "spec.ingress[0]")),
        "{w:?}"
    );
    assert!(
        w.contains(&e("NetworkPolicy", "ns1/p", "spec.ingress[1]")),
        "{w:?}"
    );
    assert!(
        w.contains(&e("NetworkPolicy", "ns1/p", "spec.egress[0]")),
        "{w:?}"
    );
}

#[test]
fn wrong_types_in_a_policy_reject_it() {
    // A list where an object belongs, or the reverse, means the policy is not what its author
    // thinks: no part of it is loaded (not even narrowed).
    let cases = [
        ("  egress:\n  - to: \"not a list\"", "spec.egress[0].to"),
        (
            "  ingress:\n  - from: [podSelector]",
            "spec.ingress[0].from[0]",
        ),
        (
            "  ingress:\n  - from: [{ipBlock: [10.0.0.0/8]}]",
            "spec.ingress[0].from[0].ipBlock",
        ),
        (
            "  ingress:\n  - from: [{ipBlock: {cidr: 10.0.0.0/8, except: [5]}}]",
            "spec.ingress[0].from[0].ipBlock.except[0]",
        ),
        ("  ingress:\n  - ports: [80]", "spec.ingress[0].ports[0]"),
        ("  ingress: [\"x\"]", "spec.ingress[0]"),
        (
            "  podSelector: {matchLabels: {app: true}}",
            "spec.podSelector.matchLabels[\"app\"]",
        ),
        ("  podSelector: []", "spec.podSelector"),
    ];
    for (spec, field) in cases {
        let inv = load(&format!(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: p, namespace: ns1}}\nspec:\n{spec}\n{GOOD_POD}"
        ));
        // Not loaded as written: in its fail-closed form (SPEC 7); when even its podSelector
        // cannot be read, it isolates every pod of its namespace.
        if field.starts_with("spec.podSelector") {
            assert_eq!(fail_closed_directions(&inv, "p"), Some((true, false)));
            assert!(policy(&inv, "p").pod_selector.is_empty(), "{spec}");
        } else {
            let egress = spec.contains("egress");
            assert_eq!(
                fail_closed_directions(&inv, "p"),
                Some((true, egress)),
                "{spec}"
            );
            assert!(says_fail_closed(&inv), "{spec}: {:#?}", inv.problems);
        }
        let errs = errors(&inv);
        assert!(
            errs.contains(&e("NetworkPolicy", "ns1/p", field)),
            "{spec}: {errs:?}"
        );
        assert!(
            inv.errors().any(|p| p.reason.ends_with("object ignored")),
            "{spec}: {:#?}",
            inv.problems
        );
        assert_eq!(inv.pods.len(), 1, "{spec}");
    }
}

// ---------------------------------------------------------------------------------------
// Policies

#[test]
fn policy_types_defaulting() {
    // (spec, isolates ingress, isolates egress)
    let cases = [
        ("{}", true, false),
        ("{egress: []}", true, false),
        ("{egress: [{}]}", true, true),
        (
            "{ingress: [{}], egress: [{}], policyTypes: [Egress]}",
            false,
            true,
        ),
        ("{policyTypes: [Ingress, Egress]}", true, true),
        ("{policyTypes: []}", true, false),
    ];
    for (spec, ing, eg) in cases {
        let inv = load(&format!(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: p}}\nspec: {spec}\n"
        ));
        let p = policy(&inv, "p");
        assert_eq!(
            (p.ingress.is_some(), p.egress.is_some()),
            (ing, eg),
            "{spec}"
        );
        assert_eq!(inv.problems, vec![], "{spec}");
    }
    // A policyTypes that cannot be read rejects the policy as written: no default applies (a
    // misspelled Egress would otherwise leave egress open). It fails closed instead: isolating
    // what it selects, allowing nothing, in both directions when they cannot be read (SPEC 7).
    for (spec, field, directions) in [
        (
            "{policyTypes: [Ingress, Egres]}",
            "spec.policyTypes[1]",
            (true, true),
        ),
        (
            "{policyTypes: [Sideways], egress: [{}]}",
            "spec.policyTypes[0]",
            (true, true),
        ),
        (
            "{policyTypes: [Ingress, 7]}",
            "spec.policyTypes[1]",
            (true, true),
        ),
        (
            "{policyTypes: Egress, egress: []}",
            "spec.policyTypes",
            (true, true),
        ),
        (
            "{ingress: [{}], egress: {to: []}}",
            "spec.egress",
            (true, true),
        ),
        (
            "{policyTypes: [Egress], egress: [{to: 5}]}",
            "spec.egress[0].to",
            (false, true),
        ),
    ] {
        let inv = load(&format!(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: p}}\nspec: {spec}\n{GOOD_POD}"
        ));
        assert_eq!(
            fail_closed_directions(&inv, "p"),
            Some(directions),
            "{spec}"
        );
        assert_eq!(
            errors(&inv),
            vec![
                e("NetworkPolicy", "default/p", field),
                e("NetworkPolicy", "default/p", ""),
            ],
            "{spec}"
        );
        assert!(inv.problems[0].reason.ends_with("object ignored"), "{spec}");
        assert!(says_fail_closed(&inv), "{spec}");
        assert_eq!(inv.pods.len(), 1, "{spec}");
    }
    // A spec that is not an object: which pods and directions it meant are unknown, so it
    // isolates its whole namespace both ways.
    for spec in ["5", "[a]", "text"] {
        let inv = load(&format!(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: p}}\nspec: {spec}\n{GOOD_POD}"
        ));
        assert_eq!(
            fail_closed_directions(&inv, "p"),
            Some((true, true)),
            "{spec}"
        );
        assert_eq!(
            policy(&inv, "p").pod_selector,
            LabelSelector::everything(),
            "{spec}"
        );
        assert!(says_fail_closed(&inv), "{spec}: {:#?}", inv.problems);
        assert!(
            errors(&inv).contains(&e("NetworkPolicy", "default/p", "spec")),
            "{spec}: {:#?}",
            inv.problems
        );
    }
    // Rules of a direction that is not isolated are ignored; an isolated one without rules
    // denies everything.
    let inv = load(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p}\nspec: {policyTypes: [Egress], ingress: [{}]}\n",
    );
    let p = policy(&inv, "p");
    assert_eq!((p.ingress.clone(), p.egress.clone()), (None, Some(vec![])));
}

#[test]
fn full_network_policy() {
    let inv = load(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web, namespace: shop}
spec:
  podSelector:
    matchLabels: {app: web}
    matchExpressions:
    - {key: tier, operator: In, values: [front, edge]}
    - {key: canary, operator: DoesNotExist}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {team: a}}
      podSelector: {matchExpressions: [{key: role, operator: NotIn, values: [db]}]}
    - ipBlock: {cidr: 10.1.0.0/16, except: [10.1.2.0/24]}
    ports:
    - {port: 80}
    - {protocol: UDP, port: dns}
    - {protocol: SCTP}
    - {port: 8000, endPort: 8080}
  - {}
"#,
    );
    assert_eq!(inv.problems, vec![]);
    let p = policy(&inv, "web");
    assert_eq!(p.kind, PolicyKind::NetworkPolicy);
    assert_eq!(p.scope, PolicyScope::Primary);
    assert_eq!(p.mode, Mode::Enforce);
    assert_eq!(p.pod_selector.match_labels["app"], "web");
    assert_eq!(p.pod_selector.match_expressions[0].operator, Operator::In);
    assert_eq!(
        p.pod_selector.match_expressions[0].values,
        ["front", "edge"]
    );
    assert_eq!(
        p.pod_selector.match_expressions[1].operator,
        Operator::DoesNotExist
    );
    let rules = p.ingress.as_ref().unwrap();
    assert_eq!(rules.len(), 2);
    assert_eq!(
        rules[1],
        Default::default(),
        "an empty rule allows everything"
    );
    match &rules[0].peers[0] {
        Peer::Pods {
            pod_selector: Some(ps),
            namespace_selector: Some(ns),
            network_selector: None,
        } => {
            assert_eq!(ns.match_labels["team"], "a");
            assert_eq!(ps.match_expressions[0].operator, Operator::NotIn);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        rules[0].peers[1],
        Peer::IpBlock(IpBlock {
            cidr: "10.1.0.0/16".parse().unwrap(),
            except: vec!["10.1.2.0/24".parse().unwrap()]
        })
    );
    assert_eq!(
        rules[0].ports,
        vec![
            PolicyPort {
                protocol: Protocol::Tcp,
                port: Some(PortRef::Number(80)),
                end_port: None
            },
            PolicyPort {
                protocol: Protocol::Udp,
                port: Some(PortRef::Named("dns".into())),
                end_port: None
            },
            PolicyPort {
                protocol: Protocol::Sctp,
                port: None,
                end_port: None
            },
            PolicyPort {
                protocol: Protocol::Tcp,
                port: Some(PortRef::Number(8000)),
                end_port: Some(8080)
            },
        ]
    );
    assert_eq!(p.egress, None);
}

#[test]
fn ip_block_checks() {
    // (ipBlock, error fields (relative to the ipBlock), warnings, loaded block)
    let cases: Vec<(&str, Vec<&str>, usize, Option<&str>)> = vec![
        ("{cidr: 10.0.0.1/24}", vec![], 1, Some("10.0.0.0/24")),
        (
            "{cidr: 10.0.0.0/24, except: [10.0.1.0/28]}",
            vec!["except[0]"],
            0,
            None,
        ),
        (
            "{cidr: 10.0.0.0/24, except: [10.0.0.0/24]}",
            vec!["except[0]"],
            0,
            None,
        ),
        (
            "{cidr: 10.0.0.0/24, except: ['fd00::/64']}",
            vec!["except[0]"],
            0,
            None,
        ),
        (
            "{cidr: 10.0.0.0/24, except: [bogus]}",
            vec!["except[0]"],
            0,
            None,
        ),
        ("{cidr: 10.0.0.5}", vec!["cidr"], 0, None),
        ("{except: [10.0.0.0/25]}", vec!["cidr"], 0, None),
        (
            "{cidr: 'fd00::/48', except: ['fd00::/64']}",
            vec![],
            0,
            Some("fd00::/48"),
        ),
    ];
    for (block, errs, nwarn, want) in cases {
        let inv = load(&format!(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: p}}\nspec:\n  ingress:\n  - from:\n    - ipBlock: {block}\n    - podSelector: {{}}\n"
        ));
        let want_errs: Vec<_> = errs
            .iter()
            .map(|f| {
                e(
                    "NetworkPolicy",
                    "default/p",
                    &format!("spec.ingress[0].from[0].ipBlock.{f}"),
                )
            })
            .collect();
        assert_eq!(errors(&inv), want_errs, "{block}");
        let got_warn = warnings(&inv).len();
        assert_eq!(got_warn, nwarn, "{block}: {:?}", inv.problems);
        let peers = &policy(&inv, "p").ingress.as_ref().unwrap()[0].peers;
        match want {
            Some(cidr) => {
                assert_eq!(peers.len(), 2, "{block}");
                assert!(
                    matches!(&peers[0], Peer::IpBlock(b) if b.cidr.to_string() == cidr),
                    "{block}"
                );
            }
            None => assert_eq!(
                peers.len(),
                1,
                "{block}: the invalid block is dropped, never widened"
            ),
        }
    }
}

#[test]
fn peer_shape_checks() {
    let inv = load(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p}
spec:
  ingress:
  - from:
    - {ipBlock: {cidr: 10.0.0.0/8}, podSelector: {}}
    - {}
    - {networkSelector: [{name: n}]}
    - namespaceSelector: {}
"#,
    );
    assert_eq!(
        errors(&inv),
        vec![
            e("NetworkPolicy", "default/p", "spec.ingress[0].from[0]"),
            e("NetworkPolicy", "default/p", "spec.ingress[0].from[1]"),
            e(
                "NetworkPolicy",
                "default/p",
                "spec.ingress[0].from[2].networkSelector"
            ),
        ]
    );
    assert_eq!(
        policy(&inv, "p").ingress.as_ref().unwrap()[0].peers.len(),
        1
    );
}

#[test]
fn selector_checks() {
    // (selector, error field suffixes)
    let cases: Vec<(&str, Vec<&str>)> = vec![
        (
            "{matchExpressions: [{key: a, operator: In}]}",
            vec!["matchExpressions[0].values"],
        ),
        (
            "{matchExpressions: [{key: a, operator: NotIn, values: []}]}",
            vec!["matchExpressions[0].values"],
        ),
        (
            "{matchExpressions: [{key: a, operator: Exists, values: [x]}]}",
            vec!["matchExpressions[0].values"],
        ),
        (
            "{matchExpressions: [{key: 'a b', operator: Exists}]}",
            vec!["matchExpressions[0].key"],
        ),
        (
            "{matchExpressions: [{operator: Exists}]}",
            vec!["matchExpressions[0].key"],
        ),
        (
            "{matchExpressions: [{key: a, operator: In, values: ['-x']}]}",
            vec!["matchExpressions[0].values[0]"],
        ),
        (
            "{matchLabels: {'x/y/z': b}}",
            vec!["matchLabels[\"x/y/z\"]"],
        ),
    ];
    for (sel, fields) in cases {
        // In a peer: the peer is dropped, the rule keeps its other peer.
        let inv = load(&format!(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: p}}\nspec:\n  ingress:\n  - from:\n    - namespaceSelector: {sel}\n    - podSelector: {{}}\n"
        ));
        let base = "spec.ingress[0].from[0].namespaceSelector";
        let want: Vec<_> = fields
            .iter()
            .map(|f| {
                e(
                    "NetworkPolicy",
                    "default/p",
                    &if f.is_empty() {
                        base.to_string()
                    } else {
                        format!("{base}.{f}")
                    },
                )
            })
            .collect();
        assert_eq!(errors(&inv), want, "{sel}");
        assert_eq!(
            policy(&inv, "p").ingress.as_ref().unwrap()[0].peers.len(),
            1,
            "{sel}"
        );

        // As the policy's podSelector: which pods it meant is unknown, so it fails closed for
        // its whole namespace (ingress, as it names no policyTypes), allowing nothing.
        let inv = load(&format!(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: p}}\nspec:\n  podSelector: {sel}\n{GOOD_POD}"
        ));
        assert_eq!(
            fail_closed_directions(&inv, "p"),
            Some((true, false)),
            "{sel}"
        );
        assert_eq!(
            policy(&inv, "p").pod_selector,
            netwarden_engine::LabelSelector::everything(),
            "{sel}"
        );
        assert!(says_fail_closed(&inv), "{sel}: {:#?}", inv.problems);
        for f in &fields {
            let field = format!("spec.podSelector.{f}");
            assert!(
                errors(&inv).contains(&e("NetworkPolicy", "default/p", &field)),
                "{sel}: {:#?}",
                inv.problems
            );
        }
        assert_eq!(inv.pods.len(), 1);
    }
}

#[test]
fn ports_checks() {
    // (port entry, error field suffix or "" for none, loaded port)
    let cases: Vec<(&str, &str, Option<PolicyPort>)> = vec![
        ("{port: '80'}", "port", None),
        ("{port: Http}", "port", None),
        ("{port: 80.5}", "port", None),
        ("{port: 80, endPort: 70000}", "endPort", None),
        ("{protocol: ICMP}", "protocol", None),
        (
            "{port: 80, endPort: 80}",
            "",
            Some(PolicyPort {
                protocol: Protocol::Tcp,
                port: Some(PortRef::Number(80)),
                end_port: Some(80),
            }),
        ),
        (
            "{protocol: udp, port: 65535}",
            "",
            Some(PolicyPort {
                protocol: Protocol::Udp,
                port: Some(PortRef::Number(65535)),
                end_port: None,
            }),
        ),
    ];
    for (port, field, want) in cases {
        let inv = load(&format!(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: p}}\nspec:\n  ingress:\n  - ports:\n    - {port}\n    - port: 1\n"
        ));
        let want_errs: Vec<_> = if field.is_empty() {
            vec![]
        } else {
            vec![e(
                "NetworkPolicy",
                "default/p",
                &format!("spec.ingress[0].ports[0].{field}"),
            )]
        };
        assert_eq!(errors(&inv), want_errs, "{port}: {:?}", inv.problems);
        let ports = &policy(&inv, "p").ingress.as_ref().unwrap()[0].ports;
        match want {
            Some(w) => assert_eq!(ports[0], w, "{port}"),
            None => assert_eq!(ports.len(), 1, "{port}"),
        }
    }
    // Wrong types reject the policy rather than narrow it.
    for (port, field) in [
        ("{port: [80]}", "port"),
        ("{port: 80, endPort: '90'}", "endPort"),
        ("{protocol: 7}", "protocol"),
    ] {
        let inv = load(&format!(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: p}}\nspec:\n  ingress:\n  - ports:\n    - {port}\n    - port: 1\n"
        ));
        let field = format!("spec.ingress[0].ports[0].{field}");
        assert_eq!(
            fail_closed_directions(&inv, "p"),
            Some((true, false)),
            "{port}"
        );
        assert!(
            errors(&inv).contains(&e("NetworkPolicy", "default/p", &field)),
            "{port}: {:?}",
            inv.problems
        );
    }
}

#[test]
fn danm_network_policy_network_selectors() {
    let inv = load(
        r#"
apiVersion: danm.k8s.io/v1
kind: DanmNetworkPolicy
metadata: {name: d, namespace: tel}
spec:
  podSelector: {matchLabels: {app: x}}
  ingress:
  - from:
    - networkSelector: [{name: internal}]
    - networkSelector: [{name: core, type: ClusterNetwork}, {name: t, type: TenantNetwork}]
      podSelector: {}
    - networkSelector: [{name: m1, type: NAD}, {name: other/m2, type: NetworkAttachmentDefinition}]
    - networkSelector: [{name: x, type: Bogus}]
    - networkSelector: [{name: ns/x, type: DanmNet}]
  - from:
    - networkSelector: [{name: yy, type: Bogus}]
"#,
    );
    let p = policy(&inv, "d");
    assert_eq!(p.kind, PolicyKind::DanmNetworkPolicy);
    assert_eq!(p.scope, PolicyScope::AllInterfaces);
    let rules = p.ingress.as_ref().unwrap();
    assert_eq!(
        rules.len(),
        1,
        "the rule whose only peer was invalid is dropped"
    );
    let nets: Vec<_> = rules[0]
        .peers
        .iter()
        .map(|peer| match peer {
            Peer::Pods {
                network_selector: Some(n),
                ..
            } => n.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    let entry = |kind, ns: Option<&str>, name: &str| NetworkSelectorEntry {
        kind,
        namespace: ns.map(str::to_string),
        name: name.into(),
    };
    assert_eq!(
        nets,
        vec![
            vec![entry(NetworkType::DanmNet, None, "internal")],
            vec![
                entry(NetworkType::ClusterNetwork, None, "core"),
                entry(NetworkType::TenantNetwork, None, "t")
            ],
            vec![
                entry(NetworkType::NetworkAttachmentDefinition, Some("tel"), "m1"),
                entry(
                    NetworkType::NetworkAttachmentDefinition,
                    Some("other"),
                    "m2"
                ),
            ],
        ]
    );
    assert_eq!(
        errors(&inv),
        vec![
            e(
                "DanmNetworkPolicy",
                "tel/d",
                "spec.ingress[0].from[3].networkSelector[0].type"
            ),
            e(
                "DanmNetworkPolicy",
                "tel/d",
                "spec.ingress[0].from[4].networkSelector[0].name"
            ),
            e(
                "DanmNetworkPolicy",
                "tel/d",
                "spec.ingress[1].from[0].networkSelector[0].type"
            ),
        ]
    );
}

#[test]
fn multi_network_policy_policy_for() {
    // (annotation or None, networks, errors, warnings)
    let cases: Vec<(Option<&str>, Vec<NetworkId>, usize, usize)> = vec![
        (Some("net1"), vec![NetworkId::nad("ns1", "net1")], 0, 0),
        (
            Some(" net1 , other/net2,net1,"),
            vec![
                NetworkId::nad("ns1", "net1"),
                NetworkId::nad("other", "net2"),
            ],
            0,
            0,
        ),
        (Some("a/b/c, ok"), vec![NetworkId::nad("ns1", "ok")], 1, 0),
        // No valid network left: the policy applies nowhere, which is worth a warning.
        (Some("Bad Name"), vec![], 1, 1),
        (Some(",,,"), vec![], 0, 1),
        (Some(" , "), vec![], 0, 1),
        (Some(""), vec![], 0, 1),
        (None, vec![], 0, 1),
    ];
    for (ann, nets, nerr, nwarn) in cases {
        for version in ["v1beta1", "v1beta2"] {
            let annotations = ann
                .map(|a| format!("  annotations: {{k8s.v1.cni.cncf.io/policy-for: '{a}'}}\n"))
                .unwrap_or_default();
            let inv = load(&format!(
                "apiVersion: k8s.cni.cncf.io/{version}\nkind: MultiNetworkPolicy\nmetadata:\n  name: m\n  namespace: ns1\n{annotations}spec: {{}}\n"
            ));
            let p = policy(&inv, "m");
            assert_eq!(p.kind, PolicyKind::MultiNetworkPolicy);
            assert_eq!(p.scope, PolicyScope::Networks(nets.clone()), "{ann:?}");
            assert_eq!(inv.errors().count(), nerr, "{ann:?}: {:?}", inv.problems);
            assert_eq!(warnings(&inv).len(), nwarn, "{ann:?}: {:?}", inv.problems);
        }
    }
}

#[test]
fn monitor_mode_annotations() {
    // (annotations, mode, errors)
    let cases: Vec<(&str, Mode, usize)> = vec![
        ("{}", Mode::Enforce, 0),
        ("{netwarden.io/mode: monitor}", Mode::Monitor, 0),
        ("{netwarden.io/mode: enforce}", Mode::Enforce, 0),
        (
            "{kube-router.io/network-policy.monitor: 'true'}",
            Mode::Monitor,
            0,
        ),
        (
            "{kube-router.io/network-policy.staged: 'true'}",
            Mode::Monitor,
            0,
        ),
        (
            "{kube-router.io/network-policy.staged: 'false'}",
            Mode::Enforce,
            0,
        ),
        (
            "{netwarden.io/mode: monitor, kube-router.io/network-policy.staged: 'true'}",
            Mode::Monitor,
            0,
        ),
        ("{netwarden.io/mode: Monitor}", Mode::Enforce, 1),
        (
            "{kube-router.io/network-policy.monitor: 'yes'}",
            Mode::Enforce,
            1,
        ),
        (
            "{netwarden.io/mode: monitor, kube-router.io/network-policy.monitor: 'maybe'}",
            Mode::Enforce,
            1,
        ),
        (
            "{netwarden.io/mode: monitor, kube-router.io/network-policy.staged: 'false'}",
            Mode::Enforce,
            1,
        ),
    ];
    for (ann, mode, nerr) in cases {
        let inv = load(&format!(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: p, annotations: {ann}}}\n"
        ));
        assert_eq!(policy(&inv, "p").mode, mode, "{ann}");
        assert_eq!(inv.errors().count(), nerr, "{ann}: {:?}", inv.problems);
    }
}

#[test]
fn replaces_and_log_annotations() {
    let inv = load(
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: a
  annotations: {netwarden.io/mode: monitor, netwarden.io/replaces: old-policy, netwarden.io/log: "true"}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: b
  annotations: {netwarden.io/mode: monitor, netwarden.io/replaces: "x\ny", netwarden.io/log: "on"}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: c
  annotations: {netwarden.io/replaces: old}
"#,
    );
    let a = policy(&inv, "a");
    assert_eq!(
        (a.replaces.as_deref(), a.log_denies),
        (Some("old-policy"), true)
    );
    let b = policy(&inv, "b");
    assert_eq!((b.replaces.as_deref(), b.log_denies), (None, false));
    assert_eq!(
        errors(&inv),
        vec![
            e(
                "NetworkPolicy",
                "default/b",
                "metadata.annotations[\"netwarden.io/replaces\"]"
            ),
            e(
                "NetworkPolicy",
                "default/b",
                "metadata.annotations[\"netwarden.io/log\"]"
            ),
        ]
    );
    // An enforced policy with `replaces`: kept, with a warning that it has no effect.
    assert_eq!(
        warnings(&inv),
        vec![e(
            "NetworkPolicy",
            "default/c",
            "metadata.annotations[\"netwarden.io/replaces\"]"
        )]
    );
}

#[test]
fn network_policies_can_be_switched_off() {
    let text = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: a}\n---\napiVersion: k8s.cni.cncf.io/v1beta1\nkind: MultiNetworkPolicy\nmetadata: {name: a, annotations: {k8s.v1.cni.cncf.io/policy-for: net}}\n---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: bad, annotations: {netwarden.io/log: x}}\n";
    let inv = parse_str(
        "t.yaml",
        text,
        &LoadOptions {
            network_policy_enabled: false,
        },
    );
    assert_eq!(inv.policies.len(), 1);
    assert_eq!(inv.policies[0].kind, PolicyKind::MultiNetworkPolicy);
    assert_eq!(
        inv.errors().count(),
        1,
        "switched-off policies are still checked"
    );
}

// ---------------------------------------------------------------------------------------
// Pods and interfaces

#[test]
fn pod_basics() {
    let inv = load(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: shop
  labels: {app: web}
  annotations: {netwarden.io/netns: /var/run/netns/web}
spec:
  initContainers:
  - ports: [{containerPort: 9000, name: init}]
  containers:
  - ports:
    - {containerPort: 80, name: http}
    - {containerPort: 53, protocol: UDP, name: dns}
    - {containerPort: 70000}
    - {containerPort: 81, name: "NOT VALID"}
  - name: sidecar
status:
  podIP: 10.0.0.1
  podIPs: [{ip: 10.0.0.1}, {ip: "fd00::1"}]
---
apiVersion: v1
kind: Pod
metadata: {name: host, annotations: {netwarden.io/netns: "relative/path"}}
spec: {hostNetwork: true}
status: {podIP: 192.168.1.10}
"#,
    );
    let web = pod(&inv, "web");
    assert_eq!(web.labels["app"], "web");
    assert_eq!(web.netns.as_deref(), Some("/var/run/netns/web"));
    let ports: Vec<_> = web
        .container_ports
        .iter()
        .map(|p| (p.name.as_deref(), p.port, p.protocol))
        .collect();
    assert_eq!(
        ports,
        vec![
            (Some("init"), 9000, Protocol::Tcp),
            (Some("http"), 80, Protocol::Tcp),
            (Some("dns"), 53, Protocol::Udp),
            (None, 81, Protocol::Tcp),
        ]
    );
    assert_eq!(web.named_port("dns", Protocol::Udp), Some(53));
    assert_eq!(web.interfaces.len(), 1);
    let eth0 = web.primary().unwrap();
    assert_eq!(eth0.name, "eth0");
    assert_eq!(eth0.ips, vec![ip("10.0.0.1"), ip("fd00::1")]);
    assert_eq!(eth0.prefix_lens, vec![24, 64]);

    let host = pod(&inv, "host");
    assert!(host.host_network);
    assert_eq!(host.netns, None);
    assert_eq!(
        errors(&inv),
        vec![
            e(
                "Pod",
                "shop/web",
                "spec.containers[0].ports[2].containerPort"
            ),
            e("Pod", "shop/web", "spec.containers[0].ports[3].name"),
            e(
                "Pod",
                "default/host",
                "metadata.annotations[\"netwarden.io/netns\"]"
            ),
        ]
    );
    assert_eq!(
        warnings(&inv),
        vec![e("Pod", "default/host", "spec.hostNetwork")]
    );
    assert!(inv
        .problems
        .iter()
        .any(|p| p.reason.contains("never isolated")));
}

fn pod_with_status(status_json: &str, pod_ips: &[&str]) -> Inventory {
    let ips: Vec<String> = pod_ips.iter().map(|i| format!("{{ip: \"{i}\"}}")).collect();
    load(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  namespace: ns1\n  annotations:\n    k8s.v1.cni.cncf.io/network-status: '{status_json}'\nstatus: {{podIPs: [{}]}}\n",
        ips.join(", ")
    ))
}

/// (name, network, ips) of each interface.
fn ifaces(inv: &Inventory) -> Vec<(String, NetworkId, Vec<IpAddr>)> {
    inv.pods[0]
        .interfaces
        .iter()
        .map(|i| (i.name.clone(), i.network.clone(), i.ips.clone()))
        .collect()
}

#[test]
fn network_status_primary_detection() {
    let p = NetworkId::Primary;
    let nad = |ns: &str, n: &str| NetworkId::nad(ns, n);
    // (annotation, podIPs, interfaces, errors)
    type Iface = (&'static str, NetworkId, Vec<&'static str>);
    let cases: Vec<(&str, Vec<&str>, Vec<Iface>, usize)> = vec![
        // `default: true` wins, whatever the order.
        (
            r#"[{"name":"macvlan","interface":"net1","ips":["192.168.1.5"]},{"name":"kindnet","interface":"eth0","ips":["10.0.0.5"],"default":true}]"#,
            vec!["10.0.0.5"],
            vec![
                ("net1", nad("ns1", "macvlan"), vec!["192.168.1.5"]),
                ("eth0", p.clone(), vec!["10.0.0.5"]),
            ],
            0,
        ),
        // No default: the interface holding podIPs (even when not named eth0).
        (
            r#"[{"name":"cbr","interface":"ens3","ips":["10.0.0.5"]},{"name":"other/sriov","interface":"net1","ips":["fd00::5/120"]}]"#,
            vec!["10.0.0.5"],
            vec![
                ("ens3", p.clone(), vec!["10.0.0.5"]),
                ("net1", nad("other", "sriov"), vec!["fd00::5"]),
            ],
            0,
        ),
        // Neither: the entry without an interface name.
        (
            r#"[{"name":"cluster","ips":["10.9.0.5"]},{"name":"m","interface":"net1","ips":["192.168.1.5"]}]"#,
            vec![],
            vec![
                ("eth0", p.clone(), vec!["10.9.0.5"]),
                ("net1", nad("ns1", "m"), vec!["192.168.1.5"]),
            ],
            0,
        ),
        // Only secondaries listed: the primary comes from podIPs.
        (
            r#"[{"name":"m","interface":"net1","ips":["192.168.1.5"]}]"#,
            vec!["10.0.0.5"],
            vec![
                ("eth0", p.clone(), vec!["10.0.0.5"]),
                ("net1", nad("ns1", "m"), vec!["192.168.1.5"]),
            ],
            0,
        ),
        // Default entry without ips: it holds podIPs. Entries without ips are skipped.
        (
            r#"[{"name":"c","interface":"eth0","default":true},{"name":"m","interface":"net1","ips":[]}]"#,
            vec!["10.0.0.5"],
            vec![("eth0", p.clone(), vec!["10.0.0.5"])],
            0,
        ),
        // A secondary without interface name, one with a name Linux refuses, one with a bad
        // network name, a bad address, a duplicate name: each reported and skipped.
        (
            r#"[{"name":"c","interface":"eth0","ips":["10.0.0.5"],"default":true},{"name":"a","ips":["1.1.1.1"]},{"name":"b","interface":"net1:0","ips":["1.1.1.2"]},{"name":"Bad!","interface":"net2","ips":["1.1.1.3"]},{"name":"d","interface":"net3","ips":["nope","1.1.1.4"]},{"name":"e","interface":"net3","ips":["1.1.1.5"]}]"#,
            vec!["10.0.0.5"],
            vec![
                ("eth0", p.clone(), vec!["10.0.0.5"]),
                ("net3", nad("ns1", "d"), vec!["1.1.1.4"]),
            ],
            5,
        ),
        // Any name the kernel accepts is kept: the renderers quote it or match by index.
        (
            r#"[{"name":"c","interface":"eth0","ips":["10.0.0.5"],"default":true},{"name":"b","interface":"a\"b;+","ips":["1.1.1.2"]},{"name":"d","interface":"$(id)","ips":["1.1.1.3"]},{"name":"e","interface":"x\\y*","ips":["1.1.1.4"]},{"name":"f","interface":"eth0{}","ips":["1.1.1.5"]}]"#,
            vec!["10.0.0.5"],
            vec![
                ("eth0", p.clone(), vec!["10.0.0.5"]),
                ("a\"b;+", nad("ns1", "b"), vec!["1.1.1.2"]),
                ("$(id)", nad("ns1", "d"), vec!["1.1.1.3"]),
                ("x\\y*", nad("ns1", "e"), vec!["1.1.1.4"]),
                ("eth0{}", nad("ns1", "f"), vec!["1.1.1.5"]),
            ],
            0,
        ),
        // Not a list: reported, podIPs used.
        (
            r#"{"name":"x"}"#,
            vec!["10.0.0.5"],
            vec![("eth0", p.clone(), vec!["10.0.0.5"])],
            1,
        ),
    ];
    for (status, pod_ips, want, nerr) in cases {
        let inv = pod_with_status(status, &pod_ips);
        let want: Vec<_> = want
            .into_iter()
            .map(|(n, net, ips)| {
                (
                    n.to_string(),
                    net,
                    ips.into_iter().map(ip).collect::<Vec<_>>(),
                )
            })
            .collect();
        assert_eq!(ifaces(&inv), want, "{status}");
        assert_eq!(inv.errors().count(), nerr, "{status}: {:#?}", inv.problems);
    }
    // Prefix lengths: from the address when written, else /24 and /64.
    let inv = pod_with_status(
        r#"[{"name":"c","interface":"eth0","ips":["10.0.0.5"],"default":true},{"name":"m","interface":"net1","ips":["fd00::5/120","192.168.0.1/16"]}]"#,
        &[],
    );
    assert_eq!(inv.pods[0].interfaces[1].prefix_lens, vec![120, 16]);
    assert_eq!(inv.pods[0].interfaces[0].prefix_lens, vec![24]);
}

#[test]
fn older_networks_status_key_and_bad_ifname_field() {
    let inv = load(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: p
  annotations:
    k8s.v1.cni.cncf.io/networks-status: '[{"name":"c","ips":["10.0.0.1"]},{"name":"m","interface":"a very long name!","ips":["1.2.3.4"]}]'
"#,
    );
    assert_eq!(
        ifaces(&inv),
        vec![("eth0".into(), NetworkId::Primary, vec![ip("10.0.0.1")])]
    );
    assert_eq!(
        errors(&inv),
        vec![e(
            "Pod",
            "default/p",
            "metadata.annotations[\"k8s.v1.cni.cncf.io/networks-status\"][1].interface"
        )]
    );
}

// ---------------------------------------------------------------------------------------
// DanmEp

fn danmep(
    name: &str,
    pod: &str,
    network: &str,
    api_type: Option<&str>,
    iface: &str,
    v4: &str,
    v6: &str,
) -> String {
    let api = api_type
        .map(|t| format!("  apiType: {t}\n"))
        .unwrap_or_default();
    format!(
        "---\napiVersion: danm.k8s.io/v1\nkind: DanmEp\nmetadata: {{name: {name}, namespace: tel}}\nspec:\n  Pod: {pod}\n  NetworkName: {network}\n{api}  netns: /proc/42/ns/net\n  Interface: {{Name: {iface}, Address: \"{v4}\", AddressIPv6: \"{v6}\", MacAddress: aa:bb:cc:dd:ee:ff}}\n"
    )
}

#[test]
fn danmep_pairing() {
    let pod_doc = "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: tel}\nstatus: {podIPs: [{ip: 10.0.0.5}]}\n";
    let danm = |kind, ns: Option<&str>, name: &str| NetworkId::Named {
        kind,
        namespace: ns.map(str::to_string),
        name: name.into(),
    };
    // (DanmEps, interfaces as (name, network, ips, prefixes), errors, warnings)
    type Want = Vec<(&'static str, NetworkId, Vec<&'static str>, Vec<u8>)>;
    let cases: Vec<(String, Want, usize, usize)> = vec![
        // A secondary on a DanmNet (default apiType): namespaced in the pod's namespace.
        (
            danmep(
                "ep1",
                "p",
                "internal",
                None,
                "ext0",
                "192.168.5.5/26",
                "dynamic",
            ),
            vec![
                ("eth0", NetworkId::Primary, vec!["10.0.0.5"], vec![24]),
                (
                    "ext0",
                    danm(NetworkType::DanmNet, Some("tel"), "internal"),
                    vec!["192.168.5.5"],
                    vec![26],
                ),
            ],
            0,
            0,
        ),
        // ClusterNetwork has no namespace; both families.
        (
            danmep(
                "ep1",
                "p",
                "core",
                Some("ClusterNetwork"),
                "core1",
                "172.16.0.2/16",
                "fd00:1::2/64",
            ),
            vec![
                ("eth0", NetworkId::Primary, vec!["10.0.0.5"], vec![24]),
                (
                    "core1",
                    danm(NetworkType::ClusterNetwork, None, "core"),
                    vec!["172.16.0.2", "fd00:1::2"],
                    vec![16, 64],
                ),
            ],
            0,
            0,
        ),
        // The primary's own DanmEp (shares the pod IP): stays Primary, gains the real prefix.
        (
            danmep(
                "ep1",
                "p",
                "default",
                Some("TenantNetwork"),
                "eth0",
                "10.0.0.5/20",
                "none",
            ),
            vec![("eth0", NetworkId::Primary, vec!["10.0.0.5"], vec![20])],
            0,
            0,
        ),
        // Issue 20, defect 1: the primary interface's name with another address contradicts
        // the pod (it replaced eth0's network and removed the pod's rules): reported and
        // ignored, the primary interface stays.
        (
            danmep("ep1", "p", "internal", None, "eth0", "192.168.9.9/24", ""),
            vec![("eth0", NetworkId::Primary, vec!["10.0.0.5"], vec![24])],
            1,
            0,
        ),
        // The pod's primary address on another interface: the same contradiction.
        (
            danmep("ep1", "p", "internal", None, "net5", "10.0.0.5/32", ""),
            vec![("eth0", NetworkId::Primary, vec!["10.0.0.5"], vec![24])],
            1,
            0,
        ),
        // Unknown pod: warning; no address yet: nothing added; bad apiType and unsafe
        // interface name: errors; two DanmEps for one interface: error on the second.
        (
            format!(
                "{}{}{}{}{}{}",
                danmep("ep1", "ghost", "net-n", None, "x0", "1.1.1.1/24", ""),
                danmep("ep2", "p", "net-n", None, "x1", "dynamic", ""),
                danmep("ep3", "p", "net-n", Some("Bogus"), "x2", "1.1.1.3/24", ""),
                danmep("ep4", "p", "net-n", None, "\"x/y\"", "1.1.1.4/24", ""),
                danmep("ep5", "p", "net-n", None, "x5", "1.1.1.5/24", ""),
                danmep("ep6", "p", "net-m", None, "x5", "1.1.1.6/24", ""),
            ),
            vec![
                ("eth0", NetworkId::Primary, vec!["10.0.0.5"], vec![24]),
                (
                    "x5",
                    danm(NetworkType::DanmNet, Some("tel"), "net-n"),
                    vec!["1.1.1.5"],
                    vec![24],
                ),
            ],
            3,
            1,
        ),
    ];
    for (eps, want, nerr, nwarn) in cases {
        let inv = load(&format!("{pod_doc}{eps}"));
        let got: Vec<_> = inv.pods[0]
            .interfaces
            .iter()
            .map(|i| {
                (
                    i.name.clone(),
                    i.network.clone(),
                    i.ips.clone(),
                    i.prefix_lens.clone(),
                )
            })
            .collect();
        let want: Vec<_> = want
            .into_iter()
            .map(|(n, net, ips, pl)| {
                (
                    n.to_string(),
                    net,
                    ips.into_iter().map(ip).collect::<Vec<_>>(),
                    pl,
                )
            })
            .collect();
        assert_eq!(got, want, "{eps}");
        assert_eq!(inv.errors().count(), nerr, "{eps}: {:#?}", inv.problems);
        assert_eq!(warnings(&inv).len(), nwarn, "{eps}: {:#?}", inv.problems);
        // An ignored DanmEp gives nothing, its netns included.
        let ignored = inv
            .problems
            .iter()
            .any(|p| p.reason.contains("contradicts"));
        let netns = (!ignored).then_some("/proc/42/ns/net");
        assert_eq!(inv.pods[0].netns.as_deref(), netns, "{eps}");
    }
}

#[test]
fn danmep_older_schema_and_missing_fields() {
    let inv = load(
        r#"
apiVersion: v1
kind: Pod
metadata: {name: p}
---
apiVersion: danm.k8s.io/v1
kind: DanmEp
metadata: {name: old}
spec: {Pod: p, NetworkID: legacy, Interface: {Name: net1, Address: 10.5.0.1/24}}
---
apiVersion: danm.k8s.io/v1
kind: DanmEp
metadata: {name: empty}
spec: {}
"#,
    );
    assert_eq!(
        ifaces(&inv),
        vec![(
            "net1".into(),
            NetworkId::Named {
                kind: NetworkType::DanmNet,
                namespace: Some("default".into()),
                name: "legacy".into()
            },
            vec![ip("10.5.0.1")]
        )]
    );
    assert_eq!(
        errors(&inv),
        vec![
            e("DanmEp", "default/empty", "spec.Pod"),
            e("DanmEp", "default/empty", "spec.NetworkName"),
            e("DanmEp", "default/empty", "spec.Interface.Name"),
        ]
    );
}

// ---------------------------------------------------------------------------------------
// Services

#[test]
fn services_and_endpoint_slices() {
    let inv = load(
        r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10, "fd00:96::10"]
  selector: {app: web}
  ports:
  - {port: 80, targetPort: http}
  - {port: 443, targetPort: 8443, protocol: TCP}
  - {port: 53, protocol: UDP}
  - {port: 8080, targetPort: "9090"}
  - {port: 0}
---
apiVersion: v1
kind: Service
metadata: {name: ext, namespace: shop}
spec: {clusterIP: 10.96.0.11, ports: [{port: 5432}]}
---
apiVersion: v1
kind: Service
metadata: {name: headless, namespace: shop}
spec: {clusterIP: None, selector: {app: db}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ext-1, namespace: shop, labels: {kubernetes.io/service-name: ext}}
addressType: IPv4
endpoints:
- addresses: [192.168.0.7, 192.168.0.2]
- addresses: [192.168.0.9]
  conditions: {ready: false}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ext-2, namespace: shop, labels: {kubernetes.io/service-name: ext}}
endpoints:
- addresses: [192.168.0.2, not-an-ip]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: orphan-1, namespace: shop, labels: {kubernetes.io/service-name: orphan}}
endpoints: []
"#,
    );
    let web = &inv.services[0];
    assert_eq!(web.cluster_ips, vec![ip("10.96.0.10"), ip("fd00:96::10")]);
    assert_eq!(web.selector.as_ref().unwrap()["app"], "web");
    let ports: Vec<_> = web
        .ports
        .iter()
        .map(|p| (p.protocol, p.port, p.target.clone()))
        .collect();
    assert_eq!(
        ports,
        vec![
            (Protocol::Tcp, 80, PortRef::Named("http".into())),
            (Protocol::Tcp, 443, PortRef::Number(8443)),
            (Protocol::Udp, 53, PortRef::Number(53)),
            (Protocol::Tcp, 8080, PortRef::Number(9090)),
        ]
    );
    let ext = &inv.services[1];
    assert_eq!(ext.selector, None);
    assert_eq!(
        ext.endpoint_addrs,
        vec![ip("192.168.0.2"), ip("192.168.0.7")]
    );
    assert_eq!(inv.services[2].cluster_ips, Vec::<IpAddr>::new());
    assert_eq!(
        errors(&inv),
        vec![
            e("Service", "shop/web", "spec.ports[4].port"),
            e("EndpointSlice", "shop/ext-2", "endpoints[0].addresses[1]"),
        ]
    );
    assert_eq!(
        warnings(&inv),
        vec![e(
            "EndpointSlice",
            "shop/orphan-1",
            "metadata.labels[\"kubernetes.io/service-name\"]"
        )]
    );
}

// ---------------------------------------------------------------------------------------
// Files

/// A temporary directory removed on drop.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("nw-manifest-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn load_paths_walks_directories_in_order() {
    let dir = TempDir::new("walk");
    let d = &dir.0;
    std::fs::create_dir_all(d.join("sub/deeper")).unwrap();
    std::fs::create_dir_all(d.join(".hidden")).unwrap();
    let pod = |n: &str| format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {n}}}\n");
    std::fs::write(d.join("b.yaml"), pod("b")).unwrap();
    std::fs::write(d.join("a.yml"), pod("a")).unwrap();
    std::fs::write(
        d.join("sub/deeper/c.json"),
        r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"c"}}"#,
    )
    .unwrap();
    std::fs::write(d.join("notes.txt"), pod("ignored")).unwrap();
    std::fs::write(d.join(".hidden/h.yaml"), pod("hidden")).unwrap();
    std::fs::write(d.join("dup.yaml"), pod("a")).unwrap();
    // A symlink loop must not hang the walk.
    std::os::unix::fs::symlink(d, d.join("sub/loop")).unwrap();
    let explicit = d.join("notes.txt");
    let missing = d.join("missing.yaml");

    let inv = load_paths(
        &[d.clone(), explicit, missing.clone()],
        &LoadOptions::default(),
    );
    let names: Vec<_> = inv.pods.iter().map(|p| p.key.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c", "ignored"]);
    let dup = inv
        .problems
        .iter()
        .find(|p| p.field == "metadata.name")
        .expect("duplicate reported");
    assert!(dup.file.ends_with("dup.yaml"), "{dup}");
    assert!(dup.reason.contains("a.yml"), "{dup}");
    let io = inv
        .problems
        .iter()
        .find(|p| p.file == missing.display().to_string())
        .expect("IO problem");
    assert!(io.reason.starts_with("cannot read"), "{io}");
    assert_eq!(inv.problems.len(), 2, "{:#?}", inv.problems);
}

#[test]
fn problem_display() {
    let p = Problem {
        file: "a.yaml".into(),
        kind: "NetworkPolicy".into(),
        object: "ns/p".into(),
        field: "spec.ingress[0].from[1].ipBlock.cidr".into(),
        reason: "invalid CIDR".into(),
        severity: Severity::Error,
    };
    assert_eq!(
        p.to_string(),
        "a.yaml: NetworkPolicy ns/p: spec.ingress[0].from[1].ipBlock.cidr: invalid CIDR"
    );
    let q = Problem {
        kind: String::new(),
        object: String::new(),
        field: String::new(),
        severity: Severity::Warning,
        ..p
    };
    assert_eq!(q.to_string(), "a.yaml: warning: invalid CIDR");
}

#[test]
fn selectors_match_after_loading() {
    // End to end through the engine's matcher: the loaded selector means what was written.
    let inv = load(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p}\nspec: {podSelector: {matchExpressions: [{key: env, operator: NotIn, values: [prod]}]}}\n",
    );
    let sel: &LabelSelector = &policy(&inv, "p").pod_selector;
    let labels = |v: &str| {
        [("env".to_string(), v.to_string())]
            .into_iter()
            .collect::<Labels>()
    };
    assert!(sel.matches(&labels("dev")));
    assert!(!sel.matches(&labels("prod")));
    assert!(sel.matches(&Labels::new()));
}

// ---------------------------------------------------------------------------------------
// Properties: hostile input never panics, and whatever loads is well-formed.

mod props {
    use proptest::prelude::*;
    use serde_json::{json, Value};

    use super::*;

    /// Keys the loader looks at, so random documents reach deep into it.
    const KEYS: &[&str] = &[
        "kind",
        "apiVersion",
        "metadata",
        "name",
        "namespace",
        "labels",
        "annotations",
        "spec",
        "status",
        "podIPs",
        "ip",
        "podIP",
        "containers",
        "ports",
        "containerPort",
        "protocol",
        "port",
        "endPort",
        "podSelector",
        "namespaceSelector",
        "ipBlock",
        "cidr",
        "except",
        "ingress",
        "egress",
        "from",
        "to",
        "policyTypes",
        "matchLabels",
        "matchExpressions",
        "key",
        "operator",
        "values",
        "networkSelector",
        "type",
        "items",
        "Pod",
        "Interface",
        "Name",
        "Address",
        "NetworkName",
        "apiType",
        "selector",
        "clusterIPs",
        "targetPort",
        "endpoints",
        "addresses",
        "hostNetwork",
        "k8s.v1.cni.cncf.io/network-status",
        "k8s.v1.cni.cncf.io/policy-for",
        "netwarden.io/mode",
    ];
    const STRINGS: &[&str] = &[
        "Pod",
        "NetworkPolicy",
        "DanmNetworkPolicy",
        "MultiNetworkPolicy",
        "DanmEp",
        "Service",
        "EndpointSlice",
        "Namespace",
        "List",
        "v1",
        "networking.k8s.io/v1",
        "danm.k8s.io/v1",
        "k8s.cni.cncf.io/v1beta1",
        "discovery.k8s.io/v1",
        "a",
        "ns",
        "10.0.0.1",
        "10.0.0.0/8",
        "fd00::/64",
        "TCP",
        "In",
        "Exists",
        "Ingress",
        "Egress",
        "eth0",
        "monitor",
        "[{\"name\":\"x\",\"interface\":\"net1\",\"ips\":[\"1.2.3.4\"]}]",
        "",
        "x/y",
        "ClusterNetwork",
    ];

    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            (0u32..70000).prop_map(|n| json!(n)),
            any::<f64>().prop_map(|f| json!(f)),
            prop::sample::select(STRINGS).prop_map(|s| json!(s)),
            ".{0,20}".prop_map(Value::String),
        ];
        leaf.prop_recursive(6, 64, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec((prop::sample::select(KEYS), inner), 0..6).prop_map(|kv| {
                    Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
                }),
            ]
        })
    }

    fn check_well_formed(inv: &Inventory) {
        for p in &inv.pods {
            for i in &p.interfaces {
                assert!(crate::validate::ifname(&i.name).is_ok(), "{:?}", i.name);
                assert_eq!(i.ips.len(), i.prefix_lens.len());
            }
            assert!(crate::validate::dns1123_subdomain(&p.key.name).is_ok());
        }
        for p in &inv.policies {
            assert!(crate::validate::dns1123_subdomain(&p.key.name).is_ok());
            assert!(crate::validate::dns1123_label(&p.key.namespace).is_ok());
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn arbitrary_text_never_panics(text in "(?s).{0,300}") {
            let inv = parse_str("x.yaml", &text, &LoadOptions::default());
            check_well_formed(&inv);
        }

        #[test]
        fn yamlish_text_never_panics(lines in prop::collection::vec(
            prop_oneof![
                Just("---".to_string()),
                Just("kind: Pod".to_string()),
                Just("metadata: {name: a}".to_string()),
                Just("spec:".to_string()),
                Just("  ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8}}]}]".to_string()),
                "[ :{}\\[\\]a-z0-9\"'-]{0,20}",
            ], 0..12)) {
            let inv = parse_str("x.yaml", &lines.join("\n"), &LoadOptions::default());
            check_well_formed(&inv);
        }

        #[test]
        fn arbitrary_documents_never_panic(kind in prop::sample::select(STRINGS), doc in value()) {
            let mut doc = doc;
            if let Value::Object(m) = &mut doc {
                m.insert("kind".into(), json!(kind));
            }
            let text = doc.to_string();
            let inv = parse_str("x.json", &text, &LoadOptions::default());
            check_well_formed(&inv);
            let mut loader = Loader::new(LoadOptions::default());
            loader.add_value("x", "#1", &doc);
            check_well_formed(&loader.finish());
        }
    }
}

// ---------------------------------------------------------------------------------------
// Kinds and apiVersions: near misses are errors, other projects' objects are not ours.

#[test]
fn misspelled_kinds_are_errors_naming_the_intended_kind() {
    let inv = load(&format!(
        r#"
apiVersion: networking.k8s.io/v1
kind: Networkpolicy
metadata: {{name: a, namespace: ns1}}
spec: {{podSelector: {{}}}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicies
metadata: {{name: b, namespace: ns1}}
---
apiVersion: networking.k8s.io/v1
kind: networkpolicy
metadata: {{name: c}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicys
metadata: {{name: d}}
---
apiVersion: danm.k8s.io/v1
kind: DanmNetworkpolicy
metadata: {{name: e}}
---
kind: Namepsace
metadata: {{name: f}}
{GOOD_POD}"#
    ));
    assert_eq!(
        errors(&inv),
        vec![
            e("Networkpolicy", "ns1/a", "kind"),
            e("NetworkPolicies", "ns1/b", "kind"),
            e("networkpolicy", "c", "kind"),
            e("NetworkPolicys", "d", "kind"),
            e("DanmNetworkpolicy", "e", "kind"),
            e("Namepsace", "f", "kind"),
        ]
    );
    let reasons: Vec<&str> = inv.errors().map(|p| p.reason.as_str()).collect();
    for (reason, intended) in reasons.iter().zip([
        "NetworkPolicy (networking.k8s.io/v1)",
        "NetworkPolicy (networking.k8s.io/v1)",
        "NetworkPolicy (networking.k8s.io/v1)",
        "NetworkPolicy (networking.k8s.io/v1)",
        "DanmNetworkPolicy (danm.k8s.io/v1)",
        "Namespace (v1)",
    ]) {
        assert!(
            reason.contains(&format!("did you mean {intended}?")),
            "{reason}"
        );
    }
    assert!(inv.policies.is_empty());
    assert_eq!(inv.pods.len(), 1);
}

#[test]
fn wrong_api_versions_of_our_kinds_are_errors() {
    let doc = |api: &str, kind: &str, name: &str| {
        format!("---\n{api}kind: {kind}\nmetadata: {{name: {name}, namespace: ns1}}\n")
    };
    let text = [
        doc("apiVersion: networking.k8s.io/v2\n", "NetworkPolicy", "a"),
        doc("apiVersion: networking.k8s.io/v1beta1\n", "NetworkPolicy", "b"),
        doc("apiVersion: extensions/v1beta1\n", "NetworkPolicy", "c"),
        doc("apiVersion: danm.k8s.io/v2\n", "DanmNetworkPolicy", "d"),
        doc("", "NetworkPolicy", "e"),
        doc("apiVersion: 1\n", "Pod", "f"),
        doc("apiVersion: k8s.cni.cncf.io/v2\n", "MultiNetworkPolicy", "g"),
        doc("apiVersion: v2\n", "Service", "h"),
        // Items of a typed list inherit its apiVersion, wrong or right.
        "---\napiVersion: networking.k8s.io/v2\nkind: NetworkPolicyList\nitems: [{metadata: {name: i, namespace: ns1}}]\n".into(),
        "---\napiVersion: v1\nkind: List\nitems: [{kind: Pod, metadata: {name: j, namespace: ns1}}]\n".into(),
    ]
    .concat();
    let inv = load(&format!("{text}{GOOD_POD}"));
    let got: Vec<(String, String, String)> = inv
        .errors()
        .map(|p| (p.kind.clone(), p.object.clone(), p.field.clone()))
        .collect();
    let want: Vec<Where> = [
        ("NetworkPolicy", "ns1/a"),
        ("NetworkPolicy", "ns1/b"),
        ("NetworkPolicy", "ns1/c"),
        ("DanmNetworkPolicy", "ns1/d"),
        ("NetworkPolicy", "ns1/e"),
        ("Pod", "ns1/f"),
        ("MultiNetworkPolicy", "ns1/g"),
        ("Service", "ns1/h"),
        ("NetworkPolicy", "ns1/i"),
        ("Pod", "ns1/j"),
    ]
    .iter()
    .map(|(k, o)| e(k, o, "apiVersion"))
    .collect();
    assert_eq!(got, want, "{:#?}", inv.problems);
    let missing = &inv.errors().nth(4).unwrap().reason;
    assert!(
        missing.starts_with("missing apiVersion (NetworkPolicy is networking.k8s.io/v1)"),
        "{missing}"
    );
    let mnp = &inv.errors().nth(6).unwrap().reason;
    assert!(
        mnp.contains("k8s.cni.cncf.io/v1beta1 or k8s.cni.cncf.io/v1beta2"),
        "{mnp}"
    );
    assert!(inv.policies.is_empty() && inv.services.is_empty());
    assert_eq!(inv.pods.len(), 1);
}

#[test]
fn other_projects_kinds_stay_silent() {
    let inv = load(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: a}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: b}
---
apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: c}
---
apiVersion: crd.projectcalico.org/v1
kind: GlobalNetworkPolicy
metadata: {name: d}
---
apiVersion: serving.knative.dev/v1
kind: Service
metadata: {name: e}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: f}
---
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {name: g}
---
apiVersion: danm.k8s.io/v1
kind: DanmNet
metadata: {name: h}
"#,
    );
    assert_eq!(inv.problems, vec![]);
}

// ---------------------------------------------------------------------------------------
// Fields that cannot be read reject the object; nothing moves to a default.

#[test]
fn yaml_booleans_and_numbers_where_strings_belong_reject_the_object() {
    for (value, example) in [
        ("y", "namespace: \"y\""),
        ("yes", "namespace: \"y\""),
        ("on", "namespace: \"y\""),
        ("n", "namespace: \"n\""),
        ("no", "namespace: \"n\""),
        ("off", "namespace: \"n\""),
        ("true", "namespace: \"y\""),
        ("1234", "namespace: \"1234\""),
    ] {
        let inv = load(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p, namespace: {value}}}\nstatus: {{podIPs: [{{ip: 10.0.0.1}}]}}\n{GOOD_POD}"
        ));
        assert_eq!(
            inv.pods
                .iter()
                .map(|p| p.key.to_string())
                .collect::<Vec<_>>(),
            ["ns1/good"],
            "namespace: {value} must not land in default"
        );
        assert!(
            inv.namespaces.iter().all(|n| n.name != "default"),
            "{value}"
        );
        assert_eq!(
            errors(&inv),
            vec![e("Pod", "p", "metadata.namespace")],
            "{value}"
        );
        let reason = &inv.problems[0].reason;
        assert!(
            reason.contains(&format!("quote the value, e.g. {example}")),
            "{value}: {reason}"
        );
        assert!(reason.ends_with("object ignored"), "{reason}");
    }
    // Names, label values and annotation values alike.
    let inv = load(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: 123, namespace: ns1}}
---
apiVersion: v1
kind: Pod
metadata: {{name: a, namespace: ns1, labels: {{enabled: yes}}}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {{name: b, namespace: ns1, annotations: {{kube-router.io/network-policy.monitor: true}}}}
{GOOD_POD}"#
    ));
    assert_eq!(
        errors(&inv),
        vec![
            e("Pod", "#1", "metadata.name"),
            e("Pod", "ns1/a", "metadata.labels[\"enabled\"]"),
            e(
                "NetworkPolicy",
                "ns1/b",
                "metadata.annotations[\"kube-router.io/network-policy.monitor\"]"
            ),
            // Not readable as written: loaded in its fail-closed form (SPEC 7).
            e("NetworkPolicy", "ns1/b", ""),
        ]
    );
    let reasons: Vec<&str> = inv.errors().map(|p| p.reason.as_str()).collect();
    assert!(reasons[0].contains("e.g. name: \"123\""), "{}", reasons[0]);
    assert!(reasons[1].contains("e.g. enabled: \"y\""), "{}", reasons[1]);
    assert!(
        reasons[2].contains("e.g. kube-router.io/network-policy.monitor: \"y\""),
        "{}",
        reasons[2]
    );
    assert_eq!(fail_closed_directions(&inv, "b"), Some((true, false)));
    assert_eq!(inv.pods.len(), 1);
}

#[test]
fn wrong_types_reject_pods_services_slices_and_danmeps() {
    // (document, field of the error)
    let cases = [
        (
            // Read as an ordinary pod, its rules would go into the node's namespace.
            "apiVersion: v1\nkind: Pod\nmetadata: {name: x, namespace: ns1}\nspec: {hostNetwork: \"true\"}\nstatus: {podIP: 10.0.0.7}\n",
            "spec.hostNetwork",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: x, namespace: ns1}\nspec: [a]\n",
            "spec",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: x, namespace: ns1}\nstatus: {podIPs: [{ip: 5}]}\n",
            "status.podIPs[0].ip",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: x, namespace: ns1}\nspec: {containers: [{ports: [{containerPort: \"80\"}]}]}\n",
            "spec.containers[0].ports[0].containerPort",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: [x]\n",
            "metadata",
        ),
        (
            // A selector missing a key would select more pods than written.
            "apiVersion: v1\nkind: Service\nmetadata: {name: x, namespace: ns1}\nspec: {selector: {app: 1, tier: web}}\n",
            "spec.selector[\"app\"]",
        ),
        (
            // `ready: "false"` read as unset would count the endpoint as ready.
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: x, namespace: ns1, labels: {kubernetes.io/service-name: s}}\nendpoints: [{addresses: [10.0.0.1], conditions: {ready: \"false\"}}]\n",
            "endpoints[0].conditions.ready",
        ),
        (
            // An unreadable apiType would fall back to DanmNet: another network.
            "apiVersion: danm.k8s.io/v1\nkind: DanmEp\nmetadata: {name: x, namespace: ns1}\nspec: {Pod: good, NetworkName: net-n, apiType: 5, Interface: {Name: net1, Address: 10.1.0.1/24}}\n",
            "spec.apiType",
        ),
        (
            "apiVersion: danm.k8s.io/v1\nkind: DanmEp\nmetadata: {name: x, namespace: ns1}\nspec: {Pod: good, NetworkName: net-n, Interface: net1}\n",
            "spec.Interface",
        ),
    ];
    for (doc, field) in cases {
        let inv = load(&format!("{doc}{GOOD_POD}"));
        let errs = errors(&inv);
        assert!(
            errs.iter().any(|(_, _, f)| f == field),
            "{doc}: {:#?}",
            inv.problems
        );
        assert!(
            inv.errors().any(|p| p.reason.ends_with("object ignored")),
            "{doc}: {:#?}",
            inv.problems
        );
        assert!(inv.pods.iter().all(|p| p.key.name != "x"), "{doc}");
        assert!(inv.services.is_empty(), "{doc}");
        assert_eq!(
            pod(&inv, "good").interfaces.len(),
            1,
            "{doc}: no DanmEp attached"
        );
    }
}

#[test]
fn a_network_status_with_wrong_types_is_not_read() {
    // Like malformed JSON: reported, and interfaces come from status.podIPs (SPEC 7).
    for (entry, field) in [
        (
            r#"{"name":"m","interface":"net1","ips":["1.1.1.1"],"default":"yes"}"#,
            "[1].default",
        ),
        (
            r#"{"name":"m","interface":7,"ips":["1.1.1.1"]}"#,
            "[1].interface",
        ),
        (
            r#"{"name":"m","interface":"net1","ips":"1.1.1.1"}"#,
            "[1].ips",
        ),
        (r#"{"name":"m","interface":"net1","ips":[1]}"#, "[1].ips[0]"),
        (r#""net1""#, "[1]"),
    ] {
        let status = format!(r#"[{{"name":"c","interface":"eth9","ips":["10.0.0.5"]}},{entry}]"#);
        let inv = pod_with_status(&status, &["10.0.0.5"]);
        assert_eq!(
            ifaces(&inv),
            vec![("eth0".into(), NetworkId::Primary, vec![ip("10.0.0.5")])],
            "{entry}"
        );
        let want = format!("metadata.annotations[\"k8s.v1.cni.cncf.io/network-status\"]{field}");
        assert_eq!(errors(&inv), vec![e("Pod", "ns1/p", &want)], "{entry}");
        assert!(inv.problems[0]
            .reason
            .contains("interfaces taken from status.podIPs"));
    }
}

// ---------------------------------------------------------------------------------------
// Warnings: loaded, but probably not what the author expects.

#[test]
fn duplicate_json_keys_are_warned_with_their_path() {
    let text = r#"{"apiVersion":"v1","kind":"Pod",
        "metadata":{"name":"p","namespace":"ns1","labels":{"app":"a","app":"b"},"namespace":"ns2"},
        "status":{"podIPs":[{"ip":"10.0.0.1","ip":"10.0.0.2"}]}}"#;
    let inv = parse_str("p.json", text, &LoadOptions::default());
    assert_eq!(
        warnings(&inv),
        vec![
            e("", "#1", "metadata.labels.app"),
            e("", "#1", "metadata.namespace"),
            e("", "#1", "status.podIPs[0].ip"),
        ]
    );
    assert!(!inv.has_errors());
    // As the API server does, the last value is used (and said so).
    let p = &inv.pods[0];
    assert_eq!(p.key.to_string(), "ns2/p");
    assert_eq!(p.labels["app"], "b");
    assert_eq!(p.primary().unwrap().ips, vec![ip("10.0.0.2")]);
    assert!(inv.problems[0].reason.contains("the last value is used"));

    // Inside the network-status annotation too.
    let inv = pod_with_status(
        r#"[{"name":"m","name":"n","interface":"net1","ips":["1.1.1.1"]}]"#,
        &["10.0.0.5"],
    );
    assert_eq!(
        warnings(&inv),
        vec![e(
            "Pod",
            "ns1/p",
            "metadata.annotations[\"k8s.v1.cni.cncf.io/network-status\"][0].name"
        )]
    );
}

#[test]
fn duplicate_yaml_keys_are_refused() {
    // The YAML parser refuses the document: an error, the document is not loaded.
    let inv = load(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  namespace: ns1\n  namespace: ns2\n{GOOD_POD}"
    ));
    assert_eq!(errors(&inv), vec![e("", "#1", "")]);
    assert!(
        inv.problems[0].reason.contains("duplicate"),
        "{}",
        inv.problems[0]
    );
    assert_eq!(inv.pods.len(), 1);
}

#[test]
fn duplicate_container_port_names_warn_and_the_first_wins() {
    let inv = load(
        r#"
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: ns1}
spec:
  initContainers:
  - ports: [{containerPort: 9000, name: http}]
  containers:
  - ports:
    - {containerPort: 80, name: http}
    - {containerPort: 53, name: dns, protocol: UDP}
  - ports:
    - {containerPort: 5353, name: dns, protocol: UDP}
    - {containerPort: 53, name: dns, protocol: TCP}
"#,
    );
    assert_eq!(
        warnings(&inv),
        vec![
            e("Pod", "ns1/p", "spec.containers[0].ports[0].name"),
            e("Pod", "ns1/p", "spec.containers[1].ports[0].name"),
            e("Pod", "ns1/p", "spec.containers[1].ports[1].name"),
        ]
    );
    let reasons: Vec<&str> = inv.problems.iter().map(|p| p.reason.as_str()).collect();
    assert!(
        reasons[0].contains("also used by 9000/TCP at spec.initContainers[0].ports[0].name")
            && reasons[0].contains("not to 80/TCP"),
        "{}",
        reasons[0]
    );
    assert!(reasons[2].contains("another protocol"), "{}", reasons[2]);
    // The engine resolves to the first port written, as the warning says.
    let p = pod(&inv, "p");
    assert_eq!(p.named_port("http", Protocol::Tcp), Some(9000));
    assert_eq!(p.named_port("dns", Protocol::Udp), Some(53));
    assert_eq!(p.named_port("dns", Protocol::Tcp), Some(53));
}

#[test]
fn pods_sharing_an_address_are_reported() {
    let inv = load(
        r#"
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: ns1}
status: {podIPs: [{ip: 10.0.0.5}]}
---
apiVersion: v1
kind: Pod
metadata: {name: b, namespace: ns2}
status: {podIPs: [{ip: 10.0.0.5}]}
---
apiVersion: v1
kind: Pod
metadata: {name: host1, namespace: ns1}
spec: {hostNetwork: true}
status: {podIPs: [{ip: 192.168.0.1}]}
---
apiVersion: v1
kind: Pod
metadata: {name: host2, namespace: ns1}
spec: {hostNetwork: true}
status: {podIPs: [{ip: 192.168.0.1}]}
---
apiVersion: v1
kind: Pod
metadata:
  name: m1
  namespace: ns1
  annotations:
    k8s.v1.cni.cncf.io/network-status: '[{"name":"c","interface":"eth0","ips":["10.0.0.6"],"default":true},{"name":"isolated","interface":"net1","ips":["192.168.9.1"]}]'
---
apiVersion: v1
kind: Pod
metadata:
  name: m2
  namespace: ns2
  annotations:
    k8s.v1.cni.cncf.io/network-status: '[{"name":"c","interface":"eth0","ips":["10.0.0.7"],"default":true},{"name":"isolated","interface":"net1","ips":["192.168.9.1"]}]'
"#,
    );
    // hostNetwork pods share the node's address by design. Any other address two pods claim
    // is an error, on any networks (ns1/isolated and ns2/isolated too): rules match peers by
    // address, so it is kept out of every allow set (SPEC 7, issue 20 defect 2).
    assert!(
        warnings(&inv).iter().all(|w| w.2 == "spec.hostNetwork"),
        "{:#?}",
        inv.problems
    );
    assert_eq!(inv.errors().count(), 2, "{:#?}", inv.problems);
    let clash = inv
        .problems
        .iter()
        .find(|p| p.object == "ns2/b")
        .expect("the second pod is reported");
    assert_eq!(clash.severity, Severity::Error);
    assert!(
        clash.reason.contains("address 10.0.0.5 on network default")
            && clash.reason.contains("pod ns1/a")
            && clash.reason.contains("kept out of every allow set"),
        "{clash}"
    );
    let other_network = inv
        .problems
        .iter()
        .find(|p| p.object == "ns2/m2")
        .expect("the same address on another network is reported too");
    assert!(
        other_network.reason.contains("192.168.9.1"),
        "{other_network}"
    );
}

#[test]
fn empty_directories_and_paths_without_objects_warn() {
    let dir = TempDir::new("empty");
    let d = &dir.0;
    std::fs::create_dir_all(d.join("empty/sub")).unwrap();
    std::fs::write(d.join("empty/notes.txt"), "not a manifest").unwrap();
    let inv = load_paths(&[d.join("empty")], &LoadOptions::default());
    assert_eq!(inv.problems.len(), 1, "{:#?}", inv.problems);
    assert_eq!(inv.problems[0].severity, Severity::Warning);
    assert!(inv.problems[0].reason.contains("no manifest files"));

    // Files that hold nothing netwarden reads.
    std::fs::write(
        d.join("deploy.yaml"),
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: a}\n",
    )
    .unwrap();
    std::fs::write(d.join("comments.yaml"), "# nothing yet\n").unwrap();
    let paths = [d.join("deploy.yaml"), d.join("comments.yaml")];
    let inv = load_paths(&paths, &LoadOptions::default());
    assert_eq!(inv.problems.len(), 1, "{:#?}", inv.problems);
    assert_eq!(inv.problems[0].severity, Severity::Warning);
    assert!(inv.problems[0]
        .reason
        .starts_with("no object that netwarden reads"));
    assert!(inv.problems[0].file.contains("deploy.yaml"));

    // No warning when something loads, or when nothing was asked for.
    std::fs::write(d.join("pod.yaml"), GOOD_POD).unwrap();
    assert_eq!(
        load_paths(&[d.join("pod.yaml")], &LoadOptions::default()).problems,
        vec![]
    );
    assert_eq!(load_paths(&[], &LoadOptions::default()).problems, vec![]);
}

#[test]
fn danmeps_with_kernel_legal_names_are_attached() {
    let pod_doc = "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: tel}\nstatus: {podIPs: [{ip: 10.0.0.5}]}\n";
    let eps = [
        danmep("ep1", "p", "n1", None, "'a\"b;+'", "1.1.1.1/24", ""),
        danmep("ep2", "p", "n2", None, "\"$(id)\"", "1.1.1.2/24", ""),
        danmep("ep3", "p", "n3", None, "\"a:b\"", "1.1.1.3/24", ""),
    ]
    .concat();
    let inv = load(&format!("{pod_doc}{eps}"));
    let names: Vec<_> = inv.pods[0]
        .interfaces
        .iter()
        .map(|i| i.name.as_str())
        .collect();
    assert_eq!(names, ["eth0", "a\"b;+", "$(id)"]);
    assert_eq!(
        errors(&inv),
        vec![e("DanmEp", "tel/ep3", "spec.Interface.Name")]
    );
}

// ---------------------------------------------------------------------------------------
// ManifestSet: files re-read as they change; a broken file never opens a pod.

const SET_POLICY: &str = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny, namespace: ns1}\nspec: {podSelector: {}}\n";

fn set_pod(name: &str, ip: &str) -> String {
    format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: ns1}}\nstatus: {{podIPs: [{{ip: {ip}}}]}}\n")
}

fn changes(set: &mut ManifestSet) -> Vec<(String, Change)> {
    set.refresh()
        .into_iter()
        .map(|c| {
            (
                c.path.file_name().unwrap().to_string_lossy().into_owned(),
                c.change,
            )
        })
        .collect()
}

fn policy_names(inv: &Inventory) -> Vec<String> {
    inv.policies.iter().map(|p| p.key.to_string()).collect()
}

#[test]
fn manifest_set_keeps_the_last_good_version_of_a_broken_file() {
    let dir = TempDir::new("set");
    let d = dir.0.clone();
    let a = d.join("a.yaml");
    let b = d.join("b.yaml");
    std::fs::write(
        &a,
        format!("{SET_POLICY}---\n{}", set_pod("p1", "10.0.0.1")),
    )
    .unwrap();
    std::fs::write(&b, set_pod("p2", "10.0.0.2")).unwrap();
    let opts = LoadOptions::default();
    let mut set = ManifestSet::new(vec![d.clone()], opts.clone());
    assert_eq!(
        changes(&mut set),
        [
            ("a.yaml".into(), Change::Added),
            ("b.yaml".into(), Change::Added)
        ]
    );
    assert_eq!(
        *set.inventory(),
        load_paths(std::slice::from_ref(&d), &opts)
    );
    let good = set.inventory().clone();
    assert_eq!(policy_names(&good), ["ns1/deny"]);

    // Truncated mid-write: everything from a.yaml stays, and a problem says so.
    let text = std::fs::read_to_string(&a).unwrap();
    std::fs::write(&a, &text[..text.find("spec:").unwrap() + 8]).unwrap();
    assert_eq!(changes(&mut set), [("a.yaml".into(), Change::Modified)]);
    let inv = set.inventory();
    assert_eq!(inv.policies, good.policies);
    assert_eq!(inv.pods, good.pods);
    assert!(inv
        .problems
        .iter()
        .any(|p| p.reason.contains("keeping 2 object(s)")));
    assert!(inv.has_errors());

    // Empty while being written: kept too, with a warning.
    std::fs::write(&a, "").unwrap();
    assert_eq!(changes(&mut set), [("a.yaml".into(), Change::Modified)]);
    assert_eq!(set.inventory().policies, good.policies);
    assert!(set
        .inventory()
        .problems
        .iter()
        .any(|p| p.severity == Severity::Warning && p.reason.contains("delete the file")));

    // The policy rejected (a wrong type): its last good version stays; the pod's new address
    // is taken.
    std::fs::write(
        &a,
        format!(
            "{}---\n{}",
            SET_POLICY.replace("podSelector: {}", "podSelector: [x]"),
            set_pod("p1", "10.0.0.11")
        ),
    )
    .unwrap();
    assert_eq!(changes(&mut set), [("a.yaml".into(), Change::Modified)]);
    let inv = set.inventory();
    assert_eq!(inv.policies, good.policies);
    assert_eq!(inv.pods[0].primary().unwrap().ips, vec![ip("10.0.0.11")]);
    assert!(inv
        .problems
        .iter()
        .any(|p| p.reason.contains("keeping its last good version")));

    // Fixed, with the policy changed: the new version, exactly what load_paths gives.
    std::fs::write(
        &a,
        format!(
            "{}---\n{}",
            SET_POLICY.replace("podSelector: {}", "podSelector: {matchLabels: {app: x}}"),
            set_pod("p1", "10.0.0.1")
        ),
    )
    .unwrap();
    assert_eq!(changes(&mut set), [("a.yaml".into(), Change::Modified)]);
    assert_eq!(
        *set.inventory(),
        load_paths(std::slice::from_ref(&d), &opts)
    );
    assert_eq!(
        set.inventory().policies[0].pod_selector.match_labels["app"],
        "x"
    );

    // Removed from a file that parses cleanly: gone.
    std::fs::write(&a, set_pod("p1", "10.0.0.1")).unwrap();
    assert_eq!(changes(&mut set), [("a.yaml".into(), Change::Modified)]);
    assert!(set.inventory().policies.is_empty());
    assert_eq!(
        *set.inventory(),
        load_paths(std::slice::from_ref(&d), &opts)
    );

    // A removed file removes its objects.
    std::fs::remove_file(&b).unwrap();
    assert_eq!(changes(&mut set), [("b.yaml".into(), Change::Removed)]);
    let pods: Vec<_> = set
        .inventory()
        .pods
        .iter()
        .map(|p| p.key.name.clone())
        .collect();
    assert_eq!(pods, ["p1"]);
    assert_eq!(
        *set.inventory(),
        load_paths(std::slice::from_ref(&d), &opts)
    );

    // Nothing changed: nothing reported.
    assert_eq!(changes(&mut set), []);
}

#[test]
fn manifest_set_sees_edits_that_keep_size_and_mtime() {
    let dir = TempDir::new("set-stamp");
    let a = dir.0.join("a.yaml");
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    let write = |text: &str| {
        std::fs::write(&a, text).unwrap();
        // Restore the old modification time, as `cp -p` or `touch -d` would.
        std::fs::File::options()
            .write(true)
            .open(&a)
            .unwrap()
            .set_modified(old)
            .unwrap();
    };
    let v1 = set_pod("p1", "10.0.0.1");
    let v2 = set_pod("p1", "10.0.0.2");
    assert_eq!(v1.len(), v2.len());

    // Within the racy window: hashed on every refresh, so the edit is seen.
    write(&v1);
    let mut set = ManifestSet::new(vec![dir.0.clone()], LoadOptions::default());
    assert_eq!(changes(&mut set), [("a.yaml".into(), Change::Added)]);
    write(&v2);
    assert_eq!(changes(&mut set), [("a.yaml".into(), Change::Modified)]);
    assert_eq!(
        set.inventory().pods[0].primary().unwrap().ips,
        vec![ip("10.0.0.2")]
    );

    // Settled (no racy window): an unchanged file is not read again, and an edit that keeps
    // size, mtime and inode is still seen through its ctime.
    let pause = || std::thread::sleep(std::time::Duration::from_millis(50));
    let mut set = ManifestSet::new(vec![dir.0.clone()], LoadOptions::default())
        .with_racy_window(std::time::Duration::ZERO);
    pause();
    assert_eq!(changes(&mut set), [("a.yaml".into(), Change::Added)]);
    assert_eq!(set.reads, 1);
    pause();
    assert_eq!(changes(&mut set), []);
    assert_eq!(set.reads, 1, "a settled, unchanged file is not read");
    write(&v1);
    pause();
    assert_eq!(changes(&mut set), [("a.yaml".into(), Change::Modified)]);
    assert_eq!(
        set.inventory().pods[0].primary().unwrap().ips,
        vec![ip("10.0.0.1")]
    );
    // Touched but identical: read, not reported.
    write(&v1);
    pause();
    assert_eq!(changes(&mut set), []);
    assert_eq!(set.reads, 3);
}

#[test]
fn manifest_set_keeps_files_under_a_directory_it_cannot_list() {
    let dir = TempDir::new("set-unlistable");
    let sub = dir.0.join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::write(sub.join("a.yaml"), SET_POLICY).unwrap();
    let mut set = ManifestSet::new(vec![dir.0.clone()], LoadOptions::default());
    assert_eq!(changes(&mut set), [("a.yaml".into(), Change::Added)]);
    // The directory turns into a symlink loop: examining it fails with ELOOP (not NotFound,
    // and unlike a permission error this also holds for root), so what was under it stays.
    std::fs::remove_dir_all(&sub).unwrap();
    std::os::unix::fs::symlink(&sub, &sub).unwrap();
    assert_eq!(changes(&mut set), []);
    let inv = set.inventory();
    assert_eq!(policy_names(inv), ["ns1/deny"]);
    let problem = inv.errors().next().expect("the listing error is reported");
    assert!(
        problem.file.ends_with("sub") && problem.reason.starts_with("cannot read"),
        "{problem}"
    );
    // Gone for real: removed.
    std::fs::remove_file(&sub).unwrap();
    assert_eq!(changes(&mut set), [("a.yaml".into(), Change::Removed)]);
    assert!(set.inventory().policies.is_empty());
}

#[test]
fn a_misspelled_kind_is_shown_escaped() {
    // Found by cargo-fuzz: the kind as written went into the problem raw, so a tab or a
    // newline in it broke the one-line output.
    let inv = load("apiVersion: v1\nkind: \"Name\\t!space\"\nmetadata: {name: web}\n");
    assert_eq!(errors(&inv), vec![e("Name\\t!space", "web", "kind")]);
    for p in &inv.problems {
        assert!(!p.to_string().chars().any(char::is_control), "{p:?}");
    }
}

#[test]
fn problems_about_huge_keys_and_values_stay_short() {
    let key = "k".repeat(5000);
    for text in [
        format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\n  {key}: 1\n  {key}: 2\n"),
        format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: a, labels: {{{key}: x}}}}\n"),
        format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: a, namespace: {key}}}\n"),
        format!("{{\"apiVersion\": \"v1\", \"kind\": \"Pod\", \"metadata\": {{\"name\": \"a\", \"{key}\": 1, \"{key}\": 2}}}}"),
        // Found by cargo-fuzz: the YAML parser quotes the scalar it refuses, however long.
        format!("[\t{}", "6".repeat(5000)),
        format!("a: {}\nb: [", "6".repeat(5000)),
    ] {
        for label in ["t.yaml", "t.json"] {
            let inv = parse_str(label, &text, &LoadOptions::default());
            assert!(!inv.problems.is_empty(), "{label}: {}", &text[..40]);
            for p in &inv.problems {
                for part in [&p.object, &p.field, &p.reason] {
                    assert!(part.len() <= crate::fuzzing::MAX_PROBLEM_PART, "{}", &part[..200]);
                    assert!(!part.chars().any(char::is_control), "{part}");
                }
            }
        }
    }
}

/// A FIFO or a device named like a manifest never blocks or floods the reader: skipped with a
/// warning under a directory, refused when named explicitly; a file that becomes a FIFO keeps
/// its last good objects in a [`ManifestSet`].
#[test]
fn special_files_are_never_read() {
    let dir = TempDir::new("special");
    let d = dir.0.clone();
    std::fs::write(d.join("a.yaml"), set_pod("p1", "10.0.0.1")).unwrap();
    let fifo = d.join("evil.yaml");
    let mode = nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR;
    nix::unistd::mkfifo(&fifo, mode).unwrap();
    let opts = LoadOptions::default();
    let inv = load_paths(std::slice::from_ref(&d), &opts);
    assert_eq!(inv.pods.len(), 1);
    let warning = inv
        .problems
        .iter()
        .find(|p| p.file.ends_with("evil.yaml"))
        .expect("a warning names the FIFO");
    assert_eq!(warning.severity, Severity::Warning);
    assert!(warning.reason.contains("a FIFO"), "{}", warning.reason);

    for (path, what) in [
        (fifo.clone(), "a FIFO"),
        ("/dev/zero".into(), "a character device"),
    ] {
        let inv = load_paths(&[path], &opts);
        assert!(inv.has_errors());
        assert!(
            inv.problems[0]
                .reason
                .contains(&format!("not a regular file ({what})")),
            "{:?}",
            inv.problems
        );
    }

    let a = d.join("a.yaml");
    let mut set = ManifestSet::new(vec![a.clone()], opts);
    set.refresh();
    assert_eq!(set.inventory().pods.len(), 1);
    std::fs::remove_file(&a).unwrap();
    nix::unistd::mkfifo(&a, mode).unwrap();
    set.refresh();
    assert_eq!(set.inventory().pods.len(), 1, "last good objects kept");
    assert!(set.inventory().has_errors());
}

#[test]
fn learn_annotation_on_pods_and_namespaces() {
    let inv = load(
        r#"
apiVersion: v1
kind: Namespace
metadata: {name: ns1, annotations: {netwarden.io/learn: "true"}}
---
apiVersion: v1
kind: Namespace
metadata: {name: ns2, annotations: {netwarden.io/learn: "yes"}}
---
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: ns2, annotations: {netwarden.io/learn: "true"}}
status: {podIP: 10.0.0.1}
---
apiVersion: v1
kind: Pod
metadata: {name: b, namespace: ns2, annotations: {netwarden.io/learn: "false"}}
status: {podIP: 10.0.0.2}
---
apiVersion: v1
kind: Pod
metadata: {name: c, namespace: ns2, annotations: {netwarden.io/learn: "True"}}
status: {podIP: 10.0.0.3}
"#,
    );
    let ns = |name: &str| inv.namespaces.iter().find(|n| n.name == name).unwrap();
    assert!(ns("ns1").learn);
    assert!(!ns("ns2").learn);
    assert!(pod(&inv, "a").learn);
    assert!(!pod(&inv, "b").learn);
    assert!(!pod(&inv, "c").learn);
    // A value other than "true"/"false" is an error naming the object and the field; the
    // object is read without learn mode.
    let field = "metadata.annotations[\"netwarden.io/learn\"]";
    assert_eq!(
        errors(&inv),
        vec![e("Namespace", "ns2", field), e("Pod", "ns2/c", field)],
        "{:#?}",
        inv.problems
    );
}

/// Issue 20, defect 9: a Succeeded or Failed pod's address may already be another pod's; it is
/// neither a peer nor programmed: not loaded at all, silently (finished pods are routine).
#[test]
fn finished_pods_are_not_loaded() {
    // A finished pod keeps the address it had; the next pod may hold it already.
    let pod = |name: &str, phase: &str| {
        let ip = if phase == "Pending" {
            "10.0.0.8"
        } else {
            "10.0.0.7"
        };
        format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: ns}}\n\
             status: {{phase: {phase}, podIP: {ip}, podIPs: [{{ip: {ip}}}]}}\n"
        )
    };
    let inv = load(&format!(
        "{}{}{}{}",
        pod("job-done", "Succeeded"),
        pod("job-failed", "Failed"),
        pod("running", "Running"),
        pod("pending", "Pending"),
    ));
    let names: Vec<&str> = inv.pods.iter().map(|p| p.key.name.as_str()).collect();
    assert_eq!(names, ["running", "pending"]);
    assert!(inv.problems.is_empty(), "{:#?}", inv.problems);
    // A phase of the wrong type rejects the pod (it might be finished or not).
    let inv = load(&pod("odd", "[Failed]"));
    assert!(inv.pods.is_empty());
    assert_eq!(errors(&inv), vec![e("Pod", "ns/odd", "status.phase")]);
}

/// Issue 20, defect 14: an item of a typed List that is another kind was read (or, not being
/// one of netwarden's kinds, ignored) without a word.
#[test]
fn items_of_another_kind_in_a_typed_list_are_reported() {
    let inv = load(
        r#"
apiVersion: v1
kind: PodList
items:
- metadata: {name: web, namespace: prod}
  status: {podIPs: [{ip: 10.0.0.1}]}
- apiVersion: v1
  kind: Service
  metadata: {name: svc, namespace: prod}
  spec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}
- apiVersion: apps/v1
  kind: Deployment
  metadata: {name: dep, namespace: prod}
"#,
    );
    assert_eq!(inv.pods.len(), 1);
    assert_eq!(inv.services.len(), 1, "read as what it says");
    let w = warnings(&inv);
    assert_eq!(
        w,
        vec![
            e("Service", "prod/svc", "kind"),
            e("Deployment", "prod/dep", "kind"),
        ],
        "{:#?}",
        inv.problems
    );
    assert!(
        inv.problems[1].reason.contains("ignored"),
        "{}",
        inv.problems[1]
    );
}

/// SPEC 5: a pod that can change its own netns's rules is pointed out (a warning, once per
/// pod, naming the field); a hostNetwork pod is not (netwarden never programs it), nor are
/// capabilities that do not include NET_ADMIN.
#[test]
fn pods_with_net_admin_are_warned_about() {
    let inv = load(
        r#"
apiVersion: v1
kind: Pod
metadata: {name: nf, namespace: ns}
spec:
  containers:
  - name: a
    securityContext: {capabilities: {add: [NET_RAW]}}
  - name: b
    securityContext: {capabilities: {add: [NET_RAW, CAP_NET_ADMIN]}}
  - name: c
    securityContext: {capabilities: {add: [NET_ADMIN]}}
---
apiVersion: v1
kind: Pod
metadata: {name: priv, namespace: ns}
spec:
  initContainers:
  - name: i
    securityContext: {privileged: true}
  containers: [{name: c}]
---
apiVersion: v1
kind: Pod
metadata: {name: all, namespace: ns}
spec:
  ephemeralContainers:
  - name: dbg
    securityContext: {capabilities: {add: [all]}}
---
apiVersion: v1
kind: Pod
metadata: {name: plain, namespace: ns}
spec:
  containers:
  - name: c
    securityContext: {capabilities: {add: [NET_RAW], drop: [NET_ADMIN]}, privileged: false}
---
apiVersion: v1
kind: Pod
metadata: {name: host, namespace: ns}
spec:
  hostNetwork: true
  containers:
  - name: c
    securityContext: {privileged: true}
"#,
    );
    let net_admin: Vec<_> = inv
        .problems
        .iter()
        .filter(|p| p.reason.contains("NET_ADMIN"))
        .map(|p| (p.object.clone(), p.field.clone(), p.severity))
        .collect();
    assert_eq!(
        net_admin,
        vec![
            (
                "ns/nf".to_string(),
                "spec.containers[1].securityContext.capabilities.add".to_string(),
                Severity::Warning
            ),
            (
                "ns/priv".to_string(),
                "spec.initContainers[0].securityContext.privileged".to_string(),
                Severity::Warning
            ),
            (
                "ns/all".to_string(),
                "spec.ephemeralContainers[0].securityContext.capabilities.add".to_string(),
                Severity::Warning
            ),
        ]
    );
    assert_eq!(inv.pods.len(), 5, "warned, not dropped");
}
