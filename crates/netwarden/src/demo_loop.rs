//! The demo's second act: from observed traffic to an enforced policy, on real network
//! namespaces (issue 9) — observe → suggest → monitor → report → promote.
//!
//! 1. **observe**: the manifests' namespaces and pods with no policy at all, every pod in
//!    learn mode; the workloads' traffic (a traffic file, one flow a line) is sent as real
//!    connections, and the kernel logs each distinct flow once (`observed` events);
//! 2. **suggest**: least-privilege policies from those events (the `suggest` command's code),
//!    written to a file in monitor mode;
//! 3. **monitor**: the suggested policies enforced in monitor mode in a fresh lab; the same
//!    traffic flows again and no would-deny is logged, while the kernel counts the
//!    connections the policies judged (the evidence `status` records carry);
//! 4. **report**: the status records and events give each policy its verdict (the `report`
//!    command's code): ready to promote;
//! 5. **promote**: each policy's mode is switched to enforce in the file (the `promote`
//!    command's code), the rules are applied, and every pod pair is probed: the observed
//!    traffic still flows, everything else towards the isolated pods is refused, exactly as
//!    `reach` predicts.
//!
//! The traffic file: `FROM -> TO PORT/PROTO [on NETWORK]`, pods as `namespace/name`, the
//! network a NetworkAttachmentDefinition `namespace/name` (the cluster network when absent);
//! `#` starts a comment. Each flow is sent on every address family both ends have there.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use netwarden_dataplane::Backend;
use netwarden_engine::{EngineOptions, LearnSelector, Mode, NetworkId, Pod, PodKey, PolicyKind};
use netwarden_lab::ProbeSpec;
use netwarden_manifest::{Inventory, LoadOptions};
use netwarden_monitor::{Event, EventAction, StatusRecord, Timestamp};
use netwarden_render::RenderOptions;

use crate::cli_args::PortProto;
use crate::lab::{default_ports, EnforcedLab, LabCheckOptions};
use crate::promote::{self, Target};
use crate::suggest::{self, Observations, Workloads};
use netwarden_agent::status_tracker::{coverage, Counters, StatusTracker};

/// The evidence window of the demo's report (a real one is an hour or days).
const CLEAN_FOR: Duration = Duration::from_secs(3);
/// The kind the demo suggests: it covers every interface of a pod.
const KIND: PolicyKind = PolicyKind::DanmNetworkPolicy;

/// One line of the traffic file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrafficFlow {
    pub from: PodKey,
    pub to: PodKey,
    pub port: PortProto,
    pub network: NetworkId,
}

impl std::fmt::Display for TrafficFlow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} -> {} {}/{} on {}",
            self.from,
            self.to,
            self.port.port,
            self.port.protocol.as_str(),
            self.network
        )
    }
}

fn pod_key(s: &str) -> Option<PodKey> {
    let (ns, name) = s.split_once('/')?;
    (!ns.is_empty() && !name.is_empty() && !name.contains('/')).then(|| PodKey::new(ns, name))
}

/// Parses a traffic file (see the module doc); an error names the line.
pub fn parse_traffic(text: &str) -> Result<Vec<TrafficFlow>, String> {
    let mut out = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        let bad = |why: &str| format!("line {}: {why}: {raw:?}", n + 1);
        let words: Vec<&str> = line.split_whitespace().collect();
        let (from, arrow, to, port, rest) = match words.as_slice() {
            [from, arrow, to, port, rest @ ..] => (*from, *arrow, *to, *port, rest),
            _ => return Err(bad("expected FROM -> TO PORT/PROTO [on NETWORK]")),
        };
        if arrow != "->" {
            return Err(bad("expected `->` between the pods"));
        }
        let network = match rest {
            [] => NetworkId::Primary,
            ["on", net] => {
                let (ns, name) = net
                    .split_once('/')
                    .filter(|(ns, name)| !ns.is_empty() && !name.is_empty())
                    .ok_or_else(|| bad("the network is namespace/name"))?;
                NetworkId::nad(ns, name)
            }
            _ => return Err(bad("after the port only `on NETWORK` may follow")),
        };
        out.push(TrafficFlow {
            from: pod_key(from).ok_or_else(|| bad("FROM is namespace/name"))?,
            to: pod_key(to).ok_or_else(|| bad("TO is namespace/name"))?,
            port: port.parse().map_err(|e: String| bad(&e))?,
            network,
        });
    }
    Ok(out)
}

