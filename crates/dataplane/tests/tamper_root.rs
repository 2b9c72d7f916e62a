//! Tamper repair against the real kernel (SPEC 5, "Tamper repair"), both backends: a pod with
//! NET_ADMIN in its own netns changes netwarden's rules with the system tools, as an attacker
//! would; [`Dataplane::verify`] must see every change, [`Dataplane::repair`] must put back
//! exactly the computed rules (what was added goes too), and real TCP probes must show the
//! denied port refused again and the allowed one open.
//!
//! Also: what is not tampering. The dataplane's own applies verify clean (random tables, both
//! families), a table of the pod's own beside netwarden's is not a difference, and an
//! earlier-priority chain of the pod's that sets the packet and conntrack mark bits netwarden
//! uses (`--allow-mark`, `--staged-mark`) changes no verdict.
//!
//! ```text
//!   client (eth0 10.233.0.2, fd33::2) ──veth── (eth0 10.233.0.1, fd33::1) server
//! ```

use std::path::{Path, PathBuf};

use netwarden_dataplane::iptables_apply::IptablesDataplane;
use netwarden_dataplane::netns::exec_in;
use netwarden_dataplane::tamper::VerifyScope;
use netwarden_dataplane::{ApplyOutcome, Dataplane, NftDataplane};
use netwarden_engine::testing::{
    interface, pod_with_interfaces, pods_with, policy, rule, selector, tcp,
};
use netwarden_engine::{
    Engine, EngineOptions, Mode, NetworkId, PodKey, PodRules, Policy, PolicyKind,
};
use netwarden_render::RenderOptions;
use netwarden_testing::{
    assert_connects, assert_refused_fast, listen, pin_neighbours, root_or_skip, veth, Lcg,
    Namespaces,
};

const ALLOWED: u16 = 8080;
const DENIED: u16 = 8081;

struct Topology {
    _namespaces: Namespaces,
    server: PathBuf,
    client: PathBuf,
}

fn topology(tag: &str) -> Topology {
    let mut namespaces = Namespaces::new(&format!("nwtmp{tag}"));
    let (server, client) = (namespaces.create("s"), namespaces.create("c"));
    veth(
        &server,
        "eth0",
        &["10.233.0.1/24", "fd33::1/64"],
        &client,
        "eth0",
        &["10.233.0.2/24", "fd33::2/64"],
    );
    pin_neighbours(&server, "eth0", &client, "eth0");
    Topology {
        _namespaces: namespaces,
        server,
        client,
    }
}

/// The server's rules: ingress TCP `ALLOWED` from the client only; with `monitored`, a
/// monitored policy beside it (the chains then use the mark bits).
fn server_rules(monitored: bool) -> PodRules {
    let mut engine = Engine::new(EngineOptions::default());
    engine.set_pod(pod_with_interfaces(
        "ns",
        "server",
        &[("app", "web")],
        vec![interface(
            "eth0",
            NetworkId::Primary,
            &["10.233.0.1", "fd33::1"],
        )],
    ));
    engine.set_pod(pod_with_interfaces(
        "ns",
        "client",
        &[("app", "client")],
        vec![interface(
            "eth0",
            NetworkId::Primary,
            &["10.233.0.2", "fd33::2"],
        )],
    ));
    let allow = rule(vec![pods_with(&[("app", "client")])], vec![tcp(ALLOWED)]);
    engine.set_policy(web_policy("allow", Some(vec![allow])));
    if monitored {
        let mut staged = web_policy("lockdown", Some(vec![]));
        staged.mode = Mode::Monitor;
        engine.set_policy(staged);
    }
    engine.pod_rules(&PodKey::new("ns", "server")).unwrap()
}

fn web_policy(name: &str, ingress: Option<Vec<netwarden_engine::PolicyRule>>) -> Policy {
    policy(
        PolicyKind::NetworkPolicy,
        "ns",
        name,
        selector(&[("app", "web")]),
        ingress,
        None,
    )
}

