//! `netwarden reach`: every ordered pod pair on every network, for each port, with the enforced
//! and the staged verdict (SPEC section 6). The JSON shape is a contract other tools rely on.
//!
//! The number of probes grows with the square of the number of pods (10,000 pods: 100 million
//! per port), so probes are never all held at once: [`Reach`] indexes the pods of each network
//! (O(pods × interfaces)) and computes probes as they are consumed — written one by one as
//! JSON, one matrix row at a time as a table, or collected by callers that need them in memory
//! (the lab, tests) through the same [`Reach::probes`] iterator.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::net::IpAddr;

use netwarden_engine::{
    flow_verdict, verdict::TierDecision, AdminRef, Engine, FlowEnd, FlowVerdict, InterfaceRules,
    NetworkId, PodKey, PodRules, PolicyRef, Protocol, StagedCause,
};
use serde::{Serialize, Serializer};

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

pub use netwarden_engine::Family;

/// One probe of the `reach` output. Typed to the edge: pods, network and protocol serialize to
/// the contract's strings (`ns/name`, `default` or `ns/name`, `TCP`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Probe {
    #[serde(serialize_with = "as_display")]
    pub from: PodKey,
    #[serde(serialize_with = "as_display")]
    pub to: PodKey,
    pub network: NetworkId,
    pub port: u16,
    pub protocol: Protocol,
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
    /// The admin policy rule that decided the egress side (enforced view), when one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress_tier: Option<TierDecision>,
    /// The admin policy rule that decided the ingress side (enforced view), when one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ingress_tier: Option<TierDecision>,
    /// Monitored admin policies concerned by a would-deny (SPEC 8).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub monitored_admin: Vec<AdminRef>,
}

/// A pod key as the contract writes it, `ns/name`.
pub(crate) fn as_display<S: Serializer>(
    value: &impl std::fmt::Display,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_str(value)
}

/// All probes in memory, for callers that need them so (small clusters: the lab, tests).
/// Serializes exactly as [`Reach::write_json`] writes.
#[derive(Debug, Clone, Serialize)]
pub struct ReachReport {
    pub probes: Vec<Probe>,
}

/// An interface taking part in a network: pod, interface rules, first address per family.
pub(crate) struct Member<'a> {
    pub(crate) pod: &'a PodKey,
    pub(crate) rules: &'a InterfaceRules,
    v4: Option<IpAddr>,
    v6: Option<IpAddr>,
}

impl Member<'_> {
    pub(crate) fn address(&self, family: Family) -> Option<IpAddr> {
        match family {
            Family::Ipv4 => self.v4,
            Family::Ipv6 => self.v6,
        }
    }
}

/// The pods of every network a query covers, ready to be paired.
pub struct Reach<'a> {
    query: &'a ReachQuery,
    /// In network order; members in pod order, then interface order.
    networks: Vec<(&'a NetworkId, Vec<Member<'a>>)>,
}

