//! The HTML pages in a real headless browser (Debian's `chromium`): each page loads with no
//! console message (no script error, no blocked fetch: the page's Content-Security-Policy
//! forbids every fetch, so a fetch would log a violation), the matrix cells the script draws
//! equal `reach -o json` for the same input cell by cell (on examples/ and on a generated
//! cluster), hostile names stay text, and a screenshot is taken (kept under the target dir as a
//! test artifact).
//!
//! Without chromium the tests skip with a line on stderr, except with `CI=true`, where they
//! fail (`.ci/run` installs it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use netwarden_testing::{docs_text, netwarden_bin, wait_until, TempDir};
use serde_json::Value;

/// Runs `cmd` with stdout and stderr in files (pages and DOMs are larger than a pipe's buffer,
/// which a reader that waits for the exit first would deadlock on); kills it and panics after
/// `limit`. Returns (success, stdout, stderr).
fn run_captured(cmd: &mut Command, limit: Duration, what: &str) -> (bool, Vec<u8>, String) {
    let dir = TempDir::new("captured");
    let (out, err) = (dir.path.join("stdout"), dir.path.join("stderr"));
    let mut child = cmd
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    if !wait_until(limit, || child.try_wait().expect("try_wait").is_some()) {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{what}: still running after {limit:?}");
    }
    let ok = child.wait().expect("wait").success();
    let stderr = String::from_utf8_lossy(&std::fs::read(&err).unwrap()).into_owned();
    (ok, std::fs::read(&out).unwrap(), stderr)
}

/// The browser, or `None` (skip) when it is missing outside CI.
fn chromium() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("chromium"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("chromium is not installed, and CI=true: refusing to skip (apt-get install chromium)");
        }
        eprintln!("skipped: chromium is not installed");
    }
    found
}

/// What a page did in the browser.
struct Loaded {
    /// The DOM after the scripts ran (`--dump-dom`).
    dom: String,
    /// Console messages (script errors, CSP violations, logs).
    console: Vec<String>,
}

/// Runs chromium headless on `file#fragment` with a fresh profile; `extra` adds the action
/// (`--dump-dom`, `--screenshot=...`).
fn run_chromium(
    browser: &Path,
    file: &Path,
    fragment: &str,
    extra: &[String],
) -> (String, Vec<String>) {
    let profile = TempDir::new("chromium-profile");
    let url = format!("file://{}{fragment}", file.display());
    let mut cmd = Command::new(browser);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--enable-logging=stderr",
        "--v=0",
        "--window-size=1400,1000",
    ])
    .arg(format!("--user-data-dir={}", profile.path.display()))
    .args(extra)
    .arg(&url);
    let (ok, stdout, stderr) = run_captured(
        &mut cmd,
        Duration::from_secs(300),
        &format!("chromium {url}"),
    );
    assert!(ok, "chromium {url}: {stderr}");
    let console = stderr
        .lines()
        .filter(|l| l.contains(":CONSOLE"))
        .map(str::to_owned)
        .collect();
    (String::from_utf8_lossy(&stdout).into_owned(), console)
}

fn load(browser: &Path, file: &Path, fragment: &str) -> Loaded {
    let (dom, console) = run_chromium(browser, file, fragment, &["--dump-dom".to_owned()]);
    assert!(
        dom.contains("</html>"),
        "no DOM for {}: {dom}",
        file.display()
    );
    Loaded { dom, console }
}

