//! End-to-end regression tests of the fail-open defects of the hardening issue, through the
//! `netwarden` binary on real network namespaces (root; they fail when `CI=true` without it):
//!
//! - the primary interface is the one holding the pod IP, whatever its name (no `eth0` guess);
//! - interfaces with unusual kernel names are covered (nft), quoted or refused loudly
//!   (iptables);
//! - a netns deleted and created again at the same path is programmed again at once;
//! - switching backend removes what the other backend left;
//! - a pod netns path that is a FIFO, or that resolves to netwarden's own netns, is refused
//!   (exit 1, nothing programmed), unless `--allow-host-netns` says otherwise.
//!
//! Each test builds its own namespaces (`nwh<pid>-…`), joined by veths, and removes them even
//! when it fails. Traffic only flows between them.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use netwarden_dataplane::Backend;
use netwarden_testing::{
    assert_connects, assert_refused, docs_text, listen, netwarden_bin, netwarden_leftovers,
    output_within, root_or_skip, wait_reachable, AgentProcess, Namespaces, TempDir,
};
use serde_json::{json, Value};

/// A veth from `pod` (`pod_if`, `net`.1/24) to the client netns `client` (`client_if`,
/// `net`.2/24).
fn veth(pod: &Path, pod_if: &str, client: &Path, client_if: &str, net: &str) {
    netwarden_testing::veth(
        pod,
        pod_if,
        &[&format!("{net}.1/24")],
        client,
        client_if,
        &[&format!("{net}.2/24")],
    );
}

/// A pod netns serving TCP 8080 and 8081 on `<net>.1` (eth0), and a client netns at `<net>.2`
/// that reaches both before any rule is applied.
struct ServedPod {
    pod: std::path::PathBuf,
    client: std::path::PathBuf,
    _listeners: [std::net::TcpListener; 2],
    // Last: the namespaces go after the sockets in them.
    _nss: Namespaces,
}

impl ServedPod {
    fn new(tag: &str, net: &str) -> ServedPod {
        let mut nss = Namespaces::new(tag);
        let pod = nss.create("pod");
        let client = nss.create("client");
        veth(&pod, "eth0", &client, "c1", net);
        let listeners = [
            listen(&pod, &format!("{net}.1:8080")),
            listen(&pod, &format!("{net}.1:8081")),
        ];
        wait_reachable(&client, &format!("{net}.1:8081"));
        ServedPod {
            pod,
            client,
            _listeners: listeners,
            _nss: nss,
        }
    }
}

/// Everything of netwarden's backend `backend` that the system tools show in `netns`.
fn leftovers(backend: Backend, netns: &Path) -> Vec<String> {
    netwarden_leftovers(backend.as_str(), netns)
}

fn namespace_doc() -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "h"}})
}

/// A pod `web` whose netns is `netns`, with `pod_ips` and no network-status annotation.
fn pod_doc(netns: &Path, pod_ips: &[&str]) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "h", "labels": {"app": "web"},
                     "annotations": {"netwarden.io/netns": netns.display().to_string()}},
        "spec": {"containers": [{"name": "c"}]},
        "status": {"podIPs": pod_ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>()},
    })
}

/// A policy of `kind` on `web` denying all ingress except TCP `port` (no `port`: all ingress
/// denied).
fn deny_ingress(kind: &str, name: &str, port: Option<u16>) -> Value {
    let api = match kind {
        "NetworkPolicy" => "networking.k8s.io/v1",
        _ => "danm.k8s.io/v1",
    };
    let ingress = match port {
        Some(p) => json!([{"ports": [{"protocol": "TCP", "port": p}]}]),
        None => json!([]),
    };
    json!({
        "apiVersion": api, "kind": kind,
        "metadata": {"name": name, "namespace": "h"},
        "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"],
                 "ingress": ingress},
    })
}

fn netwarden(args: &[&str], dir: &Path) -> Output {
    Command::new(netwarden_bin!())
        .args(args)
        .arg("-f")
        .arg(dir)
        .env("NO_COLOR", "1")
        .output()
        .expect("run netwarden")
}

fn apply(dir: &Path, backend: Backend) -> Output {
    netwarden(&["apply", "--backend", backend.as_str()], dir)
}

