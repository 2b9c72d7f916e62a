//! Real-kernel test of the nft dataplane in a throwaway netns pair joined by a veth:
//! apply, read back, skip unchanged, atomic failure, TCP allowed/refused with RST, removal that
//! leaves other tables alone; in-place updates that keep the sets old rules use for one more
//! apply and collect them (and departed interfaces' chains) afterwards, also after a restart.
//! Both ways of sending transactions: `nft -i` sessions (the default) and one-shot `nft -f`;
//! sessions that die, hang, or outlive their netns.

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
    in_real_netns("a", NftDataplane::with_sessions(), true);
}

#[test]
fn nft_dataplane_in_real_netns_one_shot() {
    if !root_or_skip() {
        return;
    }
    in_real_netns("o", NftDataplane::one_shot(), false);
}

fn in_real_netns(tag: &str, mut dp: NftDataplane, sessions: bool) {
    let (guard, pod, client) = topology(tag);

    // A table we do not own, which must survive everything below.
    exec_in(&pod, "nft", &["-f", "-"], Some(b"table inet other {\n chain c {\n  type filter hook input priority 10; policy accept;\n }\n}\n")).unwrap();

    let _l1 = listen(&pod, 8080);
    let _l2 = listen(&pod, 8081);
    // Before any rules both ports connect.
    wait_reachable(&client, 8081);
    assert!(connect(&client, 8080).0.is_ok());

    let opts = RenderOptions::default();
    let ruleset = RenderedRuleset::nft(render_nft(&pod_rules(&[8080]), &opts));
    assert_eq!(dp.apply(&pod, &ruleset).unwrap(), ApplyOutcome::Applied);
    let session = dp.session_pid(&pod);
    assert_eq!(session.is_some(), sessions);
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
    let err = dp.apply(&pod, &bad).unwrap_err().to_string();
    // The error names what nft refused (a session narrows its echo to the failing command).
    assert!(
        err.contains("Error") && err.contains("bogus-statement") && err.len() < 2000,
        "{err}"
    );
    assert_eq!(
        dp.read_back(&pod).unwrap().as_deref(),
        Some(listed.as_str()),
        "failed apply left the table"
    );
    eprintln!("refused: {err}");
    assert_eq!(
        dp.apply(&pod, &ruleset).unwrap(),
        ApplyOutcome::Applied,
        "full resync after failure"
    );
    assert_eq!(dp.session_pid(&pod), session, "a refusal keeps the session");

    // Update: 8081 allowed too, replaced atomically.
    let wider = RenderedRuleset::nft(render_nft(&pod_rules(&[8080, 8081]), &opts));
    assert_eq!(dp.apply(&pod, &wider).unwrap(), ApplyOutcome::Applied);
    assert!(connect(&client, 8081).0.is_ok());

    // An open pod renders a removal: applied as a removal, and only our table goes.
    let mut open = pod_rules(&[]);
    open.interfaces[0].ingress = DirectionRules::open();
    let removal = RenderedRuleset::nft(render_nft(&open, &opts));
    assert_eq!(dp.apply(&pod, &removal).unwrap(), ApplyOutcome::Removed);
    assert_eq!(dp.session_pid(&pod), None, "a removal closes the session");
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
    assert_eq!(dp.sessions_open(), 0);
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
    updates_in_place("g", NftDataplane::with_sessions);
}

#[test]
fn updates_in_place_and_collects_stale_objects_one_shot() {
    if !root_or_skip() {
        return;
    }
    updates_in_place("h", NftDataplane::one_shot);
}

fn updates_in_place(tag: &str, new_dataplane: fn() -> NftDataplane) {
    let (_guard, pod, client) = topology(tag);
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

    let mut dp = new_dataplane();
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
    let mut dp = new_dataplane();
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

fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig).unwrap();
}

/// Whether link `name` exists in `ns`.
fn has_link(ns: &Path, name: &str) -> bool {
    netns::exec_in_unchecked(ns, "ip", &["link", "show", "dev", name], None)
        .unwrap()
        .status
        .success()
}

