//! A reference evaluator for cluster-scoped admin policies, written from upstream's API
//! documentation (sigs.k8s.io/network-policy-api, `apis/v1alpha1` and `apis/v1alpha2` type
//! comments, the site's hairpin note) and netwarden's SPEC section 8 — not from netwarden's
//! engine, so that the corpus checks the engine against an independent reading.
//!
//! It reads raw Kubernetes objects (`serde_json::Value`) and decides one connection:
//!
//! - each direction on its own: egress at the source pod, ingress at the destination pod; the
//!   connection succeeds iff both allow;
//! - per direction: **Admin tier** (AdminNetworkPolicy v1alpha1, ClusterNetworkPolicy `tier:
//!   Admin`) → **NetworkPolicy tier** → **Baseline tier** (BaselineAdminNetworkPolicy,
//!   ClusterNetworkPolicy `tier: Baseline`) → allowed;
//! - inside an admin tier, policies selecting the pod in ascending `priority` (then name: equal
//!   priorities are undefined upstream), rules in written order, the first rule whose peers and
//!   ports match decides: Allow/Accept allows, Deny denies, Pass leaves the tier (in Baseline,
//!   where upstream's CRDs refuse Pass, the rule cannot be implemented and fails closed as SPEC
//!   8 says: it denies what it covers);
//! - the NetworkPolicy tier decides iff a NetworkPolicy selects the pod for that direction
//!   (allowed iff one of their rules matches);
//! - host-network pods are never subjects nor pod peers; a pod dialling its own address is not
//!   subject to any tier (upstream's hairpin rule for admin policies; for NetworkPolicy it is
//!   SPEC 3.1's loopback, always allowed).
//!
//! It is deliberately naive (scans every object per question) and strict: anything it does not
//! understand is an error, never a silent verdict.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::Value;

use crate::admin_corpus::Protocol;

/// Which side of a connection a verdict is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    fn rules_key(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }

    fn peers_key(self) -> &'static str {
        match self {
            Direction::Ingress => "from",
            Direction::Egress => "to",
        }
    }

    fn policy_type(self) -> &'static str {
        match self {
            Direction::Ingress => "Ingress",
            Direction::Egress => "Egress",
        }
    }
}

/// The verdict of one direction and what decided it (for mismatch reports).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub allowed: bool,
    pub by: String,
}

impl Verdict {
    fn allow(by: impl Into<String>) -> Verdict {
        Verdict {
            allowed: true,
            by: by.into(),
        }
    }
}

/// The decision on one connection: both directions must allow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub egress: Verdict,
    pub ingress: Verdict,
}

impl Decision {
    pub fn allowed(&self) -> bool {
        self.egress.allowed && self.ingress.allowed
    }
}

/// Decides whether pod `from` (`ns/name`) reaches `to` — a pod (`ns/name`, dialled at its
/// `status.podIP`) or an IP literal — on `port`/`protocol`, given every object in force.
pub fn decide(
    objects: &[Value],
    from: &str,
    to: &str,
    port: u16,
    protocol: Protocol,
) -> Result<Decision, String> {
    let world = World { objects };
    let src = world.pod(from)?;
    let (dst_ip, dst_pod) = if to.contains('/') {
        let pod = world.pod(to)?;
        (primary_ip(pod)?, Some(pod))
    } else {
        let ip: IpAddr = to
            .parse()
            .map_err(|e| format!("probe target {to:?}: {e}"))?;
        (ip, world.pod_with_ip(ip)?)
    };
    // Host-network pods are not pods of the pod network: never subjects, never pod peers.
    let dst_pod = dst_pod.filter(|p| !host_network(p));
    let src_net = (!host_network(src)).then_some(src);

    if let Some(s) = src_net {
        if pod_ips(s)?.contains(&dst_ip) {
            let why = "a pod dialling its own address is not subject to policies";
            return Ok(Decision {
                egress: Verdict::allow(why),
                ingress: Verdict::allow(why),
            });
        }
    }

    let egress = match src_net {
        None => Verdict::allow("the source is a host-network pod: no egress side"),
        Some(s) => world.direction(
            s,
            Direction::Egress,
            &Remote {
                ip: dst_ip,
                pod: dst_pod,
            },
            dst_pod,
            port,
            protocol,
        )?,
    };
    let ingress = match dst_pod {
        None => Verdict::allow("the destination is not a pod-network pod: no ingress side"),
        Some(d) => world.direction(
            d,
            Direction::Ingress,
            &Remote {
                ip: primary_ip(src)?,
                pod: src_net,
            },
            Some(d),
            port,
            protocol,
        )?,
    };
    Ok(Decision { egress, ingress })
}

/// The other end of a connection as the deciding pod sees it: its address, and the pod behind
/// it when that is a pod-network pod (only those match `namespaces`/`pods` peers).
struct Remote<'a> {
    ip: IpAddr,
    pod: Option<&'a Value>,
}

/// What a tier concluded for one direction.
enum TierResult {
    Allow(String),
    Deny(String),
    /// No rule decided (no policy, no matching rule, or Pass): the next tier decides.
    Undecided,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Tier {
    Admin,
    Baseline,
}

struct World<'a> {
    objects: &'a [Value],
}