impl<'a> Reach<'a> {
    /// Indexes the pods of `rules` per network (host-network pods and interfaces without an
    /// address take no part), keeping only the networks `query` names.
    pub fn new(
        engine: &'a Engine,
        rules: &'a BTreeMap<PodKey, PodRules>,
        query: &'a ReachQuery,
    ) -> Reach<'a> {
        let taking_part = rules
            .values()
            .filter(|r| engine.pod(&r.pod).is_some_and(|p| !p.host_network));
        Reach::over(taking_part, query)
    }

    /// [`Reach::new`] over the rules of the pods taking part (host-network pods already left
    /// out by the caller), in pod order: for callers holding two views' rules at once
    /// (`diff`).
    pub fn over(rules: impl IntoIterator<Item = &'a PodRules>, query: &'a ReachQuery) -> Reach<'a> {
        let mut networks: BTreeMap<&NetworkId, Vec<Member<'_>>> = BTreeMap::new();
        for pod_rules in rules {
            for iface in &pod_rules.interfaces {
                let v4 = iface.ips.iter().find(|ip| ip.is_ipv4()).copied();
                let v6 = iface.ips.iter().find(|ip| ip.is_ipv6()).copied();
                if v4.is_none() && v6.is_none() {
                    continue;
                }
                networks.entry(&iface.network).or_default().push(Member {
                    pod: &pod_rules.pod,
                    rules: iface,
                    v4,
                    v6,
                });
            }
        }
        let wanted = |network: &NetworkId| match query.network.as_deref() {
            None | Some("all") => true,
            Some(name) => network.display_name() == name,
        };
        Reach {
            query,
            networks: networks
                .into_iter()
                .filter(|(network, _)| wanted(network))
                .collect(),
        }
    }

    /// The members of every network covered, in network order, members in pod order.
    pub(crate) fn networks(&self) -> &[(&'a NetworkId, Vec<Member<'a>>)] {
        &self.networks
    }

    /// Every probe, computed as it is consumed, in the contract's order: network, source pod,
    /// destination pod, port (as given), family.
    pub fn probes(&self) -> impl Iterator<Item = Probe> + '_ {
        self.explained_probes().map(|(probe, _)| probe)
    }

    /// [`Reach::probes`], each with the verdict that decided it (the policies and rules of
    /// both sides, as `explain` shows them): what the HTML page explains a cell with.
    pub fn explained_probes(&self) -> impl Iterator<Item = (Probe, FlowVerdict)> + '_ {
        let query = self.query;
        self.networks.iter().flat_map(move |(network, members)| {
            let sources = members.iter().filter(|m| query.from.matches(m.pod));
            sources.flat_map(move |src| {
                let destinations = members.iter().filter(|m| query.to.matches(m.pod));
                destinations.flat_map(move |dst| {
                    query.ports.iter().flat_map(move |port| {
                        [Family::Ipv4, Family::Ipv6]
                            .into_iter()
                            .filter_map(move |family| self.probe(network, src, dst, *port, family))
                    })
                })
            })
        })
    }

    /// Writes `{"probes": [...]}` (pretty-printed, then a newline) probe by probe.
    pub fn write_json(&self, out: &mut impl Write) -> io::Result<()> {
        /// The probes as a JSON array, streamed from [`Reach::probes`].
        struct Stream<'r, 'a>(&'r Reach<'a>);
        impl Serialize for Stream<'_, '_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_seq(self.0.probes())
            }
        }
        /// Same field as [`ReachReport`], so both print the same bytes.
        #[derive(Serialize)]
        struct Document<'r, 'a> {
            probes: Stream<'r, 'a>,
        }
        serde_json::to_writer_pretty(
            &mut *out,
            &Document {
                probes: Stream(self),
            },
        )?;
        out.write_all(b"\n")
    }

    /// The readable form: one matrix per (network, port, family), rows = from, columns = to,
    /// written one row at a time. `.` allowed, `X` denied, `w` allowed now but denied by the
    /// staged view (would-deny), `s` denied now but allowed by the staged view.
    pub fn write_table(&self, out: &mut impl Write) -> io::Result<()> {
        let mut ports = self.query.ports.clone();
        ports.sort_by_key(|p| (p.port, p.protocol.as_str()));
        ports.dedup();
        // Matrices ordered by the network's name, port, protocol name and family.
        let mut matrices: Vec<(String, PortProto, Family, usize)> = Vec::new();
        for (index, (network, _)) in self.networks.iter().enumerate() {
            for port in &ports {
                for family in [Family::Ipv4, Family::Ipv6] {
                    matrices.push((network.display_name(), *port, family, index));
                }
            }
        }
        matrices.sort_by(|a, b| {
            (&a.0, a.1.port, a.1.protocol.as_str(), a.2, a.3).cmp(&(
                &b.0,
                b.1.port,
                b.1.protocol.as_str(),
                b.2,
                b.3,
            ))
        });
        for (name, port, family, index) in matrices {
            let (_, members) = &self.networks[index];
            // A pod attached twice to one network appears once: its last interface there.
            let side = |selector: &PodSelectorArg| -> BTreeMap<String, &Member<'_>> {
                members
                    .iter()
                    .filter(|m| selector.matches(m.pod) && m.address(family).is_some())
                    .map(|m| (m.pod.to_string(), m))
                    .collect()
            };
            let (rows, cols) = (side(&self.query.from), side(&self.query.to));
            if rows.is_empty() || cols.is_empty() {
                continue;
            }
            let width = rows
                .keys()
                .chain(cols.keys())
                .map(|s| s.len())
                .max()
                .unwrap_or(1);
            let family_name = match family {
                Family::Ipv4 => "IPv4",
                Family::Ipv6 => "IPv6",
            };
            writeln!(out, "network {name}, {port}, {family_name}")?;
            write!(out, "{:width$}", "")?;
            for c in cols.keys() {
                write!(out, " {c:>width$}")?;
            }
            writeln!(out)?;
            for (r, src) in &rows {
                write!(out, "{r:width$}")?;
                for dst in cols.values() {
                    let mark = match self.flow(src, dst, port, family) {
                        None => "-",
                        Some((_, _, v)) => match (v.allowed, v.staged_allowed) {
                            (true, true) => ".",
                            (false, false) => "X",
                            (true, false) => "w",
                            (false, true) => "s",
                        },
                    };
                    write!(out, " {mark:>width$}")?;
                }
                writeln!(out)?;
            }
            writeln!(out)?;
        }
        writeln!(
            out,
            ". allowed   X denied   w would be denied by monitored policies   s would be allowed"
        )
    }

    /// The addresses and verdict of `src → dst` on `port`, if both have an address of `family`.
    pub(crate) fn flow(
        &self,
        src: &Member<'_>,
        dst: &Member<'_>,
        port: PortProto,
        family: Family,
    ) -> Option<(IpAddr, IpAddr, FlowVerdict)> {
        let (s, d) = (src.address(family)?, dst.address(family)?);
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
        Some((s, d, verdict))
    }

    fn probe(
        &self,
        network: &NetworkId,
        src: &Member<'_>,
        dst: &Member<'_>,
        port: PortProto,
        family: Family,
    ) -> Option<(Probe, FlowVerdict)> {
        let (s, d, verdict) = self.flow(src, dst, port, family)?;
        let probe = Probe {
            from: src.pod.clone(),
            to: dst.pod.clone(),
            network: network.clone(),
            port: port.port,
            protocol: port.protocol,
            family,
            allowed: verdict.allowed,
            staged_allowed: verdict.staged_allowed,
            src: s,
            dst: d,
            from_interface: src.rules.name.clone(),
            to_interface: dst.rules.name.clone(),
            cause: verdict.cause,
            monitored_policies: verdict.monitored_policies.clone(),
            egress_tier: verdict.egress.enforced.tier_rule.clone(),
            ingress_tier: verdict.ingress.enforced.tier_rule.clone(),
            monitored_admin: verdict.monitored_admin.clone(),
        };
        Some((probe, verdict))
    }
}

