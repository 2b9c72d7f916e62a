//! The scenario of the privileged end-to-end tests (`dataplane_e2e`, `agent_e2e`,
//! `conformance_lab`): a small dual-stack lab built from manifests, and probes between its
//! pods. (Root checks, locks, temp dirs and what netwarden left in a netns come from
//! `netwarden_testing`.)
//!
//! Every lab here uses a name prefix of its own (`<tag><pid>`, see
//! `netwarden_testing::unique_prefix`), so leftovers can be checked without being confused by
//! labs of other test suites running at the same time.

#![allow(dead_code)] // each test binary uses a part of these helpers

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use netwarden_engine::{PodKey, Protocol};
use netwarden_lab::{Lab, LabOptions, LabSpec, ProbeOutcome, ProbeSpec};
use netwarden_manifest::{parse_str, Inventory, LoadOptions};
use netwarden_testing::docs_text;
use serde_json::{json, Value};

/// The namespace of every test object.
pub const NS: &str = "e2e";
/// The port every lab pod listens on and the policies talk about.
pub const PORT: u16 = 8080;

/// A test pod: name, labels, IPv4 and IPv6 address (on-link /24 and /64).
pub struct PodDef {
    pub name: &'static str,
    pub labels: &'static [(&'static str, &'static str)],
    pub v4: &'static str,
    pub v6: &'static str,
}

/// `server` (the pod the policies isolate), `client-ok` (allowed), `client-no` (denied) and
/// `other` (isolated by a policy of its own), all on the primary network.
pub const PODS: [PodDef; 4] = [
    PodDef {
        name: "server",
        labels: &[("app", "server")],
        v4: "10.77.0.10",
        v6: "fd77::10",
    },
    PodDef {
        name: "client-ok",
        labels: &[("role", "ok")],
        v4: "10.77.0.11",
        v6: "fd77::11",
    },
    PodDef {
        name: "client-no",
        labels: &[("role", "no")],
        v4: "10.77.0.12",
        v6: "fd77::12",
    },
    PodDef {
        name: "other",
        labels: &[("app", "other")],
        v4: "10.77.0.13",
        v6: "fd77::13",
    },
];

pub fn pod_def(name: &str) -> &'static PodDef {
    PODS.iter()
        .find(|p| p.name == name)
        .unwrap_or_else(|| panic!("no test pod {name}"))
}

pub fn key(name: &str) -> PodKey {
    PodKey::new(NS, name)
}

/// The Namespace object.
pub fn namespace_doc() -> Value {
    namespace_doc_with(NS, "team", "e2e")
}

/// A Namespace object `name` with one label (for tests with pods in other namespaces).
pub fn namespace_doc_with(name: &str, label: &str, value: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {label: value}}})
}

/// A Pod object; `netns` becomes the standalone annotation `netwarden.io/netns`.
pub fn pod_doc(def: &PodDef, netns: Option<&Path>) -> Value {
    pod_doc_in(NS, def, netns)
}

/// [`pod_doc`] in namespace `namespace`.
pub fn pod_doc_in(namespace: &str, def: &PodDef, netns: Option<&Path>) -> Value {
    let labels: serde_json::Map<String, Value> = def
        .labels
        .iter()
        .map(|(k, v)| ((*k).to_string(), Value::from(*v)))
        .collect();
    let mut metadata = json!({"name": def.name, "namespace": namespace, "labels": labels});
    if let Some(path) = netns {
        metadata["annotations"] = json!({"netwarden.io/netns": path.display().to_string()});
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [{"name": "c", "ports": [{"name": "http", "containerPort": PORT}]}]},
        "status": {"podIPs": [{"ip": def.v4}, {"ip": def.v6}]},
    })
}