impl<'a> World<'a> {
    fn of_kind(&self, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.objects.iter().filter(move |o| o["kind"] == kind)
    }

    fn pod(&self, ns_name: &str) -> Result<&'a Value, String> {
        let (ns, name) = ns_name
            .split_once('/')
            .ok_or_else(|| format!("pod {ns_name:?} is not ns/name"))?;
        self.of_kind("Pod")
            .find(|p| p["metadata"]["namespace"] == ns && p["metadata"]["name"] == name)
            .ok_or_else(|| format!("no pod {ns_name}"))
    }

    /// The pod-network pod owning `ip`, if any (host-network pods share their node's address).
    fn pod_with_ip(&self, ip: IpAddr) -> Result<Option<&'a Value>, String> {
        for pod in self.of_kind("Pod").filter(|p| !host_network(p)) {
            if pod_ips(pod)?.contains(&ip) {
                return Ok(Some(pod));
            }
        }
        Ok(None)
    }

    fn namespace_labels(&self, ns: &str) -> Result<BTreeMap<String, String>, String> {
        let obj = self
            .of_kind("Namespace")
            .find(|n| n["metadata"]["name"] == ns)
            .ok_or_else(|| format!("no Namespace {ns}"))?;
        labels(obj)
    }

    /// The verdict of one direction at `subject`; `dest` is the destination pod (the subject
    /// for ingress), on which named ports resolve.
    fn direction(
        &self,
        subject: &Value,
        dir: Direction,
        remote: &Remote,
        dest: Option<&Value>,
        port: u16,
        protocol: Protocol,
    ) -> Result<Verdict, String> {
        let m = Match {
            world: self,
            remote,
            dest,
            port,
            protocol,
        };
        match self.admin_tier(Tier::Admin, subject, dir, &m)? {
            TierResult::Allow(by) => return Ok(Verdict::allow(by)),
            TierResult::Deny(by) => return Ok(Verdict { allowed: false, by }),
            TierResult::Undecided => {}
        }
        if let Some(v) = self.network_policy_tier(subject, dir, &m)? {
            return Ok(v);
        }
        match self.admin_tier(Tier::Baseline, subject, dir, &m)? {
            TierResult::Allow(by) => Ok(Verdict::allow(by)),
            TierResult::Deny(by) => Ok(Verdict { allowed: false, by }),
            TierResult::Undecided => Ok(Verdict::allow("no tier decided: default allow")),
        }
    }

    /// The admin policies of `tier`, in evaluation order.
    fn tier_policies(&self, tier: Tier) -> Result<Vec<&'a Value>, String> {
        let mut out = Vec::new();
        for obj in self.objects {
            let in_tier = match obj["kind"].as_str() {
                Some("AdminNetworkPolicy") => tier == Tier::Admin,
                Some("BaselineAdminNetworkPolicy") => tier == Tier::Baseline,
                Some("ClusterNetworkPolicy") => match obj["spec"]["tier"].as_str() {
                    Some("Admin") => tier == Tier::Admin,
                    Some("Baseline") => tier == Tier::Baseline,
                    other => return Err(format!("ClusterNetworkPolicy tier {other:?}: {obj}")),
                },
                _ => false,
            };
            if in_tier {
                out.push(obj);
            }
        }
        // BaselineAdminNetworkPolicy has no priority (it is a singleton): 0.
        out.sort_by_key(|o| {
            (
                o["spec"]["priority"].as_i64().unwrap_or(0),
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        });
        Ok(out)
    }

    fn admin_tier(
        &self,
        tier: Tier,
        subject: &Value,
        dir: Direction,
        m: &Match,
    ) -> Result<TierResult, String> {
        let tier_name = match tier {
            Tier::Admin => "Admin",
            Tier::Baseline => "Baseline",
        };
        for policy in self.tier_policies(tier)? {
            if !self.admin_subject_selects(policy, subject)? {
                continue;
            }
            let rules = &policy["spec"][dir.rules_key()];
            for (i, rule) in as_list(rules, "rules")?.iter().enumerate() {
                if !m.admin_rule(rule, dir)? {
                    continue;
                }
                let by = format!(
                    "{tier_name} tier: {}/{} {} rule {i} {:?}: {}",
                    policy["kind"].as_str().unwrap_or_default(),
                    policy["metadata"]["name"].as_str().unwrap_or_default(),
                    dir.rules_key(),
                    rule["name"].as_str().unwrap_or_default(),
                    rule["action"].as_str().unwrap_or_default(),
                );
                return Ok(match rule["action"].as_str() {
                    Some("Allow") | Some("Accept") => TierResult::Allow(by),
                    Some("Deny") => TierResult::Deny(by),
                    // Not a Baseline action: SPEC 8's fail-closed rule, a Pass that cannot be
                    // implemented denies everything it would have covered.
                    Some("Pass") if tier == Tier::Baseline => {
                        TierResult::Deny(format!("{by} (not a Baseline action: fails closed)"))
                    }
                    // Pass skips every later rule and policy of this tier.
                    Some("Pass") => TierResult::Undecided,
                    other => return Err(format!("unknown action {other:?} in {by}")),
                });
            }
        }
        Ok(TierResult::Undecided)
    }

    /// `spec.subject`: exactly one of `namespaces` (a namespace selector) or `pods`
    /// (namespaceSelector AND podSelector).
    fn admin_subject_selects(&self, policy: &Value, pod: &Value) -> Result<bool, String> {
        let subject = &policy["spec"]["subject"];
        let ns = pod_namespace(pod)?;
        match one_field(subject, "subject")? {
            ("namespaces", sel) => selects(sel, &self.namespace_labels(ns)?),
            ("pods", sel) => Ok(
                selects(&sel["namespaceSelector"], &self.namespace_labels(ns)?)?
                    && selects(&sel["podSelector"], &labels(pod)?)?,
            ),
            (other, _) => Err(format!("unknown subject {other:?}: {policy}")),
        }
    }

    /// `Some(verdict)` iff a NetworkPolicy of the subject's namespace selects it for `dir`.
    fn network_policy_tier(
        &self,
        subject: &Value,
        dir: Direction,
        m: &Match,
    ) -> Result<Option<Verdict>, String> {
        let ns = pod_namespace(subject)?;
        let subject_labels = labels(subject)?;
        let mut isolating = Vec::new();
        for np in self.of_kind("NetworkPolicy") {
            if np["metadata"]["namespace"] != ns
                || !selects(&np["spec"]["podSelector"], &subject_labels)?
            {
                continue;
            }
            let affects = match np["spec"]["policyTypes"].as_array() {
                Some(types) => types.iter().any(|t| t == dir.policy_type()),
                // Without policyTypes: Ingress always, Egress iff egress rules are written.
                None => dir == Direction::Ingress || !np["spec"]["egress"].is_null(),
            };
            if !affects {
                continue;
            }
            let name = np["metadata"]["name"].as_str().unwrap_or_default();
            for (i, rule) in as_list(&np["spec"][dir.rules_key()], "rules")?
                .iter()
                .enumerate()
            {
                if m.netpol_rule(rule, dir, ns)? {
                    return Ok(Some(Verdict::allow(format!(
                        "NetworkPolicy tier: {ns}/{name} {} rule {i}",
                        dir.rules_key()
                    ))));
                }
            }
            isolating.push(name.to_string());
        }
        Ok((!isolating.is_empty()).then(|| Verdict {
            allowed: false,
            by: format!(
                "NetworkPolicy tier: isolated by {ns}/{}, no rule matches",
                isolating.join(",")
            ),
        }))
    }
}

