//! Pods and DanmEps: labels, container ports, and the interfaces with their networks (SPEC 2).
//!
//! A pod's interfaces come from, in this order: `status.podIPs` (one primary `eth0`), the
//! Multus `network-status` annotation (which replaces that guess when present), and in the
//! second pass the DanmEp objects naming the pod.

use std::net::IpAddr;

use netwarden_engine::{ContainerPort, NetworkId, NetworkType, Pod, PodInterface, PodKey};
use serde_json::Value;

use crate::ctx::{get, index, join, keyed, parse_addr, Ctx};
use crate::{read_meta, validate, PodRecord, Problem, Severity};

pub const NETWORK_STATUS: &str = "k8s.v1.cni.cncf.io/network-status";
/// What Multus wrote before the key was renamed.
pub const NETWORKS_STATUS_OLD: &str = "k8s.v1.cni.cncf.io/networks-status";
pub const NETNS: &str = "netwarden.io/netns";
const PRIMARY_IFNAME: &str = "eth0";

pub(crate) fn read_pod(cx: &mut Ctx<'_>, doc: &Value) -> Option<PodRecord> {
    let meta = read_meta(cx, doc, true)?;
    let empty = Value::Null;
    let spec = get(doc, "spec").unwrap_or(&empty);
    let status = get(doc, "status").unwrap_or(&empty);

    let host_network = cx.bool(spec, "spec", "hostNetwork").unwrap_or(false);
    if host_network {
        cx.warn(
            "spec.hostNetwork",
            "hostNetwork pods share the node's network namespace and are never isolated",
        );
    }

    let mut container_ports = Vec::new();
    for list in ["initContainers", "containers"] {
        let base = join("spec", list);
        let Some(containers) = cx.array(spec, "spec", list) else {
            continue;
        };
        for (ci, c) in containers.iter().enumerate() {
            let cbase = index(&base, ci);
            let Some(ports) = cx.array(c, &cbase, "ports") else {
                continue;
            };
            for (pi, p) in ports.iter().enumerate() {
                let pbase = index(&join(&cbase, "ports"), pi);
                if let Some(cp) = read_container_port(cx, p, &pbase) {
                    container_ports.push(cp);
                }
            }
        }
    }

    let pod_ips = read_pod_ips(cx, status);

    let status_key = if meta.annotations.contains_key(NETWORK_STATUS) {
        Some(NETWORK_STATUS)
    } else if meta.annotations.contains_key(NETWORKS_STATUS_OLD) {
        Some(NETWORKS_STATUS_OLD)
    } else {
        None
    };
    let from_status = status_key.and_then(|k| {
        let field = keyed("metadata.annotations", k);
        read_network_status(cx, &field, &meta.annotations[k], &meta.namespace, &pod_ips)
    });
    let interfaces = match from_status {
        Some(ifaces) => ifaces,
        None if pod_ips.is_empty() => Vec::new(),
        None => vec![primary_from_pod_ips(&pod_ips)],
    };

    let netns = meta
        .annotations
        .get(NETNS)
        .and_then(|path| match validate::netns_path(path) {
            Ok(()) => Some(path.clone()),
            Err(e) => {
                cx.error(
                    &keyed("metadata.annotations", NETNS),
                    format!("{e}; ignored"),
                );
                None
            }
        });

    let from_danmep = vec![false; interfaces.len()];
    Some(PodRecord {
        pod: Pod {
            key: PodKey::new(meta.namespace, meta.name),
            labels: meta.labels,
            host_network,
            container_ports,
            interfaces,
            netns,
        },
        pod_ips,
        from_danmep,
    })
}

fn primary_from_pod_ips(pod_ips: &[IpAddr]) -> PodInterface {
    PodInterface {
        name: PRIMARY_IFNAME.to_string(),
        network: NetworkId::Primary,
        ips: pod_ips.to_vec(),
        prefix_lens: pod_ips
            .iter()
            .map(|ip| crate::ctx::default_prefix(*ip))
            .collect(),
    }
}

fn read_container_port(cx: &mut Ctx<'_>, p: &Value, base: &str) -> Option<ContainerPort> {
    let field = join(base, "containerPort");
    let port = match get(p, "containerPort") {
        Some(v) => cx.port_number(&field, v)?,
        None => {
            cx.error(&field, "missing containerPort; port ignored");
            return None;
        }
    };
    let protocol = cx.protocol(p, base, "protocol")?;
    let name = cx
        .str(p, base, "name")
        .filter(|n| !n.is_empty())
        .and_then(|n| match validate::port_name(n) {
            Ok(()) => Some(n.to_string()),
            Err(e) => {
                cx.error(
                    &join(base, "name"),
                    format!("{e}; the port is kept without a name"),
                );
                None
            }
        });
    Some(ContainerPort {
        name,
        port,
        protocol,
    })
}