/// Every probe of `query` over precomputed pod rules, in memory (see [`Reach`] for large
/// clusters).
pub fn reach(
    engine: &Engine,
    rules: &BTreeMap<PodKey, PodRules>,
    query: &ReachQuery,
) -> ReachReport {
    ReachReport {
        probes: Reach::new(engine, rules, query).probes().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netwarden_engine::testing::{netpol, pod, selector, with_interface};
    use netwarden_engine::{EngineOptions, Mode};

    /// x/a (dual-stack, and on x/net1), x/b (dual-stack), x/c (IPv4, and on x/net1); x/b only
    /// accepts from itself, and a monitored policy would close x/a.
    fn engine() -> Engine {
        let mut e = Engine::new(EngineOptions::default());
        let net1 = NetworkId::nad("x", "net1");
        e.set_pod(with_interface(
            pod("x", "a", &[("app", "a")], &["10.0.0.1", "fd00::1"]),
            "net1",
            net1.clone(),
            &["192.168.0.1"],
        ));
        e.set_pod(pod("x", "b", &[("app", "b")], &["10.0.0.2", "fd00::2"]));
        e.set_pod(with_interface(
            pod("x", "c", &[("app", "c")], &["10.0.0.3"]),
            "net1",
            net1,
            &["192.168.0.3"],
        ));
        e.set_policy(netpol(
            "x",
            "b",
            selector(&[("app", "b")]),
            Some(vec![]),
            None,
        ));
        let mut monitored = netpol("x", "a", selector(&[("app", "a")]), Some(vec![]), None);
        monitored.mode = Mode::Monitor;
        e.set_policy(monitored);
        e
    }

    fn query(ports: &[&str]) -> ReachQuery {
        ReachQuery {
            ports: ports.iter().map(|p| p.parse().unwrap()).collect(),
            ..ReachQuery::default()
        }
    }

    fn json_of(reach: &Reach<'_>) -> String {
        let mut out = Vec::new();
        reach.write_json(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn streamed_json_is_the_report_json() {
        let mut e = engine();
        let rules = e.all_pod_rules();
        let q = query(&["80/TCP", "53/UDP"]);
        let report = reach(&e, &rules, &q);
        // default: 3 pods, IPv4 9 pairs + IPv6 4 pairs; x/net1: 4 pairs; 2 ports.
        assert_eq!(report.probes.len(), (9 + 4 + 4) * 2);
        let streamed = json_of(&Reach::new(&e, &rules, &q));
        assert_eq!(
            streamed,
            serde_json::to_string_pretty(&report).unwrap() + "\n"
        );
        let first = streamed.find("{\n      \"from\"").expect("first probe");
        assert!(
            streamed[first..].starts_with(
                "{\n      \"from\": \"x/a\",\n      \"to\": \"x/a\",\n      \"network\": \"default\",\n      \"port\": 80,\n      \"protocol\": \"TCP\",\n      \"family\": \"ipv4\","
            ),
            "{streamed}"
        );
        assert!(streamed.contains("\"network\": \"x/net1\""));
        assert!(
            streamed.contains("\"cause\": \"new-isolation\""),
            "{streamed}"
        );
        assert!(streamed.contains("\"monitored_policies\": [\n        \"x/a\"\n      ]"));
        // Nothing to probe: the same document shape.
        let none = query(&[]);
        assert_eq!(
            json_of(&Reach::new(&e, &rules, &none)),
            "{\n  \"probes\": []\n}\n"
        );
    }

    #[test]
    fn network_and_pod_filters() {
        let mut e = engine();
        let rules = e.all_pod_rules();
        let mut q = query(&["80/TCP"]);
        q.network = Some("x/net1".into());
        q.from = "x/c".parse().unwrap();
        let probes: Vec<Probe> = Reach::new(&e, &rules, &q).probes().collect();
        let pairs: Vec<(String, String, String)> = probes
            .iter()
            .map(|p| (p.from.to_string(), p.to.to_string(), p.network.to_string()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("x/c".into(), "x/a".into(), "x/net1".into()),
                ("x/c".into(), "x/c".into(), "x/net1".into())
            ]
        );
    }

    #[test]
    fn table_one_matrix_per_network_port_and_family() {
        let mut e = engine();
        let rules = e.all_pod_rules();
        let mut out = Vec::new();
        Reach::new(&e, &rules, &query(&["80/TCP"]))
            .write_table(&mut out)
            .unwrap();
        // The policies are NetworkPolicies: x/net1 is open.
        let want = "\
network default, 80/TCP, IPv4
    x/a x/b x/c
x/a   .   X   .
x/b   w   .   .
x/c   w   X   .

network default, 80/TCP, IPv6
    x/a x/b
x/a   .   X
x/b   w   .

network x/net1, 80/TCP, IPv4
    x/a x/c
x/a   .   .
x/c   .   .

. allowed   X denied   w would be denied by monitored policies   s would be allowed
";
        assert_eq!(String::from_utf8(out).unwrap(), want);
    }
}