/// Waits (up to 10 s) until link `name` is gone from `ns`; panics otherwise.
fn wait_link_gone(ns: &Path, name: &str) {
    let start = Instant::now();
    while has_link(ns, name) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{name} still in {} after 10 s: its peer's netns is kept alive",
            ns.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until process `pid` (a child of this test process) has ended.
fn wait_zombie(pid: u32) {
    let start = Instant::now();
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The state follows the command name in parentheses.
        let state = stat.rsplit(')').next().unwrap_or_default().trim_start();
        if stat.is_empty() || state.starts_with('Z') {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{pid} still runs"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A session whose `nft` is killed, or stops answering, is replaced: the apply still lands
/// (the broken one through a re-planned one-shot `nft -f`), and later applies use a new session.
#[test]
fn sessions_survive_a_killed_or_hung_nft() {
    if !root_or_skip() {
        return;
    }
    use nix::sys::signal::Signal;
    let (_guard, pod, client) = topology("k");
    let _l1 = listen(&pod, 8080);
    let _l2 = listen(&pod, 8081);
    wait_reachable(&client, 8081);
    let opts = RenderOptions::default();
    let only_8080 = RenderedRuleset::nft(render_nft(&pod_rules(&[8080]), &opts));
    let only_8081 = RenderedRuleset::nft(render_nft(&pod_rules(&[8081]), &opts));
    let refused = |port| connect(&client, port).0.is_err();

    let mut dp = NftDataplane::with_sessions();
    assert_eq!(dp.apply(&pod, &only_8080).unwrap(), ApplyOutcome::Applied);
    let first = dp.session_pid(&pod).expect("a session");
    assert!(!refused(8080) && refused(8081));

    // Killed between two applies: noticed before use, a new session takes over.
    signal(first, Signal::SIGKILL);
    wait_zombie(first);
    assert_eq!(dp.apply(&pod, &only_8081).unwrap(), ApplyOutcome::Applied);
    let second = dp.session_pid(&pod).expect("a new session");
    assert_ne!(first, second);
    assert!(refused(8080) && !refused(8081));
    assert!(dp.state(&pod).is_some());

    // Stopped: no reply within the timeout, the session is killed and the transaction is
    // planned again against the kernel and sent with `nft -f`.
    signal(second, Signal::SIGSTOP);
    let start = Instant::now();
    assert_eq!(dp.apply(&pod, &only_8080).unwrap(), ApplyOutcome::Applied);
    let took = start.elapsed();
    assert!(took < Duration::from_secs(30), "{took:?}");
    assert_eq!(dp.session_pid(&pod), None, "the hung session is gone");
    assert!(!refused(8080) && refused(8081));
    assert!(
        !Path::new(&format!("/proc/{second}")).exists(),
        "the hung nft was killed and reaped"
    );

    // And the next apply gets a session again.
    assert_eq!(dp.apply(&pod, &only_8081).unwrap(), ApplyOutcome::Applied);
    assert!(dp.session_pid(&pod).is_some());
    assert!(refused(8080) && !refused(8081));
}

/// A session runs inside its pod's netns and so keeps it alive: deleting the netns must not
/// leave it behind. `remove()`, the check before each use, the sweep of a batch, and dropping
/// the dataplane each release it (the veth's peer goes once the pod netns really ends).
#[test]
fn sessions_release_deleted_netns() {
    if !root_or_skip() {
        return;
    }
    let opts = RenderOptions::default();
    let ruleset = RenderedRuleset::nft(render_nft(&pod_rules(&[8080]), &opts));
    // Another ruleset: an unchanged one would not even look at the netns.
    let other = RenderedRuleset::nft(render_nft(&pod_rules(&[8081]), &opts));
    let mut dp = NftDataplane::with_sessions();
    let mut topologies = Vec::new();
    for tag in ["r", "u", "s", "d"] {
        let (guard, pod, client) = topology(tag);
        assert_eq!(dp.apply(&pod, &ruleset).unwrap(), ApplyOutcome::Applied);
        assert!(dp.session_pid(&pod).is_some());
        topologies.push((guard, pod, client));
    }
    let pod_name = |pod: &Path| pod.file_name().unwrap().to_str().unwrap().to_string();
    let mut drops = topologies.into_iter();

    // remove(): the pod is gone, its session goes with it.
    let (_g, pod, client) = drops.next().unwrap();
    delete_named(&pod_name(&pod)).unwrap();
    assert!(
        has_link(&client, "nwv1"),
        "the session keeps the deleted netns alive until released"
    );
    dp.remove(&pod).unwrap();
    assert_eq!(dp.session_pid(&pod), None);
    wait_link_gone(&client, "nwv1");

    // The next apply: the path names no namespace any more; fails fast as gone.
    let (_g, pod, client) = drops.next().unwrap();
    delete_named(&pod_name(&pod)).unwrap();
    let start = Instant::now();
    let err = dp.apply(&pod, &other).unwrap_err();
    assert!(err.netns_gone(), "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(dp.session_pid(&pod), None);
    wait_link_gone(&client, "nwv1");

    // A batch for other netns sweeps the sessions of deleted ones.
    let (_g, pod, client) = drops.next().unwrap();
    delete_named(&pod_name(&pod)).unwrap();
    let out = dp.apply_many(&[(client.clone(), other.clone())]);
    assert!(matches!(out[..], [Ok(ApplyOutcome::Applied)]), "{out:?}");
    assert_eq!(dp.session_pid(&pod), None);
    wait_link_gone(&client, "nwv1");
    dp.remove(&client).unwrap();

    // Dropping the dataplane kills (and waits for) every session.
    let (_g, pod, client) = drops.next().unwrap();
    delete_named(&pod_name(&pod)).unwrap();
    assert!(has_link(&client, "nwv1"));
    drop(dp);
    wait_link_gone(&client, "nwv1");
}

/// At most `max_sessions` sessions; the least recently used is closed to open another, and
/// a batch beyond the bound falls back to one-shot `nft -f` for the rest. Every apply lands.
#[test]
fn sessions_are_bounded() {
    if !root_or_skip() {
        return;
    }
    let (_g1, pod, client) = topology("b");
    let opts = RenderOptions::default();
    let a = RenderedRuleset::nft(render_nft(&pod_rules(&[8080]), &opts));
    let b = RenderedRuleset::nft(render_nft(&pod_rules(&[8081]), &opts));
    let mut dp = NftDataplane::with_sessions().with_max_sessions(1);
    assert_eq!(dp.apply(&pod, &a).unwrap(), ApplyOutcome::Applied);
    assert_eq!(dp.apply(&client, &a).unwrap(), ApplyOutcome::Applied);
    assert_eq!(dp.sessions_open(), 1);
    assert!(dp.session_pid(&pod).is_none() && dp.session_pid(&client).is_some());

    let out = dp.apply_many(&[(pod.clone(), b.clone()), (client.clone(), b.clone())]);
    assert!(
        out.iter().all(|r| matches!(r, Ok(ApplyOutcome::Applied))),
        "{out:?}"
    );
    assert_eq!(dp.sessions_open(), 1);
    for ns in [&pod, &client] {
        let listed = dp.read_back(ns).unwrap().unwrap();
        assert!(listed.contains("dport 8081"), "{listed}");
        assert!(!listed.contains("dport 8080"), "{listed}");
    }

    // No sessions at all.
    let mut dp = dp.with_max_sessions(0);
    assert_eq!(dp.sessions_open(), 0);
    assert_eq!(dp.apply(&pod, &a).unwrap(), ApplyOutcome::Applied);
    assert_eq!(dp.sessions_open(), 0);
}

/// A UDP exchange from `ns`: sends to the pod's `port`, waits up to 1 s for the echo.
fn udp_probe(ns: &Path, port: u16) -> (std::io::Result<()>, Duration) {
    let addr: SocketAddr = format!("{POD_IP}:{port}").parse().unwrap();
    run_in(ns, move || {
        let start = Instant::now();
        let r = (|| {
            let s = std::net::UdpSocket::bind("0.0.0.0:0")?;
            s.connect(addr)?;
            s.set_read_timeout(Some(Duration::from_secs(1)))?;
            s.send(b"ping")?;
            let mut buf = [0u8; 16];
            s.recv(&mut buf).map(|_| ())
        })();
        (r, start.elapsed())
    })
    .unwrap()
}

/// Pod rules allowing TCP and UDP `port` from `peers` on nwv0.
fn tcp_udp_rules(port: u16, peers: &[&str]) -> PodRules {
    let mut rules = pod_rules_with(&[port], peers, &["nwv0"]);
    let add_udp = |iso: &mut Isolation| {
        if let Isolation::Isolated(r) = iso {
            if let PortMatch::Only(ports) = &mut r[0].clauses[0].ports {
                ports.push(PortRange {
                    protocol: Protocol::Udp,
                    ports: Some((port, port)),
                });
            }
        }
    };
    add_udp(&mut rules.interfaces[0].ingress.enforced);
    add_udp(&mut rules.interfaces[0].ingress.staged);
    rules
}

/// Replaces the rules (alternating peer sets) as fast as possible while TCP and UDP exchanges
/// run without pause: every allowed one succeeds without a retransmission (a dropped packet
/// costs 1 s), every denied TCP connection is refused.
fn rapid_replacements(tag: &str, mut dp: NftDataplane) {
    use std::io::ErrorKind;
    use std::sync::atomic::{AtomicBool, Ordering};
    let (_guard, pod, client) = topology(tag);
    // The kernel sends at most one ICMP error per second to a peer by default: lift the limit
    // as the lab does, so that denied UDP probes are mostly refused rather than timed out.
    exec_in(
        &pod,
        "sysctl",
        &[
            "-qw",
            "net.ipv4.icmp_ratelimit=0",
            "net.ipv4.icmp_msgs_per_sec=100000",
        ],
        None,
    )
    .unwrap();
    let (l1, l2) = (listen(&pod, 8080), listen(&pod, 8081));
    // UDP echo on 8080 and 8081 (8081 is denied: the ICMP error answers instead).
    let addr: SocketAddr = format!("{POD_IP}:8080").parse().unwrap();
    let echo = run_in(&pod, move || std::net::UdpSocket::bind(addr))
        .unwrap()
        .unwrap();
    echo.set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    wait_reachable(&client, 8080);
    let opts = RenderOptions::default();
    let a = RenderedRuleset::nft(render_nft(&tcp_udp_rules(8080, &[CLIENT_IP]), &opts));
    let b = RenderedRuleset::nft(render_nft(
        &tcp_udp_rules(8080, &[CLIENT_IP, "10.231.77.50"]),
        &opts,
    ));
    dp.apply(&pod, &a).unwrap();
    let stop = AtomicBool::new(false);
    let applying = AtomicBool::new(false);
    let (mut slow, mut wrong, mut during) = (Vec::new(), Vec::new(), 0usize);
    std::thread::scope(|scope| {
        // Accept (and close) every connection: a full accept queue would drop SYNs.
        let drain = |l: &TcpListener| {
            l.set_nonblocking(true).unwrap();
            while !stop.load(Ordering::SeqCst) {
                if l.accept().is_err() {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        };
        scope.spawn(move || drain(&l1));
        scope.spawn(move || drain(&l2));
        scope.spawn(|| {
            let mut buf = [0u8; 16];
            while !stop.load(Ordering::SeqCst) {
                if let Ok((n, from)) = echo.recv_from(&mut buf) {
                    let _ = echo.send_to(&buf[..n], from);
                }
            }
        });
        let prober = scope.spawn(|| {
            let mut log = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let during = applying.load(Ordering::SeqCst);
                let (ok, t1) = connect(&client, 8080);
                let (no, t2) = connect(&client, 8081);
                let refused = no.is_err_and(|e| e.kind() == ErrorKind::ConnectionRefused);
                log.push((during, ok.is_ok(), t1, refused, t2));
                // A denied UDP probe must never be answered; refused or timed out are both
                // fine (ICMP errors are still rate-limited now and then, one-shot `nft -f` or
                // not), so its time does not count.
                let (ok, t1) = udp_probe(&client, 8080);
                let (no, _) = udp_probe(&client, 8081);
                log.push((during, ok.is_ok(), t1, no.is_err(), Duration::ZERO));
            }
            log
        });
        std::thread::sleep(Duration::from_millis(50));
        applying.store(true, Ordering::SeqCst);
        let start = Instant::now();
        let mut i = 0;
        while i < 200 || start.elapsed() < Duration::from_secs(2) {
            let r = if i % 2 == 0 { &b } else { &a };
            assert_eq!(dp.apply(&pod, r).unwrap(), ApplyOutcome::Applied);
            i += 1;
        }
        eprintln!("{tag}: {i} applies in {:?}", start.elapsed());
        applying.store(false, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(50));
        stop.store(true, Ordering::SeqCst);
        for (d, ok, t1, no, t2) in prober.join().unwrap() {
            during += usize::from(d);
            if !ok || !no {
                wrong.push((ok, no));
            }
            if t1.max(t2) > Duration::from_millis(500) {
                slow.push((t1, t2));
            }
        }
    });
    eprintln!("{tag}: {during} probes during the applies, slow {slow:?}, wrong {wrong:?}");
    assert!(during >= 10, "{during}");
    assert!(wrong.is_empty(), "{wrong:?}");
    assert!(slow.is_empty(), "{slow:?}");
}

#[test]
fn rapid_replacements_lose_no_packets() {
    if !root_or_skip() {
        return;
    }
    rapid_replacements("q", NftDataplane::with_sessions());
}

#[test]
fn rapid_replacements_lose_no_packets_one_shot() {
    if !root_or_skip() {
        return;
    }
    rapid_replacements("w", NftDataplane::one_shot());
}