/// `status.podIPs[].ip`, or `status.podIP` when the list is absent (older API servers).
fn read_pod_ips(cx: &mut Ctx<'_>, status: &Value) -> Vec<IpAddr> {
    fn add(cx: &mut Ctx<'_>, out: &mut Vec<IpAddr>, field: &str, s: &str) {
        match s.trim().parse::<IpAddr>() {
            Ok(ip) => {
                if !out.contains(&ip) {
                    out.push(ip);
                }
            }
            Err(_) => cx.error(
                field,
                format!("\"{}\" is not an IP address", validate::shorten(s)),
            ),
        }
    }
    let mut out: Vec<IpAddr> = Vec::new();
    if let Some(list) = cx.array(status, "status", "podIPs") {
        for (i, entry) in list.iter().enumerate() {
            let base = index("status.podIPs", i);
            if let Some(s) = cx.str(entry, &base, "ip") {
                add(cx, &mut out, &join(&base, "ip"), s);
            }
        }
    }
    if out.is_empty() {
        if let Some(s) = cx.str(status, "status", "podIP").filter(|s| !s.is_empty()) {
            add(cx, &mut out, "status.podIP", s);
        }
    }
    out
}

/// One parsed `network-status` entry.
struct StatusEntry {
    name: Option<String>,
    interface: Option<String>,
    ips: Vec<(IpAddr, u8)>,
    default: bool,
    /// A field had the wrong type (already reported): the entry is skipped.
    malformed: bool,
}

/// Reads the Multus network-status annotation; `None` (reported) when it is not a JSON list,
/// in which case the caller falls back to `status.podIPs`.
fn read_network_status(
    cx: &mut Ctx<'_>,
    field: &str,
    text: &str,
    pod_ns: &str,
    pod_ips: &[IpAddr],
) -> Option<Vec<PodInterface>> {
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            cx.error(
                field,
                format!("malformed JSON ({e}); interfaces taken from status.podIPs"),
            );
            return None;
        }
    };
    let Value::Array(list) = value else {
        cx.error(
            field,
            format!(
                "expected a JSON list, found {}; interfaces taken from status.podIPs",
                crate::ctx::type_name(&value)
            ),
        );
        return None;
    };

    let mut entries = Vec::new();
    for (i, e) in list.iter().enumerate() {
        let base = index(field, i);
        if !e.is_object() {
            cx.error(
                &base,
                format!(
                    "expected an object, found {}; skipped",
                    crate::ctx::type_name(e)
                ),
            );
            continue;
        }
        let malformed = ["name", "interface"]
            .iter()
            .any(|k| get(e, k).is_some_and(|v| !v.is_string()));
        let name = cx.str(e, &base, "name").map(str::to_string);
        let interface = cx
            .str(e, &base, "interface")
            .filter(|s| !s.is_empty())
            .map(str::to_string);
        let default = cx.bool(e, &base, "default").unwrap_or(false);
        let mut ips = Vec::new();
        if let Some(list) = cx.array(e, &base, "ips") {
            for (j, ip) in list.iter().enumerate() {
                let f = index(&join(&base, "ips"), j);
                match ip {
                    Value::String(s) => match parse_addr(s) {
                        Ok(a) => ips.push(a),
                        Err(err) => cx.error(&f, err),
                    },
                    other => cx.error(
                        &f,
                        format!("expected a string, found {}", crate::ctx::type_name(other)),
                    ),
                }
            }
        }
        entries.push((
            i,
            StatusEntry {
                name,
                interface,
                ips,
                default,
                malformed,
            },
        ));
    }

    // The primary interface: the `default` entry; else the one holding a pod IP; else the one
    // without an interface name (or named eth0), which is how Multus lists the cluster network.
    let primary = entries
        .iter()
        .position(|(_, e)| e.default)
        .or_else(|| {
            entries
                .iter()
                .position(|(_, e)| e.ips.iter().any(|(ip, _)| pod_ips.contains(ip)))
        })
        .or_else(|| {
            entries
                .iter()
                .position(|(_, e)| e.interface.as_deref().is_none_or(|i| i == PRIMARY_IFNAME))
        });

    let mut out: Vec<PodInterface> = Vec::new();
    for (pos, (i, e)) in entries.into_iter().enumerate() {
        let base = index(field, i);
        let is_primary = primary == Some(pos);
        if e.malformed {
            continue;
        }
        let mut ips: Vec<(IpAddr, u8)> = e.ips;
        if is_primary && ips.is_empty() {
            ips = pod_ips
                .iter()
                .map(|ip| (*ip, crate::ctx::default_prefix(*ip)))
                .collect();
        }
        if ips.is_empty() {
            // No L3 address: not an interface netwarden can filter on (SPEC 2).
            continue;
        }
        let ifname = match (e.interface, is_primary) {
            (Some(n), _) => n,
            (None, true) => PRIMARY_IFNAME.to_string(),
            (None, false) => {
                cx.error(
                    &join(&base, "interface"),
                    "missing interface name; entry skipped",
                );
                continue;
            }
        };
        if let Err(err) = validate::ifname(&ifname) {
            cx.error(
                &join(&base, "interface"),
                format!("{err}; interface dropped"),
            );
            continue;
        }
        if out.iter().any(|o| o.name == ifname) {
            cx.error(
                &join(&base, "interface"),
                format!("interface {ifname} listed twice; the later entry is skipped"),
            );
            continue;
        }
        let network = if is_primary {
            NetworkId::Primary
        } else {
            let Some(name) = e.name.filter(|n| !n.is_empty()) else {
                cx.error(&join(&base, "name"), "missing network name; entry skipped");
                continue;
            };
            match split_network_name(&name, pod_ns) {
                Ok((ns, n)) => NetworkId::nad(ns, n),
                Err(err) => {
                    cx.error(&join(&base, "name"), format!("{err}; entry skipped"));
                    continue;
                }
            }
        };
        out.push(PodInterface {
            name: ifname,
            network,
            prefix_lens: ips.iter().map(|(_, p)| *p).collect(),
            ips: ips.into_iter().map(|(ip, _)| ip).collect(),
        });
    }
    if primary.is_none() && !pod_ips.is_empty() {
        if out.iter().any(|o| o.name == PRIMARY_IFNAME) {
            cx.warn(
                field,
                "no entry holds status.podIPs and eth0 is taken; no primary interface",
            );
        } else {
            out.insert(0, primary_from_pod_ips(pod_ips));
        }
    }
    Some(out)
}

