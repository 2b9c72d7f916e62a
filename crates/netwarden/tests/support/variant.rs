//! Variants derived from the upstream cases: the same truth tables, moved to IPv6, to a
//! secondary network through MultiNetworkPolicy, and to every interface through
//! DanmNetworkPolicy.
//!
//! Addressing plan (see `conformance/README.md`): the pod with primary IPv4 `10.244.N.P` has
//! primary IPv6 `fd00:10:244:N::P`, and on the secondary network `x/net1` the addresses
//! `192.168.N.P` and `fd00:192:168:N::P`. ipBlocks written against the IPv4 plan are translated
//! to the other plans by [`translate_cidr`].

use super::case::Probe;
use super::matrix::Matrix;
use serde_json::{json, Value};
use std::net::{Ipv4Addr, Ipv6Addr};

/// The secondary network every pod joins in the multi-network variants (`ns/name`).
pub const NET1: &str = "x/net1";

/// How the upstream cases are rewritten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// The case as written: NetworkPolicy, IPv4 pods.
    Base,
    /// NetworkPolicy with dual-stack pods; the matrix holds for both families.
    DualStack,
    /// MultiNetworkPolicy for `x/net1` (dual-stack there); the primary network is untouched.
    MultiNetworkPolicy,
    /// DanmNetworkPolicy: isolates the primary interface and `net1` (IPv4) alike.
    Danm,
}

impl Variant {
    pub const ALL: [Variant; 4] = [
        Variant::Base,
        Variant::DualStack,
        Variant::MultiNetworkPolicy,
        Variant::Danm,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Variant::Base => "networkpolicy",
            Variant::DualStack => "networkpolicy-dualstack",
            Variant::MultiNetworkPolicy => "multinetworkpolicy",
            Variant::Danm => "danmnetworkpolicy",
        }
    }
}

/// An address plan an IPv4 primary address or CIDR can be moved to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    PrimaryV6,
    Net1V4,
    Net1V6,
}

/// `(N, P)` of a primary IPv4 address `10.244.N.P`.
fn plan_indices(ip: Ipv4Addr) -> Option<(u8, u8)> {
    let o = ip.octets();
    (o[0] == 10 && o[1] == 244).then_some((o[2], o[3]))
}

fn host(plan: Plan, n: u8, p: u8) -> String {
    match plan {
        Plan::PrimaryV6 => format!("fd00:10:244:{n:x}::{p:x}"),
        Plan::Net1V4 => format!("192.168.{n}.{p}"),
        Plan::Net1V6 => format!("fd00:192:168:{n:x}::{p:x}"),
    }
}

/// Moves a primary IPv4 pod address to another plan.
pub fn translate_ip(ip: &str, plan: Plan) -> Result<String, String> {
    let addr: Ipv4Addr = ip.parse().map_err(|e| format!("{ip}: {e}"))?;
    let (n, p) = plan_indices(addr).ok_or_else(|| format!("{ip} is outside 10.244.0.0/16"))?;
    Ok(host(plan, n, p))
}

/// Moves a CIDR written against the IPv4 primary plan to another plan, keeping its meaning:
/// a pod's /32 becomes that pod's host route, a namespace's /24 the namespace's /24 or /64, the
/// plan's /16 the whole plan (/16 or /48), and a block shorter than /16 that holds the whole plan
/// the block of the same length holding the target plan (upstream's "large CIDR" is the /4
/// around a pod's address, in either family).
pub fn translate_cidr(cidr: &str, plan: Plan) -> Result<String, String> {
    let (ip, len) = cidr
        .split_once('/')
        .ok_or_else(|| format!("{cidr}: no prefix length"))?;
    let addr: Ipv4Addr = ip.parse().map_err(|e| format!("{cidr}: {e}"))?;
    let len: u32 = len.parse().map_err(|e| format!("{cidr}: {e}"))?;
    let v6 = matches!(plan, Plan::PrimaryV6 | Plan::Net1V6);
    let o = addr.octets();
    if len < 16 {
        let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
        let plan_base = u32::from(Ipv4Addr::new(10, 244, 0, 0));
        if u32::from(addr) != plan_base & mask {
            return Err(format!("{cidr} does not hold the plan 10.244.0.0/16"));
        }
        return Ok(if v6 {
            let base: Ipv6Addr = if plan == Plan::PrimaryV6 {
                "fd00:10:244::".parse().expect("literal")
            } else {
                "fd00:192:168::".parse().expect("literal")
            };
            let mask = if len == 0 {
                0
            } else {
                u128::MAX << (128 - len)
            };
            format!("{}/{len}", Ipv6Addr::from(u128::from(base) & mask))
        } else {
            let base = u32::from(Ipv4Addr::new(192, 168, 0, 0));
            format!("{}/{len}", Ipv4Addr::from(base & mask))
        });
    }
    if o[0] != 10 || o[1] != 244 {
        return Err(format!("{cidr} is outside 10.244.0.0/16"));
    }
    match (len, v6) {
        (32, false) => Ok(format!("{}/32", host(plan, o[2], o[3]))),
        (32, true) => Ok(format!("{}/128", host(plan, o[2], o[3]))),
        (24, false) if o[3] == 0 => Ok(format!("192.168.{}.0/24", o[2])),
        (24, true) if o[3] == 0 => Ok(if plan == Plan::PrimaryV6 {
            format!("fd00:10:244:{:x}::/64", o[2])
        } else {
            format!("fd00:192:168:{:x}::/64", o[2])
        }),
        (16, false) if o[2] == 0 && o[3] == 0 => Ok("192.168.0.0/16".to_string()),
        (16, true) if o[2] == 0 && o[3] == 0 => Ok(if plan == Plan::PrimaryV6 {
            "fd00:10:244::/48".to_string()
        } else {
            "fd00:192:168::/48".to_string()
        }),
        _ => Err(format!(
            "{cidr}: only /32, /24, /16 or blocks holding the whole plan translate"
        )),
    }
}