/// One connection seen from a deciding pod: the rule matchers.
struct Match<'a, 'w> {
    world: &'a World<'w>,
    remote: &'a Remote<'w>,
    dest: Option<&'a Value>,
    port: u16,
    protocol: Protocol,
}

impl Match<'_, '_> {
    fn admin_rule(&self, rule: &Value, dir: Direction) -> Result<bool, String> {
        let mut peer_matches = false;
        for peer in as_list(&rule[dir.peers_key()], "peers")? {
            if self.admin_peer(peer, dir)? {
                peer_matches = true;
                break;
            }
        }
        Ok(peer_matches && self.admin_ports(rule)?)
    }

    fn admin_peer(&self, peer: &Value, dir: Direction) -> Result<bool, String> {
        let (field, value) = one_field(peer, "peer")?;
        match (field, dir) {
            ("namespaces", _) => match self.remote.pod {
                Some(pod) => selects(value, &self.world.namespace_labels(pod_namespace(pod)?)?),
                None => Ok(false),
            },
            ("pods", _) => match self.remote.pod {
                Some(pod) => Ok(selects(
                    &value["namespaceSelector"],
                    &self.world.namespace_labels(pod_namespace(pod)?)?,
                )? && selects(&value["podSelector"], &labels(pod)?)?),
                None => Ok(false),
            },
            ("networks", Direction::Egress) => {
                for cidr in as_list(value, "networks")? {
                    if parse_cidr(cidr)?.contains(&self.remote.ip) {
                        return Ok(true);
                    }
                }
                Ok(false)
            }
            ("nodes", Direction::Egress) => {
                // Node peers match node addresses only, never a pod's.
                if self.remote.pod.is_some() {
                    return Ok(false);
                }
                for node in self.world.of_kind("Node") {
                    if !selects(value, &labels(node)?)? {
                        continue;
                    }
                    for addr in as_list(&node["status"]["addresses"], "addresses")? {
                        let parsed = addr["address"].as_str().and_then(|a| a.parse().ok());
                        if parsed == Some(self.remote.ip) {
                            return Ok(true);
                        }
                    }
                }
                Ok(false)
            }
            // Until names are resolved a domain-name peer matches nothing (fail closed for
            // Accept, the only action upstream allows with it).
            ("domainNames", Direction::Egress) => Ok(false),
            _ => Err(format!("peer {field:?} not allowed in {dir:?}: {peer}")),
        }
    }