/// Defects 1 and 2 for one backend: the pod IP sits on `ens5` (no network-status annotation:
/// the manifests would guess `eth0`), and a second interface has an unusual name.
fn primary_and_unusual_names(backend: Backend, unusual: &str, tag: &str) {
    let mut nss = Namespaces::new(&format!("nwh{tag}"));
    let pod = nss.create("pod");
    let client = nss.create("client");
    veth(&pod, "ens5", &client, "c1", "10.231.90");
    veth(&pod, unusual, &client, "c2", "10.231.91");
    let _l = [
        listen(&pod, "10.231.90.1:8080"),
        listen(&pod, "10.231.90.1:8081"),
        listen(&pod, "10.231.91.1:8080"),
        listen(&pod, "10.231.91.1:8081"),
    ];
    for a in ["10.231.90.1:8081", "10.231.91.1:8081"] {
        wait_reachable(&client, a);
    }
    let dir = TempDir::new(tag);
    dir.write(
        "pods.yaml",
        &docs_text(&[namespace_doc(), pod_doc(&pod, &["10.231.90.1"])]),
    );

    // A NetworkPolicy isolates the primary interface: the one holding the pod IP.
    dir.write(
        "np.yaml",
        &docs_text(&[deny_ingress("NetworkPolicy", "np", Some(8080))]),
    );
    let out = apply(&dir.path, backend);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_connects(
        &client,
        "10.231.90.1:8080",
        "allowed port on the primary interface",
    );
    assert_refused(
        &client,
        "10.231.90.1:8081",
        "NetworkPolicy on the primary ens5",
    );
    assert_connects(
        &client,
        "10.231.91.1:8081",
        "a NetworkPolicy leaves other interfaces open",
    );

    // A DanmNetworkPolicy isolates every interface, the unusually named one included.
    dir.write(
        "danm.yaml",
        &docs_text(&[deny_ingress("DanmNetworkPolicy", "danm", Some(8080))]),
    );
    let out = apply(&dir.path, backend);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_connects(
        &client,
        "10.231.91.1:8080",
        "allowed port on the unusual interface",
    );
    assert_refused(
        &client,
        "10.231.91.1:8081",
        &format!("DanmNetworkPolicy on {unusual:?}"),
    );
    assert_refused(&client, "10.231.90.1:8081", "still on ens5");
    remove_everything(&pod);
}

/// Removes whatever any backend left in `pod` (the netns goes anyway; this keeps ipsets tidy).
fn remove_everything(pod: &Path) {
    use netwarden_dataplane::{Dataplane, IptablesDataplane, NftDataplane};
    let o = netwarden_render::RenderOptions::default();
    let _ = NftDataplane::new(o).remove(pod);
    let _ = IptablesDataplane::new(o).remove(pod);
}

#[test]
fn primary_interface_and_unusual_names_nft() {
    if !root_or_skip() {
        return;
    }
    primary_and_unusual_names(Backend::Nft, "a\"b;+", "pn");
}

#[test]
fn primary_interface_and_unusual_names_iptables() {
    if !root_or_skip() {
        return;
    }
    // iptables quotes what it can: everything but a trailing '+'.
    primary_and_unusual_names(Backend::Iptables, "a\"b;x", "pi");
}

/// iptables has no way to match a name ending in '+' exactly: the pod is refused loudly (exit
/// status 1, the interface named) and nothing is programmed that would leave it uncovered.
#[test]
fn iptables_refuses_a_name_it_cannot_match() {
    if !root_or_skip() {
        return;
    }
    let mut nss = Namespaces::new("nwhir");
    let pod = nss.create("pod");
    let client = nss.create("client");
    veth(&pod, "ens5", &client, "c1", "10.231.92");
    veth(&pod, "a\"b;+", &client, "c2", "10.231.93");
    let dir = TempDir::new("ir");
    dir.write(
        "pods.yaml",
        &docs_text(&[namespace_doc(), pod_doc(&pod, &["10.231.92.1"])]),
    );
    dir.write(
        "danm.yaml",
        &docs_text(&[deny_ingress("DanmNetworkPolicy", "danm", None)]),
    );
    let out = apply(&dir.path, Backend::Iptables);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("refused") && stderr.contains("a\\\"b;+"),
        "the error names the interface: {stderr}"
    );
    assert!(leftovers(Backend::Iptables, &pod).is_empty());
}