/// A NetworkPolicy isolating pods `app=<target>` for ingress, allowing TCP and UDP `PORT` from
/// pods whose `role` is in `roles` (no role: nothing is allowed). `extra` adds what no probe
/// uses (ipBlock peers of both families no pod is in, and port 9090), so the ruleset differs
/// while every probed verdict stays the same.
pub fn ingress_policy(name: &str, target: &str, roles: &[&str], extra: bool) -> Value {
    let mut ingress = Vec::new();
    if !roles.is_empty() {
        let mut from = vec![json!({"podSelector": {"matchExpressions": [
            {"key": "role", "operator": "In", "values": roles}
        ]}})];
        let mut ports = vec![
            json!({"protocol": "TCP", "port": PORT}),
            json!({"protocol": "UDP", "port": PORT}),
        ];
        if extra {
            from.push(json!({"ipBlock": {"cidr": "198.51.100.0/24"}}));
            from.push(json!({"ipBlock": {"cidr": "2001:db8:77::/48"}}));
            ports.push(json!({"protocol": "TCP", "port": 9090}));
        }
        ingress.push(json!({"from": from, "ports": ports}));
    }
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "podSelector": {"matchLabels": {"app": target}},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    })
}

/// Parses documents with the manifest loader; any problem fails the test.
pub fn inventory(docs: &[Value]) -> Inventory {
    let inv = parse_str("e2e.yaml", &docs_text(docs), &LoadOptions::default());
    assert!(
        inv.problems.is_empty(),
        "test manifests have problems: {:?}",
        inv.problems
    );
    inv
}

/// Builds a lab of `pods` (listening on TCP and UDP `PORT`) under `prefix`, and returns the
/// inventory with every pod's netns set to its lab netns.
pub fn lab_up(prefix: &str, docs: &[Value]) -> (Lab, Inventory) {
    lab_up_with_ports(
        prefix,
        docs,
        &[(PORT, Protocol::Tcp), (PORT, Protocol::Udp)],
    )
}

/// [`lab_up`] with every pod listening on `ports` instead.
pub fn lab_up_with_ports(
    prefix: &str,
    docs: &[Value],
    ports: &[(u16, Protocol)],
) -> (Lab, Inventory) {
    let mut inv = inventory(docs);
    let spec = LabSpec {
        pods: inv.pods.clone(),
        ports: ports.to_vec(),
    };
    let options = LabOptions {
        prefix: prefix.to_owned(),
        ..LabOptions::default()
    };
    let lab = Lab::up_with(&spec, &options).expect("building the lab");
    for pod in &mut inv.pods {
        let path = lab
            .pod_netns(&pod.key)
            .unwrap_or_else(|| panic!("{} got no netns", pod.key));
        pod.netns = Some(path.display().to_string());
    }
    (lab, inv)
}

/// The netns of a lab pod.
pub fn netns_of(lab: &Lab, name: &str) -> PathBuf {
    lab.pod_netns(&key(name))
        .unwrap_or_else(|| panic!("no netns for {name}"))
        .to_path_buf()
}

/// A probe from pod `from` to pod `to`'s address of the family of `v6`.
pub fn probe(from: &str, to: &str, protocol: Protocol, v6: bool) -> ProbeSpec {
    let (src, dst) = (pod_def(from), pod_def(to));
    let pick = |d: &PodDef| -> IpAddr { if v6 { d.v6 } else { d.v4 }.parse().expect("address") };
    ProbeSpec {
        from: key(from),
        to: key(to),
        src_ip: Some(pick(src)),
        dst_ip: pick(dst),
        port: PORT,
        protocol,
    }
}

/// TCP and UDP probes `from` → `to`, IPv4 and IPv6.
pub fn probes(from: &str, to: &str) -> Vec<ProbeSpec> {
    let mut out = Vec::new();
    for protocol in [Protocol::Tcp, Protocol::Udp] {
        for v6 in [false, true] {
            out.push(probe(from, to, protocol, v6));
        }
    }
    out
}

/// A short description of an outcome for failure messages.
pub fn describe(o: &ProbeOutcome) -> String {
    format!(
        "{} -> {} {}:{}/{:?}: {} in {:.0} ms",
        o.spec.from,
        o.spec.to,
        o.spec.dst_ip,
        o.spec.port,
        o.spec.protocol,
        o.detail,
        o.elapsed.as_secs_f64() * 1e3
    )
}

/// Asserts every probe connected (`allowed`) or none did.
pub fn assert_probes(lab: &Lab, specs: &[ProbeSpec], allowed: bool, what: &str) {
    let outcomes = lab.probe(specs);
    let wrong: Vec<String> = outcomes
        .iter()
        .filter(|o| o.connected != allowed)
        .map(describe)
        .collect();
    assert!(
        wrong.is_empty(),
        "{what}: expected {}, but: {wrong:#?}",
        if allowed { "connected" } else { "refused" }
    );
}
