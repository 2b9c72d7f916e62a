//! Real-kernel test of the nft dataplane in a throwaway netns pair joined by a veth:
//! apply, read back, skip unchanged, atomic failure, TCP allowed/refused with RST, removal that
//! leaves other tables alone; in-place updates that keep the sets old rules use for one more
//! apply and collect them (and departed interfaces' chains) afterwards, also after a restart.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use netwarden_dataplane::netns::{self, create_named, delete_named, exec_in, run_in};
use netwarden_dataplane::{ApplyOutcome, Dataplane, NftDataplane, RenderedRuleset};
use netwarden_engine::{
    AddrSet, AllowRule, Clause, Direction, DirectionRules, InterfaceRules, Isolation, Mode,
    NetworkId, ObjectKey, PeerMatch, PodRules, PolicyKind, PolicyRef, PortMatch, PortRange,
    Protocol, RuleOrigin,
};
use netwarden_render::{render_nft, RenderOptions};

fn root_or_skip() -> bool {
    if netns::is_root() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "these tests need root in CI"
    );
    eprintln!("skipped: needs root");
    false
}

/// Deletes the namespaces (and with them the veth) even when the test panics.
struct Guard(Vec<String>);
impl Drop for Guard {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = delete_named(n);
        }
    }
}

const POD_IP: &str = "10.231.77.1";
const CLIENT_IP: &str = "10.231.77.2";

fn pod_rules(allowed_ports: &[u16]) -> PodRules {
    pod_rules_with(allowed_ports, &[CLIENT_IP], &["nwv0"])
}

/// Ingress on each of `ifaces` allowing `allowed_ports` from `peers`.
fn pod_rules_with(allowed_ports: &[u16], peers: &[&str], ifaces: &[&str]) -> PodRules {
    let policy = PolicyRef {
        kind: PolicyKind::NetworkPolicy,
        key: ObjectKey::new("t", "allow"),
    };
    let rule = AllowRule {
        origin: RuleOrigin {
            policy: policy.clone(),
            direction: Direction::Ingress,
            index: 0,
            mode: Mode::Enforce,
        },
        clauses: vec![Clause {
            peers: PeerMatch::Addrs(Arc::new(AddrSet::from_addrs(
                peers.iter().map(|p| p.parse().unwrap()),
            ))),
            ports: PortMatch::Only(
                allowed_ports
                    .iter()
                    .map(|&p| PortRange {
                        protocol: Protocol::Tcp,
                        ports: Some((p, p)),
                    })
                    .collect(),
            ),
        }],
    };
    let iso = Isolation::Isolated(vec![rule]);
    PodRules {
        pod: ObjectKey::new("t", "pod"),
        netns: None,
        interfaces: ifaces
            .iter()
            .map(|name| InterfaceRules {
                name: name.to_string(),
                network: NetworkId::Primary,
                ips: vec![POD_IP.parse().unwrap()],
                ingress: DirectionRules {
                    enforced: iso.clone(),
                    staged: iso.clone(),
                    enforced_policies: vec![policy.clone()],
                    monitored_policies: vec![],
                    replaced_policies: vec![],
                    log_denies: false,
                },
                egress: DirectionRules::open(),
            })
            .collect(),
    }
}

fn listen(ns: &Path, port: u16) -> TcpListener {
    let addr: SocketAddr = format!("{POD_IP}:{port}").parse().unwrap();
    run_in(ns, move || TcpListener::bind(addr))
        .unwrap()
        .unwrap()
}

/// Connects from the client netns; returns the result and how long it took.
fn connect(ns: &Path, port: u16) -> (std::io::Result<TcpStream>, Duration) {
    let addr: SocketAddr = format!("{POD_IP}:{port}").parse().unwrap();
    run_in(ns, move || {
        let start = Instant::now();
        let r = TcpStream::connect_timeout(&addr, Duration::from_secs(5));
        (r, start.elapsed())
    })
    .unwrap()
}

fn tables(ns: &Path) -> String {
    String::from_utf8(
        exec_in(ns, "nft", &["list", "tables"], None)
            .unwrap()
            .stdout,
    )
    .unwrap()
}