/// Defect 4: a pod sandbox restart deletes the pod's netns and creates a new one at the same
/// path. The agent notices the new identity and programs it at once, though no manifest
/// changed.
fn recreated_netns_is_reprogrammed(backend: Backend, tag: &str) {
    let mut nss = Namespaces::new(&format!("nwh{tag}"));
    let pod = nss.create("pod");
    let client = nss.create("client");
    veth(&pod, "eth0", &client, "c1", "10.231.94");
    let dir = TempDir::new(tag);
    dir.write(
        "pods.yaml",
        &docs_text(&[namespace_doc(), pod_doc(&pod, &["10.231.94.1"])]),
    );
    dir.write(
        "np.yaml",
        &docs_text(&[deny_ingress("NetworkPolicy", "np", Some(8080))]),
    );
    let mut agent = AgentProcess::start(
        &netwarden_bin!(),
        &[
            "run",
            "-f",
            &dir.path.display().to_string(),
            "--interval",
            "100ms",
            "--backend",
            backend.as_str(),
        ],
        &dir.path.join("agent.log"),
    );
    let within = Duration::from_secs(10);
    agent.wait_for("the first rules", within, || {
        !leftovers(backend, &pod).is_empty()
    });

    // The sandbox restarts: same path, new namespace, same addresses.
    nss.delete("pod");
    assert_eq!(nss.create("pod"), pod);
    veth(&pod, "eth0", &client, "c2", "10.231.94");
    let _l = [
        listen(&pod, "10.231.94.1:8080"),
        listen(&pod, "10.231.94.1:8081"),
    ];
    agent.wait_for("the rules in the new netns", within, || {
        !leftovers(backend, &pod).is_empty()
    });
    let reached = netwarden_testing::wait_until(Duration::from_secs(30), || {
        netwarden_testing::connect(&client, "10.231.94.1:8080").is_ok()
    });
    if !reached {
        let show = |ns: &std::path::Path, args: &[&str]| {
            let out = netwarden_testing::run_in(ns, args[0], &args[1..]);
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        };
        panic!(
            "the allowed port never reachable in the new netns\nrules:\n{}\naddresses:\n{}\n\
             client:\n{}\nagent log:\n{}",
            show(&pod, &["nft", "list", "ruleset"]),
            show(&pod, &["ip", "addr"]),
            show(&client, &["ip", "addr"]),
            agent.log()
        );
    }
    assert_refused(&client, "10.231.94.1:8081", "rules of the recreated netns");
    // Not asserted: which path noticed it. Usually the netns identity check logs "recreated";
    // when the agent reads the new netns while it has no veth yet, the interface change alone
    // re-applies the pod (and records the new identity), which is just as good.
    drop(agent);
    remove_everything(&pod);
}

#[test]
fn recreated_netns_is_reprogrammed_nft() {
    if !root_or_skip() {
        return;
    }
    recreated_netns_is_reprogrammed(Backend::Nft, "rn");
}

#[test]
fn recreated_netns_is_reprogrammed_iptables() {
    if !root_or_skip() {
        return;
    }
    recreated_netns_is_reprogrammed(Backend::Iptables, "ri");
}

/// Defect 8: moving from one backend to the other removes what the first one left: the
/// iptables chains and ipsets after moving to nft, the nft table after moving to iptables —
/// and the pod stays enforced through the switch.
#[test]
fn switching_backend_removes_the_other_backends_rules() {
    if !root_or_skip() {
        return;
    }
    let served = ServedPod::new("nwhsw", "10.231.95");
    let (pod, client) = (served.pod.clone(), served.client.clone());
    let dir = TempDir::new("sw");
    dir.write(
        "pods.yaml",
        &docs_text(&[namespace_doc(), pod_doc(&pod, &["10.231.95.1"])]),
    );
    // An ipBlock peer, so the iptables backend has a set to leave behind.
    let mut np = deny_ingress("NetworkPolicy", "np", Some(8080));
    np["spec"]["ingress"][0]["from"] = json!([{"ipBlock": {"cidr": "10.231.95.0/24"}}]);
    dir.write("np.yaml", &docs_text(&[np]));

    for (from, to) in [
        (Backend::Iptables, Backend::Nft),
        (Backend::Nft, Backend::Iptables),
    ] {
        let out = apply(&dir.path, from);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!leftovers(from, &pod).is_empty(), "{from:?} applied");
        let out = apply(&dir.path, to);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!leftovers(to, &pod).is_empty(), "{to:?} applied");
        assert_eq!(
            leftovers(from, &pod),
            Vec::<String>::new(),
            "{from:?} left behind after switching to {to:?}"
        );
        assert_connects(&client, "10.231.95.1:8080", "allowed after the switch");
        assert_refused(&client, "10.231.95.1:8081", "denied after the switch");
    }
    remove_everything(&pod);
}