/// Takes a screenshot of `file` into the target dir's artifacts and checks it is a PNG.
fn screenshot(browser: &Path, file: &Path, name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("html-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    let png = dir.join(name);
    let _ = std::fs::remove_file(&png);
    let (_, console) = run_chromium(
        browser,
        file,
        "",
        &[format!("--screenshot={}", png.display())],
    );
    assert!(console.is_empty(), "console: {console:#?}");
    let bytes =
        std::fs::read(&png).unwrap_or_else(|e| panic!("no screenshot {}: {e}", png.display()));
    assert!(bytes.len() > 1000, "screenshot of {} bytes", bytes.len());
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    png
}

/// Runs netwarden; its stdout.
fn netwarden(args: &[&str]) -> Vec<u8> {
    let (ok, stdout, stderr) = run_captured(
        Command::new(netwarden_bin!()).args(args),
        Duration::from_secs(300),
        &format!("netwarden {args:?}"),
    );
    assert!(ok, "netwarden {args:?}: {stderr}");
    stdout
}

/// The attributes of the tag starting at `tag` (`<td class="x" data-a="1">`), unescaped.
fn attributes(tag: &str) -> BTreeMap<String, String> {
    let end = tag.find('>').expect("tag end");
    let mut rest = &tag[..end];
    let mut out = BTreeMap::new();
    while let Some(eq) = rest.find("=\"") {
        let name = rest[..eq].rsplit(' ').next().unwrap().to_owned();
        let value_end = eq + 2 + rest[eq + 2..].find('"').expect("quote");
        let value = rest[eq + 2..value_end]
            .replace("&quot;", "\"")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&amp;", "&");
        out.insert(name, value);
        rest = &rest[value_end + 1..];
    }
    out
}

/// (network, port, protocol, family, from pod, from interface, to pod, to interface).
type CellKey = (String, u64, String, String, String, String, String, String);

/// Every cell the script drew: its key and its class (the state).
fn dom_cells(dom: &str) -> BTreeMap<CellKey, String> {
    let mut cells = BTreeMap::new();
    let mut matrix: Option<BTreeMap<String, String>> = None;
    let mut cols: Vec<(String, String)> = Vec::new();
    let mut row: Option<(String, String, usize)> = None;
    let mut at = 0;
    while let Some(lt) = dom[at..].find('<') {
        let tag = &dom[at + lt..];
        at += lt + 1;
        let attrs = || attributes(tag);
        if tag.starts_with("<table ") {
            let a = attrs();
            if a.get("class").map(String::as_str) == Some("matrix") {
                matrix = Some(a);
                cols.clear();
                row = None;
            }
        } else if tag.starts_with("<th ") {
            let a = attrs();
            if a.get("class").map(String::as_str) == Some("col") {
                cols.push((
                    format!("{}/{}", a["data-ns"], a["data-pod"]),
                    a["data-iface"].clone(),
                ));
            }
        } else if tag.starts_with("<tr ") {
            let a = attrs();
            if let Some(pod) = a.get("data-pod") {
                row = Some((
                    format!("{}/{pod}", a["data-ns"]),
                    a["data-iface"].clone(),
                    0,
                ));
            }
        } else if tag.starts_with("<td") {
            let (m, (from, from_if, n)) = (
                matrix.as_ref().expect("td in a matrix"),
                row.as_mut().expect("td in a row"),
            );
            let (to, to_if) = &cols[*n];
            *n += 1;
            let key = (
                m["data-network"].clone(),
                m["data-port"].parse().unwrap(),
                m["data-protocol"].clone(),
                m["data-family"].clone(),
                from.clone(),
                from_if.clone(),
                to.clone(),
                to_if.clone(),
            );
            let state = attributes(tag)["class"].clone();
            assert!(
                cells.insert(key.clone(), state).is_none(),
                "cell twice: {key:?}"
            );
        }
    }
    cells
}

/// The same map from `reach -o json`.
fn json_cells(json: &Value) -> BTreeMap<CellKey, String> {
    let mut cells = BTreeMap::new();
    for p in json["probes"].as_array().unwrap() {
        let s = |k: &str| p[k].as_str().unwrap().to_owned();
        let state = match (
            p["allowed"].as_bool().unwrap(),
            p["staged_allowed"].as_bool().unwrap(),
        ) {
            (true, true) => "allowed",
            (false, false) => "denied",
            (true, false) => "would-deny",
            (false, true) => "would-allow",
        };
        let key = (
            s("network"),
            p["port"].as_u64().unwrap(),
            s("protocol"),
            s("family"),
            s("from"),
            s("from_interface"),
            s("to"),
            s("to_interface"),
        );
        assert!(
            cells.insert(key.clone(), state.to_owned()).is_none(),
            "probe twice: {key:?}"
        );
    }
    cells
}

/// `reach -o html` and `-o json` on `input` with `ports`: the page (all matrices drawn) shows
/// exactly the JSON's cells; returns the page's path and size.
fn reach_page_equals_json(
    browser: &Path,
    dir: &TempDir,
    input: &str,
    ports: &[&str],
    name: &str,
) -> (PathBuf, usize) {
    let mut args = vec!["reach", "-f", input];
    for p in ports {
        args.extend(["--port", p]);
    }
    let json: Value =
        serde_json::from_slice(&netwarden(&[&args[..], &["-o", "json"]].concat())).unwrap();
    let html = netwarden(&[&args[..], &["-o", "html"]].concat());
    let page = dir.path.join(name);
    std::fs::write(&page, &html).unwrap();
    let loaded = load(browser, &page, "#all");
    assert!(loaded.console.is_empty(), "console: {:#?}", loaded.console);
    let (want, got) = (json_cells(&json), dom_cells(&loaded.dom));
    assert!(!want.is_empty());
    for (key, state) in &want {
        assert_eq!(got.get(key), Some(state), "cell {key:?}");
    }
    assert_eq!(got.len(), want.len(), "cells the JSON does not have");
    (page, html.len())
}

fn example() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/multinet")
        .display()
        .to_string()
}