    /// v1alpha1 `ports` or v1alpha2 `protocols`; neither = every port and protocol.
    fn admin_ports(&self, rule: &Value) -> Result<bool, String> {
        if !rule["ports"].is_null() {
            for p in as_list(&rule["ports"], "ports")? {
                let hit = match one_field(p, "port")? {
                    ("portNumber", v) => {
                        protocol_of(&v["protocol"])? == self.protocol
                            && v["port"].as_u64() == Some(self.port.into())
                    }
                    ("portRange", v) => {
                        protocol_of(&v["protocol"])? == self.protocol
                            && in_range(self.port, &v["start"], &v["end"])?
                    }
                    ("namedPort", v) => self.named_port(str_of(v, "namedPort")?)?,
                    (other, _) => return Err(format!("unknown port field {other:?}: {p}")),
                };
                if hit {
                    return Ok(true);
                }
            }
            return Ok(false);
        }
        if !rule["protocols"].is_null() {
            for p in as_list(&rule["protocols"], "protocols")? {
                let hit = match one_field(p, "protocol")? {
                    ("destinationNamedPort", v) => {
                        self.named_port(str_of(v, "destinationNamedPort")?)?
                    }
                    (proto, v) => {
                        let proto = match proto {
                            "tcp" => Protocol::Tcp,
                            "udp" => Protocol::Udp,
                            "sctp" => Protocol::Sctp,
                            other => return Err(format!("unknown protocol {other:?}: {p}")),
                        };
                        proto == self.protocol
                            && match &v["destinationPort"] {
                                Value::Null => true,
                                dp if !dp["number"].is_null() => {
                                    dp["number"].as_u64() == Some(self.port.into())
                                }
                                dp if !dp["range"].is_null() => {
                                    in_range(self.port, &dp["range"]["start"], &dp["range"]["end"])?
                                }
                                dp => {
                                    return Err(format!(
                                        "destinationPort without number or range: {dp}"
                                    ))
                                }
                            }
                    }
                };
                if hit {
                    return Ok(true);
                }
            }
            return Ok(false);
        }
        Ok(true)
    }