/// Runs a shell script inside `ns` (the attacker's commands); it must succeed.
fn attack(ns: &Path, script: &str) {
    let out = exec_in(ns, "sh", &["-c", script], None).unwrap();
    assert!(
        out.status.success(),
        "tamper script failed: {script}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Text of a command run in `ns`.
fn text(ns: &Path, program: &str, args: &[&str]) -> String {
    let out = exec_in(ns, program, args, None).unwrap();
    String::from_utf8(out.stdout).unwrap()
}

/// What netwarden owns in the server netns, as the system tools list it without counters: the
/// rules read back must be these again after each repair.
fn listing(ns: &Path, backend: &str) -> String {
    if backend == "nft" {
        text(ns, "nft", &["-s", "list", "table", "inet", "netwarden"])
    } else {
        let mut all = String::new();
        for tool in ["iptables-save", "ip6tables-save"] {
            for line in text(ns, tool, &[]).lines() {
                // Chain counters and the dump's timestamps are not rules.
                if line.starts_with('#') {
                    continue;
                }
                let line = match line.split_once(" [") {
                    Some((head, _)) if line.starts_with(':') => head,
                    _ => line,
                };
                all.push_str(line);
                all.push('\n');
            }
        }
        let mut sets: Vec<String> = text(ns, "ipset", &["save"])
            .lines()
            // The hash seed is drawn again when a set is created again.
            .map(|l| l.split(" initval ").next().unwrap().to_string())
            .collect();
        sets.sort();
        all + &sets.join("\n")
    }
}

/// The probes: the allowed port connects, the denied one is refused with a reset, both
/// families.
fn probes_hold(t: &Topology, why: &str) {
    for addr in ["10.233.0.1", "[fd33::1]"] {
        assert_connects(&t.client, &format!("{addr}:{ALLOWED}"), why);
        assert_refused_fast(&t.client, &format!("{addr}:{DENIED}"), why);
    }
}

/// One tamper: `script` run in the server netns must be seen by `verify`, then `repair` must
/// leave the kernel listing what it listed after the apply, with the probes as before.
/// `opens`: the tamper lets the denied port through (checked, so that the test proves the
/// attack was real).
fn tamper_and_repair<D: Dataplane>(
    dp: &mut D,
    t: &Topology,
    backend: &str,
    name: &str,
    script: &str,
    opens: bool,
) {
    let applied = listing(&t.server, backend);
    attack(&t.server, script);
    if opens {
        assert_connects(
            &t.client,
            &format!("10.233.0.1:{DENIED}"),
            &format!("{backend} {name}: the tamper opens the denied port"),
        );
    }
    let seen = dp.verify(&t.server, &VerifyScope::all()).unwrap();
    assert!(
        !seen.is_empty(),
        "{backend} {name}: verify saw no difference\n{}",
        listing(&t.server, backend)
    );
    dp.repair(&t.server).unwrap();
    let after = dp.verify(&t.server, &VerifyScope::all()).unwrap();
    assert!(after.is_empty(), "{backend} {name}: after repair {after:?}");
    assert_eq!(
        listing(&t.server, backend),
        applied,
        "{backend} {name}: the rules read back equal the computed ones"
    );
    probes_hold(t, &format!("{backend} {name}: repaired"));
}

/// Names of netwarden's base chains and sets in the server netns (nft).
fn nft_parts(ns: &Path) -> (Vec<String>, Vec<String>) {
    let json = text(ns, "nft", &["-j", "list", "table", "inet", "netwarden"]);
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    let mut base = Vec::new();
    let mut sets = Vec::new();
    for item in value["nftables"].as_array().unwrap() {
        if let Some(chain) = item.get("chain") {
            if chain.get("hook").is_some() {
                base.push(chain["name"].as_str().unwrap().to_string());
            }
        }
        if let Some(set) = item.get("set") {
            sets.push(set["name"].as_str().unwrap().to_string());
        }
    }
    assert!(!base.is_empty(), "{json}");
    (base, sets)
}

#[test]
fn nft_every_tamper_is_seen_and_repaired() {
    if !root_or_skip() {
        return;
    }
    let t = topology("n");
    // Dual-stack listeners: IPv4 arrives as mapped addresses.
    let _a = listen(&t.server, &format!("[::]:{ALLOWED}"));
    let _d = listen(&t.server, &format!("[::]:{DENIED}"));
    let mut dp = NftDataplane::new(RenderOptions::default());
    let ruleset = dp.render(&server_rules(false)).unwrap();
    assert_eq!(
        dp.apply(&t.server, &ruleset).unwrap(),
        ApplyOutcome::Applied
    );
    probes_hold(&t, "nft applied");
    assert_eq!(dp.verify(&t.server, &VerifyScope::all()).unwrap(), vec![]);

    // A table of the pod's own, even one accepting everything first, is not tampering.
    attack(
        &t.server,
        "nft add table inet mine; nft add chain inet mine in '{ type filter hook input priority -300; policy accept; }'; nft add rule inet mine in accept",
    );
    assert_eq!(dp.verify(&t.server, &VerifyScope::all()).unwrap(), vec![]);
    probes_hold(
        &t,
        "nft: the pod's own accept cannot undo netwarden's reject",
    );

    let (base, sets) = nft_parts(&t.server);
    let first = &base[0];
    let set = sets
        .iter()
        .find(|s| {
            text(&t.server, "nft", &["list", "set", "inet", "netwarden", s]).contains("10.233.0.2")
        })
        .unwrap_or_else(|| panic!("a set holds the client: {sets:?}"))
        .clone();
    let insert_accepts: String = base
        .iter()
        .map(|c| format!("nft insert rule inet netwarden {c} accept;"))
        .collect();
    let chain_line = text(
        &t.server,
        "nft",
        &["list", "chain", "inet", "netwarden", first],
    )
    .lines()
    .find(|l| l.contains("hook"))
    .unwrap()
    .trim()
    .replace("policy accept;", "policy drop;");
    let tampers: Vec<(&str, String, bool)> = vec![
        ("delete table", "nft delete table inet netwarden".into(), true),
        ("flush table", "nft flush table inet netwarden".into(), true),
        ("flush ruleset", "nft flush ruleset".into(), true),
        ("accept at the top of each base chain", insert_accepts, true),
        (
            "chain policy",
            format!("nft add chain inet netwarden {first} '{{ {chain_line} }}'"),
            false,
        ),
        (
            "one set element deleted",
            format!("nft delete element inet netwarden {set} '{{ 10.233.0.2 }}'"),
            false,
        ),
        (
            "one set element added",
            format!("nft add element inet netwarden {set} '{{ 10.233.0.9 }}'"),
            false,
        ),
        (
            "table renamed",
            "nft list table inet netwarden | sed 's/table inet netwarden/table inet renamed/' > /tmp/nw-tamper-$$.nft && nft -f /tmp/nw-tamper-$$.nft; rc=$?; rm -f /tmp/nw-tamper-$$.nft; nft delete table inet netwarden; exit $rc".into(),
            // The copy rejects as the original did.
            false,
        ),
        (
            "chain added",
            "nft add chain inet netwarden extra".into(),
            false,
        ),
        (
            "set added",
            "nft add set inet netwarden extra '{ type ipv4_addr; }'".into(),
            false,
        ),
    ];
    for (name, script, opens) in &tampers {
        tamper_and_repair(&mut dp, &t, "nft", name, script, *opens);
    }
    // The renamed copy stays: it is the pod's own table now, not netwarden's.
    assert!(text(&t.server, "nft", &["list", "tables"]).contains("renamed"));
    // The earlier tampers left the pod's own table untouched (apart from `flush ruleset`,
    // which removed it): nothing of the pod's is repaired away.
    assert_eq!(dp.verify(&t.server, &VerifyScope::all()).unwrap(), vec![]);
}

/// A process holding a table with the `owner` flag in `ns` (an attacker's `nft -i`): while it
/// lives, nobody else may change or delete that table. Killed on drop.
struct HeldTable(std::process::Child);

impl HeldTable {
    /// Deletes `inet netwarden` and creates a table of that name, held, whose input chain
    /// accepts everything.
    fn take_netwardens_name(ns: &Path) -> HeldTable {
        use std::io::Write;
        use std::process::{Command, Stdio};
        let mut child = Command::new("nsenter")
            .arg(format!("--net={}", ns.display()))
            .args(["nft", "-i"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.as_mut().unwrap();
        stdin
            .write_all(
                b"delete table inet netwarden\n\
                  add table inet netwarden { flags owner; }\n\
                  add chain inet netwarden in { type filter hook input priority 0; policy accept; }\n\
                  add rule inet netwarden in accept\n",
            )
            .unwrap();
        stdin.flush().unwrap();
        let held = HeldTable(child);
        let start = std::time::Instant::now();
        while !text(ns, "nft", &["list", "ruleset"]).contains("flags owner") {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(5),
                "the attacker's table never appeared"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        held
    }
}

impl Drop for HeldTable {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Netwarden's tables (its name and the names it moves to) in `ns`.
fn netwarden_tables(ns: &Path) -> Vec<String> {
    text(ns, "nft", &["list", "tables"])
        .lines()
        .filter_map(|l| l.strip_prefix("table inet "))
        .filter(|name| netwarden_render::nft::is_netwarden_table_name(name))
        .map(str::to_string)
        .collect()
}

/// A pod that deletes netwarden's table and creates one of that name with the `owner` flag
/// (which nobody else may change or delete while its process lives) does not keep itself open:
/// the repair puts the rules in a table of a new, random name; an agent started afresh does
/// the same; once the pod lets its table go, the rules return to `inet netwarden` and the
/// other table goes. Nothing of the pod's is deleted while it holds it.
#[test]
fn nft_a_table_held_by_the_pod_does_not_keep_it_open() {
    if !root_or_skip() {
        return;
    }
    let t = topology("o");
    let _a = listen(&t.server, &format!("[::]:{ALLOWED}"));
    let _d = listen(&t.server, &format!("[::]:{DENIED}"));
    let rules = server_rules(true);
    let mut dp = NftDataplane::new(RenderOptions::default());
    let ruleset = dp.render(&rules).unwrap();
    dp.apply(&t.server, &ruleset).unwrap();
    probes_hold(&t, "applied");

    let held = HeldTable::take_netwardens_name(&t.server);
    assert_connects(
        &t.client,
        &format!("10.233.0.1:{DENIED}"),
        "the held table replaced netwarden's: the denied port is open",
    );
    let seen = dp.verify(&t.server, &VerifyScope::all()).unwrap();
    assert!(!seen.is_empty());
    dp.repair(&t.server).unwrap();
    let moved = dp.table_name(&t.server).to_string();
    assert_ne!(
        moved, "netwarden",
        "the rules moved to a table of another name"
    );
    assert_eq!(dp.verify(&t.server, &VerifyScope::all()).unwrap(), vec![]);
    probes_hold(&t, "repaired into a table of another name");
    // The table of the new name is tampered with in turn: repaired under its name.
    attack(&t.server, &format!("nft flush table inet {moved}"));
    assert!(!dp
        .verify(&t.server, &VerifyScope::all())
        .unwrap()
        .is_empty());
    dp.repair(&t.server).unwrap();
    assert_eq!(dp.table_name(&t.server), moved);
    probes_hold(&t, "the moved table repaired");
    // Counters still read (the monitored policy's evidence).
    dp.read_counters(&t.server).unwrap();

    // An agent started afresh (it knows nothing of the name): its apply moves the rules to a
    // name of its own, then deletes the table the earlier one left.
    let mut fresh = NftDataplane::new(RenderOptions::default());
    assert_eq!(
        fresh.apply(&t.server, &ruleset).unwrap(),
        ApplyOutcome::Applied
    );
    let renamed = fresh.table_name(&t.server).to_string();
    assert!(renamed != "netwarden" && renamed != moved, "{renamed}");
    let mut tables = netwarden_tables(&t.server);
    tables.sort();
    let mut expected = vec!["netwarden".to_string(), renamed.clone()];
    expected.sort();
    assert_eq!(tables, expected, "the pod's table and the new one only");
    assert_eq!(
        fresh.verify(&t.server, &VerifyScope::all()).unwrap(),
        vec![]
    );
    probes_hold(&t, "a fresh agent, the pod holding the name");

    // The pod lets go: its table goes with its process; the next full apply returns to the
    // name and deletes the other.
    drop(held);
    let mut back = NftDataplane::new(RenderOptions::default());
    back.apply(&t.server, &ruleset).unwrap();
    assert_eq!(back.table_name(&t.server), "netwarden");
    assert_eq!(netwarden_tables(&t.server), vec!["netwarden".to_string()]);
    assert_eq!(back.verify(&t.server, &VerifyScope::all()).unwrap(), vec![]);
    probes_hold(&t, "back under netwarden's name");
    // Removal leaves nothing of netwarden's.
    back.remove(&t.server).unwrap();
    assert_eq!(netwarden_tables(&t.server), Vec::<String>::new());
}

/// A pod's own table with flags (here `dormant`, which any NET_ADMIN pod may set) is printed
/// wrongly by libnftables 1.0.6 in JSON, corrupting the heap of the process that lists it
/// (see `nft_netlink`). Nothing netwarden does in-process may list it: a hundred rounds of
/// every reading the agent does (adoption by a fresh dataplane, comparison, counters, repair)
/// beside such a table, and the process is alive, the comparisons clean, the probes right.
#[test]
fn nft_a_flagged_table_of_the_pod_cannot_crash_the_agent() {
    if !root_or_skip() {
        return;
    }
    let t = topology("f");
    let _a = listen(&t.server, &format!("[::]:{ALLOWED}"));
    let _d = listen(&t.server, &format!("[::]:{DENIED}"));
    let rules = server_rules(true);
    let mut dp = NftDataplane::new(RenderOptions::default());
    let ruleset = dp.render(&rules).unwrap();
    dp.apply(&t.server, &ruleset).unwrap();
    attack(
        &t.server,
        "nft add table inet pod_dormant '{ flags dormant; }'; \
         nft add table ip pod_two '{ flags dormant; }'",
    );
    for round in 0..100 {
        let mut fresh = NftDataplane::new(RenderOptions::default());
        assert_eq!(
            fresh.apply(&t.server, &ruleset).unwrap(),
            ApplyOutcome::Applied,
            "round {round}"
        );
        assert_eq!(
            fresh.verify(&t.server, &VerifyScope::all()).unwrap(),
            vec![],
            "round {round}"
        );
        fresh.read_counters(&t.server).unwrap();
        if round % 10 == 0 {
            attack(&t.server, "nft flush table inet netwarden");
            assert!(!fresh
                .verify(&t.server, &VerifyScope::all())
                .unwrap()
                .is_empty());
            fresh.repair(&t.server).unwrap();
        }
    }
    probes_hold(&t, "beside the pod's flagged tables");
    assert!(text(&t.server, "nft", &["list", "tables"]).contains("pod_dormant"));
}

#[test]
fn iptables_every_tamper_is_seen_and_repaired() {
    if !root_or_skip() {
        return;
    }
    let t = topology("i");
    // Dual-stack listeners: IPv4 arrives as mapped addresses.
    let _a = listen(&t.server, &format!("[::]:{ALLOWED}"));
    let _d = listen(&t.server, &format!("[::]:{DENIED}"));
    let mut dp = IptablesDataplane::new(RenderOptions::default());
    let ruleset = dp.render(&server_rules(false)).unwrap();
    assert_eq!(
        dp.apply(&t.server, &ruleset).unwrap(),
        ApplyOutcome::Applied
    );
    probes_hold(&t, "iptables applied");
    assert_eq!(dp.verify(&t.server, &VerifyScope::all()).unwrap(), vec![]);

    let sets: Vec<String> = text(&t.server, "ipset", &["list", "-n"])
        .lines()
        .map(str::to_string)
        .collect();
    let set = sets
        .iter()
        .find(|s| text(&t.server, "ipset", &["list", s]).contains("10.233.0.2"))
        .unwrap_or_else(|| panic!("a set holds the client: {sets:?}"))
        .clone();
    let chain = text(&t.server, "iptables-save", &["-t", "filter"])
        .lines()
        .filter_map(|l| l.strip_prefix(':'))
        .map(|l| l.split(' ').next().unwrap().to_string())
        .find(|c| !["INPUT", "OUTPUT", "FORWARD"].contains(&c.as_str()))
        .expect("a chain of netwarden's");
    let tampers: Vec<(&str, String, bool)> = vec![
        ("iptables -F", "iptables -F".into(), true),
        (
            "iptables -F; -X",
            "iptables -F && iptables -X && ip6tables -F && ip6tables -X".into(),
            true,
        ),
        (
            "accept at the top of INPUT",
            "iptables -I INPUT 1 -j ACCEPT".into(),
            true,
        ),
        ("ipset flush", format!("ipset flush {set}"), false),
        ("chain policy", "iptables -P INPUT DROP".into(), false),
        (
            "one set element deleted",
            format!("ipset del {set} 10.233.0.2"),
            false,
        ),
        (
            "one set element added",
            format!("ipset add {set} 10.233.0.9"),
            false,
        ),
        (
            "chain renamed",
            format!("iptables -E {chain} renamed"),
            false,
        ),
        ("chain added", "iptables -N extra".into(), false),
    ];
    for (name, script, opens) in &tampers {
        tamper_and_repair(&mut dp, &t, "iptables", name, script, *opens);
    }
}

/// An earlier-priority chain of the pod's that sets netwarden's mark bits (packet and
/// connection) must change no verdict, with and without a monitored policy (the chains that
/// use the bits).
#[test]
fn marks_set_by_the_pod_change_no_verdict() {
    if !root_or_skip() {
        return;
    }
    let opts = RenderOptions::default();
    let bits = opts.allow_mark | opts.staged_mark;
    for monitored in [false, true] {
        let t = topology(if monitored { "m" } else { "k" });
        // Dual-stack listeners: IPv4 arrives as mapped addresses.
        let _a = listen(&t.server, &format!("[::]:{ALLOWED}"));
        let _d = listen(&t.server, &format!("[::]:{DENIED}"));
        let rules = server_rules(monitored);

        let mut nft = NftDataplane::new(RenderOptions::default());
        let ruleset = nft.render(&rules).unwrap();
        nft.apply(&t.server, &ruleset).unwrap();
        attack(
            &t.server,
            &format!(
                "nft add table inet mine; \
                 nft add chain inet mine pre '{{ type filter hook prerouting priority -400; policy accept; }}'; \
                 nft add rule inet mine pre meta mark set meta mark or {bits:#x} ct mark set ct mark or {bits:#x}; \
                 nft add chain inet mine in '{{ type filter hook input priority -400; policy accept; }}'; \
                 nft add rule inet mine in meta mark set meta mark or {bits:#x}"
            ),
        );
        probes_hold(&t, &format!("nft, marks preset, monitored={monitored}"));
        assert_eq!(nft.verify(&t.server, &VerifyScope::all()).unwrap(), vec![]);
        nft.remove(&t.server).unwrap();
        attack(&t.server, "nft delete table inet mine");

        let mut ipt = IptablesDataplane::new(RenderOptions::default());
        let ruleset = ipt.render(&rules).unwrap();
        ipt.apply(&t.server, &ruleset).unwrap();
        for tool in ["iptables", "ip6tables"] {
            attack(
                &t.server,
                &format!(
                    "{tool} -t mangle -A PREROUTING -j MARK --set-xmark {bits:#x}/{bits:#x} && \
                     {tool} -t mangle -A PREROUTING -j CONNMARK --set-xmark {bits:#x}/{bits:#x} && \
                     {tool} -t mangle -A INPUT -j MARK --set-xmark {bits:#x}/{bits:#x}"
                ),
            );
        }
        probes_hold(
            &t,
            &format!("iptables, marks preset, monitored={monitored}"),
        );
    }
}

/// The dataplane's own applies are never tampering: random rules (both families, monitored
/// chains, sets, every port form the fuzzer makes), applied one after the other into one
/// netns per backend (each backend removes the other's rules where it applies), each verifies
/// clean.
#[test]
fn own_applies_verify_clean() {
    if !root_or_skip() {
        return;
    }
    let mut namespaces = Namespaces::new("nwtmpo");
    let ns = namespaces.create("n");
    let ns_ipt = namespaces.create("i");
    let mut nft = NftDataplane::new(RenderOptions::default());
    let mut ipt = IptablesDataplane::new(RenderOptions::default());
    let mut random = Lcg::new(0x7a3b_e11d);
    let mut applied = 0;
    for round in 0..40 {
        let bytes = random.bytes(512);
        let rules = netwarden_render::fuzzing::pod_rules_from_bytes(&bytes);
        if let Ok(table) = nft.render(&rules) {
            if let Err(e) = nft.apply(&ns, &table) {
                panic!("nft round {round}: {e}: {rules:?}");
            }
            let seen = nft.verify(&ns, &VerifyScope::all()).unwrap();
            assert_eq!(seen, vec![], "nft round {round}: {rules:?}");
            applied += 1;
        }
        if round % 4 == 0 {
            if let Ok(ruleset) = ipt.render(&rules) {
                ipt.apply(&ns_ipt, &ruleset).unwrap();
                let seen = ipt.verify(&ns_ipt, &VerifyScope::all()).unwrap();
                assert_eq!(seen, vec![], "iptables round {round}: {rules:?}");
            }
        }
    }
    assert!(applied >= 20, "only {applied} of 40 random tables rendered");
}