fn translate_ipblock(block: &Value, plan: Plan) -> Result<Value, String> {
    let cidr = block["cidr"].as_str().ok_or("ipBlock without cidr")?;
    let mut out = json!({ "cidr": translate_cidr(cidr, plan)? });
    if let Some(except) = block.get("except").and_then(Value::as_array) {
        let except: Result<Vec<Value>, String> = except
            .iter()
            .map(|e| {
                let e = e.as_str().ok_or("except entry is not a string")?;
                translate_cidr(e, plan).map(Value::String)
            })
            .collect();
        out["except"] = Value::Array(except?);
    }
    Ok(out)
}

/// Rewrites every ipBlock peer of a policy: `keep` keeps the original IPv4 peer, then one
/// translated peer is appended per plan.
fn rewrite_ipblocks(policy: &mut Value, keep: bool, plans: &[Plan]) -> Result<(), String> {
    for (section, peers_key) in [("ingress", "from"), ("egress", "to")] {
        let Some(rules) = policy["spec"][section].as_array_mut() else {
            continue;
        };
        for rule in rules {
            let Some(peers) = rule[peers_key].as_array_mut() else {
                continue;
            };
            let mut out = Vec::new();
            for peer in peers.iter() {
                match peer.get("ipBlock") {
                    Some(block) => {
                        if keep {
                            out.push(peer.clone());
                        }
                        for plan in plans {
                            out.push(json!({ "ipBlock": translate_ipblock(block, *plan)? }));
                        }
                    }
                    None => out.push(peer.clone()),
                }
            }
            *peers = out;
        }
    }
    Ok(())
}

fn network_status(primary: &str, net1: &[String]) -> String {
    json!([
        { "name": "kindnet", "interface": "eth0", "ips": [primary], "default": true },
        { "name": NET1, "interface": "net1", "ips": net1 }
    ])
    .to_string()
}

/// Rewrites the model's objects for a variant (pods gain addresses and interfaces).
pub fn objects(variant: Variant, model: &[Value]) -> Result<Vec<Value>, String> {
    let mut out = model.to_vec();
    for obj in out.iter_mut().filter(|o| o["kind"] == "Pod") {
        let ip = obj["status"]["podIP"]
            .as_str()
            .ok_or("model pod without status.podIP")?
            .to_string();
        match variant {
            Variant::Base => {}
            Variant::DualStack => {
                obj["status"]["podIPs"] =
                    json!([{ "ip": ip }, { "ip": translate_ip(&ip, Plan::PrimaryV6)? }]);
            }
            Variant::MultiNetworkPolicy | Variant::Danm => {
                let mut net1 = vec![translate_ip(&ip, Plan::Net1V4)?];
                if variant == Variant::MultiNetworkPolicy {
                    net1.push(translate_ip(&ip, Plan::Net1V6)?);
                }
                let annotations = obj["metadata"]
                    .as_object_mut()
                    .ok_or("pod without metadata")?
                    .entry("annotations")
                    .or_insert_with(|| json!({}));
                annotations["k8s.v1.cni.cncf.io/network-status"] =
                    Value::String(network_status(&ip, &net1));
            }
        }
    }
    Ok(out)
}

/// Rewrites a step's policies for a variant.
pub fn policies(variant: Variant, policies: &[Value]) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    for p in policies {
        let mut p = p.clone();
        if p["kind"] != "NetworkPolicy" {
            return Err(format!(
                "variants only rewrite NetworkPolicy, found {}",
                p["kind"]
            ));
        }
        match variant {
            Variant::Base => {}
            Variant::DualStack => rewrite_ipblocks(&mut p, true, &[Plan::PrimaryV6])?,
            Variant::MultiNetworkPolicy => {
                rewrite_ipblocks(&mut p, false, &[Plan::Net1V4, Plan::Net1V6])?;
                p["apiVersion"] = json!("k8s.cni.cncf.io/v1beta1");
                p["kind"] = json!("MultiNetworkPolicy");
                let annotations = p["metadata"]
                    .as_object_mut()
                    .ok_or("policy without metadata")?
                    .entry("annotations")
                    .or_insert_with(|| json!({}));
                annotations["k8s.v1.cni.cncf.io/policy-for"] = json!(NET1);
            }
            Variant::Danm => {
                rewrite_ipblocks(&mut p, true, &[Plan::Net1V4])?;
                p["apiVersion"] = json!("danm.k8s.io/v1");
                p["kind"] = json!("DanmNetworkPolicy");
            }
        }
        out.push(p);
    }
    Ok(out)
}

