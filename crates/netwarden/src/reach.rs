//! `netwarden reach`: every ordered pod pair on every network, for each port, with the enforced
//! and the staged verdict (SPEC section 6). The JSON shape is a contract other tools rely on.

use std::collections::BTreeMap;
use std::net::IpAddr;

use netwarden_engine::{
    flow_verdict, Engine, FlowEnd, NetworkId, PodKey, PodRules, PolicyRef, StagedCause,
};
use serde::Serialize;

use crate::cli_args::{PodSelectorArg, PortProto};

/// What to probe.
#[derive(Debug, Clone, Default)]
pub struct ReachQuery {
    pub ports: Vec<PortProto>,
    /// `None` = every network; else the network's display name (`default`, `ns/name`).
    pub network: Option<String>,
    pub from: PodSelectorArg,
    pub to: PodSelectorArg,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    Ipv4,
    Ipv6,
}

impl Family {
    pub fn of(ip: &IpAddr) -> Family {
        if ip.is_ipv4() {
            Family::Ipv4
        } else {
            Family::Ipv6
        }
    }
}

/// One probe of the `reach` output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Probe {
    pub from: String,
    pub to: String,
    pub network: String,
    pub port: u16,
    pub protocol: String,
    pub family: Family,
    pub allowed: bool,
    pub staged_allowed: bool,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub from_interface: String,
    pub to_interface: String,
    /// Set on a would-deny (allowed now, denied once the monitored policies are enforced).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<StagedCause>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub monitored_policies: Vec<PolicyRef>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ReachReport {
    pub probes: Vec<Probe>,
}

/// An interface taking part in a network: pod, interface rules, first address per family.
struct Member<'a> {
    pod: &'a PodKey,
    rules: &'a netwarden_engine::InterfaceRules,
    v4: Option<IpAddr>,
    v6: Option<IpAddr>,
}

/// Computes the probes for `query` over precomputed pod rules.
pub fn reach(
    engine: &Engine,
    rules: &BTreeMap<PodKey, PodRules>,
    query: &ReachQuery,
) -> ReachReport {
    let mut networks: BTreeMap<NetworkId, Vec<Member<'_>>> = BTreeMap::new();
    for (key, pod_rules) in rules {
        if engine.pod(key).is_none_or(|p| p.host_network) {
            continue;
        }
        for iface in &pod_rules.interfaces {
            let v4 = iface.ips.iter().find(|ip| ip.is_ipv4()).copied();
            let v6 = iface.ips.iter().find(|ip| ip.is_ipv6()).copied();
            if v4.is_none() && v6.is_none() {
                continue;
            }
            networks
                .entry(iface.network.clone())
                .or_default()
                .push(Member {
                    pod: key,
                    rules: iface,
                    v4,
                    v6,
                });
        }
    }
    let mut probes = Vec::new();
    for (network, members) in &networks {
        let name = network.display_name();
        if query
            .network
            .as_deref()
            .is_some_and(|n| n != "all" && n != name)
        {
            continue;
        }
        for src in members.iter().filter(|m| query.from.matches(m.pod)) {
            for dst in members.iter().filter(|m| query.to.matches(m.pod)) {
                for port in &query.ports {
                    for (family, s, d) in [
                        (Family::Ipv4, src.v4, dst.v4),
                        (Family::Ipv6, src.v6, dst.v6),
                    ] {
                        let (Some(s), Some(d)) = (s, d) else { continue };
                        let verdict = flow_verdict(
                            FlowEnd {
                                pod: src.pod,
                                interface: src.rules,
                                ip: s,
                            },
                            FlowEnd {
                                pod: dst.pod,
                                interface: dst.rules,
                                ip: d,
                            },
                            port.protocol,
                            port.port,
                        );
                        probes.push(Probe {
                            from: src.pod.to_string(),
                            to: dst.pod.to_string(),
                            network: name.clone(),
                            port: port.port,
                            protocol: port.protocol.as_str().to_string(),
                            family,
                            allowed: verdict.allowed,
                            staged_allowed: verdict.staged_allowed,
                            src: s,
                            dst: d,
                            from_interface: src.rules.name.clone(),
                            to_interface: dst.rules.name.clone(),
                            cause: verdict.cause,
                            monitored_policies: verdict.monitored_policies,
                        });
                    }
                }
            }
        }
    }
    ReachReport { probes }
}

/// The readable form: one matrix per (network, port, family), rows = from, columns = to.
/// `.` allowed, `X` denied, `w` allowed now but denied by the staged view (would-deny),
/// `s` denied now but allowed by the staged view.
pub fn render_table(report: &ReachReport) -> String {
    let mut groups: BTreeMap<(String, u16, String, Family), Vec<&Probe>> = BTreeMap::new();
    for p in &report.probes {
        groups
            .entry((p.network.clone(), p.port, p.protocol.clone(), p.family))
            .or_default()
            .push(p);
    }
    let mut out = String::new();
    for ((network, port, protocol, family), probes) in groups {
        let mut rows: Vec<&str> = probes.iter().map(|p| p.from.as_str()).collect();
        rows.dedup();
        rows.sort();
        rows.dedup();
        let mut cols: Vec<&str> = probes.iter().map(|p| p.to.as_str()).collect();
        cols.sort();
        cols.dedup();
        let cell: BTreeMap<(&str, &str), &Probe> = probes
            .iter()
            .map(|p| ((p.from.as_str(), p.to.as_str()), *p))
            .collect();
        let width = rows
            .iter()
            .chain(cols.iter())
            .map(|s| s.len())
            .max()
            .unwrap_or(1);
        let family = match family {
            Family::Ipv4 => "IPv4",
            Family::Ipv6 => "IPv6",
        };
        out.push_str(&format!("network {network}, {port}/{protocol}, {family}\n"));
        out.push_str(&format!("{:width$}", ""));
        for c in &cols {
            out.push_str(&format!(" {c:>width$}"));
        }
        out.push('\n');
        for r in &rows {
            out.push_str(&format!("{r:width$}"));
            for c in &cols {
                let mark = match cell.get(&(*r, *c)) {
                    None => "-",
                    Some(p) => match (p.allowed, p.staged_allowed) {
                        (true, true) => ".",
                        (false, false) => "X",
                        (true, false) => "w",
                        (false, true) => "s",
                    },
                };
                out.push_str(&format!(" {mark:>width$}"));
            }
            out.push('\n');
        }
        out.push('\n');
    }
    out.push_str(
        ". allowed   X denied   w would be denied by monitored policies   s would be allowed\n",
    );
    out
}