/// Two namespaces joined by a veth (`nwv0` in the pod netns, `nwv1` in the client netns).
fn topology(tag: &str) -> (Guard, PathBuf, PathBuf) {
    let pid = std::process::id();
    let (pod_name, client_name) = (format!("nwnft-p{tag}-{pid}"), format!("nwnft-c{tag}-{pid}"));
    let guard = Guard(vec![pod_name.clone(), client_name.clone()]);
    let pod: PathBuf = create_named(&pod_name).unwrap();
    let client: PathBuf = create_named(&client_name).unwrap();

    // veth created inside the pod netns, peer moved to the client netns: nothing in the root
    // namespace is touched.
    let sh = |ns: &Path, args: &[&str]| {
        exec_in(ns, "ip", args, None).unwrap();
    };
    sh(
        &pod,
        &[
            "link", "add", "nwv0", "type", "veth", "peer", "name", "nwv1",
        ],
    );
    sh(&pod, &["link", "set", "nwv1", "netns", &client_name]);
    sh(
        &pod,
        &["addr", "add", &format!("{POD_IP}/24"), "dev", "nwv0"],
    );
    sh(&pod, &["link", "set", "nwv0", "up"]);
    sh(&pod, &["link", "set", "lo", "up"]);
    sh(
        &client,
        &["addr", "add", &format!("{CLIENT_IP}/24"), "dev", "nwv1"],
    );
    sh(&client, &["link", "set", "nwv1", "up"]);
    sh(&client, &["link", "set", "lo", "up"]);

    (guard, pod, client)
}

