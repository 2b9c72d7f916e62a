//! The suggestion as YAML documents, with a `#` comment above each rule naming the flows that
//! justify it (count, first and last seen). The header lists the flows the Admin tier decides
//! (SPEC 8) with its rules in `explain`'s words, and a policy isolating a direction the
//! Baseline tier had rules for says that they stop applying there.
//!
//! Each policy is written as the API object [`crate::synthetic::policy_json`] builds from the
//! engine's [`netwarden_engine::Policy`] (one writer of policy objects for the whole project),
//! laid out as block YAML here, because JSON has no comments. Every string value is written
//! double-quoted with JSON escapes (valid YAML), and keys are left plain only when YAML cannot
//! read them as anything but that string; comment text keeps printable ASCII only. So nothing
//! from an object's names or labels can end a comment or change the document's structure.

use std::fmt::Write as _;

use netwarden_engine::{Direction, PolicyKind};
use serde_json::Value;

use super::flows::{End, Flow, Observations, Seen};
use super::policies::{SuggestedPolicy, Suggestion};
use super::workloads::Workloads;
use crate::explain::tier_rule_text;
use crate::synthetic::policy_json;

/// A step into a JSON value: an object key or an array index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

/// The whole output: a header (what was read and skipped, what the kind cannot express), then
/// one document per policy.
pub fn render(
    suggestion: &Suggestion,
    workloads: &Workloads,
    observations: &Observations,
) -> String {
    let mut out = String::new();
    let kind = suggestion.kind;
    let skipped = &observations.skipped;
    let _ = writeln!(
        out,
        "# Suggested by `netwarden suggest --kind {kind}` from {} event(s): {} distinct flow(s), {} polic{}.",
        observations.events,
        observations.flows.len(),
        suggestion.policies.len(),
        if suggestion.policies.len() == 1 { "y" } else { "ies" },
    );
    let _ = writeln!(
        out,
        "# Monitor mode: check `netwarden report` shows no would-deny before promoting them."
    );
    let counts = [
        (skipped.not_events, "line(s) that are not events"),
        (
            skipped.denied,
            "deny event(s) (refused by enforced policies, not allowed here)",
        ),
        (
            skipped.unknown_pod,
            "event(s) of pods or interfaces not in the cluster state",
        ),
        (
            skipped.no_port,
            "event(s) without a TCP/UDP/SCTP destination port",
        ),
    ];
    for (n, what) in counts.into_iter().filter(|(n, _)| *n > 0) {
        let _ = writeln!(out, "# Skipped {n} {what}.");
    }
    if !suggestion.unexpressible.is_empty() {
        let _ = writeln!(
            out,
            "# Not expressible as {kind} ({} flow(s); the suggestion leaves them as they are):",
            suggestion.unexpressible.len()
        );
        for u in &suggestion.unexpressible {
            let _ = writeln!(
                out,
                "#   {} - {}",
                comment_text(&describe(workloads, &u.flow, &u.seen)),
                u.reason
            );
        }
    }
    render_admin(&mut out, suggestion, workloads);
    for p in &suggestion.policies {
        out.push_str("---\n");
        render_policy(&mut out, p, workloads);
    }
    out
}

/// The flows the Admin tier decides: what the suggestion did with each, and the rules.
fn render_admin(out: &mut String, suggestion: &Suggestion, workloads: &Workloads) {
    if suggestion.admin.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "# Decided by the Admin tier, before any namespaced policy ({} flow(s); SPEC 8):",
        suggestion.admin.len()
    );
    for a in &suggestion.admin {
        let t = &a.tiers;
        let what = if t.denied {
            let mut what = "denied by the Admin tier: no rule suggested".to_owned();
            for direction in &a.refused_too {
                let _ = write!(
                    what,
                    "; the suggestion refuses it at the {} too (would-deny events there while monitored)",
                    direction_side(*direction)
                );
            }
            what
        } else if !t.settled.is_empty() {
            let sides: Vec<&str> = t.settled.iter().map(|d| direction_side(*d)).collect();
            format!(
                "the Admin tier decides the {}: no rule suggested there",
                sides.join(" and ")
            )
        } else {
            "the Admin tier decides for some pods or in one view only: rules suggested as without it"
                .to_owned()
        };
        let _ = writeln!(
            out,
            "#   {} - {what}",
            comment_text(&describe(workloads, &a.flow, &a.seen))
        );
        for d in &t.rules {
            let _ = writeln!(
                out,
                "#     {}, {}: {}",
                direction_side(d.origin.direction),
                d.views(),
                comment_text(&tier_rule_text(&d.origin, d.action))
            );
        }
    }
}

/// The side of a flow a direction is: the source's egress, the destination's ingress.
fn direction_side(direction: Direction) -> &'static str {
    match direction {
        Direction::Egress => "source's egress",
        Direction::Ingress => "destination's ingress",
    }
}