/// Rewrites a step's expected probes for a variant.
pub fn probes(variant: Variant, probes: &[Probe]) -> Result<Vec<Probe>, String> {
    let mut out = Vec::new();
    for p in probes {
        let with = |network: &str, family: Option<&str>, expect: String| Probe {
            network: network.to_string(),
            family: family.map(str::to_string),
            expect: expect.clone(),
            staged: Some(expect),
            ..p.clone()
        };
        let staged = p.staged.clone().unwrap_or_else(|| p.expect.clone());
        let same = |network: &str, family: Option<&str>| Probe {
            network: network.to_string(),
            family: family.map(str::to_string),
            staged: Some(staged.clone()),
            ..p.clone()
        };
        match variant {
            Variant::Base => out.push(same("default", Some("ipv4"))),
            Variant::DualStack => {
                out.push(same("default", Some("ipv4")));
                out.push(same("default", Some("ipv6")));
            }
            Variant::MultiNetworkPolicy => {
                let open = Matrix::all_allowed(&Matrix::parse(&p.expect)?.pods).text();
                out.push(with("default", Some("ipv4"), open));
                out.push(same(NET1, Some("ipv4")));
                out.push(same(NET1, Some("ipv6")));
            }
            Variant::Danm => {
                out.push(same("default", Some("ipv4")));
                out.push(same(NET1, Some("ipv4")));
            }
        }
    }
    Ok(out)
}

/// A step made ready to run: the objects, policies and probes of `variant` (`None`: as
/// written), and the `(port, PROTOCOL)` set to pass to `--port`.
pub struct Prepared {
    pub objects: Vec<Value>,
    pub policies: Vec<Value>,
    pub probes: Vec<Probe>,
    pub ports: std::collections::BTreeSet<(u16, String)>,
}

pub fn prepare(
    variant: Option<Variant>,
    objects: &[Value],
    step: &super::case::Step,
) -> Result<Prepared, String> {
    let (objects, policies, probes) = match variant {
        Some(v) => (
            self::objects(v, objects)?,
            self::policies(v, &step.policies)?,
            self::probes(v, &step.probes)?,
        ),
        None => (objects.to_vec(), step.policies.clone(), step.probes.clone()),
    };
    let ports = probes
        .iter()
        .map(|p| (p.port, p.protocol.to_ascii_uppercase()))
        .collect();
    Ok(Prepared {
        objects,
        policies,
        probes,
        ports,
    })
}

/// `<label> step N` and the step's description, if any: how failures name a step.
pub fn step_name(label: &str, index: usize, step: &super::case::Step) -> String {
    format!(
        "{label} step {}{}",
        index + 1,
        step.description
            .as_ref()
            .map(|d| format!(" ({d})"))
            .unwrap_or_default()
    )
}

/// Every step of `case` (with its index) made ready to run for `variant` (see [`prepare`]),
/// starting from `base_objects`. Label changes persist into later steps, as upstream relabels
/// live objects; when a step's label changes fail, its error is the last item. A step whose
/// variant cannot be built fails alone.
pub fn prepared_steps<'a>(
    case: &'a super::case::Case,
    base_objects: &[Value],
    variant: Option<Variant>,
) -> impl Iterator<Item = (usize, &'a super::case::Step, Result<Prepared, String>)> + 'a {
    let mut objects = base_objects.to_vec();
    let mut relabel_failed = false;
    case.steps.iter().enumerate().map_while(move |(i, step)| {
        if relabel_failed {
            return None;
        }
        if let Err(e) = super::case::apply_labels(&mut objects, &step.add_labels) {
            relabel_failed = true;
            return Some((i, step, Err(e)));
        }
        let prepared =
            prepare(variant, &objects, step).map_err(|e| format!("cannot build the variant: {e}"));
        Some((i, step, prepared))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn translates_the_plan() {
        assert_eq!(
            translate_cidr("10.244.2.2/32", Plan::PrimaryV6).unwrap(),
            "fd00:10:244:2::2/128"
        );
        assert_eq!(
            translate_cidr("10.244.2.2/32", Plan::Net1V4).unwrap(),
            "192.168.2.2/32"
        );
        assert_eq!(
            translate_cidr("10.244.3.0/24", Plan::Net1V6).unwrap(),
            "fd00:192:168:3::/64"
        );
        assert_eq!(
            translate_cidr("0.0.0.0/4", Plan::Net1V4).unwrap(),
            "192.0.0.0/4"
        );
        assert_eq!(
            translate_cidr("0.0.0.0/4", Plan::PrimaryV6).unwrap(),
            "f000::/4"
        );
        assert_eq!(translate_cidr("0.0.0.0/0", Plan::Net1V6).unwrap(), "::/0");
        assert!(translate_cidr("10.244.2.0/25", Plan::Net1V4).is_err());
        assert!(translate_cidr("172.16.0.0/12", Plan::Net1V4).is_err());
    }
}