/// Waits until the client reaches the pod's listener on `port`: a fresh veth only passes
/// packets once the kernel's link watcher has activated it, which takes seconds when many
/// namespaces are being created at the same time (other tests, the lab). Later failures are then
/// ours, not the topology's.
fn wait_reachable(client: &Path, port: u16) {
    let start = Instant::now();
    loop {
        match connect(client, port).0 {
            Ok(_) => {
                eprintln!("topology reachable after {:?}", start.elapsed());
                return;
            }
            Err(e) if start.elapsed() > Duration::from_secs(60) => {
                panic!("topology never became reachable: {e}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

#[test]
fn nft_dataplane_in_real_netns() {
    if !root_or_skip() {
        return;
    }
    let (guard, pod, client) = topology("a");

    // A table we do not own, which must survive everything below.
    exec_in(&pod, "nft", &["-f", "-"], Some(b"table inet other {\n chain c {\n  type filter hook input priority 10; policy accept;\n }\n}\n")).unwrap();

    let _l1 = listen(&pod, 8080);
    let _l2 = listen(&pod, 8081);
    // Before any rules both ports connect.
    wait_reachable(&client, 8081);
    assert!(connect(&client, 8080).0.is_ok());

    let opts = RenderOptions::default();
    let ruleset = RenderedRuleset::nft(render_nft(&pod_rules(&[8080]), &opts));
    let mut dp = NftDataplane::new();
    assert_eq!(dp.apply(&pod, &ruleset).unwrap(), ApplyOutcome::Applied);
    let listed = dp.read_back(&pod).unwrap().expect("table present");
    assert!(listed.contains("table inet netwarden"), "{listed}");
    assert!(listed.contains("jump in_0"), "{listed}");
    assert!(listed.contains("10.231.77.2"), "{listed}");
    assert_eq!(dp.apply(&pod, &ruleset).unwrap(), ApplyOutcome::Unchanged);

    // Allowed port connects; denied port (with a listener!) is refused fast by our TCP reset.
    let (ok, _) = connect(&client, 8080);
    assert!(ok.is_ok(), "allowed port: {ok:?}");
    let (denied, took) = connect(&client, 8081);
    let err = denied.expect_err("8081 must be rejected");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
    assert!(
        took < Duration::from_secs(1),
        "refusal took {took:?} (a timeout, not a reset)"
    );

    // A failing transaction changes nothing and forgets the hash.
    let bad = RenderedRuleset::nft(
        "add table inet netwarden\nadd chain inet netwarden x\nflush chain inet netwarden x\nadd rule inet netwarden x bogus-statement\n".into(),
    );
    assert!(dp.apply(&pod, &bad).is_err());
    assert_eq!(
        dp.read_back(&pod).unwrap().as_deref(),
        Some(listed.as_str()),
        "failed apply left the table"
    );
    assert_eq!(
        dp.apply(&pod, &ruleset).unwrap(),
        ApplyOutcome::Applied,
        "full resync after failure"
    );

    // Update: 8081 allowed too, replaced atomically.
    let wider = RenderedRuleset::nft(render_nft(&pod_rules(&[8080, 8081]), &opts));
    assert_eq!(dp.apply(&pod, &wider).unwrap(), ApplyOutcome::Applied);
    assert!(connect(&client, 8081).0.is_ok());

    // An open pod renders a removal: applied as a removal, and only our table goes.
    let mut open = pod_rules(&[]);
    open.interfaces[0].ingress = DirectionRules::open();
    let removal = RenderedRuleset::nft(render_nft(&open, &opts));
    assert_eq!(dp.apply(&pod, &removal).unwrap(), ApplyOutcome::Removed);
    assert_eq!(dp.read_back(&pod).unwrap(), None);
    let t = tables(&pod);
    assert!(
        t.contains("table inet other") && !t.contains("netwarden"),
        "{t}"
    );

    // Apply again, then remove(): table gone, other untouched; remove twice is fine.
    assert_eq!(dp.apply(&pod, &ruleset).unwrap(), ApplyOutcome::Applied);
    assert!(connect(&client, 8081).0.is_err());
    dp.remove(&pod).unwrap();
    dp.remove(&pod).unwrap();
    assert_eq!(dp.read_back(&pod).unwrap(), None);
    let t = tables(&pod);
    assert!(
        t.contains("table inet other") && !t.contains("netwarden"),
        "{t}"
    );
    assert!(connect(&client, 8081).0.is_ok());

    // A netns that no longer exists has nothing to remove.
    drop(guard);
    assert!(!pod.exists());
    dp.remove(&pod).unwrap();
    let err = dp.apply(&pod, &ruleset).unwrap_err();
    assert!(err.netns_gone(), "{err}");
}

/// The monitor evaluation runs beside enforcement without changing it: a monitored policy that
/// would allow only 8080 lets 8081 through; with an enforced policy allowing only 8080 and a
/// monitored one replacing it, 8081 is still refused and 8080 still connects.
#[test]
fn monitor_rules_never_block_in_the_kernel() {
    if !root_or_skip() {
        return;
    }
    let (_guard, pod, client) = topology("m");
    let _l1 = listen(&pod, 8080);
    let _l2 = listen(&pod, 8081);
    wait_reachable(&client, 8081);
    let opts = RenderOptions::default();
    let mut dp = NftDataplane::new();

    let mut rules = pod_rules(&[8080]);
    let staged = rules.interfaces[0].ingress.staged.clone();
    let monitor = PolicyRef {
        kind: PolicyKind::NetworkPolicy,
        key: ObjectKey::new("t", "mon"),
    };
    {
        let ing = &mut rules.interfaces[0].ingress;
        ing.enforced = Isolation::Open;
        ing.enforced_policies.clear();
        ing.monitored_policies = vec![monitor.clone()];
    }
    let text = render_nft(&rules, &opts);
    assert!(text.contains("nw:wd:"), "{text}");
    assert_eq!(
        dp.apply(&pod, &RenderedRuleset::nft(text)).unwrap(),
        ApplyOutcome::Applied
    );
    assert!(connect(&client, 8080).0.is_ok());
    assert!(
        connect(&client, 8081).0.is_ok(),
        "monitor-only must not block"
    );

    // Enforced (8080 only) + monitored replacing it with "allow all TCP".
    let mut rules = pod_rules(&[8080]);
    {
        let ing = &mut rules.interfaces[0].ingress;
        let mut wide = staged.clone();
        if let Isolation::Isolated(r) = &mut wide {
            r[0].clauses[0].ports = PortMatch::Only(vec![PortRange {
                protocol: Protocol::Tcp,
                ports: None,
            }]);
        }
        ing.staged = wide;
        ing.monitored_policies = vec![monitor];
        ing.replaced_policies = ing.enforced_policies.clone();
        ing.log_denies = true;
    }
    let text = render_nft(&rules, &opts);
    assert_eq!(
        dp.apply(&pod, &RenderedRuleset::nft(text)).unwrap(),
        ApplyOutcome::Applied
    );
    assert!(connect(&client, 8080).0.is_ok());
    let (denied, took) = connect(&client, 8081);
    assert_eq!(
        denied.expect_err("enforced deny").kind(),
        std::io::ErrorKind::ConnectionRefused
    );
    assert!(took < Duration::from_secs(1));
}

/// The sets and chains of our table, read with `nft` (not through the dataplane under test).
fn objects(ns: &Path) -> (Vec<String>, Vec<String>) {
    let out = exec_in(
        ns,
        "nft",
        &["-t", "list", "table", "inet", "netwarden"],
        None,
    )
    .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let named = |kind: &str| -> Vec<String> {
        text.lines()
            .filter_map(|l| l.trim().strip_prefix(kind)?.strip_suffix(" {"))
            .map(str::to_string)
            .collect()
    };
    (named("set "), named("chain "))
}

/// Updates happen in place: a changed peer list is a new set, the old one survives the apply
/// that stops using it and goes with the next; a departed interface's chain goes at once; a
/// restarted agent keeps every set it finds for one apply. Allowed traffic passes throughout.
#[test]
fn updates_in_place_and_collects_stale_objects() {
    if !root_or_skip() {
        return;
    }
    let (_guard, pod, client) = topology("g");
    let _l = listen(&pod, 8080);
    wait_reachable(&client, 8080);
    let opts = RenderOptions::default();
    let ruleset = |peers: &[&str], ifaces: &[&str]| {
        let rules = pod_rules_with(&[8080], peers, ifaces);
        let table = netwarden_render::nft::build_table(&rules, &opts).unwrap();
        let sets: Vec<String> = table.sets.iter().map(|s| s.name.clone()).collect();
        (RenderedRuleset::nft(render_nft(&rules, &opts)), sets)
    };
    let (a, set_a) = ruleset(&[CLIENT_IP, "10.231.77.10"], &["nwv0", "nwv9"]);
    let (b, set_b) = ruleset(&[CLIENT_IP, "10.231.77.11"], &["nwv0"]);
    let (c, set_c) = ruleset(&[CLIENT_IP, "10.231.77.12"], &["nwv0"]);
    assert_ne!(set_a, set_b);

    let mut dp = NftDataplane::new();
    assert_eq!(dp.apply(&pod, &a).unwrap(), ApplyOutcome::Applied);
    let (sets, chains) = objects(&pod);
    assert_eq!(sets, set_a);
    assert!(chains.contains(&"in_1".to_string()), "{chains:?}");
    assert!(connect(&client, 8080).0.is_ok());

    assert_eq!(dp.apply(&pod, &b).unwrap(), ApplyOutcome::Applied);
    let (sets, chains) = objects(&pod);
    assert!(
        sets.contains(&set_a[0]) && sets.contains(&set_b[0]),
        "{sets:?}"
    );
    assert!(!chains.contains(&"in_1".to_string()), "{chains:?}");
    assert!(connect(&client, 8080).0.is_ok());

    assert_eq!(dp.apply(&pod, &c).unwrap(), ApplyOutcome::Applied);
    let (mut sets, _) = objects(&pod);
    sets.sort();
    let mut want = vec![set_b[0].clone(), set_c[0].clone()];
    want.sort();
    assert_eq!(sets, want, "A two applies stale is gone, B kept");
    assert!(connect(&client, 8080).0.is_ok());

    // A restarted agent (new dataplane): every set found is kept once, then collected.
    let mut dp = NftDataplane::new();
    assert_eq!(dp.apply(&pod, &a).unwrap(), ApplyOutcome::Applied);
    assert_eq!(objects(&pod).0.len(), 3);
    assert_eq!(dp.apply(&pod, &b).unwrap(), ApplyOutcome::Applied);
    let (mut sets, _) = objects(&pod);
    sets.sort();
    let mut want = vec![set_a[0].clone(), set_b[0].clone()];
    want.sort();
    assert_eq!(sets, want);
    assert!(connect(&client, 8080).0.is_ok());

    // A failed transaction leaves the state unknown: re-read, nothing lost.
    let bad = RenderedRuleset::nft(format!(
        "{}add rule inet netwarden in_0 bogus-statement\n",
        c.nft.as_deref().unwrap()
    ));
    assert!(dp.apply(&pod, &bad).is_err());
    assert!(dp.state(&pod).is_none());
    assert_eq!(dp.apply(&pod, &c).unwrap(), ApplyOutcome::Applied);
    assert_eq!(
        objects(&pod).0.len(),
        3,
        "unknown state keeps every set once"
    );
    assert!(connect(&client, 8080).0.is_ok());

    // A batch over two netns (applied in parallel): each gets its own planned transaction.
    let batch = vec![(pod.clone(), b.clone()), (client.clone(), a.clone())];
    let out = dp.apply_many(&batch);
    assert!(
        out.iter().all(|r| matches!(r, Ok(ApplyOutcome::Applied))),
        "{out:?}"
    );
    assert_eq!(objects(&client).0, set_a);
    assert!(dp.state(&client).is_some() && dp.state(&pod).is_some());
    assert!(connect(&client, 8080).0.is_ok());
    let again = dp.apply_many(&batch);
    assert!(
        again
            .iter()
            .all(|r| matches!(r, Ok(ApplyOutcome::Unchanged))),
        "{again:?}"
    );
    dp.remove(&client).unwrap();
    dp.remove(&pod).unwrap();
    assert!(tables(&pod).trim().is_empty());
    assert!(tables(&client).trim().is_empty());
}