/// `ns/name` or a bare `name` (in `default_ns`), both checked; used for network-status entries,
/// `policy-for` and NAD network selectors.
pub(crate) fn split_network_name(s: &str, default_ns: &str) -> Result<(String, String), String> {
    let (ns, name) = match s.split_once('/') {
        Some((ns, name)) => (ns, name),
        None => (default_ns, s),
    };
    validate::dns1123_label(ns).map_err(|e| format!("network namespace: {e}"))?;
    validate::dns1123_subdomain(name).map_err(|e| format!("network name: {e}"))?;
    Ok((ns.to_string(), name.to_string()))
}

/// A DanmEp reduced to the interface it describes.
#[derive(Debug)]
pub(crate) struct DanmEpRecord {
    file: String,
    object: String,
    namespace: String,
    pod: String,
    iface: String,
    network: NetworkId,
    ips: Vec<(IpAddr, u8)>,
    netns: Option<String>,
}

pub(crate) fn read_danmep(cx: &mut Ctx<'_>, doc: &Value) -> Option<DanmEpRecord> {
    let meta = read_meta(cx, doc, true)?;
    let empty = Value::Null;
    let spec = match get(doc, "spec") {
        Some(s) if s.is_object() => s,
        Some(other) => {
            cx.error(
                "spec",
                format!(
                    "expected an object, found {}; ignored",
                    crate::ctx::type_name(other)
                ),
            );
            return None;
        }
        None => {
            cx.error("spec", "missing spec; ignored");
            return None;
        }
    };
    let mut ok = true;
    let pod = cx
        .required_str(spec, "spec", "Pod", "pod name")
        .map(str::to_string);
    match &pod {
        Some(p) => {
            if let Err(e) = validate::dns1123_subdomain(p) {
                cx.error("spec.Pod", format!("invalid pod name: {e}"));
                ok = false;
            }
        }
        None => ok = false,
    }
    // DANM 4 calls it NetworkName; older releases NetworkID.
    let (net_field, net_name) = match cx.str(spec, "spec", "NetworkName") {
        Some(n) => ("spec.NetworkName", Some(n)),
        None if get(spec, "NetworkName").is_some() => ("spec.NetworkName", None),
        None => ("spec.NetworkID", cx.str(spec, "spec", "NetworkID")),
    };
    match net_name {
        Some(n) => {
            if let Err(e) = validate::dns1123_subdomain(n) {
                cx.error(net_field, format!("invalid network name: {e}"));
                ok = false;
            }
        }
        None => {
            if get(spec, "NetworkName").is_none() && get(spec, "NetworkID").is_none() {
                cx.error("spec.NetworkName", "missing network name");
            }
            ok = false;
        }
    }
    let (type_field, api_type) = match cx.str(spec, "spec", "apiType") {
        Some(t) => ("spec.apiType", Some(t)),
        None => ("spec.ApiType", cx.str(spec, "spec", "ApiType")),
    };
    let kind = match api_type.filter(|t| !t.is_empty()) {
        None => NetworkType::DanmNet,
        Some(t) => match NetworkType::parse(t) {
            Some(k) => k,
            None => {
                cx.error(
                    type_field,
                    format!(
                        "unknown apiType \"{}\" (expected DanmNet, TenantNetwork or ClusterNetwork)",
                        validate::shorten(t)
                    ),
                );
                ok = false;
                NetworkType::DanmNet
            }
        },
    };
    let iface = get(spec, "Interface").unwrap_or(&empty);
    let ifname = cx
        .required_str(iface, "spec.Interface", "Name", "interface name")
        .map(str::to_string);
    match &ifname {
        Some(n) => {
            if let Err(e) = validate::ifname(n) {
                cx.error("spec.Interface.Name", format!("{e}; interface dropped"));
                ok = false;
            }
        }
        None => ok = false,
    }
    let mut ips = Vec::new();
    for key in ["Address", "AddressIPv6"] {
        let Some(a) = cx.str(iface, "spec.Interface", key) else {
            continue;
        };
        // DANM writes the allocation scheme here until (or instead of) an address.
        if a.is_empty() || a == "dynamic" || a == "none" {
            continue;
        }
        match parse_addr(a) {
            Ok(x) => ips.push(x),
            Err(e) => cx.error(&join("spec.Interface", key), e),
        }
    }
    let netns = cx
        .str(spec, "spec", "netns")
        .filter(|s| !s.is_empty())
        .and_then(|p| match validate::netns_path(p) {
            Ok(()) => Some(p.to_string()),
            Err(e) => {
                cx.error("spec.netns", format!("{e}; ignored"));
                None
            }
        });
    if !ok {
        return None;
    }
    let name = net_name.unwrap_or_default().to_string();
    let network = NetworkId::Named {
        kind,
        namespace: kind.is_namespaced().then(|| meta.namespace.clone()),
        name,
    };
    Some(DanmEpRecord {
        file: cx.file.to_string(),
        object: cx.object.clone(),
        namespace: meta.namespace,
        pod: pod.unwrap_or_default(),
        iface: ifname.unwrap_or_default(),
        network,
        ips,
        netns,
    })
}