fn render_policy(out: &mut String, p: &SuggestedPolicy, workloads: &Workloads) {
    let value = policy_json(&p.policy);
    let comments = |path: &[Step<'_>]| -> Vec<String> {
        let evidence = match path {
            [Step::Key("spec"), Step::Key("ingress"), Step::Index(i)] => p.ingress_evidence.get(*i),
            [Step::Key("spec"), Step::Key("egress"), Step::Index(i)] => p.egress_evidence.get(*i),
            _ => None,
        };
        let Some(flows) = evidence else {
            return Vec::new();
        };
        let mut lines = vec![format!("allows {} observed flow(s):", flows.len())];
        lines.extend(
            flows
                .iter()
                .map(|(flow, seen)| format!("  {}", describe(workloads, flow, seen))),
        );
        lines
    };
    if p.policy.kind == PolicyKind::NetworkPolicy {
        let _ = writeln!(out, "# Primary network only.");
    }
    for (direction, names) in &p.baseline {
        let names: Vec<String> = names.iter().map(ToString::to_string).collect();
        let _ = writeln!(
            out,
            "# Isolates {direction}: the Baseline tier's rules there ({}) stop applying once this is enforced (SPEC 8).",
            comment_text(&names.join(", "))
        );
    }
    write_value(out, &value, 0, &mut Vec::new(), &comments);
}

/// `src -> dst port/PROTO on network: N seen, first T, last T`.
pub fn describe(workloads: &Workloads, flow: &Flow, seen: &Seen) -> String {
    let end = |e: End| match e {
        End::Workload(id) => workloads.get(id).display(),
        End::Address(ip) => ip.to_string(),
    };
    format!(
        "{} -> {} {}/{} on {}: {} seen, first {}, last {}",
        end(flow.src),
        end(flow.dst),
        flow.port,
        flow.protocol,
        flow.network,
        seen.count,
        seen.first,
        seen.last
    )
}

/// Printable ASCII only (anything else becomes `?`): a comment ends at a line break.
fn comment_text(s: &str) -> String {
    s.chars()
        .map(|c| if (' '..='~').contains(&c) { c } else { '?' })
        .collect()
}

/// Block YAML for `value` at `indent`; `comments(path)` gives the comment lines written above
/// the array item at `path`.
fn write_value<'v>(
    out: &mut String,
    value: &'v Value,
    indent: usize,
    path: &mut Vec<Step<'v>>,
    comments: &dyn Fn(&[Step<'_>]) -> Vec<String>,
) {
    let pad = " ".repeat(indent);
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (key, v) in map {
                let _ = write!(out, "{pad}{}:", yaml_key(key));
                path.push(Step::Key(key));
                if is_block(v) {
                    out.push('\n');
                    // A list under a key sits at the key's indentation (the usual style).
                    let child = if v.is_array() { indent } else { indent + 2 };
                    write_value(out, v, child, path, comments);
                } else {
                    let _ = writeln!(out, " {}", inline(v));
                }
                path.pop();
            }
        }
        Value::Array(items) if !items.is_empty() => {
            for (i, item) in items.iter().enumerate() {
                path.push(Step::Index(i));
                for line in comments(path) {
                    let _ = writeln!(out, "{pad}# {}", comment_text(&line));
                }
                if is_block(item) {
                    // Written two deeper, then its first line's indentation becomes "- ".
                    let start = out.len();
                    write_value(out, item, indent + 2, path, comments);
                    out.replace_range(start..start + indent + 2, &format!("{pad}- "));
                } else {
                    let _ = writeln!(out, "{pad}- {}", inline(item));
                }
                path.pop();
            }
        }
        scalar => {
            let _ = writeln!(out, "{pad}{}", inline(scalar));
        }
    }
}

/// A non-empty object or list: written as a block.
fn is_block(v: &Value) -> bool {
    match v {
        Value::Object(m) => !m.is_empty(),
        Value::Array(a) => !a.is_empty(),
        _ => false,
    }
}

/// A scalar or an empty container on one line; strings double-quoted with JSON escapes.
fn inline(v: &Value) -> String {
    match v {
        Value::Object(_) => "{}".to_owned(),
        Value::Array(_) => "[]".to_owned(),
        other => other.to_string(),
    }
}

/// A key plain when YAML can only read it as this string (a label key such as
/// `app.kubernetes.io/name`), else double-quoted.
fn yaml_key(key: &str) -> String {
    const RESERVED: &[&str] = &["y", "n", "yes", "no", "on", "off", "true", "false", "null"];
    let plain = key.starts_with(|c: char| c.is_ascii_alphabetic())
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-'))
        && !RESERVED.contains(&key.to_ascii_lowercase().as_str());
    if plain {
        key.to_owned()
    } else {
        Value::String(key.to_owned()).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn yaml(v: &Value) -> String {
        let mut out = String::new();
        write_value(
            &mut out,
            v,
            0,
            &mut Vec::new(),
            &|path: &[Step<'_>]| match path {
                [Step::Key("l"), Step::Index(1)] => vec!["second\nitem: injected".into()],
                _ => vec![],
            },
        );
        out
    }

    #[test]
    fn block_layout_quoting_and_comments() {
        let v = json!({
            "a": {"b": "x", "true": 1, "k8s.io/x": [], "e": {}},
            "l": [{"p": 1, "q": [2, "3"]}, {"r": "s\n#t"}],
        });
        assert_eq!(
            yaml(&v),
            "a:\n  b: \"x\"\n  e: {}\n  k8s.io/x: []\n  \"true\": 1\nl:\n- p: 1\n  q:\n  - 2\n  - \"3\"\n# second?item: injected\n- r: \"s\\n#t\"\n"
        );
    }
}