#[test]
fn the_console_check_sees_script_errors() {
    // The checks below rely on chromium reporting an uncaught error on stderr.
    let Some(browser) = chromium() else { return };
    let dir = TempDir::new("html-sentinel");
    let page = dir.path.join("broken.html");
    std::fs::write(
        &page,
        "<!DOCTYPE html><p>x</p><script>throw new Error('nw-sentinel')</script>",
    )
    .unwrap();
    let loaded = load(&browser, &page, "");
    assert!(
        loaded.console.iter().any(|l| l.contains("nw-sentinel")),
        "{:#?}",
        loaded.console
    );
}

#[test]
fn reach_page_on_the_examples_equals_reach_json() {
    let Some(browser) = chromium() else { return };
    let dir = TempDir::new("html-examples");
    let (page, _) = reach_page_equals_json(
        &browser,
        &dir,
        &example(),
        &["8080/TCP", "5432/TCP", "53/UDP"],
        "examples.html",
    );
    let png = screenshot(&browser, &page, "reach-examples.png");
    eprintln!("screenshot: {}", png.display());
}

/// A generated cluster (the benchmarks' generator): many namespaces, secondary networks,
/// all three kinds, monitored policies.
fn generated(dir: &TempDir, pods: usize, policies: usize) -> String {
    let cluster = netwarden_engine::generate::cluster(pods, policies, 7);
    dir.write(
        "cluster.yaml",
        &docs_text(&netwarden::synthetic::api_objects(&cluster)),
    );
    dir.path.join("cluster.yaml").display().to_string()
}

#[test]
fn reach_page_on_a_generated_cluster_equals_reach_json() {
    let Some(browser) = chromium() else { return };
    let dir = TempDir::new("html-generated");
    let input = generated(&dir, 60, 30);
    let (page, _) = reach_page_equals_json(
        &browser,
        &dir,
        &input,
        &["80/TCP", "53/UDP"],
        "generated.html",
    );
    screenshot(&browser, &page, "reach-generated.png");
}

#[test]
fn reach_page_for_500_pods_stays_small_and_loads() {
    let Some(browser) = chromium() else { return };
    let dir = TempDir::new("html-500");
    let input = generated(&dir, 500, 100);
    let html = netwarden(&["reach", "-f", &input, "--port", "80/TCP", "-o", "html"]);
    let page = dir.path.join("500.html");
    std::fs::write(&page, &html).unwrap();
    let probes = {
        let json: Value =
            serde_json::from_slice(&netwarden(&["reach", "-f", &input, "--port", "80/TCP"]))
                .unwrap();
        json["probes"].as_array().unwrap().len()
    };
    eprintln!(
        "500 pods, 80/TCP: {probes} probes, page {} bytes",
        html.len()
    );
    // The compact data block: well under the 250,000+ cells' worth of markup.
    assert!(html.len() < 2_000_000, "{} bytes", html.len());
    // The default view (one matrix) draws with no error.
    let loaded = load(&browser, &page, "");
    assert!(loaded.console.is_empty(), "console: {:#?}", loaded.console);
    assert!(loaded.dom.matches("<td ").count() > 10_000);
    screenshot(&browser, &page, "reach-500.png");
}

/// The examples' admin policies (SPEC 8) and a monitored one that would deny ops into shop.
fn admin_cluster(dir: &TempDir) -> String {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/admin/cluster.yaml");
    let audit = "---
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata:
  name: audit
  annotations: {netwarden.io/mode: monitor}
spec:
  priority: 1
  subject: {namespaces: {matchLabels: {team: shop}}}
  ingress:
  - {name: no-ops, action: Deny, from: [{namespaces: {matchLabels: {team: ops}}}]}
";
    dir.write(
        "cluster.yaml",
        &(std::fs::read_to_string(example).unwrap() + audit),
    );
    dir.path.join("cluster.yaml").display().to_string()
}

/// The page's data block.
fn page_data(html: &[u8]) -> Value {
    let html = String::from_utf8_lossy(html);
    let start = html.find("id=\"data\">").expect("data block") + "id=\"data\">".len();
    let end = start + html[start..].find("</script>").unwrap();
    serde_json::from_str(&html[start..end]).unwrap()
}

