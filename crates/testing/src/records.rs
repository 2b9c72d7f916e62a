//! What `netwarden` prints, read back: the fields of its JSON records (with a message naming
//! the record when one is missing or of the wrong type), the probe records of `lab check
//! --json`, and the agent's `sync:` report lines.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// Typed access to the fields of one JSON record; errors name the record (`what`) and show it.
#[derive(Clone, Copy)]
pub struct Fields<'a> {
    what: &'a str,
    v: &'a Value,
}

impl<'a> Fields<'a> {
    /// The fields of `v`, a record of kind `what` ("lab probe", "event", ...).
    pub fn of(what: &'a str, v: &'a Value) -> Fields<'a> {
        Fields { what, v }
    }

    pub fn str(&self, k: &str) -> Result<String, String> {
        self.v[k]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("{} without string {k:?}: {}", self.what, self.v))
    }

    pub fn bool(&self, k: &str) -> Result<bool, String> {
        self.v[k]
            .as_bool()
            .ok_or_else(|| format!("{} without boolean {k:?}: {}", self.what, self.v))
    }

    /// A port number (`u16`).
    pub fn port(&self, k: &str) -> Result<u16, String> {
        self.v[k]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .ok_or_else(|| format!("{} without port {k:?}: {}", self.what, self.v))
    }

    /// A port number, or `null`.
    pub fn optional_port(&self, k: &str) -> Result<Option<u16>, String> {
        match &self.v[k] {
            Value::Null => Ok(None),
            _ => self.port(k).map(Some),
        }
    }

    /// A string, or `null`.
    pub fn optional_str(&self, k: &str) -> Result<Option<String>, String> {
        match &self.v[k] {
            Value::Null => Ok(None),
            _ => self.str(k).map(Some),
        }
    }

    /// A boolean, or `null`.
    pub fn optional_bool(&self, k: &str) -> Result<Option<bool>, String> {
        match &self.v[k] {
            Value::Null => Ok(None),
            _ => self.bool(k).map(Some),
        }
    }

    /// An IP address written as a string.
    pub fn ip(&self, k: &str) -> Result<IpAddr, String> {
        self.str(k)?
            .parse()
            .map_err(|e| format!("{} {k:?} is no address ({e}): {}", self.what, self.v))
    }
}

/// One probe record of `netwarden lab check --json`: the `reach` prediction and what the real
/// connection did.
#[derive(Debug, Clone)]
pub struct LabProbe {
    pub from: String,
    pub to: String,
    pub network: String,
    pub port: u16,
    pub protocol: String,
    pub family: String,
    pub allowed: bool,
    pub staged_allowed: bool,
    /// `None`: not probed (SCTP has no sockets on this kernel).
    pub observed: Option<bool>,
    /// How the connection disagreed with `allowed` (`denied-but-timed-out`, ...), if it did.
    pub mismatch: Option<String>,
    pub src: IpAddr,
    pub dst: IpAddr,
    /// The whole record, for what a failure message shows.
    pub raw: Value,
}

impl LabProbe {
    pub fn parse(v: &Value) -> Result<LabProbe, String> {
        let f = Fields::of("lab probe", v);
        Ok(LabProbe {
            from: f.str("from")?,
            to: f.str("to")?,
            network: f.str("network")?,
            port: f.port("port")?,
            protocol: f.str("protocol")?,
            family: f.str("family")?,
            allowed: f.bool("allowed")?,
            staged_allowed: f.bool("staged_allowed")?,
            observed: f.optional_bool("observed")?,
            mismatch: f.optional_str("mismatch")?,
            src: f.ip("src")?,
            dst: f.ip("dst")?,
            raw: v.clone(),
        })
    }

    /// Every record of the `probes` array of a `lab check --json` report.
    pub fn all_of(report: &Value) -> Result<Vec<LabProbe>, String> {
        report["probes"]
            .as_array()
            .ok_or("lab check JSON has no \"probes\" array")?
            .iter()
            .map(LabProbe::parse)
            .collect()
    }

    /// The whole probe in one line, for failure messages.
    pub fn describe(&self) -> String {
        format!(
            "{} -> {} {}/{} {} ({} -> {}), allowed {}, staged_allowed {}, observed {:?}, detail {}",
            self.from,
            self.to,
            self.port,
            self.protocol,
            self.family,
            self.src,
            self.dst,
            self.allowed,
            self.staged_allowed,
            self.observed,
            self.raw["detail"]
        )
    }