/// Defect 6: a policy file truncated or made invalid mid-edit made the agent drop the policy
/// and open the pod. A file that does not parse (or is emptied, or whose policy no longer
/// reads) keeps its last good objects, and says so; only removing the file removes them.
#[test]
fn a_broken_policy_file_keeps_the_pod_enforced() {
    if !root_or_skip() {
        return;
    }
    let served = ServedPod::new("nwhbf", "10.231.98");
    let (pod, client) = (served.pod.clone(), served.client.clone());
    let dir = TempDir::new("bf");
    dir.write(
        "pods.yaml",
        &docs_text(&[namespace_doc(), pod_doc(&pod, &["10.231.98.1"])]),
    );
    let policy = serde_yaml_text(&deny_ingress("NetworkPolicy", "np", Some(8080)));
    dir.write("np.yaml", &policy);
    let log = dir.path.join("agent.log");
    let mut agent = AgentProcess::start(
        &netwarden_bin!(),
        &[
            "run",
            "-f",
            &dir.path.display().to_string(),
            "--interval",
            "100ms",
        ],
        &log,
    );
    let within = Duration::from_secs(10);
    agent.wait_for("the rules", within, || {
        !leftovers(Backend::Nft, &pod).is_empty()
    });
    assert_refused(&client, "10.231.98.1:8081", "enforced");

    // Each of these is what an editor or a copy leaves halfway: the policy must stay.
    let half = &policy[..policy.len() / 2];
    for (what, text) in [
        ("truncated", half.to_string()),
        ("emptied", String::new()),
        ("invalid YAML", format!("{policy}\n  : [unclosed")),
        (
            "a policy that no longer reads",
            policy.replace("\"ingress\":", "\"ingress\": 7, \"x\":"),
        ),
    ] {
        dir.write_in_place("np.yaml", &text);
        // Let the agent see it (several ticks), then check the pod is still enforced.
        std::thread::sleep(Duration::from_millis(600));
        assert_refused(&client, "10.231.98.1:8081", &format!("np.yaml {what}"));
        assert_connects(&client, "10.231.98.1:8080", &format!("np.yaml {what}"));
        assert!(
            agent.log().contains("keeping"),
            "the agent says it keeps the last good version ({what}):\n{}",
            agent.log()
        );
    }
    // Fixed again, then removed: only the clean removal opens the pod.
    dir.write("np.yaml", &policy);
    std::thread::sleep(Duration::from_millis(400));
    assert_refused(&client, "10.231.98.1:8081", "fixed");
    dir.remove("np.yaml");
    agent.wait_for("the rules to go with the file", within, || {
        leftovers(Backend::Nft, &pod).is_empty()
    });
    assert_connects(&client, "10.231.98.1:8081", "removed cleanly");
}

/// A policy as YAML text (JSON is YAML), one document.
fn serde_yaml_text(doc: &Value) -> String {
    serde_json::to_string_pretty(doc).unwrap()
}

/// Defect 5: a FIFO as a pod's netns neither hangs `apply` nor is programmed; the pod is
/// refused and `apply` fails.
#[test]
fn a_fifo_netns_path_is_refused_at_once() {
    let dir = TempDir::new("nwh-fifo");
    let fifo = dir.path.join("fifo");
    nix::unistd::mkfifo(
        &fifo,
        nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
    )
    .expect("mkfifo");
    dir.write(
        "all.yaml",
        &docs_text(&[
            namespace_doc(),
            pod_doc(&fifo, &["10.9.0.1"]),
            deny_ingress("NetworkPolicy", "deny", None),
        ]),
    );
    let out = output_within(
        Command::new(netwarden_bin!())
            .args(["apply", "-f"])
            .arg(&dir.path),
        Duration::from_secs(20),
        "apply with a FIFO netns path",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a refused pod fails apply: {stderr}"
    );
    assert!(stderr.contains("it is a FIFO"), "{stderr}");
}