/// The connections that make up `flows`: per flow, one per address family both pods have
/// on its network.
fn probe_specs(pods: &[Pod], flows: &[TrafficFlow]) -> Result<Vec<ProbeSpec>> {
    let find = |key: &PodKey| {
        pods.iter()
            .find(|p| p.key == *key)
            .ok_or_else(|| anyhow!("traffic names pod {key}, which the manifests do not hold"))
    };
    let mut out = Vec::new();
    for flow in flows {
        let (from, to) = (find(&flow.from)?, find(&flow.to)?);
        let ends = from
            .interface_on(&flow.network)
            .zip(to.interface_on(&flow.network))
            .ok_or_else(|| anyhow!("{flow}: a pod has no interface on that network"))?;
        let mut any = false;
        for src in &ends.0.ips {
            if let Some(dst) = ends.1.ips.iter().find(|d| d.is_ipv6() == src.is_ipv6()) {
                any = true;
                out.push(ProbeSpec {
                    from: flow.from.clone(),
                    to: flow.to.clone(),
                    src_ip: Some(*src),
                    dst_ip: *dst,
                    port: flow.port.port,
                    protocol: flow.port.protocol,
                });
            }
        }
        if !any {
            bail!("{flow}: the pods share no address family on that network");
        }
    }
    Ok(out)
}

/// Sends `specs` in `lab`; fails when one does not connect (the traffic must flow in every
/// act before promotion, and after it too).
fn send(lab: &EnforcedLab, specs: &[ProbeSpec], act: &str) -> Result<()> {
    let refused: Vec<String> = lab
        .lab
        .probe(specs)
        .iter()
        .filter(|o| !o.connected)
        .map(|o| {
            format!(
                "{} -> {} {}:{}",
                o.spec.from, o.spec.to, o.spec.dst_ip, o.spec.port
            )
        })
        .collect();
    if !refused.is_empty() {
        bail!(
            "{act}: the workloads' traffic was refused: {}",
            refused.join(", ")
        );
    }
    println!("   {} connection(s) sent, all connected", specs.len());
    Ok(())
}

/// The status records of the monitored policies in `lab`, as the agent writes them.
fn status_records(lab: &EnforcedLab, tracker: &mut StatusTracker, node: &str) -> Vec<StatusRecord> {
    let metrics = lab.collector.metrics().clone();
    let dropped = metrics.nflog_dropped_pods();
    let syncer = lab.syncer.as_ref();
    let counters = Counters {
        would_deny: &|p: &str| metrics.would_deny_count(p),
        dropped: &dropped,
        kernel: &|pods: &[PodKey]| {
            syncer
                .read_counters_many(pods)
                .into_iter()
                .map(|r| r?.ok())
                .collect()
        },
    };
    let rules = syncer
        .programmed()
        .keys()
        .filter_map(|key| syncer.current().get(key));
    let now = Timestamp::now();
    let admin = lab.engine.admin_policies().map(|p| p.as_ref());
    tracker.observe(
        lab.engine.policies(),
        admin,
        &coverage(rules),
        &counters,
        now,
    );
    tracker.records(node, &counters, now)
}