/// Second pass: adds each DanmEp's interface to its pod.
///
/// When the DanmEp names the pod's primary interface and shares an address with
/// `status.podIPs`, the interface stays `Primary` (DANM can own the cluster network too); its
/// addresses (with their real prefix lengths) come from the DanmEp. Otherwise the DanmEp's
/// record replaces whatever was guessed for that interface name.
pub(crate) fn attach_danmeps(
    pods: &mut [PodRecord],
    eps: &[DanmEpRecord],
    problems: &mut Vec<Problem>,
) {
    let mut report = |ep: &DanmEpRecord, field: &str, reason: String, severity: Severity| {
        problems.push(Problem {
            file: ep.file.clone(),
            kind: "DanmEp".into(),
            object: ep.object.clone(),
            field: field.into(),
            reason,
            severity,
        });
    };
    for ep in eps {
        let Some(rec) = pods
            .iter_mut()
            .find(|r| r.pod.key.namespace == ep.namespace && r.pod.key.name == ep.pod)
        else {
            report(
                ep,
                "spec.Pod",
                format!("pod {}/{} not found; DanmEp ignored", ep.namespace, ep.pod),
                Severity::Warning,
            );
            continue;
        };
        if ep.ips.is_empty() {
            // No L3 address (yet): not an interface netwarden filters on.
            continue;
        }
        let ips: Vec<IpAddr> = ep.ips.iter().map(|(ip, _)| *ip).collect();
        let prefix_lens: Vec<u8> = ep.ips.iter().map(|(_, p)| *p).collect();
        let existing = rec.pod.interfaces.iter().position(|i| i.name == ep.iface);
        match existing {
            Some(idx) if rec.from_danmep[idx] => {
                report(
                    ep,
                    "spec.Interface.Name",
                    format!(
                        "interface {} of pod {} is already described by another DanmEp; ignored",
                        ep.iface, rec.pod.key
                    ),
                    Severity::Error,
                );
                continue;
            }
            Some(idx) => {
                let iface = &mut rec.pod.interfaces[idx];
                let keeps_primary =
                    iface.is_primary() && ips.iter().any(|ip| rec.pod_ips.contains(ip));
                if !keeps_primary {
                    iface.network = ep.network.clone();
                }
                iface.ips = ips;
                iface.prefix_lens = prefix_lens;
                rec.from_danmep[idx] = true;
            }
            None => {
                rec.pod.interfaces.push(PodInterface {
                    name: ep.iface.clone(),
                    network: ep.network.clone(),
                    ips,
                    prefix_lens,
                });
                rec.from_danmep.push(true);
            }
        }
        if rec.pod.netns.is_none() {
            rec.pod.netns = ep.netns.clone();
        }
    }
}
