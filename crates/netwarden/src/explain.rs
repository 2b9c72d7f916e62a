//! `netwarden explain`: why one flow is allowed or denied, naming the policies that isolate each
//! side and the rules that match, in the enforced and in the staged view; where an admin policy
//! decided (SPEC 8), its tier, policy, rule (index and name) and action.

use std::collections::BTreeMap;
use std::fmt::Write;

use netwarden_engine::{
    flow_verdict, verdict::SideVerdict, verdict::SideVerdicts, AdminAction, FlowEnd, FlowVerdict,
    Mode, PodKey, PodRules, Tier, TierOrigin,
};
use serde::Serialize;

use crate::cli_args::PortProto;
use crate::reach::Family;

#[derive(Debug, Clone, Serialize)]
pub struct Explanation {
    pub from: String,
    pub to: String,
    pub network: String,
    pub family: Family,
    pub src: std::net::IpAddr,
    pub dst: std::net::IpAddr,
    pub port: u16,
    pub protocol: String,
    pub verdict: FlowVerdict,
}

/// Explains `from → to` on `port`: one explanation per shared network and family (filtered by
/// `network` / `family` when given). An error names what is missing.
pub fn explain(
    rules: &BTreeMap<PodKey, PodRules>,
    from: &PodKey,
    to: &PodKey,
    port: PortProto,
    network: Option<&str>,
    family: Option<Family>,
) -> Result<Vec<Explanation>, String> {
    let src_rules = rules
        .get(from)
        .ok_or_else(|| format!("pod {from} not found (or has no address)"))?;
    let dst_rules = rules
        .get(to)
        .ok_or_else(|| format!("pod {to} not found (or has no address)"))?;
    let mut out = Vec::new();
    for s_if in &src_rules.interfaces {
        let Some(d_if) = dst_rules
            .interfaces
            .iter()
            .find(|d| d.network == s_if.network)
        else {
            continue;
        };
        let name = s_if.network.display_name();
        if network.is_some_and(|n| n != name) {
            continue;
        }
        for fam in [Family::Ipv4, Family::Ipv6] {
            if family.is_some_and(|f| f != fam) {
                continue;
            }
            let pick =
                |ips: &[std::net::IpAddr]| ips.iter().find(|ip| Family::of(ip) == fam).copied();
            let (Some(src), Some(dst)) = (pick(&s_if.ips), pick(&d_if.ips)) else {
                continue;
            };
            let verdict = flow_verdict(
                FlowEnd {
                    pod: from,
                    interface: s_if,
                    ip: src,
                },
                FlowEnd {
                    pod: to,
                    interface: d_if,
                    ip: dst,
                },
                port.protocol,
                port.port,
            );
            out.push(Explanation {
                from: from.to_string(),
                to: to.to_string(),
                network: name.clone(),
                family: fam,
                src,
                dst,
                port: port.port,
                protocol: port.protocol.to_string(),
                verdict,
            });
        }
    }
    if out.is_empty() {
        return Err(format!(
            "{from} and {to} share no network (and address family) matching the query"
        ));
    }
    Ok(out)
}

fn allowed_word(allowed: bool) -> &'static str {
    if allowed {
        "allowed"
    } else {
        "denied"
    }
}

fn verdict_word(allowed: bool) -> &'static str {
    if allowed {
        "ALLOWED"
    } else {
        "DENIED"
    }
}

/// An admin policy rule as `explain` names it (SPEC 8): tier, policy, rule index and name,
/// action, priority and mode.
pub(crate) fn tier_rule_text(origin: &TierOrigin, action: AdminAction) -> String {
    let name = origin
        .name
        .as_ref()
        .map(|n| format!(" \"{}\"", n.escape_debug()))
        .unwrap_or_default();
    format!(
        "{} tier: {} {}[{}]{name} {action} (priority {}, {})",
        origin.tier,
        origin.policy,
        origin.direction,
        origin.index,
        origin.priority,
        mode_word(origin.mode)
    )
}

fn mode_word(mode: Mode) -> &'static str {
    match mode {
        Mode::Enforce => "enforced",
        Mode::Monitor => "monitored",
    }
}

fn describe_side(out: &mut String, view: &str, side: &SideVerdict, peer: &str) {
    let _ = write!(out, "    {view:8} ");
    // Admin tier first (SPEC 8): a decision there ends the side; a Pass hands on.
    if let Some(decision) = side
        .tier_rule
        .as_ref()
        .filter(|d| d.origin.tier == Tier::Admin)
    {
        let _ = writeln!(
            out,
            "{} -> {}",
            tier_rule_text(&decision.origin, decision.action),
            allowed_word(side.allowed)
        );
        return;
    }
    for origin in &side.passed {
        let _ = write!(
            out,
            "{} -> namespaced tier\n             ",
            tier_rule_text(origin, AdminAction::Pass)
        );
    }
    if !side.isolated {
        match side.tier_rule.as_ref() {
            Some(decision) => {
                let _ = writeln!(
                    out,
                    "not isolated; {} -> {}",
                    tier_rule_text(&decision.origin, decision.action),
                    allowed_word(side.allowed)
                );
            }
            None => {
                let _ = writeln!(out, "not isolated -> allowed");
            }
        }
        return;
    }
    let policies: Vec<String> = side
        .policies
        .iter()
        .map(|p| format!("{} {}", p.kind, p))
        .collect();
    let _ = writeln!(out, "isolated by {}", policies.join(", "));
    if let Some(always) = side.always_allowed {
        let _ = writeln!(
            out,
            "             always allowed ({}) -> allowed",
            serde_json::to_value(always)
                .unwrap_or_default()
                .as_str()
                .unwrap_or("")
        );
    } else if side.matched.is_empty() {
        let _ = writeln!(out, "             no rule allows {peer} -> denied");
    } else {
        for m in &side.matched {
            let _ = writeln!(
                out,
                "             allowed by {} {} {}[{}] ({})",
                m.policy.kind,
                m.policy,
                m.direction,
                m.index,
                mode_word(m.mode)
            );
        }
    }
}

fn describe_sides(out: &mut String, title: &str, sides: &SideVerdicts, peer: &str) {
    let _ = writeln!(out, "  {title} of {} on {}:", sides.pod, sides.interface);
    describe_side(out, "enforced", &sides.enforced, peer);
    if sides.staged != sides.enforced {
        describe_side(out, "staged", &sides.staged, peer);
    }
}

/// Human-readable explanation.
pub fn render_text(explanations: &[Explanation]) -> String {
    let mut out = String::new();
    for e in explanations {
        let v = &e.verdict;
        let _ = writeln!(
            out,
            "{} ({}) -> {} ({}) {}/{} on network {}:",
            e.from, e.src, e.to, e.dst, e.port, e.protocol, e.network
        );
        let _ = write!(out, "  verdict: {}", verdict_word(v.allowed));
        if v.staged_allowed != v.allowed {
            let _ = write!(out, " (staged: {}", verdict_word(v.staged_allowed));
            if let Some(cause) = v.cause {
                let _ = write!(out, ", would-deny: {}", cause.as_str());
            }
            let _ = write!(out, ")");
        }
        out.push('\n');
        describe_sides(&mut out, "egress", &v.egress, &e.dst.to_string());
        describe_sides(&mut out, "ingress", &v.ingress, &e.src.to_string());
        out.push('\n');
    }
    out
}