/// Defect 5: paths that resolve to the namespace netwarden itself runs in (on a node: the
/// host's) are refused unless `--allow-host-netns` is given. netwarden runs inside a scratch
/// netns here, so even the allowed case touches only that.
#[test]
fn the_agents_own_netns_is_refused_unless_allowed() {
    if !root_or_skip() {
        return;
    }
    let mut nss = Namespaces::new("nwhown");
    let own = nss.create("own");
    let name = nss.name("own");
    let dir = TempDir::new("nwh-own");
    let bin = netwarden_bin!();
    let link = dir.path.join("link-to-self");
    std::os::unix::fs::symlink("/proc/self/ns/net", &link).unwrap();
    let run_inside = |path: &str, extra: &[&str]| {
        dir.write(
            "all.yaml",
            &docs_text(&[
                namespace_doc(),
                pod_doc(Path::new(path), &["10.9.0.1"]),
                deny_ingress("NetworkPolicy", "deny", None),
            ]),
        );
        let out = Command::new("ip")
            .args(["netns", "exec", &name, &bin, "apply"])
            .args(extra)
            .arg("-f")
            .arg(&dir.path)
            .output()
            .expect("run netwarden in the scratch netns");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for path in [
        "/proc/self/ns/net",
        "/proc/thread-self/ns/net",
        "/proc/self/../self/ns/net",
        &link.display().to_string(),
    ] {
        let (code, stderr) = run_inside(path, &[]);
        assert_eq!(code, Some(1), "{path}: {stderr}");
        assert!(
            stderr.contains("agent's own network namespace"),
            "{path}: {stderr}"
        );
        assert!(
            leftovers(Backend::Nft, &own).is_empty(),
            "{path} was programmed"
        );
    }
    let (code, stderr) = run_inside("/proc/self/ns/net", &["--allow-host-netns"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        leftovers(Backend::Nft, &own).len(),
        1,
        "allowed: programmed"
    );
}

/// A pod annotated with another pod's netns (here through a symlink) would make netwarden
/// program the victim's netns with the intruder's rules — none, so the victim's table would be
/// removed. Two pods naming one namespace are both refused: the victim keeps its rules, and
/// `apply` fails naming both.
#[test]
fn two_pods_naming_one_netns_are_refused() {
    if !root_or_skip() {
        return;
    }
    let served = ServedPod::new("nwhdup", "10.231.97");
    let (pod, client) = (served.pod.clone(), served.client.clone());
    let dir = TempDir::new("dup");
    let victim = pod_doc(&pod, &["10.231.97.1"]);
    dir.write(
        "all.yaml",
        &docs_text(&[
            namespace_doc(),
            victim.clone(),
            deny_ingress("NetworkPolicy", "np", Some(8080)),
        ]),
    );
    let out = apply(&dir.path, Backend::Nft);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_refused(&client, "10.231.97.1:8081", "enforced");

    let link = dir.path.join("looks-like-mine");
    std::os::unix::fs::symlink(&pod, &link).unwrap();
    let mut intruder = pod_doc(&link, &["10.231.96.1"]);
    intruder["metadata"]["name"] = json!("intruder");
    intruder["metadata"]["labels"] = json!({"app": "other"});
    dir.write(
        "all.yaml",
        &docs_text(&[
            namespace_doc(),
            victim,
            intruder,
            deny_ingress("NetworkPolicy", "np", Some(8080)),
        ]),
    );
    let out = apply(&dir.path, Backend::Nft);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("h/web") && stderr.contains("h/intruder"),
        "{stderr}"
    );
    assert_refused(&client, "10.231.97.1:8081", "still enforced");
    // Two declared claims nobody can attribute: the netns is locked down (issue 20, defect 8),
    // nothing allowed until one claim goes, so neither claimant can open it.
    assert_refused(&client, "10.231.97.1:8080", "locked down");
}
