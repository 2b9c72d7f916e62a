//! Writes the engine bench's synthetic cluster (`netwarden_engine::generate::cluster`) as
//! manifests that `netwarden -f DIR` reads, to measure the CLI on large clusters without
//! committing large generated files:
//!
//! ```text
//! cargo run --release -p netwarden --example gen_cluster -- DIR PODS [POLICIES] [SEED]
//! /usr/bin/time -v target/release/netwarden reach -f DIR --port 80/TCP > /dev/null
//! ```
//!
//! Three JSON files (`namespaces.json`, `pods.json`, `policies.json`), each one `kind: List`.
//! Secondary interfaces are written as Multus `network-status` entries, MultiNetworkPolicy
//! scopes as `policy-for`, monitored policies as `netwarden.io/mode: monitor`.

use std::path::PathBuf;

use netwarden_engine::generate::cluster;
use netwarden_engine::model::*;
use serde_json::{json, Map, Value};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: gen_cluster DIR PODS [POLICIES (default PODS/10)] [SEED (default 1)]";
    let (Some(dir), Some(pods)) = (args.first(), args.get(1).and_then(|n| n.parse().ok())) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let pods: usize = pods;
    let policies = args
        .get(2)
        .and_then(|n| n.parse().ok())
        .unwrap_or(pods / 10);
    let seed = args.get(3).and_then(|n| n.parse().ok()).unwrap_or(1);
    let generated = cluster(pods, policies, seed);
    let dir = PathBuf::from(dir);
    std::fs::create_dir_all(&dir).expect("create the output directory");
    let write = |file: &str, items: Vec<Value>| {
        let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
        let text = serde_json::to_string(&list).expect("JSON");
        std::fs::write(dir.join(file), text).expect("write a manifest file");
    };
    write(
        "namespaces.json",
        generated.namespaces.iter().map(namespace_json).collect(),
    );
    write("pods.json", generated.pods.iter().map(pod_json).collect());
    write(
        "policies.json",
        generated.policies.iter().map(policy_json).collect(),
    );
    eprintln!(
        "{}: {} namespaces, {} pods, {} policies",
        dir.display(),
        generated.namespaces.len(),
        generated.pods.len(),
        generated.policies.len()
    );
}

fn namespace_json(ns: &Namespace) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace",
           "metadata": {"name": ns.name, "labels": ns.labels}})
}

fn pod_json(pod: &Pod) -> Value {
    let mut metadata = json!({"name": pod.key.name, "namespace": pod.key.namespace,
                              "labels": pod.labels});
    let primary_ips: Vec<String> = pod
        .primary()
        .map(|i| i.ips.iter().map(|ip| ip.to_string()).collect())
        .unwrap_or_default();
    if pod.interfaces.iter().any(|i| !i.is_primary()) {
        let status: Vec<Value> = pod
            .interfaces
            .iter()
            .map(|i| {
                let ips: Vec<String> = i.ips.iter().map(|ip| ip.to_string()).collect();
                if i.is_primary() {
                    json!({"name": "cbr0", "interface": i.name, "ips": ips, "default": true})
                } else {
                    json!({"name": i.network.to_string(), "interface": i.name, "ips": ips})
                }
            })
            .collect();
        metadata["annotations"] = json!({
            "k8s.v1.cni.cncf.io/network-status":
                serde_json::to_string(&status).expect("JSON"),
        });
    }
    let ports: Vec<Value> = pod
        .container_ports
        .iter()
        .map(|p| {
            let mut port = json!({"containerPort": p.port, "protocol": p.protocol.as_str()});
            if let Some(name) = &p.name {
                port["name"] = json!(name);
            }
            port
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
           "spec": {"containers": [{"name": "main", "ports": ports}]},
           "status": {"podIPs": primary_ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>()}})
}

