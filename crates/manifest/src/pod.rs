//! Pods and DanmEps: labels, container ports, and the interfaces with their networks (SPEC 2).
//!
//! A pod's interfaces come from, in this order: `status.podIPs` (one primary `eth0`), the
//! Multus `network-status` annotation (which replaces that guess when present), and in the
//! second pass the DanmEp objects naming the pod.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use netwarden_engine::{ContainerPort, NetworkId, NetworkType, Pod, PodInterface, PodKey};
use serde_json::Value;

use crate::ctx::{get, index, join, keyed, parse_addr, type_name, Ctx};
use crate::meta::{read_learn, read_meta};
use crate::{validate, PodRecord, Problem, Severity, Source};

pub const NETWORK_STATUS: &str = "k8s.v1.cni.cncf.io/network-status";
/// What Multus wrote before the key was renamed.
pub const NETWORKS_STATUS_OLD: &str = "k8s.v1.cni.cncf.io/networks-status";
pub const NETNS: &str = "netwarden.io/netns";
const PRIMARY_IFNAME: &str = "eth0";

/// `v[key]` (at field `base.key`) as an object, `Null` when absent; a present non-object
/// rejects the object.
pub(crate) fn section<'v>(cx: &mut Ctx<'_>, v: &'v Value, base: &str, key: &str) -> &'v Value {
    const ABSENT: &Value = &Value::Null;
    match get(v, key) {
        Some(v @ Value::Object(_)) => v,
        Some(other) => {
            cx.wrong_type(&join(base, key), "an object", other);
            ABSENT
        }
        None => ABSENT,
    }
}

pub(crate) fn read_pod(cx: &mut Ctx<'_>, doc: &Value) -> Option<PodRecord> {
    let meta = read_meta(cx, doc, true)?;
    let spec = section(cx, doc, "", "spec");
    let status = section(cx, doc, "", "status");
    // A finished pod (a Job's, say) has released its address, which the next pod may get:
    // as a peer it would lend that pod its access (issue 20, defect 9), and it has no netns
    // left to program. It is not loaded at all (SPEC 7), as if deleted.
    if let Some("Succeeded" | "Failed") = cx.str(status, "status", "phase") {
        return None;
    }

    // A hostNetwork pod misread as an ordinary one would have rules written into the node's
    // own namespace: a value that is not a boolean rejects the pod (via the rejected flag).
    let host_network = cx.bool(spec, "spec", "hostNetwork") == Some(true);
    if host_network {
        cx.warn(
            "spec.hostNetwork",
            "hostNetwork pods share the node's network namespace and are never isolated",
        );
    }

    if !host_network {
        warn_net_admin(cx, spec);
    }
    let mut container_ports = read_container_ports(cx, spec);
    // Which node programs the pod (the kube agent's `--node-name`); a wrong type rejects the
    // pod rather than leaving it unprogrammed by every node.
    let node_name = cx
        .str(spec, "spec", "nodeName")
        .filter(|n| !n.is_empty())
        .map(str::to_string);
    // The sandbox's metadata carries the uid (CRI netns lookup); a wrong type rejects the pod
    // rather than matching it to any sandbox of its name.
    let metadata = section(cx, doc, "", "metadata");
    let uid = cx
        .str(metadata, "metadata", "uid")
        .filter(|u| !u.is_empty())
        .map(str::to_string);
    let mut pod_ips = read_pod_ips(cx, status);

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
    let mut interfaces = match from_status {
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

    let learn = read_learn(cx, &meta.annotations);
    let from_danmep = vec![false; interfaces.len()];
    // A node agent holds every pod of the cluster: no room kept beyond what was read.
    interfaces.shrink_to_fit();
    for iface in &mut interfaces {
        iface.ips.shrink_to_fit();
        iface.prefix_lens.shrink_to_fit();
    }
    container_ports.shrink_to_fit();
    pod_ips.shrink_to_fit();
    Some(PodRecord {
        pod: Arc::new(Pod {
            key: PodKey::new(meta.namespace, meta.name),
            labels: meta.labels,
            host_network,
            container_ports,
            interfaces,
            netns,
            node_name,
            uid,
            learn,
        }),
        pod_ips,
        from_danmep,
        source: Source {
            file: cx.file.to_string(),
            label: cx.object.clone(),
        },
    })
}

/// The container ports of `initContainers` then `containers`, in the order written: named
/// ports resolve to the first port with that name and protocol (`Pod::named_port`), and a
/// name used twice is reported, saying which port wins.
/// What a container with NET_ADMIN in the pod's own netns can do to the rules netwarden
/// programs there (SPEC 5, tamper repair), said once per pod at the first such container.
const NET_ADMIN_NOTE: &str = "NET_ADMIN in the pod's own network namespace lets it change the \
     rules netwarden programs there once a policy selects it: they are compared and put back \
     (SECURITY.md), but a pod that does not need the capability should not have it";

/// Warns when a container of the pod is privileged or adds NET_ADMIN (or ALL). Only read, never
/// judged: a field of another type here is the API server's to refuse, not a reason to drop
/// the pod.
fn warn_net_admin(cx: &mut Ctx<'_>, spec: &Value) {
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        let Some(containers) = spec.get(list).and_then(Value::as_array) else {
            continue;
        };
        for (ci, c) in containers.iter().enumerate() {
            let base = join(&index(&join("spec", list), ci), "securityContext");
            let Some(sc) = c.get("securityContext") else {
                continue;
            };
            if sc.get("privileged") == Some(&Value::Bool(true)) {
                cx.warn(&join(&base, "privileged"), NET_ADMIN_NOTE);
                return;
            }
            let adds = sc
                .get("capabilities")
                .and_then(|caps| caps.get("add"))
                .and_then(Value::as_array);
            let net_admin = adds.is_some_and(|adds| {
                adds.iter().filter_map(Value::as_str).any(|cap| {
                    let cap = cap.trim_start_matches("CAP_");
                    cap.eq_ignore_ascii_case("NET_ADMIN") || cap.eq_ignore_ascii_case("ALL")
                })
            });
            if net_admin {
                cx.warn(&join(&base, "capabilities.add"), NET_ADMIN_NOTE);
                return;
            }
        }
    }
}