    /// The fields that explain a failure: addresses, interfaces, what the probe saw.
    pub fn detail(&self) -> String {
        let f = |k: &str| match &self.raw[k] {
            Value::Null => "-".to_string(),
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        format!(
            "{}%{} -> {}%{}, detail {}, {} ms",
            f("src"),
            f("from_interface"),
            f("dst"),
            f("to_interface"),
            f("detail"),
            f("elapsed_ms")
        )
    }
}

/// Runs `bin lab check -f <dir> --backend <backend> --port <p/proto>... --json <extra>` and
/// returns its report. Exit status 1 (some connection disagreed with the prediction) is still
/// a report, for the caller to check.
pub fn lab_check(
    bin: &str,
    dir: &Path,
    backend: &str,
    ports: &BTreeSet<(u16, String)>,
    extra: &[&str],
) -> Result<Value, String> {
    let mut cmd = Command::new(bin);
    cmd.args(["lab", "check", "-f"]).arg(dir);
    cmd.args(["--backend", backend]);
    for (port, proto) in ports {
        cmd.arg("--port").arg(format!("{port}/{proto}"));
    }
    cmd.arg("--json").args(extra);
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run netwarden: {e}"))?;
    if !matches!(out.status.code(), Some(0 | 1)) {
        return Err(format!(
            "netwarden lab check exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "netwarden lab check printed no JSON ({e}), exit {}: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Runs one `lab check -f S0 --then S1 ...` over `states` (each the whole cluster at that
/// point: one topology, each state enforced in turn) and returns one report per state. Later
/// states are written as changes over the first ([`layer`]), as `--then` reads them. With a
/// single state, the plain report is that state's. `extra`: further arguments of `lab check`.
pub fn lab_check_states(
    bin: &str,
    states: &[Vec<Value>],
    backend: &str,
    ports: &BTreeSet<(u16, String)>,
    extra: &[&str],
) -> Result<Vec<Value>, String> {
    let first = states.first().ok_or("lab check of no state")?;
    let dir = crate::TempDir::new("lab-states");
    dir.write("s0.yaml", &crate::docs_text(first));
    let mut then: Vec<String> = Vec::new();
    for (k, objects) in states.iter().enumerate().skip(1) {
        let name = format!("s{k}.yaml");
        dir.write(&name, &crate::docs_text(&layer(first, objects)?));
        then.push("--then".into());
        then.push(dir.path.join(name).display().to_string());
    }
    let args: Vec<&str> = extra
        .iter()
        .copied()
        .chain(then.iter().map(String::as_str))
        .collect();
    let report = lab_check(bin, &dir.path.join("s0.yaml"), backend, ports, &args)?;
    let reports = match report["steps"].as_array() {
        Some(steps) => steps.clone(),
        None => vec![report],
    };
    if reports.len() != states.len() {
        return Err(format!(
            "lab check reported {} states for {}",
            reports.len(),
            states.len()
        ));
    }
    Ok(reports)
}

/// State `objects` as changes laid over `first` (`--then`'s reading): every object of the
/// state (those equal to `first`'s replace themselves), and a `netwarden.io/delete` marker for
/// each object of `first` the state no longer has.
pub fn layer(first: &[Value], objects: &[Value]) -> Result<Vec<Value>, String> {
    use crate::admin_corpus::object_key;
    let kept: BTreeSet<_> = objects.iter().map(object_key).collect::<Result<_, _>>()?;
    let mut out = objects.to_vec();
    for obj in first {
        let key = object_key(obj)?;
        if !kept.contains(&key) {
            let (kind, namespace, name) = key;
            let mut metadata = serde_json::json!({
                "name": name,
                "annotations": { "netwarden.io/delete": "true" },
            });
            if !namespace.is_empty() {
                metadata["namespace"] = serde_json::json!(namespace);
            }
            out.push(serde_json::json!({
                "apiVersion": obj["apiVersion"],
                "kind": kind,
                "metadata": metadata,
            }));
        }
    }
    Ok(out)
}

/// One `sync: N pod(s) considered, A applied, U unchanged, R removed, ..., E error(s)` line of
/// the agent (or of `netwarden apply`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncLine {
    pub considered: usize,
    pub applied: usize,
    pub removed: usize,
    pub errors: usize,
}

/// The `sync:` reports in a log, in order.
pub fn sync_lines(log: &str) -> Vec<SyncLine> {
    log.lines()
        .filter_map(|line| {
            let rest = &line[line.find("sync: ")? + "sync: ".len()..];
            // "4 pod(s) considered, 2 applied, 0 unchanged, 0 removed, 0 without netns, ..."
            let number_before = |label: &str| -> Option<usize> {
                let end = rest.find(label)?;
                rest[..end].split_whitespace().last()?.parse().ok()
            };
            Some(SyncLine {
                considered: number_before(" pod(s) considered")?,
                applied: number_before(" applied")?,
                removed: number_before(" removed")?,
                errors: number_before(" error(s)")?,
            })
        })
        .collect()
}

/// [`sync_lines`] of the log file at `path` (none while it does not exist): for polling a
/// log without borrowing the process that writes it.
pub fn sync_lines_in(path: &Path) -> Vec<SyncLine> {
    sync_lines(&std::fs::read_to_string(path).unwrap_or_default())
}

/// How many syncs in a log ended without error.
pub fn successful_syncs(log: &str) -> usize {
    sync_lines(log).iter().filter(|s| s.errors == 0).count()
}

/// [`successful_syncs`] of the log file at `path` (none while it does not exist).
pub fn successful_syncs_in(path: &Path) -> usize {
    successful_syncs(&std::fs::read_to_string(path).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `layer` writes a later state as changes over the first: objects kept as they are, and a
    /// deletion marker for what is gone (a namespaced and a cluster-scoped object).
    #[test]
    fn later_states_are_changes_with_deletion_markers() {
        let ns =
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}});
        let np = serde_json::json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "p", "namespace": "x"}, "spec": {}});
        let cnp = serde_json::json!({"apiVersion": "policy.networking.k8s.io/v1alpha2",
            "kind": "ClusterNetworkPolicy", "metadata": {"name": "c"}, "spec": {}});
        let out = layer(&[ns.clone(), np, cnp], std::slice::from_ref(&ns)).unwrap();
        assert_eq!(out.len(), 3);
        assert_eq!(out[0], ns);
        assert_eq!(out[1]["kind"], "NetworkPolicy");
        assert_eq!(out[1]["metadata"]["namespace"], "x");
        assert_eq!(
            out[1]["metadata"]["annotations"]["netwarden.io/delete"],
            "true"
        );
        assert_eq!(out[2]["kind"], "ClusterNetworkPolicy");
        assert!(out[2]["metadata"].get("namespace").is_none());
    }