    /// A named port matches when the destination pod has a container port of that name whose
    /// number and protocol are the connection's (no pod, as for nodes or networks: no match).
    fn named_port(&self, name: &str) -> Result<bool, String> {
        let Some(pod) = self.dest else {
            return Ok(false);
        };
        for c in as_list(&pod["spec"]["containers"], "containers")? {
            for p in as_list(&c["ports"], "ports")? {
                if p["name"] == name
                    && p["containerPort"].as_u64() == Some(self.port.into())
                    && protocol_of(&p["protocol"])? == self.protocol
                {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// A NetworkPolicy rule: no peers = every peer, no ports = every port.
    fn netpol_rule(&self, rule: &Value, dir: Direction, policy_ns: &str) -> Result<bool, String> {
        let peers = as_list(&rule[dir.peers_key()], "peers")?;
        let mut peer_ok = peers.is_empty();
        for peer in peers {
            if self.netpol_peer(peer, policy_ns)? {
                peer_ok = true;
                break;
            }
        }
        if !peer_ok {
            return Ok(false);
        }
        let ports = as_list(&rule["ports"], "ports")?;
        if ports.is_empty() {
            return Ok(true);
        }
        for p in ports {
            if protocol_of(&p["protocol"])? != self.protocol {
                continue;
            }
            let hit = match &p["port"] {
                Value::Null => true,
                Value::String(name) => self.named_port(name)?,
                n if p["endPort"].is_null() => n.as_u64() == Some(self.port.into()),
                n => in_range(self.port, n, &p["endPort"])?,
            };
            if hit {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn netpol_peer(&self, peer: &Value, policy_ns: &str) -> Result<bool, String> {
        if !peer["ipBlock"].is_null() {
            let block = &peer["ipBlock"];
            let inside = parse_cidr(&block["cidr"])?.contains(&self.remote.ip);
            let mut excepted = false;
            for e in as_list(&block["except"], "except")? {
                excepted |= parse_cidr(e)?.contains(&self.remote.ip);
            }
            return Ok(inside && !excepted);
        }
        let Some(pod) = self.remote.pod else {
            return Ok(false);
        };
        let ns = pod_namespace(pod)?;
        let ns_ok = match &peer["namespaceSelector"] {
            // podSelector alone: the policy's own namespace.
            Value::Null => ns == policy_ns,
            sel => selects(sel, &self.world.namespace_labels(ns)?)?,
        };
        let pod_ok = match &peer["podSelector"] {
            Value::Null => true,
            sel => selects(sel, &labels(pod)?)?,
        };
        Ok(ns_ok && pod_ok)
    }
}

fn host_network(pod: &Value) -> bool {
    pod["spec"]["hostNetwork"].as_bool().unwrap_or(false)
}

fn pod_namespace(pod: &Value) -> Result<&str, String> {
    pod["metadata"]["namespace"]
        .as_str()
        .ok_or_else(|| format!("pod without namespace: {pod}"))
}

/// `status.podIPs`, else `status.podIP`.
fn pod_ips(pod: &Value) -> Result<Vec<IpAddr>, String> {
    let mut out = Vec::new();
    for entry in as_list(&pod["status"]["podIPs"], "podIPs")? {
        out.push(parse_ip(&entry["ip"])?);
    }
    if out.is_empty() && !pod["status"]["podIP"].is_null() {
        out.push(parse_ip(&pod["status"]["podIP"])?);
    }
    Ok(out)
}

/// The address upstream dials: `status.podIP` (the first of `podIPs` without it).
fn primary_ip(pod: &Value) -> Result<IpAddr, String> {
    if !pod["status"]["podIP"].is_null() {
        return parse_ip(&pod["status"]["podIP"]);
    }
    pod_ips(pod)?
        .first()
        .copied()
        .ok_or_else(|| format!("pod without address: {pod}"))
}

fn parse_ip(v: &Value) -> Result<IpAddr, String> {
    str_of(v, "IP")?
        .parse()
        .map_err(|e| format!("bad IP {v}: {e}"))
}

fn parse_cidr(v: &Value) -> Result<IpNet, String> {
    str_of(v, "CIDR")?
        .parse()
        .map_err(|e| format!("bad CIDR {v}: {e}"))
}

fn str_of<'v>(v: &'v Value, what: &str) -> Result<&'v str, String> {
    v.as_str()
        .ok_or_else(|| format!("{what} is not a string: {v}"))
}

/// A Kubernetes protocol field; absent means TCP (the API default).
fn protocol_of(v: &Value) -> Result<Protocol, String> {
    match v.as_str() {
        None | Some("TCP") => Ok(Protocol::Tcp),
        Some("UDP") => Ok(Protocol::Udp),
        Some("SCTP") => Ok(Protocol::Sctp),
        Some(other) => Err(format!("unknown protocol {other:?}")),
    }
}

/// Inclusive port range.
fn in_range(port: u16, start: &Value, end: &Value) -> Result<bool, String> {
    match (start.as_u64(), end.as_u64()) {
        (Some(s), Some(e)) => Ok(s <= u64::from(port) && u64::from(port) <= e),
        _ => Err(format!("bad port range {start}..{end}")),
    }
}

/// A list field; absent or null is empty.
fn as_list<'v>(v: &'v Value, what: &str) -> Result<&'v [Value], String> {
    match v {
        Value::Null => Ok(&[]),
        Value::Array(a) => Ok(a),
        other => Err(format!("{what} is not a list: {other}")),
    }
}

/// The single field of a one-of object (subject, peer, port): upstream's CRDs require exactly
/// one; more or none is an error here rather than a guess.
fn one_field<'v>(v: &'v Value, what: &str) -> Result<(&'v str, &'v Value), String> {
    let obj = v
        .as_object()
        .ok_or_else(|| format!("{what} is not an object: {v}"))?;
    let set: Vec<_> = obj.iter().filter(|(_, x)| !x.is_null()).collect();
    match set.as_slice() {
        [(k, x)] => Ok((k.as_str(), x)),
        _ => Err(format!("{what} must set exactly one field: {v}")),
    }
}

fn labels(obj: &Value) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    if let Some(map) = obj["metadata"]["labels"].as_object() {
        for (k, v) in map {
            out.insert(k.clone(), str_of(v, "label value")?.to_string());
        }
    }
    Ok(out)
}

/// A metav1.LabelSelector: null or `{}` selects everything; matchLabels AND matchExpressions.
fn selects(sel: &Value, labels: &BTreeMap<String, String>) -> Result<bool, String> {
    if sel.is_null() {
        return Ok(true);
    }
    if let Some(ml) = sel["matchLabels"].as_object() {
        for (k, v) in ml {
            if labels.get(k).map(String::as_str) != Some(str_of(v, "matchLabels value")?) {
                return Ok(false);
            }
        }
    }
    for expr in as_list(&sel["matchExpressions"], "matchExpressions")? {
        let key = str_of(&expr["key"], "matchExpressions key")?;
        let mut values = Vec::new();
        for v in as_list(&expr["values"], "values")? {
            values.push(str_of(v, "matchExpressions value")?);
        }
        let have = labels.get(key).map(String::as_str);
        let ok = match str_of(&expr["operator"], "operator")? {
            "In" => have.is_some_and(|h| values.contains(&h)),
            "NotIn" => !have.is_some_and(|h| values.contains(&h)),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            other => return Err(format!("unknown selector operator {other:?}")),
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    //! The tier logic on small hand-made clusters: two namespaces `a` and `b` (pods `a/p`,
    //! `a/q`, `b/r`), a node `n1`, and a host-network pod `h/host` on that node.

    use super::*;
    use serde_json::json;

    fn ns(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name, "team": name}}})
    }

    fn pod(ns: &str, name: &str, ip: &str, host: bool) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
               "spec": {"hostNetwork": host, "nodeName": "n1", "containers": [{"name": "c", "ports": [
                   {"name": "web", "containerPort": 80, "protocol": "TCP"},
                   {"name": "dns", "containerPort": 53, "protocol": "UDP"}]}]},
               "status": {"podIP": ip, "podIPs": [{"ip": ip}]}})
    }

    fn cluster() -> Vec<Value> {
        vec![
            ns("a"),
            ns("b"),
            ns("h"),
            pod("a", "p", "10.0.1.1", false),
            pod("a", "q", "10.0.1.2", false),
            pod("b", "r", "10.0.2.1", false),
            pod("h", "host", "192.168.0.1", true),
            json!({"apiVersion": "v1", "kind": "Node",
                   "metadata": {"name": "n1", "labels": {"kubernetes.io/os": "linux"}},
                   "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.1"}]}}),
        ]
    }

    /// A v1alpha2 ClusterNetworkPolicy whose subject is namespace `subject_ns`.
    fn cnp(
        name: &str,
        tier: &str,
        priority: i64,
        subject_ns: &str,
        dir: &str,
        rules: Value,
    ) -> Value {
        json!({"apiVersion": "policy.networking.k8s.io/v1alpha2", "kind": "ClusterNetworkPolicy",
               "metadata": {"name": name},
               "spec": {"tier": tier, "priority": priority,
                        "subject": {"namespaces": {"matchLabels": {"team": subject_ns}}},
                        dir: rules}})
    }

    fn from_ns(action: &str, peer_ns: &str) -> Value {
        json!({"action": action, "from": [{"namespaces": {"matchLabels": {"team": peer_ns}}}]})
    }

    fn allowed(objects: &[Value], from: &str, to: &str, port: u16, proto: Protocol) -> bool {
        decide(objects, from, to, port, proto).unwrap().allowed()
    }

    #[test]
    fn without_policies_everything_is_allowed() {
        let c = cluster();
        let d = decide(&c, "a/p", "b/r", 80, Protocol::Tcp).unwrap();
        assert!(d.allowed());
        assert_eq!(d.ingress.by, "no tier decided: default allow");
    }

    #[test]
    fn admin_deny_beats_a_network_policy_allow() {
        let mut c = cluster();
        c.push(cnp(
            "deny",
            "Admin",
            10,
            "b",
            "ingress",
            json!([from_ns("Deny", "a")]),
        ));
        c.push(
            json!({"kind": "NetworkPolicy", "metadata": {"name": "np", "namespace": "b"},
                      "spec": {"podSelector": {}, "ingress": [{}]}}),
        );
        let d = decide(&c, "a/p", "b/r", 80, Protocol::Tcp).unwrap();
        assert!(!d.allowed());
        assert!(
            d.ingress.by.contains("ClusterNetworkPolicy/deny"),
            "{}",
            d.ingress.by
        );
        assert!(d.egress.allowed, "the source side has no policy");
    }

    #[test]
    fn pass_hands_over_to_network_policies_then_baseline() {
        let mut c = cluster();
        c.push(cnp(
            "pass",
            "Admin",
            10,
            "b",
            "ingress",
            json!([from_ns("Pass", "a"), from_ns("Deny", "a")]),
        ));
        c.push(cnp(
            "base",
            "Baseline",
            10,
            "b",
            "ingress",
            json!([from_ns("Deny", "a")]),
        ));
        // Pass skips the rest of the Admin tier (the Deny after it), no NetworkPolicy: Baseline.
        let d = decide(&c, "a/p", "b/r", 80, Protocol::Tcp).unwrap();
        assert!(!d.allowed());
        assert!(
            d.ingress.by.starts_with("Baseline tier"),
            "{}",
            d.ingress.by
        );
        // A NetworkPolicy selecting the pod decides instead of Baseline.
        c.push(json!({"kind": "NetworkPolicy", "metadata": {"name": "np", "namespace": "b"},
                      "spec": {"podSelector": {"matchLabels": {"app": "r"}},
                               "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "a"}}}]}]}}));
        assert!(allowed(&c, "a/p", "b/r", 80, Protocol::Tcp));
        // ... also when it denies: isolated, no rule matches the source.
        let last = c.len() - 1;
        c[last]["spec"]["ingress"] = json!([]);
        let d = decide(&c, "a/p", "b/r", 80, Protocol::Tcp).unwrap();
        assert!(!d.allowed());
        assert!(
            d.ingress.by.starts_with("NetworkPolicy tier"),
            "{}",
            d.ingress.by
        );
    }

    #[test]
    fn pass_in_baseline_fails_closed_denying_what_it_covers() {
        let mut c = cluster();
        c.push(cnp(
            "base",
            "Baseline",
            10,
            "b",
            "ingress",
            json!([from_ns("Pass", "a"), from_ns("Accept", "a")]),
        ));
        assert!(!allowed(&c, "a/p", "b/r", 80, Protocol::Tcp));
    }

    #[test]
    fn lower_priority_value_wins_and_rules_go_in_order() {
        let mut c = cluster();
        c.push(cnp(
            "allow-60",
            "Admin",
            60,
            "b",
            "ingress",
            json!([from_ns("Accept", "a")]),
        ));
        c.push(cnp(
            "deny-50",
            "Admin",
            50,
            "b",
            "ingress",
            json!([from_ns("Deny", "a")]),
        ));
        assert!(!allowed(&c, "a/p", "b/r", 80, Protocol::Tcp));
        c.last_mut().unwrap()["spec"]["priority"] = json!(70);
        assert!(allowed(&c, "a/p", "b/r", 80, Protocol::Tcp));
        // Inside one policy the first written rule decides.
        let mut c = cluster();
        c.push(cnp(
            "x",
            "Admin",
            1,
            "b",
            "ingress",
            json!([from_ns("Accept", "a"), from_ns("Deny", "a")]),
        ));
        assert!(allowed(&c, "a/p", "b/r", 80, Protocol::Tcp));
        c.last_mut().unwrap()["spec"]["ingress"] =
            json!([from_ns("Deny", "a"), from_ns("Accept", "a")]);
        assert!(!allowed(&c, "a/p", "b/r", 80, Protocol::Tcp));
    }

    #[test]
    fn egress_and_ingress_are_decided_apart() {
        let mut c = cluster();
        c.push(cnp(
            "out",
            "Admin",
            1,
            "a",
            "egress",
            json!([{"action": "Deny", "to": [{"namespaces": {"matchLabels": {"team": "b"}}}]}]),
        ));
        let d = decide(&c, "a/p", "b/r", 80, Protocol::Tcp).unwrap();
        assert!(!d.egress.allowed && d.ingress.allowed);
        // The reverse connection: b/r is not a subject, a/p's ingress is unaffected.
        assert!(allowed(&c, "b/r", "a/p", 80, Protocol::Tcp));
    }

    #[test]
    fn v1alpha1_port_numbers_and_inclusive_ranges() {
        let mut c = cluster();
        c.push(
            json!({"kind": "AdminNetworkPolicy", "metadata": {"name": "anp"},
            "spec": {"priority": 1, "subject": {"namespaces": {"matchLabels": {"team": "b"}}},
                     "ingress": [
                        {"action": "Allow", "from": [{"namespaces": {}}],
                         "ports": [{"portNumber": {"protocol": "UDP", "port": 53}},
                                   {"portRange": {"protocol": "TCP", "start": 8080, "end": 8090}}]},
                        {"action": "Deny", "from": [{"namespaces": {}}]}]}}),
        );
        assert!(allowed(&c, "a/p", "b/r", 8080, Protocol::Tcp));
        assert!(allowed(&c, "a/p", "b/r", 8090, Protocol::Tcp));
        assert!(!allowed(&c, "a/p", "b/r", 8091, Protocol::Tcp));
        assert!(!allowed(&c, "a/p", "b/r", 8080, Protocol::Udp));
        assert!(allowed(&c, "a/p", "b/r", 53, Protocol::Udp));
        assert!(!allowed(&c, "a/p", "b/r", 53, Protocol::Tcp));
    }

    #[test]
    fn v1alpha2_protocols_numbers_ranges_and_bare_protocols() {
        let mut c = cluster();
        c.push(cnp(
            "x",
            "Admin",
            1,
            "b",
            "ingress",
            json!([
            {"action": "Accept", "from": [{"namespaces": {}}],
             "protocols": [{"tcp": {"destinationPort": {"range": {"start": 100, "end": 200}}}},
                           {"udp": {"destinationPort": {"number": 53}}},
                           {"sctp": {}}]},
            {"action": "Deny", "from": [{"namespaces": {}}]}]),
        ));
        assert!(allowed(&c, "a/p", "b/r", 100, Protocol::Tcp));
        assert!(allowed(&c, "a/p", "b/r", 200, Protocol::Tcp));
        assert!(!allowed(&c, "a/p", "b/r", 201, Protocol::Tcp));
        assert!(allowed(&c, "a/p", "b/r", 53, Protocol::Udp));
        assert!(!allowed(&c, "a/p", "b/r", 54, Protocol::Udp));
        assert!(
            allowed(&c, "a/p", "b/r", 9003, Protocol::Sctp),
            "sctp without a port: every port"
        );
    }

    #[test]
    fn named_ports_resolve_on_the_destination_by_name_and_protocol() {
        let mut c = cluster();
        c.push(cnp("x", "Admin", 1, "a", "egress", json!([
            {"action": "Accept", "to": [{"namespaces": {}}], "protocols": [{"destinationNamedPort": "dns"}]},
            {"action": "Deny", "to": [{"namespaces": {}}]}])));
        assert!(allowed(&c, "a/p", "b/r", 53, Protocol::Udp));
        assert!(!allowed(&c, "a/p", "b/r", 53, Protocol::Tcp), "dns is UDP");
        assert!(
            !allowed(&c, "a/p", "b/r", 80, Protocol::Tcp),
            "web is not dns"
        );
        // v1alpha1 namedPort, ingress: resolved on the subject (the destination).
        let mut c = cluster();
        c.push(json!({"kind": "AdminNetworkPolicy", "metadata": {"name": "anp"},
            "spec": {"priority": 1, "subject": {"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "r"}}}},
                     "ingress": [{"action": "Allow", "from": [{"namespaces": {}}], "ports": [{"namedPort": "web"}]},
                                 {"action": "Deny", "from": [{"namespaces": {}}]}]}}));
        assert!(allowed(&c, "a/p", "b/r", 80, Protocol::Tcp));
        assert!(!allowed(&c, "a/p", "b/r", 80, Protocol::Udp));
    }

    #[test]
    fn a_pod_dialling_itself_is_not_subject_to_policies() {
        let mut c = cluster();
        c.push(cnp(
            "deny-all",
            "Admin",
            1,
            "a",
            "ingress",
            json!([{"action": "Deny", "from": [{"namespaces": {}}]}]),
        ));
        c.push(cnp(
            "deny-all-out",
            "Admin",
            1,
            "a",
            "egress",
            json!([{"action": "Deny", "to": [{"networks": ["0.0.0.0/0"]}]}]),
        ));
        let d = decide(&c, "a/p", "a/p", 80, Protocol::Tcp).unwrap();
        assert!(d.allowed(), "{d:?}");
        assert!(decide(&c, "a/p", "10.0.1.1", 80, Protocol::Tcp)
            .unwrap()
            .allowed());
        assert!(
            !allowed(&c, "a/p", "a/q", 80, Protocol::Tcp),
            "another pod still is"
        );
    }

    #[test]
    fn node_peers_match_node_addresses_never_pod_addresses() {
        let mut c = cluster();
        c.push(cnp(
            "nodes",
            "Admin",
            1,
            "a",
            "egress",
            json!([
            {"action": "Deny", "to": [{"nodes": {"matchLabels": {"kubernetes.io/os": "linux"}}}]}]),
        ));
        assert!(
            !allowed(&c, "a/p", "h/host", 80, Protocol::Tcp),
            "the host-network pod has the node's address"
        );
        assert!(!allowed(&c, "a/p", "192.168.0.1", 80, Protocol::Tcp));
        assert!(
            allowed(&c, "a/p", "b/r", 80, Protocol::Tcp),
            "a pod is not a node"
        );
        // Even a node claiming a pod's address does not make that pod a node peer.
        let node = c.iter().position(|o| o["kind"] == "Node").unwrap();
        c[node]["status"]["addresses"] = json!([{"type": "InternalIP", "address": "10.0.2.1"}]);
        assert!(allowed(&c, "a/p", "b/r", 80, Protocol::Tcp));
    }

    #[test]
    fn host_network_pods_are_neither_subjects_nor_pod_peers() {
        let mut c = cluster();
        c.push(cnp(
            "in",
            "Admin",
            1,
            "h",
            "ingress",
            json!([{"action": "Deny", "from": [{"namespaces": {}}]}]),
        ));
        assert!(allowed(&c, "a/p", "h/host", 80, Protocol::Tcp));
        c.push(cnp(
            "out",
            "Admin",
            2,
            "a",
            "egress",
            json!([{"action": "Deny", "to": [{"namespaces": {}}]}]),
        ));
        assert!(
            allowed(&c, "a/p", "h/host", 80, Protocol::Tcp),
            "namespaces peers hold no host-network pod"
        );
    }

    #[test]
    fn networks_include_pod_addresses_and_domain_names_match_nothing() {
        let mut c = cluster();
        c.push(cnp(
            "x",
            "Admin",
            1,
            "a",
            "egress",
            json!([
            {"action": "Accept", "to": [{"domainNames": ["*.example.com"]}]},
            {"action": "Deny", "to": [{"networks": ["10.0.2.0/24"]}]}]),
        ));
        assert!(!allowed(&c, "a/p", "b/r", 80, Protocol::Tcp));
        assert!(allowed(&c, "a/p", "h/host", 80, Protocol::Tcp));
    }

    #[test]
    fn baseline_is_overridden_by_an_isolating_network_policy() {
        let mut c = cluster();
        c.push(json!({"kind": "BaselineAdminNetworkPolicy", "metadata": {"name": "default"},
            "spec": {"subject": {"namespaces": {}}, "ingress": [{"action": "Deny", "from": [{"namespaces": {}}]}]}}));
        assert!(!allowed(&c, "a/p", "b/r", 80, Protocol::Tcp));
        c.push(
            json!({"kind": "NetworkPolicy", "metadata": {"name": "np", "namespace": "b"},
                      "spec": {"podSelector": {}, "policyTypes": ["Ingress"],
                               "ingress": [{"ports": [{"port": "web"}]}]}}),
        );
        assert!(allowed(&c, "a/p", "b/r", 80, Protocol::Tcp));
        assert!(
            !allowed(&c, "a/p", "b/r", 81, Protocol::Tcp),
            "isolated: the NetworkPolicy denies"
        );
    }

    #[test]
    fn what_it_does_not_understand_is_an_error() {
        let mut c = cluster();
        c.push(cnp(
            "x",
            "Admin",
            1,
            "b",
            "ingress",
            json!([{"action": "Maybe", "from": [{"namespaces": {}}]}]),
        ));
        assert!(decide(&c, "a/p", "b/r", 80, Protocol::Tcp).is_err());
        let mut c = cluster();
        c.push(cnp(
            "x",
            "Admin",
            1,
            "b",
            "ingress",
            json!([{"action": "Deny", "from": [{"namespaces": {}, "pods": {}}]}]),
        ));
        assert!(decide(&c, "a/p", "b/r", 80, Protocol::Tcp).is_err());
        assert!(decide(&cluster(), "a/p", "b/nobody", 80, Protocol::Tcp).is_err());
    }
}