fn read_container_ports(cx: &mut Ctx<'_>, spec: &Value) -> Vec<ContainerPort> {
    let mut ports_out: Vec<ContainerPort> = Vec::new();
    // Port name -> (index in `ports_out`, field) of its first use, per protocol.
    let mut first_use: HashMap<(String, netwarden_engine::Protocol), (usize, String)> =
        HashMap::new();
    let mut names: HashMap<String, String> = HashMap::new();
    for list in ["initContainers", "containers"] {
        let base = join("spec", list);
        let Some(containers) = cx.array(spec, "spec", list) else {
            continue;
        };
        for (ci, c) in containers.iter().enumerate() {
            let cbase = index(&base, ci);
            if !c.is_object() {
                cx.wrong_type(&cbase, "an object", c);
                continue;
            }
            let Some(ports) = cx.array(c, &cbase, "ports") else {
                continue;
            };
            for (pi, p) in ports.iter().enumerate() {
                let pbase = index(&join(&cbase, "ports"), pi);
                let Some(cp) = read_container_port(cx, p, &pbase) else {
                    continue;
                };
                if let Some(name) = &cp.name {
                    let name_field = join(&pbase, "name");
                    let key = (name.clone(), cp.protocol);
                    match first_use.get(&key) {
                        Some((first, field)) => {
                            let winner = &ports_out[*first];
                            cx.warn(
                                &name_field,
                                format!(
                                    "port name {name:?} is also used by {}/{} at {field}; policies and \
                                     Services naming it resolve to that first port, not to {}/{}",
                                    winner.port, winner.protocol, cp.port, cp.protocol
                                ),
                            );
                        }
                        None => {
                            if let Some(field) = names.get(name) {
                                cx.warn(
                                    &name_field,
                                    format!(
                                        "port name {name:?} is also used at {field} (another protocol); \
                                         names must be unique within a pod, and each protocol \
                                         resolves to its own first port"
                                    ),
                                );
                            }
                            first_use.insert(key, (ports_out.len(), name_field.clone()));
                        }
                    }
                    names.entry(name.clone()).or_insert(name_field);
                }
                ports_out.push(cp);
            }
        }
    }
    ports_out
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
    if !p.is_object() {
        cx.wrong_type(base, "an object", p);
        return None;
    }
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
    fn add(
        cx: &mut Ctx<'_>,
        (out, seen): (&mut Vec<IpAddr>, &mut HashSet<IpAddr>),
        field: &str,
        s: &str,
    ) {
        match s.trim().parse::<IpAddr>() {
            Ok(ip) => {
                if seen.insert(ip) {
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
    let mut seen: HashSet<IpAddr> = HashSet::new();
    if let Some(list) = cx.array(status, "status", "podIPs") {
        for (i, entry) in list.iter().enumerate() {
            let base = index("status.podIPs", i);
            if !entry.is_object() {
                cx.wrong_type(&base, "an object", entry);
                continue;
            }
            if let Some(s) = cx.str(entry, &base, "ip") {
                add(cx, (&mut out, &mut seen), &join(&base, "ip"), s);
            }
        }
    }
    // Read (and checked) even when podIPs is there, so a wrong type is never overlooked.
    let single = cx.str(status, "status", "podIP").filter(|s| !s.is_empty());
    if let (true, Some(s)) = (out.is_empty(), single) {
        add(cx, (&mut out, &mut seen), "status.podIP", s);
    }
    out
}

/// One parsed `network-status` entry.
struct StatusEntry {
    name: Option<String>,
    interface: Option<String>,
    ips: Vec<(IpAddr, u8)>,
    default: bool,
}

/// The first field of an entry with the wrong type, as (field, expected, found).
fn status_entry_type_error(e: &Value, base: &str) -> Option<(String, &'static str, &'static str)> {
    if !e.is_object() {
        return Some((base.to_string(), "an object", type_name(e)));
    }
    for key in ["name", "interface"] {
        if let Some(v) = get(e, key).filter(|v| !v.is_string()) {
            return Some((join(base, key), "a string", type_name(v)));
        }
    }
    if let Some(v) = get(e, "default").filter(|v| !v.is_boolean()) {
        return Some((join(base, "default"), "true or false", type_name(v)));
    }
    match get(e, "ips") {
        None => None,
        Some(Value::Array(list)) => list.iter().enumerate().find_map(|(j, ip)| {
            (!ip.is_string()).then(|| {
                let f = index(&join(base, "ips"), j);
                (f, "a string", type_name(ip))
            })
        }),
        Some(other) => Some((join(base, "ips"), "a list", type_name(other))),
    }
}

/// Reads the Multus network-status annotation; `None` (reported) when it cannot be read (not
/// JSON, not a list, a field of the wrong type), in which case the caller falls back to
/// `status.podIPs`. Entries with invalid values are reported and skipped one by one.
fn read_network_status(
    cx: &mut Ctx<'_>,
    field: &str,
    text: &str,
    pod_ns: &str,
    pod_ips: &[IpAddr],
) -> Option<Vec<PodInterface>> {
    const FALLBACK: &str = "interfaces taken from status.podIPs";
    let checked = match crate::json::from_str(text) {
        Ok(c) => c,
        Err(e) => {
            cx.error(field, format!("malformed JSON ({e}); {FALLBACK}"));
            return None;
        }
    };
    for path in &checked.duplicate_keys {
        let at = if path.starts_with('[') {
            format!("{field}{path}")
        } else {
            join(field, path)
        };
        cx.warn(&at, "duplicate key; the last value is used");
    }
    let Value::Array(list) = checked.value else {
        cx.error(
            field,
            format!(
                "expected a JSON list, found {}; {FALLBACK}",
                type_name(&checked.value)
            ),
        );
        return None;
    };
    let type_error = list
        .iter()
        .enumerate()
        .find_map(|(i, e)| status_entry_type_error(e, &index(field, i)));
    if let Some((at, want, found)) = type_error {
        cx.error(
            &at,
            format!("expected {want}, found {found}; the annotation cannot be read: {FALLBACK}"),
        );
        return None;
    }

    let mut entries = Vec::new();
    for (i, e) in list.iter().enumerate() {
        let base = index(field, i);
        let text = |k: &str| get(e, k).and_then(Value::as_str).map(str::to_string);
        let mut ips = Vec::new();
        let listed = get(e, "ips")
            .and_then(Value::as_array)
            .into_iter()
            .flatten();
        for (j, ip) in listed.enumerate() {
            match parse_addr(ip.as_str().unwrap_or_default()) {
                Ok(a) => ips.push(a),
                Err(err) => cx.error(&index(&join(&base, "ips"), j), err),
            }
        }
        entries.push((
            i,
            StatusEntry {
                name: text("name"),
                interface: text("interface").filter(|s| !s.is_empty()),
                ips,
                default: get(e, "default") == Some(&Value::Bool(true)),
            },
        ));
    }

    // The primary interface: the `default` entry; else the one holding a pod IP; else the one
    // without an interface name (or named eth0), which is how Multus lists the cluster network.
    let pod_ip_set: HashSet<&IpAddr> = pod_ips.iter().collect();
    let primary = entries
        .iter()
        .position(|(_, e)| e.default)
        .or_else(|| {
            entries
                .iter()
                .position(|(_, e)| e.ips.iter().any(|(ip, _)| pod_ip_set.contains(ip)))
        })
        .or_else(|| {
            entries
                .iter()
                .position(|(_, e)| e.interface.as_deref().is_none_or(|i| i == PRIMARY_IFNAME))
        });

    let mut out: Vec<PodInterface> = Vec::new();
    let mut names: HashSet<String> = HashSet::new();
    for (pos, (i, e)) in entries.into_iter().enumerate() {
        let base = index(field, i);
        let is_primary = primary == Some(pos);
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
        if names.contains(&ifname) {
            cx.error(
                &join(&base, "interface"),
                format!(
                    "interface \"{}\" listed twice; the later entry is skipped",
                    ifname.escape_debug()
                ),
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
        names.insert(ifname.clone());
        out.push(PodInterface {
            name: ifname,
            network,
            prefix_lens: ips.iter().map(|(_, p)| *p).collect(),
            ips: ips.into_iter().map(|(ip, _)| ip).collect(),
        });
    }
    if primary.is_none() && !pod_ips.is_empty() {
        if names.contains(PRIMARY_IFNAME) {
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
#[derive(Debug, Clone, PartialEq)]
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

impl DanmEpRecord {
    /// The pod it describes an interface of: namespace and name.
    pub(crate) fn pod_key(&self) -> (&str, &str) {
        (&self.namespace, &self.pod)
    }
}

pub(crate) fn read_danmep(cx: &mut Ctx<'_>, doc: &Value) -> Option<DanmEpRecord> {
    let meta = read_meta(cx, doc, true)?;
    if get(doc, "spec").is_none() {
        cx.error("spec", "missing spec; object ignored");
        return None;
    }
    let spec = section(cx, doc, "", "spec");
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
    let iface = section(cx, spec, "spec", "Interface");
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

/// Why a DanmEp contradicts its pod, if it does: it names the pod's primary interface with an
/// address the pod does not hold there, or puts one of the primary interface's addresses on
/// another interface. (The primary interface's addresses are `status.podIPs`, or what the
/// network-status annotation gives it.)
fn contradiction(rec: &PodRecord, ep: &DanmEpRecord) -> Option<String> {
    let primary = rec.pod.interfaces.iter().find(|i| i.is_primary());
    let primary_ips: Vec<IpAddr> = match primary {
        Some(iface) if !iface.ips.is_empty() => iface.ips.clone(),
        _ => rec.pod_ips.clone(),
    };
    if primary_ips.is_empty() {
        return None;
    }
    let ep_ips = ep.ips.iter().map(|(ip, _)| *ip);
    let names_primary = primary.is_some_and(|iface| iface.name == ep.iface);
    if names_primary {
        let foreign: Vec<String> = ep_ips
            .filter(|ip| !primary_ips.contains(ip))
            .map(|ip| ip.to_string())
            .collect();
        return (!foreign.is_empty()).then(|| {
            format!(
                "{} on its primary interface \"{}\", which holds {} only",
                foreign.join(", "),
                ep.iface.escape_debug(),
                join_ips(&primary_ips)
            )
        });
    }
    let taken: Vec<String> = ep_ips
        .filter(|ip| primary_ips.contains(ip))
        .map(|ip| ip.to_string())
        .collect();
    (!taken.is_empty()).then(|| {
        format!(
            "{} on interface \"{}\", but the pod holds it on its primary interface",
            taken.join(", "),
            ep.iface.escape_debug()
        )
    })
}

fn join_ips(ips: &[IpAddr]) -> String {
    ips.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Second pass: adds each DanmEp's interface to its pod.
///
/// When the DanmEp names the pod's primary interface (with the pod's addresses only), the
/// interface stays `Primary` (DANM can own the cluster network too) and takes the DanmEp's
/// prefix lengths. Otherwise the DanmEp's record replaces whatever was guessed for that
/// interface name. A DanmEp that contradicts its pod is reported and ignored: it never
/// removes or narrows the pod's primary interface (SPEC 7).
pub(crate) fn attach_danmeps(
    pods: &mut [PodRecord],
    eps: &[&DanmEpRecord],
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
    let by_key: HashMap<(String, String), usize> = pods
        .iter()
        .enumerate()
        .map(|(i, r)| ((r.pod.key.namespace.clone(), r.pod.key.name.clone()), i))
        .collect();
    // Per pod (index), interface name -> index, built when the pod's first DanmEp comes.
    let mut ifaces_by_name: HashMap<usize, HashMap<String, usize>> = HashMap::new();
    for &ep in eps {
        let Some(&pod_index) = by_key.get(&(ep.namespace.clone(), ep.pod.clone())) else {
            report(
                ep,
                "spec.Pod",
                format!("pod {}/{} not found; DanmEp ignored", ep.namespace, ep.pod),
                Severity::Warning,
            );
            continue;
        };
        let rec = &mut pods[pod_index];
        if ep.ips.is_empty() {
            // No L3 address (yet): not an interface netwarden filters on.
            continue;
        }
        // The pod's own word on its primary interface wins over any DanmEp: a DanmEp that
        // contradicts it (issue 20, defect 1: one naming eth0 with another address removed
        // the pod's primary interface, and its rules with it) is reported and ignored whole.
        if let Some(why) = contradiction(rec, ep) {
            report(
                ep,
                "spec.Interface",
                format!(
                    "contradicts pod {}: {why}; DanmEp ignored (the pod's interfaces stay as \
                     the pod says)",
                    rec.pod.key
                ),
                Severity::Error,
            );
            continue;
        }
        let ips: Vec<IpAddr> = ep.ips.iter().map(|(ip, _)| *ip).collect();
        let prefix_lens: Vec<u8> = ep.ips.iter().map(|(_, p)| *p).collect();
        let names = ifaces_by_name.entry(pod_index).or_insert_with(|| {
            let mut names = HashMap::new();
            for (i, iface) in rec.pod.interfaces.iter().enumerate() {
                names.entry(iface.name.clone()).or_insert(i);
            }
            names
        });
        match names.get(&ep.iface).copied() {
            Some(idx) if rec.from_danmep[idx] => {
                report(
                    ep,
                    "spec.Interface.Name",
                    format!(
                        "interface \"{}\" of pod {} is already described by another DanmEp; ignored",
                        ep.iface.escape_debug(),
                        rec.pod.key
                    ),
                    Severity::Error,
                );
                continue;
            }
            Some(idx) => {
                let iface = &mut Arc::make_mut(&mut rec.pod).interfaces[idx];
                if iface.is_primary() {
                    // DANM owns the cluster network too: the interface stays primary with
                    // every address the pod gives it (the DanmEp holds no other: see
                    // `contradiction`), taking the DanmEp's real prefix lengths.
                    for (ip, len) in &ep.ips {
                        if let Some(at) = iface.ips.iter().position(|a| a == ip) {
                            iface.prefix_lens[at] = *len;
                        }
                    }
                } else {
                    iface.network = ep.network.clone();
                    iface.ips = ips;
                    iface.prefix_lens = prefix_lens;
                }
                rec.from_danmep[idx] = true;
            }
            None => {
                names.insert(ep.iface.clone(), rec.pod.interfaces.len());
                Arc::make_mut(&mut rec.pod).interfaces.push(PodInterface {
                    name: ep.iface.clone(),
                    network: ep.network.clone(),
                    ips,
                    prefix_lens,
                });
                rec.from_danmep.push(true);
            }
        }
        if rec.pod.netns.is_none() && ep.netns.is_some() {
            Arc::make_mut(&mut rec.pod).netns = ep.netns.clone();
        }
    }
}