/// The fragment that opens the page on the cell `from` → `to` (`ns/name`, primary interface)
/// of the IPv4 matrix of `network`, `port`.
fn cell_fragment(data: &Value, network: &str, port: u64, from: &str, to: &str) -> String {
    let member = |name: &str| {
        data["members"]
            .as_array()
            .unwrap()
            .iter()
            .position(|m| {
                format!(
                    "{}/{}",
                    m["namespace"].as_str().unwrap(),
                    m["pod"].as_str().unwrap()
                ) == name
                    && m["interface"] == "eth0"
            })
            .unwrap_or_else(|| panic!("no member {name}"))
    };
    let matrix = data["matrices"]
        .as_array()
        .unwrap()
        .iter()
        .position(|m| m["network"] == network && m["port"] == port && m["family"] == "ipv4")
        .unwrap_or_else(|| panic!("no matrix {network} {port}"));
    format!("#cell={matrix}.{}.{}", member(from), member(to))
}

/// The text of the page's `#detail` box, unescaped.
fn detail(dom: &str) -> String {
    let start = dom.find("id=\"detail\">").expect("detail box") + "id=\"detail\">".len();
    let end = start + dom[start..].find("</div>").unwrap();
    dom[start..end]
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&amp;", "&")
}

/// `reach -o html` on admin policies: the cells equal the JSON, and a cell's explanation names
/// the admin tier's rule, the Pass and the monitored admin policy in `netwarden explain`'s
/// words (each `explain` line naming a tier is in the page's detail, `VIEW: ` before it).
#[test]
fn reach_page_explains_admin_tier_cells_as_explain_does() {
    let Some(browser) = chromium() else { return };
    let dir = TempDir::new("html-admin");
    let input = admin_cluster(&dir);
    let (page, _) = reach_page_equals_json(
        &browser,
        &dir,
        &input,
        &["8080/TCP", "9090/TCP"],
        "admin.html",
    );
    let data = page_data(&std::fs::read(&page).unwrap());
    let cases = [
        // An Admin Deny decides.
        (
            "lab/x",
            8080,
            "Admin tier: AdminNetworkPolicy/guard ingress[0] \"deny-lab\" Deny",
        ),
        // A monitored admin policy's would-deny.
        ("ops/mon", 8080, "monitored: AdminNetworkPolicy/audit"),
        // A Pass on to the namespaced tier.
        (
            "ops/mon",
            9090,
            "\"ops-to-policies\" Pass (priority 10, enforced) -> namespaced tier",
        ),
    ];
    for (from, port, expected) in cases {
        let fragment = cell_fragment(&data, "default", port, from, "shop/web");
        let loaded = load(&browser, &page, &fragment);
        assert!(loaded.console.is_empty(), "console: {:#?}", loaded.console);
        let shown = detail(&loaded.dom);
        assert!(shown.contains(expected), "{fragment}: {shown}");
        assert!(
            loaded.dom.contains("class=\"allowed sel\"")
                || loaded.dom.contains("class=\"denied sel\"")
                || loaded.dom.contains("class=\"would-deny sel\""),
            "the cell is selected"
        );
        let explained = String::from_utf8(netwarden(&[
            "explain",
            "-f",
            &input,
            "--from",
            from,
            "--to",
            "shop/web",
            "--port",
            &format!("{port}/TCP"),
            "--network",
            "default",
        ]))
        .unwrap();
        let mut tier_lines = 0;
        for line in explained
            .lines()
            .map(str::trim)
            .filter(|l| l.contains(" tier: "))
        {
            let (view, rest) = line.split_once(' ').unwrap();
            let want = format!("{view}: {}", rest.trim_start());
            assert!(
                shown.contains(&want),
                "{want:?} not in\n{shown}\nexplain:\n{explained}"
            );
            tier_lines += 1;
        }
        assert!(tier_lines > 0, "{explained}");
        if port == 8080 && from == "ops/mon" {
            assert!(shown.contains("state: would-deny (admin-tier)"), "{shown}");
        }
    }
    screenshot(&browser, &page, "reach-admin.png");
}

