//! The synthetic cluster of the benchmarks ([`netwarden_engine::generate::cluster`]) as the
//! objects an API server serves: Namespaces, Pods (secondary interfaces as Multus
//! `network-status`), the three policy kinds (MultiNetworkPolicy scopes as `policy-for`,
//! monitored policies as `netwarden.io/mode: monitor`), Services, and an EndpointSlice for each
//! selector-less Service.
//!
//! One writer for the `gen_cluster` example (files for `-f`) and the agent benchmark (objects
//! for the fake API server), so both measure the same cluster.

use netwarden_engine::generate::Cluster;
use netwarden_engine::model::*;
use serde_json::{json, Map, Value};

/// Every object of `cluster`, namespaces first (the order an API server would list them in
/// does not matter to netwarden, but a human reading the files likes it).
pub fn api_objects(cluster: &Cluster) -> Vec<Value> {
    let mut out: Vec<Value> = cluster.namespaces.iter().map(namespace_json).collect();
    out.extend(cluster.pods.iter().map(pod_json));
    out.extend(cluster.policies.iter().map(policy_json));
    for service in &cluster.services {
        out.push(service_json(service));
        if service.selector.is_none() {
            out.push(endpoint_slice_json(service));
        }
    }
    out
}

/// Writes `cluster` into `dir` as one JSON file per kind (`Namespace.json`, `Pod.json`, ...),
/// each a `kind: List`: what `netwarden -f DIR` reads.
pub fn write_files(dir: &std::path::Path, cluster: &Cluster) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut by_kind: std::collections::BTreeMap<String, Vec<Value>> = Default::default();
    for object in api_objects(cluster) {
        let kind = object["kind"].as_str().unwrap_or("Unknown").to_string();
        by_kind.entry(kind).or_default().push(object);
    }
    for (kind, items) in by_kind {
        let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
        std::fs::write(dir.join(format!("{kind}.json")), serde_json::to_vec(&list)?)?;
    }
    Ok(())
}

pub fn service_json(service: &Service) -> Value {
    let ips: Vec<String> = service
        .cluster_ips
        .iter()
        .map(ToString::to_string)
        .collect();
    let ports: Vec<Value> = service
        .ports
        .iter()
        .map(|p| {
            let target = match &p.target {
                PortRef::Number(n) => json!(n),
                PortRef::Named(name) => json!(name),
            };
            json!({"protocol": p.protocol.as_str(), "port": p.port, "targetPort": target})
        })
        .collect();
    let mut spec = json!({"clusterIP": ips.first(), "clusterIPs": ips, "ports": ports});
    if let Some(selector) = &service.selector {
        spec["selector"] = json!(selector);
    }
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": service.key.name, "namespace": service.key.namespace},
           "spec": spec})
}

/// The EndpointSlice of a selector-less Service: its endpoint addresses, ready.
pub fn endpoint_slice_json(service: &Service) -> Value {
    let endpoints: Vec<Value> = service
        .endpoint_addrs
        .iter()
        .map(|ip| json!({"addresses": [ip.to_string()], "conditions": {"ready": true}}))
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": format!("{}-1", service.key.name),
                        "namespace": service.key.namespace,
                        "labels": {"kubernetes.io/service-name": service.key.name}},
           "addressType": "IPv4", "endpoints": endpoints})
}

pub fn namespace_json(ns: &Namespace) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace",
           "metadata": {"name": ns.name, "labels": ns.labels}})
}

pub fn pod_json(pod: &Pod) -> Value {
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
    if let Some(netns) = &pod.netns {
        metadata["annotations"]["netwarden.io/netns"] = json!(netns);
    }
    if let Some(uid) = &pod.uid {
        metadata["uid"] = json!(uid);
    }
    let mut spec = json!({"containers": [{"name": "main", "ports": ports}]});
    if let Some(node) = &pod.node_name {
        spec["nodeName"] = json!(node);
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec,
           "status": {"phase": "Running",
                      "podIP": primary_ips.first(),
                      "podIPs": primary_ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>()}})
}

pub fn policy_json(policy: &Policy) -> Value {
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