fn policy_json(policy: &Policy) -> Value {
    let (api_version, kind) = match policy.kind {
        PolicyKind::NetworkPolicy => ("networking.k8s.io/v1", "NetworkPolicy"),
        PolicyKind::DanmNetworkPolicy => ("danm.k8s.io/v1", "DanmNetworkPolicy"),
        PolicyKind::MultiNetworkPolicy => ("k8s.cni.cncf.io/v1beta1", "MultiNetworkPolicy"),
    };
    let mut annotations = Map::new();
    if let PolicyScope::Networks(networks) = &policy.scope {
        let names: Vec<String> = networks.iter().map(|n| n.to_string()).collect();
        annotations.insert(
            "k8s.v1.cni.cncf.io/policy-for".into(),
            json!(names.join(",")),
        );
    }
    if policy.mode == Mode::Monitor {
        annotations.insert("netwarden.io/mode".into(), json!("monitor"));
    }
    let mut spec = json!({"podSelector": selector_json(&policy.pod_selector)});
    let mut types = Vec::new();
    if let Some(rules) = &policy.ingress {
        types.push("Ingress");
        spec["ingress"] = rules.iter().map(|r| rule_json(r, "from")).collect();
    }
    if let Some(rules) = &policy.egress {
        types.push("Egress");
        spec["egress"] = rules.iter().map(|r| rule_json(r, "to")).collect();
    }
    spec["policyTypes"] = json!(types);
    json!({"apiVersion": api_version, "kind": kind,
           "metadata": {"name": policy.key.name, "namespace": policy.key.namespace,
                        "annotations": annotations},
           "spec": spec})
}

fn rule_json(rule: &PolicyRule, peers_field: &str) -> Value {
    let mut out = Map::new();
    if !rule.peers.is_empty() {
        out.insert(
            peers_field.into(),
            rule.peers.iter().map(peer_json).collect(),
        );
    }
    if !rule.ports.is_empty() {
        out.insert("ports".into(), rule.ports.iter().map(port_json).collect());
    }
    Value::Object(out)
}

fn peer_json(peer: &Peer) -> Value {
    match peer {
        Peer::IpBlock(block) => json!({"ipBlock": {
            "cidr": block.cidr.to_string(),
            "except": block.except.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
        }}),
        Peer::Pods {
            pod_selector,
            namespace_selector,
            network_selector,
        } => {
            let mut out = Map::new();
            if let Some(s) = pod_selector {
                out.insert("podSelector".into(), selector_json(s));
            }
            if let Some(s) = namespace_selector {
                out.insert("namespaceSelector".into(), selector_json(s));
            }
            if let Some(entries) = network_selector {
                let entries: Vec<Value> = entries
                    .iter()
                    .map(|e| {
                        let name = match &e.namespace {
                            Some(ns) => format!("{ns}/{}", e.name),
                            None => e.name.clone(),
                        };
                        json!({"name": name, "type": format!("{:?}", e.kind)})
                    })
                    .collect();
                out.insert("networkSelector".into(), json!(entries));
            }
            Value::Object(out)
        }
    }
}

fn port_json(port: &PolicyPort) -> Value {
    let mut out = json!({"protocol": port.protocol.as_str()});
    match &port.port {
        Some(PortRef::Number(n)) => out["port"] = json!(n),
        Some(PortRef::Named(name)) => out["port"] = json!(name),
        None => {}
    }
    if let Some(end) = port.end_port {
        out["endPort"] = json!(end);
    }
    out
}

fn selector_json(selector: &LabelSelector) -> Value {
    let mut out = Map::new();
    if !selector.match_labels.is_empty() {
        out.insert("matchLabels".into(), json!(selector.match_labels));
    }
    if !selector.match_expressions.is_empty() {
        let exprs: Vec<Value> = selector
            .match_expressions
            .iter()
            .map(|r| {
                let operator = match r.operator {
                    Operator::In => "In",
                    Operator::NotIn => "NotIn",
                    Operator::Exists => "Exists",
                    Operator::DoesNotExist => "DoesNotExist",
                };
                json!({"key": r.key, "operator": operator, "values": r.values})
            })
            .collect();
        out.insert("matchExpressions".into(), json!(exprs));
    }
    Value::Object(out)
}