#[test]
fn report_page_loads_and_charts() {
    let Some(browser) = chromium() else { return };
    let dir = TempDir::new("html-report");
    let event = |secs: u32, policy: &str| {
        serde_json::json!({
            "time": format!("2026-01-01T00:{:02}:{:02}.000000Z", secs / 60, secs % 60),
            "node": "n", "action": "would-deny", "direction": "ingress",
            "pod": "shop/web-0", "interface": "eth0", "network": "default",
            "peer": "shop/client-0", "src": "10.0.0.1", "dst": "10.0.0.2",
            "sport": 40000, "dport": 80, "protocol": "TCP",
            "policies": [policy], "enforced_policies": [], "cause": "new-isolation"
        })
        .to_string()
    };
    let lines: Vec<String> = [
        (0, "shop/new"),
        (30, "shop/new"),
        (600, "shop/new"),
        (700, "shop/<i>x</i>"),
    ]
    .iter()
    .map(|(t, p)| event(*t, p))
    .collect();
    dir.write("events.jsonl", &(lines.join("\n") + "\n"));
    let events = dir.path.join("events.jsonl").display().to_string();
    let html = netwarden(&["report", "-e", &events, "-o", "html"]);
    let page = dir.path.join("report.html");
    std::fs::write(&page, &html).unwrap();
    let loaded = load(&browser, &page, "");
    assert!(loaded.console.is_empty(), "console: {:#?}", loaded.console);
    assert_eq!(
        loaded.dom.matches("<svg class=\"chart\"").count(),
        2,
        "one chart per policy"
    );
    // 0 s to 700 s in 30 s buckets: shop/new in buckets 0, 1 and 20, the other in 23.
    assert_eq!(
        loaded.dom.matches("<rect class=\"b\"").count(),
        4,
        "buckets with events"
    );
    assert!(loaded.dom.contains("shop/&lt;i&gt;x&lt;/i&gt;") && !loaded.dom.contains("<i>"));
    screenshot(&browser, &page, "report.png");
}

#[test]
fn diff_page_with_hostile_names_loads_and_keeps_them_text() {
    use netwarden::diff::{Change, ChangeKind};
    use netwarden::html::matrix::{diff_page, render};
    use netwarden_engine::{Family, NetworkId, ObjectKey, PodKey, PolicyKind, PolicyRef, Protocol};
    let Some(browser) = chromium() else { return };
    let dir = TempDir::new("html-diff");
    let hostile = "</script><img src=x onerror=\"document.body.dataset.pwned=1\">";
    let row = |from: &str, to: &str, before: bool, after: bool| Change {
        from: PodKey::new("x", from),
        to: PodKey::new("y", to),
        from_interface: "eth0".into(),
        to_interface: "eth0".into(),
        network: NetworkId::Primary,
        port: 80,
        protocol: Protocol::Tcp,
        family: Family::Ipv4,
        before,
        after,
        staged_before: before,
        staged_after: after,
        kind: ChangeKind::of(before, after),
        policies: vec![PolicyRef {
            kind: PolicyKind::NetworkPolicy,
            key: ObjectKey::new("x", hostile),
        }],
        admin_policies: Vec::new(),
        src: "10.0.0.1".parse().unwrap(),
        dst: "10.0.0.2".parse().unwrap(),
    };
    let mut admin_decided = row(hostile, "b", true, false);
    admin_decided.admin_policies = vec![netwarden_engine::AdminRef {
        kind: netwarden_engine::AdminKind::ClusterNetworkPolicy,
        name: hostile.to_owned(),
    }];
    let page = diff_page(&[admin_decided, row("a", "b", false, true)], hostile);
    let file = dir.path.join("diff.html");
    std::fs::write(&file, render(&page)).unwrap();
    let loaded = load(&browser, &file, "#all");
    assert!(loaded.console.is_empty(), "console: {:#?}", loaded.console);
    assert!(
        !loaded.dom.contains("<img"),
        "markup from a name was parsed"
    );
    assert!(
        !loaded.dom.contains("data-pwned"),
        "a handler from a name ran"
    );
    let cells = dom_cells(&loaded.dom);
    let states: Vec<&str> = cells.values().map(String::as_str).collect();
    // Rows x/<hostile> and x/a sort as `<` < `a`; one column y/b.
    assert_eq!(states, ["newly-denied", "newly-allowed"]);
    assert!(cells.keys().any(|k| k.4 == format!("x/{hostile}")));
    // The admin policy of the change is named in the cell's detail, as text.
    let member = |pod: &str| page.members.iter().position(|m| m.pod == pod).unwrap();
    let fragment = format!("#cell=0.{}.{}", member(hostile), member("b"));
    let loaded = load(&browser, &file, &fragment);
    assert!(loaded.console.is_empty(), "console: {:#?}", loaded.console);
    assert!(!loaded.dom.contains("<img") && !loaded.dom.contains("data-pwned"));
    let shown = detail(&loaded.dom);
    assert!(
        shown.contains(&format!("admin policies: ClusterNetworkPolicy/{hostile}")),
        "{shown}"
    );
    screenshot(&browser, &file, "diff.png");
}