/// Runs the act on `base` (its policies are left out: the act starts from none). Whether
/// every step held.
pub fn run(base: &Inventory, traffic: &Path, backend: Backend, workdir: &Path) -> Result<bool> {
    let text = std::fs::read_to_string(traffic)
        .with_context(|| format!("reading the traffic file {}", traffic.display()))?;
    let flows = parse_traffic(&text).map_err(|e| anyhow!("{}: {e}", traffic.display()))?;
    let mut cluster = base.clone();
    cluster.policies.clear();
    let specs = probe_specs(&cluster.pods, &flows)?;
    let mut ports: Vec<PortProto> = flows.iter().map(|f| f.port).collect();
    ports.extend(default_ports(&cluster));
    ports.sort_by_key(|p| (p.port, p.protocol));
    ports.dedup();
    let options = |engine: EngineOptions, backend: Backend| LabCheckOptions {
        backend,
        ports: ports.clone(),
        engine,
        render: RenderOptions::default(),
    };

    println!("\n== the loop, 1/5 observe: no policy yet, every pod in learn mode; the workloads' traffic ({}):", traffic.display());
    for flow in &flows {
        println!("   {flow}");
    }
    let learn = EngineOptions {
        learn: cluster
            .namespaces
            .iter()
            .map(|ns| LearnSelector {
                namespace: ns.name.clone(),
                pod: None,
            })
            .collect(),
        ..EngineOptions::default()
    };
    if backend != Backend::Nft {
        println!(
            "   (learn mode needs the nft backend: this step uses it; the others use {})",
            backend.as_str()
        );
    }
    let lab = EnforcedLab::up(&cluster, &options(learn, Backend::Nft))?;
    send(&lab, &specs, "observe")?;
    let observed: Vec<Event> = lab
        .events()
        .into_iter()
        .filter(|e| e.action == EventAction::Observed)
        .collect();
    lab.down()?;
    println!(
        "   the kernel logged {} observed flow(s) (each distinct flow once per window), e.g.:",
        observed.len()
    );
    for e in observed.iter().take(3) {
        println!("   {}", e.to_json_line());
    }

    println!(
        "\n== the loop, 2/5 suggest: least-privilege {KIND} objects from those events (monitor mode)"
    );
    let workloads = Workloads::new(&cluster.pods);
    let mut observations = Observations::default();
    for e in &observed {
        observations.add(&workloads, e);
    }
    let tiers = suggest::admin_tiers(
        &cluster,
        EngineOptions::default(),
        &workloads,
        &observations,
    );
    let suggestion = suggest::suggest(&workloads, &observations, &tiers, KIND);
    let yaml = suggest::yaml::render(&suggestion, &workloads, &observations);
    let file = workdir.join("suggested.yaml");
    std::fs::write(&file, &yaml).with_context(|| format!("writing {}", file.display()))?;
    let suggested =
        netwarden_manifest::parse_str(&file.display().to_string(), &yaml, &LoadOptions::default());
    if !suggested.problems.is_empty() || suggested.policies.is_empty() {
        bail!(
            "the suggestion does not load back: {:?}",
            suggested.problems
        );
    }
    println!(
        "   {} polic(ies) written to {}; the first one:",
        suggested.policies.len(),
        file.display()
    );
    for line in first_document(&yaml).lines() {
        println!("   | {line}");
    }

    println!("\n== the loop, 3/5 monitor: the suggestion in monitor mode, the same traffic again");
    let mut monitored = cluster.clone();
    monitored.policies = suggested.policies.clone();
    let mut lab = EnforcedLab::up(&monitored, &options(EngineOptions::default(), backend))?;
    let mut tracker = StatusTracker::new();
    let node = "demo";
    let mut statuses = status_records(&lab, &mut tracker, node);
    let started = Instant::now();
    let result = (|| -> Result<bool> {
        send(&lab, &specs, "monitor")?;
        let events = lab.events();
        let would_deny = events
            .iter()
            .filter(|e| e.action == EventAction::WouldDeny)
            .count();
        println!("   would-deny events: {would_deny} (the suggestion allows every observed flow)");
        // The evidence window must pass before the verdict can say "ready".
        std::thread::sleep(
            (CLEAN_FOR + Duration::from_millis(300)).saturating_sub(started.elapsed()),
        );
        statuses.extend(status_records(&lab, &mut tracker, node));

        println!(
            "\n== the loop, 4/5 report: the verdict per policy from the status records (window {}s)",
            CLEAN_FOR.as_secs()
        );
        for s in statuses.iter().rev().take(2) {
            println!("   {}", s.to_json_line());
        }
        let report =
            netwarden_monitor::report::aggregate(&events, &statuses, Timestamp::now(), CLEAN_FOR);
        let mut all_ready = true;
        for row in &report.policies {
            all_ready &= row.status == netwarden_monitor::PolicyStatus::ReadyToPromote;
            println!(
                "   {:28} {}: {}",
                row.policy,
                row.status.as_str(),
                row.reason
            );
        }
        if !all_ready || report.policies.len() != suggested.policies.len() {
            println!("   not every policy is ready: nothing is promoted");
            return Ok(false);
        }

        println!(
            "\n== the loop, 5/5 promote: each policy switched to enforce in {}",
            file.display()
        );
        let mut text = yaml.clone();
        let name = file.display().to_string();
        for policy in &suggested.policies {
            let target = Target::Namespaced {
                key: policy.key.clone(),
                kind: Some(policy.kind),
            };
            let edit = promote::plan_text(&name, &text, &target, &LoadOptions::default())
                .map_err(|e| anyhow!("promote {target}: {e}"))?;
            print!("{}", indent(&promote::describe(&name, &text, &edit)));
            text = edit.text;
        }
        promote::write_atomically(&file, &text)
            .with_context(|| format!("writing {}", file.display()))?;
        let promoted = netwarden_manifest::parse_str(&name, &text, &LoadOptions::default());
        for policy in promoted.policies {
            if policy.mode != Mode::Enforce {
                bail!("{} is still monitored after promotion", policy.key);
            }
            lab.engine.set_policy(policy);
        }
        let dirty = lab.engine.take_dirty();
        let sync = lab.syncer.sync(&mut lab.engine, dirty);
        if !sync.errors.is_empty() {
            bail!(
                "enforcing the promoted policies: {}",
                sync.errors.join("; ")
            );
        }
        println!("   {sync}");
        send(&lab, &specs, "enforced")?;
        println!("   every pod pair, every port, probed against reach's prediction:");
        let report = lab.report(&ports);
        let refused = report
            .probes
            .iter()
            .filter(|p| p.detail.is_some() && !p.predicted.allowed)
            .count();
        println!(
            "   {} connection(s) refused as predicted (flows nobody observed), {} mismatch(es)",
            refused, report.mismatches
        );
        Ok(report.mismatches == 0 && would_deny == 0)
    })();
    lab.down()?;
    result
}

