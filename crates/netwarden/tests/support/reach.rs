//! Runs `netwarden reach` on a set of objects and compares its probes with expected matrices.

use super::case::Probe;
use super::matrix::{mark, Matrix};
use netwarden_testing::{docs_text, netwarden_bin, Fields, TempDir};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// One probe record of `netwarden reach -o json` (the SPEC section 6 contract).
#[derive(Debug, Clone)]
pub struct Record {
    pub from: String,
    pub to: String,
    pub network: String,
    pub port: u16,
    pub protocol: String,
    /// Explicit, or inferred from an address the record carries; `None` matches any family.
    pub family: Option<String>,
    pub allowed: bool,
    pub staged_allowed: bool,
}

/// Writes the objects (JSON documents, which every YAML reader accepts, so that no label value
/// such as `y` can be re-read as a boolean) and runs `netwarden reach` for the given ports.
pub fn run_reach(
    objects: &[Value],
    policies: &[Value],
    ports: &BTreeSet<(u16, String)>,
) -> Result<Vec<Record>, String> {
    let dir = TempDir::new("reach");
    dir.write("objects.yaml", &docs_text(objects));
    dir.write("policies.yaml", &docs_text(policies));
    // NETWARDEN_BIN runs the suite against another build (e.g. a release binary).
    let mut cmd = Command::new(netwarden_bin!());
    cmd.arg("reach").arg("-f").arg(&dir.path);
    for (port, proto) in ports {
        cmd.arg("--port").arg(format!("{port}/{proto}"));
    }
    cmd.args(["--network", "all", "-o", "json"]);
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run netwarden: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "netwarden reach exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let json: Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "netwarden reach printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })?;
    let probes = json["probes"]
        .as_array()
        .ok_or("netwarden reach JSON has no \"probes\" array")?;
    probes.iter().map(parse_record).collect()
}

fn parse_record(v: &Value) -> Result<Record, String> {
    let f = Fields::of("probe", v);
    // `family` is only promised when both pods have both families; otherwise infer it from an
    // address the record carries (an IPv6 address has a colon). A single-family pair with no
    // address field matches any family filter: it is the only family there is.
    let family = match v["family"].as_str() {
        Some(f) => Some(f.to_string()),
        None => ["src", "dst", "from_ip", "to_ip", "src_ip", "dst_ip"]
            .iter()
            .find_map(|k| v[*k].as_str())
            .map(|a| if a.contains(':') { "ipv6" } else { "ipv4" }.to_string()),
    };
    Ok(Record {
        from: f.str("from")?,
        to: f.str("to")?,
        network: f.str("network")?,
        port: f.port("port")?,
        protocol: f.str("protocol")?,
        family,
        allowed: f.bool("allowed")?,
        staged_allowed: f.bool("staged_allowed")?,
    })
}

/// Compares the records selected by `probe` with its matrices. Returns a report of every
/// difference (empty when it conforms).
pub fn check_probe(probe: &Probe, records: &[Record]) -> Result<Option<String>, String> {
    let expect = Matrix::parse(&probe.expect)?;
    let staged = match &probe.staged {
        Some(text) => Matrix::parse(text)?,
        None => expect.clone(),
    };
    if staged.pods != expect.pods {
        return Err("the staged matrix must list the same pods as expect".to_string());
    }
    let selected: Vec<&Record> = records
        .iter()
        .filter(|r| {
            r.network == probe.network
                && r.port == probe.port
                && r.protocol.eq_ignore_ascii_case(&probe.protocol)
                && match (&probe.family, &r.family) {
                    (Some(want), Some(have)) => want == have,
                    _ => true,
                }
        })
        .collect();
    let pods: BTreeSet<&String> = expect.pods.iter().collect();
    let mut problems = Vec::new();
    // Pairs where every record agrees keep their value; a disagreement between families of an
    // unfiltered probe is reported as a mismatch through `None`.
    let mut got: BTreeMap<(String, String), Option<bool>> = BTreeMap::new();
    let mut got_staged: BTreeMap<(String, String), Option<bool>> = BTreeMap::new();
    for r in &selected {
        if !pods.contains(&r.from) || !pods.contains(&r.to) {
            problems.push(format!(
                "unexpected probe {} -> {} ({}): not in the expected matrix",
                r.from,
                r.to,
                r.family.as_deref().unwrap_or("family not given")
            ));
            continue;
        }
        let key = (r.from.clone(), r.to.clone());
        merge(&mut got, &key, r.allowed);
        merge(&mut got_staged, &key, r.staged_allowed);
    }
    let lookup = |m: &BTreeMap<(String, String), Option<bool>>, f: &str, t: &str| {
        m.get(&(f.to_string(), t.to_string())).copied().flatten()
    };
    let mut differs = false;
    let mut staged_differs = false;
    for ((f, t), want) in &expect.cells {
        if lookup(&got, f, t) != Some(*want) {
            differs = true;
        }
        if lookup(&got_staged, f, t) != Some(staged.cells[&(f.clone(), t.clone())]) {
            staged_differs = true;
        }
    }
    if !differs && !staged_differs && problems.is_empty() {
        return Ok(None);
    }
    let mut report = String::new();
    for p in &problems {
        report.push_str(p);
        report.push('\n');
    }
    for (label, want, have, bad) in [
        ("allowed", &expect, &got, differs),
        ("staged_allowed", &staged, &got_staged, staged_differs),
    ] {
        if !bad {
            continue;
        }
        let observed = want.render(|f, t| mark(lookup(have, f, t)));
        let diff = want.render(|f, t| {
            if lookup(have, f, t) == Some(want.cells[&(f.to_string(), t.to_string())]) {
                ".".to_string()
            } else {
                "X".to_string()
            }
        });
        report.push_str(&format!(
            "{label} expected:\n{}{label} got ('?' = no probe or families disagree):\n{observed}comparison (X = differs):\n{diff}",
            want.text()
        ));
    }
    Ok(Some(report))
}

fn merge(m: &mut BTreeMap<(String, String), Option<bool>>, key: &(String, String), v: bool) {
    m.entry(key.clone())
        .and_modify(|cur| {
            if *cur != Some(v) {
                *cur = None;
            }
        })
        .or_insert(Some(v));
}