    #[test]
    fn sync_lines_are_parsed() {
        let log = "2024-01-01T00:00:00Z  INFO netwarden::agent: sync: 4 pod(s) considered, 2 \
                   applied, 1 unchanged, 3 removed, 0 without netns, 5 error(s) in 12.3 ms\n\
                   other line\n\
                   sync: 1 pod(s) considered, 0 applied, 1 unchanged, 0 removed, 0 without \
                   netns, 0 error(s) in 1.0 ms\n";
        assert_eq!(
            sync_lines(log),
            vec![
                SyncLine {
                    considered: 4,
                    applied: 2,
                    removed: 3,
                    errors: 5
                },
                SyncLine {
                    considered: 1,
                    applied: 0,
                    removed: 0,
                    errors: 0
                }
            ]
        );
        assert_eq!(successful_syncs(log), 1);
    }

    #[test]
    fn lab_probes_are_parsed() {
        let v = serde_json::json!({
            "from": "x/a", "to": "x/b", "network": "default", "port": 80, "protocol": "TCP",
            "family": "ipv4", "allowed": false, "staged_allowed": false, "observed": false,
            "mismatch": "denied-but-timed-out", "src": "10.0.0.1", "dst": "10.0.0.2",
        });
        let p = LabProbe::parse(&v).unwrap();
        assert_eq!(p.mismatch.as_deref(), Some("denied-but-timed-out"));
        assert_eq!(p.observed, Some(false));
        let mut no_port = v.clone();
        no_port["port"] = Value::Null;
        let err = LabProbe::parse(&no_port).unwrap_err();
        assert!(err.starts_with("lab probe without port \"port\""), "{err}");
    }
}