/// The first YAML document of `text` that holds more than comments.
fn first_document(text: &str) -> String {
    let mut documents = vec![String::new()];
    for line in text.lines() {
        if line == "---" {
            documents.push(String::new());
        } else if let Some(doc) = documents.last_mut() {
            doc.push_str(line);
            doc.push('\n');
        }
    }
    documents
        .into_iter()
        .find(|d| {
            d.lines()
                .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        })
        .unwrap_or_default()
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("   {l}\n")).collect()
}

/// The default traffic file beside a manifests directory `examples/X`: `examples/X.traffic`.
pub fn default_traffic(paths: &[PathBuf]) -> Option<PathBuf> {
    let first = paths.first()?;
    let candidate = first.with_extension("traffic");
    candidate.is_file().then_some(candidate)
}

#[cfg(test)]
mod tests {
    use super::*;
    use netwarden_engine::Protocol;

    #[test]
    fn traffic_lines_parse_and_errors_name_the_line() {
        let flows = parse_traffic(
            "# the workloads\nweb/frontend -> web/api 8080/TCP\n\n  web/api -> data/db 5432/tcp on data/storage-net # storage\n",
        )
        .unwrap();
        assert_eq!(
            flows,
            [
                TrafficFlow {
                    from: PodKey::new("web", "frontend"),
                    to: PodKey::new("web", "api"),
                    port: PortProto {
                        port: 8080,
                        protocol: Protocol::Tcp
                    },
                    network: NetworkId::Primary,
                },
                TrafficFlow {
                    from: PodKey::new("web", "api"),
                    to: PodKey::new("data", "db"),
                    port: PortProto {
                        port: 5432,
                        protocol: Protocol::Tcp
                    },
                    network: NetworkId::nad("data", "storage-net"),
                },
            ]
        );
        for (bad, says) in [
            ("web/a => web/b 80/TCP", "line 1"),
            ("web/a -> web/b", "line 1"),
            ("\nweb -> web/b 80/TCP", "line 2"),
            ("web/a -> web/b 80/XTP", "line 1"),
            ("web/a -> web/b 80/TCP via x/y", "line 1"),
            ("web/a -> web/b 80/TCP on storage", "line 1"),
        ] {
            let err = parse_traffic(bad).unwrap_err();
            assert!(err.starts_with(says), "{bad:?}: {err}");
        }
    }

    #[test]
    fn the_first_document_is_cut_at_the_next_separator() {
        assert_eq!(first_document("# head\n---\na: 1\n---\nb: 2\n"), "a: 1\n");
        assert_eq!(first_document("a: 1\n"), "a: 1\n");
        assert_eq!(first_document("# only\n"), "");
    }
}
