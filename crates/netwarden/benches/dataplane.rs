//! Data-plane benchmark (issue 3, performance part). Needs root: it builds network namespaces.
//!
//! Full run: `cargo bench -p netwarden --bench dataplane`. Under `cargo test --all-targets`
//! (no `--bench` argument) it runs a quick mode of a few seconds, so CI exercises every path.
//! `-- --only TEXT` (repeatable) measures only the data-path configurations whose label holds
//! one of the TEXTs, and skips the control part: e.g. `cargo bench -p netwarden --bench
//! dataplane -- --only "applies/100 ms"` for the revocation pair.
//!
//! Measured:
//! 1. **Data path.** New-connection rate from a client netns into a server netns (joined by a
//!    veth, static neighbours) whose pod is isolated by a NetworkPolicy allowing N peer
//!    addresses, the client's among them. Configurations, alternated in rounds so that drift of
//!    the (noisy, 2-core) machine hits them all alike: no firewall; a conntrack-only nft table
//!    (the floor of any stateful firewall); netwarden's nft and iptables backends (rules built
//!    through Engine → render → Dataplane, as the agent does); and the seed's DANM Policer
//!    layout (one `-s <peer>/32 -p tcp --dport 80 -j ACCEPT` rule per peer, client's rule last,
//!    and in the middle); and netwarden's nft backend with learn mode on (issue 9: the learn
//!    rules run on every new connection); and revocation on vs off (SPEC 5): revocation adds no
//!    rule to the packet path, it deletes conntrack entries out of band after an apply, so what
//!    it costs the data path is the agent's pass over the conntrack table beside the traffic.
//!    Two nft configurations measure it: while the trial runs, a policy apply every 100 ms
//!    (alternating two rulesets that differ in where one peer other than the client is, through the
//!    dataplane as the agent applies them), each followed by a revocation pass judged by the
//!    new rules (`Dataplane::revoke_connections`, what the agent calls), or not. The passes
//!    are scheduled and scoped as the agent does (`netwarden_agent::revocations`): one per
//!    250 ms window for the changes in it, judged against what the previous pass judged; each
//!    change moves one filler peer, so a pass asks the kernel for that peer's connections
//!    only (a filtered dump; the first pass lists the whole table, every connection of the
//!    trial so far: reset connections linger 10 s in it), and revokes nothing: the client
//!    stays allowed. Reported per configuration: the median wall-clock rate and the CPU
//!    time per connection (this process's user + system time, which includes the server's
//!    firewall: the veth delivers in the sender's softirq context), and the paired per-round
//!    ratios of both. On a shared machine the wall-clock rate follows whatever else runs; the
//!    per-CPU-second rate does not, and equals the wall-clock rate of a dedicated machine (the
//!    loop is CPU-bound), so the targets are judged on it.
//! 2. **Control.** Apply latency of one netns (p50/p99, nft and iptables) for a ~20-rule,
//!    1,000-element ruleset; a full sync of 110 pod netns through `Syncer`; rules per pod at
//!    10, 1,000 and 10,000 peers.
//!
//! Peer addresses are spread (every third address) so that they cannot merge into ranges or
//! prefixes: the sets hold one element per peer, like real pod IPs. Every netns is named
//! `nwbench-<pid>-…` and deleted by a drop guard, also on panic. Traffic only flows between the
//! namespaces created here.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::resource::{getrusage, UsageWho};
use nix::sys::socket::{
    bind, connect, listen, setsockopt, shutdown, socket, sockopt, AddressFamily, Backlog, Shutdown,
    SockFlag, SockType, SockaddrIn,
};
use nix::sys::time::{TimeVal, TimeValLike};

use netwarden_agent::revocations::{Revocations, REVOCATION_DELAY};
use netwarden_agent::sync::{Reconciler, Syncer};
use netwarden_dataplane::iptables_apply::{iptables_variant, IptablesDataplane, IptablesVariant};
use netwarden_dataplane::netns::exec_in;
use netwarden_dataplane::{ApplyOutcome, Backend, Dataplane, Netns, NftDataplane};
use netwarden_engine::testing::{ip_block, namespace, netpol, pod, pods_peer, rule, selector, tcp};
use netwarden_engine::{Engine, EngineOptions, LabelSelector, Mode, PodKey, PodRules, Protocol};
use netwarden_render::iptables::{render_iptables, IptablesRuleset};
use netwarden_render::nft::build_table;
use netwarden_render::{render_nft, rule_count, RenderOptions};
use netwarden_testing::{root_or_skip, Namespaces};

// ----- parameters --------------------------------------------------------------------------

/// Sizes of one run: the full measurement or the quick CI mode.
struct Params {
    quick: bool,
    /// `--only`: the data-path configurations to measure (label holds one); empty: all.
    only: Vec<String>,
    /// Peer counts of the netwarden-nft configurations; the last one is the headline.
    peer_counts: Vec<usize>,
    rounds: usize,
    trial: Duration,
    warmup: Duration,
    client_threads: usize,
    acceptor_threads: usize,
    apply_iterations: usize,
    sync_namespaces: usize,
    sync_pods_per_namespace: usize,
    sync_repeats: usize,
    /// ipBlocks of the large-policy sync (the hardening issue's 40,000).
    large_blocks: usize,
}

impl Params {
    fn new(quick: bool, only: Vec<String>) -> Params {
        if quick {
            Params {
                quick,
                only,
                peer_counts: vec![10, 1_000],
                rounds: 1,
                trial: Duration::from_millis(150),
                warmup: Duration::from_millis(20),
                client_threads: 2,
                acceptor_threads: 2,
                apply_iterations: 20,
                sync_namespaces: 2,
                sync_pods_per_namespace: 5,
                sync_repeats: 1,
                large_blocks: 2_000,
            }
        } else {
            Params {
                quick,
                only,
                peer_counts: vec![10, 1_000, 10_000],
                rounds: 15,
                trial: Duration::from_secs(1),
                warmup: Duration::from_millis(200),
                client_threads: 2,
                acceptor_threads: 2,
                apply_iterations: 200,
                sync_namespaces: 10,
                sync_pods_per_namespace: 11,
                sync_repeats: 3,
                large_blocks: 40_000,
            }
        }
    }

    fn headline_peers(&self) -> usize {
        *self.peer_counts.last().expect("peer counts")
    }

    fn selected(&self, label: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| label.contains(o.as_str()))
    }
}

// ----- addresses and the model -------------------------------------------------------------

const NS: &str = "bench";
const SERVER: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
/// The client's address: one of the allowed peers.
const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 100, 200, 1);
/// A second client address that no configuration allows (checks the firewalls filter).
const DENIED: Ipv4Addr = Ipv4Addr::new(10, 101, 0, 1);
const PORT: u16 = 80;
const CLIENT_MAC: &str = "02:6e:77:00:00:01";
const SERVER_MAC: &str = "02:6e:77:00:00:02";

/// The `i`-th filler peer: every third address of 10.100.0.0/16, so no two are adjacent
/// (10,000 of them end at 10.100.117.49, below `CLIENT`).
fn filler(i: usize) -> Ipv4Addr {
    let base = u32::from(Ipv4Addr::new(10, 100, 0, 0));
    Ipv4Addr::from(base + 3 * i as u32 + 1)
}

/// `n` allowed peers in rule order: `n - 1` fillers with the client at `client_pos`.
fn peer_list(n: usize, client_pos: usize) -> Vec<Ipv4Addr> {
    let mut peers: Vec<Ipv4Addr> = (0..n - 1).map(filler).collect();
    peers.insert(client_pos.min(n - 1), CLIENT);
    peers
}

/// The server pod's rules when a NetworkPolicy allows TCP 80 from `n` peer pods (the client
/// pod among them), computed by the engine like the agent does.
fn server_rules(n: usize) -> PodRules {
    let mut engine = server_engine(n);
    engine
        .pod_rules(&PodKey::new(NS, "server"))
        .expect("server pod")
}

/// The engine behind [`server_rules`]: `n` peer pods (the client labelled `kind: client`, the
/// fillers `kind: filler`), the server, and the enforced policy allowing every peer.
fn server_engine(n: usize) -> Engine {
    let mut engine = Engine::new(EngineOptions::default());
    // Pods first, then the policy: the policy resolves its peer set once.
    for (i, addr) in peer_list(n, n - 1).iter().enumerate() {
        let kind = if *addr == CLIENT { "client" } else { "filler" };
        engine.set_pod(pod(
            NS,
            &format!("peer-{i}"),
            &[("role", "peer"), ("kind", kind)],
            &[&addr.to_string()],
        ));
    }
    engine.set_pod(pod(
        NS,
        "server",
        &[("app", "server")],
        &[&SERVER.to_string()],
    ));
    engine.set_policy(netpol(
        NS,
        "allow-peers",
        selector(&[("app", "server")]),
        Some(vec![rule(
            vec![pods_peer(Some(selector(&[("role", "peer")])), None)],
            vec![tcp(PORT)],
        )]),
        None,
    ));
    engine
}

/// How many admin policy rules stand in front of the NetworkPolicy in the admin configuration
/// (issue 23: "50 admin rules, whole-namespace subjects, 10,000 peer pods").
const ADMIN_RULES: usize = 50;

/// The server pod of [`server_rules`] with [`ADMIN_RULES`] admin policy rules in front (SPEC
/// 8): the `n` peers spread over ten namespaces (`team: t0`…`t9`, the client in `t0`), the
/// NetworkPolicy allowing `role: peer` pods of every namespace, and ten AdminNetworkPolicies
/// whose subject is the server's whole namespace, five rules each, every peer a whole
/// namespace: 49 rules a connection from the client walks past (Deny of other namespaces, and
/// of the client's namespace on other ports), the last a Pass of the client's namespace on the
/// port, which hands it to the NetworkPolicy. Each admin rule is one kernel rule on a peer set,
/// whatever the number of pods behind it.
fn server_rules_admin(n: usize) -> PodRules {
    use netwarden_engine::testing::{admin_policy, admin_rule, in_namespaces};
    use netwarden_engine::{AdminAction, AdminKind, AdminPeer, AdminPort, PortRange};
    let mut engine = Engine::new(EngineOptions::default());
    engine.set_namespace(namespace(NS, &[("team", "server")]));
    for t in 0..10 {
        engine.set_namespace(namespace(
            &format!("peers-{t}"),
            &[("team", &format!("t{t}"))],
        ));
    }
    for (i, addr) in peer_list(n, n - 1).iter().enumerate() {
        let t = if *addr == CLIENT { 0 } else { i % 10 };
        engine.set_pod(pod(
            &format!("peers-{t}"),
            &format!("peer-{i}"),
            &[("role", "peer")],
            &[&addr.to_string()],
        ));
    }
    engine.set_pod(pod(
        NS,
        "server",
        &[("app", "server")],
        &[&SERVER.to_string()],
    ));
    engine.set_policy(netpol(
        NS,
        "allow-peers",
        selector(&[("app", "server")]),
        Some(vec![rule(
            vec![pods_peer(
                Some(selector(&[("role", "peer")])),
                Some(selector(&[])),
            )],
            vec![tcp(PORT)],
        )]),
        None,
    ));
    for p in 0..ADMIN_RULES / 5 {
        let rules = (0..5)
            .map(|r| {
                let index = p * 5 + r;
                if index == ADMIN_RULES - 1 {
                    return admin_rule(
                        AdminAction::Pass,
                        vec![AdminPeer::Pods(in_namespaces(&[("team", "t0")]))],
                        Some(vec![AdminPort::Numbers(PortRange {
                            protocol: Protocol::Tcp,
                            ports: Some((PORT, PORT)),
                        })]),
                    );
                }
                // Namespaces t1…t9 denied outright; t0 on ports the client does not use.
                let team = index % 10;
                let ports = (team == 0).then(|| {
                    vec![AdminPort::Numbers(PortRange {
                        protocol: Protocol::Tcp,
                        ports: Some((1000 + index as u16, 1000 + index as u16)),
                    })]
                });
                admin_rule(
                    AdminAction::Deny,
                    vec![AdminPeer::Pods(in_namespaces(&[(
                        "team",
                        &format!("t{team}"),
                    )]))],
                    ports,
                )
            })
            .collect();
        engine.set_admin_policy(admin_policy(
            AdminKind::AdminNetworkPolicy,
            &format!("admin-{p}"),
            p as u32,
            in_namespaces(&[("team", "server")]),
            rules,
            vec![],
        ));
    }
    engine
        .pod_rules(&PodKey::new(NS, "server"))
        .expect("server pod")
}

/// Addresses no configuration uses: where [`server_rules_moved`] moves a filler peer (the
/// `k`-th move goes to the `k`-th address from here).
const MOVED_FILLER: Ipv4Addr = Ipv4Addr::new(10, 100, 250, 1);

/// How many rulesets a churning configuration cycles through: the installed one and the
/// filler peer at `CHURN_RULESETS - 1` other addresses. Two: each apply reuses the sets the
/// one before the last left (a cycle of more creates a 10,000-element set per apply, which
/// falls behind a 100 ms schedule on two cores). A revocation window (250 ms) takes three
/// changes, an odd number, so each pass finds the filler moved from where the last one
/// judged it: each pass has a lost peer to look at.
const CHURN_RULESETS: usize = 2;

/// What the churning configurations' labels say about their applies.
const CHURN_LABEL: &str = "applies/100 ms";

/// [`server_rules`] with one filler peer (`peer-0`) moved to its `k`-th other address: a
/// policy change that does not concern the client, as most changes in a cluster do not
/// concern a given connection.
fn server_rules_moved(n: usize, k: usize) -> PodRules {
    let mut engine = server_engine(n);
    let address = Ipv4Addr::from(u32::from(MOVED_FILLER) + k as u32);
    engine.set_pod(pod(
        NS,
        "peer-0",
        &[("role", "peer"), ("kind", "filler")],
        &[&address.to_string()],
    ));
    engine
        .pod_rules(&PodKey::new(NS, "server"))
        .expect("server pod")
}

/// The same server pod with the monitor evaluation active beside enforcement: a monitored
/// policy previews replacing `allow-peers` with one that allows the same peers on TCP 80 (so
/// the staged view runs on every new connection), or, with `would_deny`, one that allows only
/// the filler peers (so every connection from the client is also a would-deny, logged through
/// the rate-limited NFLOG rule while it passes).
fn server_rules_monitored(n: usize, would_deny: bool) -> PodRules {
    let mut engine = server_engine(n);
    let staged_peers = if would_deny {
        selector(&[("kind", "filler")])
    } else {
        selector(&[("role", "peer")])
    };
    let mut monitored = netpol(
        NS,
        "preview",
        selector(&[("app", "server")]),
        Some(vec![rule(
            vec![pods_peer(Some(staged_peers), None)],
            vec![tcp(PORT)],
        )]),
        None,
    );
    monitored.mode = Mode::Monitor;
    monitored.replaces = Some("allow-peers".into());
    engine.set_policy(monitored);
    engine
        .pod_rules(&PodKey::new(NS, "server"))
        .expect("server pod")
}

/// DANM Policer's layout (seed 004): its INPUT defaults, then one rule per peer address.
fn seed_text(peers: &[Ipv4Addr]) -> String {
    let mut out = String::from(
        "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
         :DANM_INGRESS_V4 - [0:0]\n\
         -A INPUT -i lo -j ACCEPT\n\
         -A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n\
         -A INPUT -j DANM_INGRESS_V4\n\
         -A INPUT -j REJECT --reject-with icmp-port-unreachable\n\
         -A FORWARD -j REJECT --reject-with icmp-port-unreachable\n",
    );
    for p in peers {
        out.push_str(&format!(
            "-A DANM_INGRESS_V4 -s {p}/32 -p tcp -m tcp --dport {PORT} -j ACCEPT\n"
        ));
    }
    out.push_str("COMMIT\n");
    out
}

/// The floor of a stateful firewall: conntrack lookups and nothing else.
const CONNTRACK_ONLY: &str = "table inet nwbench_ct {\n\
    \tchain input {\n\
    \t\ttype filter hook input priority filter; policy accept;\n\
    \t\tct state established,related accept\n\
    \t\tct state new accept\n\
    \t}\n\
    }\n";

fn iptables_of(rules: &PodRules, opts: &RenderOptions) -> IptablesRuleset {
    render_iptables(rules, opts).expect("renders")
}

fn iptables_rule_lines(r: &IptablesRuleset) -> usize {
    [&r.v4, &r.v6]
        .into_iter()
        .flat_map(|t| t.lines())
        .filter(|l| l.starts_with("-A "))
        .count()
}

fn ipset_entries(r: &IptablesRuleset) -> usize {
    r.sets.iter().map(|s| s.cidrs.len()).sum()
}

fn nft_set_elements(rules: &PodRules, opts: &RenderOptions) -> usize {
    build_table(rules, opts)
        .expect("renders")
        .map(|t| t.sets.iter().map(|s| s.ranges.len()).sum())
        .unwrap_or(0)
}

// ----- namespaces --------------------------------------------------------------------------

fn run(netns: &Path, program: &str, args: &[&str]) {
    run_stdin(netns, program, args, None);
}

fn run_stdin(netns: &Path, program: &str, args: &[&str], stdin: Option<&str>) {
    exec_in(netns, program, args, stdin.map(str::as_bytes))
        .unwrap_or_else(|e| panic!("in {}: {e}", netns.display()));
}

fn ip(args: &[&str]) {
    netwarden_dataplane::netns::exec("ip", args, None).unwrap_or_else(|e| panic!("{e}"));
}

/// Client and server namespaces joined by a veth, with static addresses, routes and permanent
/// neighbour entries (the host-wide neighbour table is small; ARP is not what is measured).
struct Topology {
    client: Netns,
    server: Netns,
    server_path: PathBuf,
}

fn build_topology(namespaces: &mut Namespaces) -> Topology {
    let cli_name = namespaces.name("cli");
    let srv_name = namespaces.name("srv");
    let cli = namespaces.create("cli");
    let srv = namespaces.create("srv");
    // The server end is `eth0`: the pod interface name netwarden's rules dispatch on.
    ip(&[
        "-n", &cli_name, "link", "add", "c0", "address", CLIENT_MAC, "type", "veth", "peer",
        "name", "eth0", "address", SERVER_MAC, "netns", &srv_name,
    ]);
    let (client, denied, server) = (CLIENT.to_string(), DENIED.to_string(), SERVER.to_string());
    for a in [&client, &denied] {
        ip(&[
            "-n",
            &cli_name,
            "addr",
            "add",
            &format!("{a}/32"),
            "dev",
            "c0",
        ]);
    }
    ip(&["-n", &cli_name, "link", "set", "lo", "up"]);
    ip(&["-n", &cli_name, "link", "set", "c0", "up"]);
    ip(&[
        "-n",
        &cli_name,
        "route",
        "add",
        &format!("{server}/32"),
        "dev",
        "c0",
        "src",
        &client,
    ]);
    ip(&[
        "-n",
        &cli_name,
        "neigh",
        "replace",
        &server,
        "lladdr",
        SERVER_MAC,
        "dev",
        "c0",
        "nud",
        "permanent",
    ]);
    ip(&[
        "-n",
        &srv_name,
        "addr",
        "add",
        &format!("{server}/32"),
        "dev",
        "eth0",
    ]);
    ip(&["-n", &srv_name, "link", "set", "lo", "up"]);
    ip(&["-n", &srv_name, "link", "set", "eth0", "up"]);
    for a in [&client, &denied] {
        ip(&[
            "-n",
            &srv_name,
            "route",
            "add",
            &format!("{a}/32"),
            "dev",
            "eth0",
        ]);
        ip(&[
            "-n",
            &srv_name,
            "neigh",
            "replace",
            a,
            "lladdr",
            CLIENT_MAC,
            "dev",
            "eth0",
            "nud",
            "permanent",
        ]);
    }
    // Ports must not run out (closes are RSTs, but be safe) and SYNs must not overflow the
    // listen queue: either would measure the TCP stack's limits, not the firewall.
    for (ns, kv) in [
        (&cli, "net.ipv4.ip_local_port_range=1024 65535"),
        (&cli, "net.ipv4.tcp_tw_reuse=1"),
        (&srv, "net.core.somaxconn=8192"),
        (&srv, "net.ipv4.tcp_max_syn_backlog=8192"),
    ] {
        run(ns, "sysctl", &["-q", "-w", kv]);
    }
    Topology {
        client: Netns::open(&cli).expect("open client netns"),
        server: Netns::open(&srv).expect("open server netns"),
        server_path: srv,
    }
}

// ----- traffic -----------------------------------------------------------------------------

/// One TCP connection to the server, closed with a RST (SO_LINGER 0: no TIME_WAIT, so ports
/// never run out). `src` binds a source address; `timeout` bounds the connect.
fn connect_once(src: Option<Ipv4Addr>, timeout: Option<Duration>) -> Result<(), Errno> {
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    setsockopt(
        &fd,
        sockopt::Linger,
        &nix::libc::linger {
            l_onoff: 1,
            l_linger: 0,
        },
    )?;
    if let Some(t) = timeout {
        // Linux bounds connect() by the send timeout.
        setsockopt(
            &fd,
            sockopt::SendTimeout,
            &TimeVal::milliseconds(t.as_millis() as i64),
        )?;
    }
    if let Some(src) = src {
        bind(fd.as_raw_fd(), &SockaddrIn::from(SocketAddrV4::new(src, 0)))?;
    }
    connect(
        fd.as_raw_fd(),
        &SockaddrIn::from(SocketAddrV4::new(SERVER, PORT)),
    )
}

/// A listener in the server netns with threads accepting and closing connections.
struct Server {
    listener: Arc<TcpListener>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<u64>>,
}

impl Server {
    fn start(netns: &Netns, acceptors: usize) -> Server {
        // The socket belongs to the netns it is created in, whichever thread uses it later.
        let listener = netns
            .run(|| -> Result<TcpListener, Errno> {
                let fd = socket(
                    AddressFamily::Inet,
                    SockType::Stream,
                    SockFlag::SOCK_CLOEXEC,
                    None,
                )?;
                setsockopt(&fd, sockopt::ReuseAddr, &true)?;
                bind(
                    fd.as_raw_fd(),
                    &SockaddrIn::from(SocketAddrV4::new(SERVER, PORT)),
                )?;
                // -1: the netns's somaxconn (raised above), not std's 128.
                listen(&fd, Backlog::MAXALLOWABLE)?;
                Ok(TcpListener::from(fd))
            })
            .expect("enter server netns")
            .expect("server listener");
        let listener = Arc::new(listener);
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..acceptors)
            .map(|_| {
                let (listener, stop) = (listener.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut accepted = 0u64;
                    loop {
                        match listener.accept() {
                            Ok(_) => accepted += 1,
                            Err(_) if stop.load(Ordering::Relaxed) => return accepted,
                            // ECONNABORTED and the like: the client reset first.
                            Err(_) => {}
                        }
                    }
                })
            })
            .collect();
        Server {
            listener,
            stop,
            threads,
        }
    }

    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        // shutdown(2) on a listening socket wakes every blocked accept() with EINVAL.
        let _ = shutdown(self.listener.as_raw_fd(), Shutdown::Both);
        self.threads
            .into_iter()
            .map(|t| t.join().expect("acceptor thread"))
            .sum()
    }
}

/// Outcome of one trial.
struct Trial {
    /// Successful connections per second of wall-clock time.
    rate: f64,
    /// CPU time of this process (client and acceptor threads, and the softirq work done in
    /// their context: the veth delivers inline, so the server's firewall runs there) per
    /// connection, in microseconds. Unlike the wall-clock rate it does not depend on the share
    /// of the CPUs that other processes leave us.
    cpu_us: f64,
    ok: u64,
    errors: BTreeMap<String, u64>,
}

/// User + system CPU time of the whole process, threads that ended included.
fn process_cpu() -> Duration {
    let usage = getrusage(UsageWho::RUSAGE_SELF).expect("getrusage");
    let us = |t: TimeVal| Duration::from_micros((t.tv_sec() * 1_000_000 + t.tv_usec()) as u64);
    us(usage.user_time()) + us(usage.system_time())
}

/// `threads` clients in the client netns connect and reset for `duration`; the rate is the
/// sum of each thread's successful connects per second of its own run.
fn trial(client: &Netns, threads: usize, duration: Duration) -> Trial {
    let cpu_before = process_cpu();
    let results: Vec<(u64, f64, BTreeMap<String, u64>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(move || {
                    client.enter_current_thread().expect("enter client netns");
                    let start = Instant::now();
                    let deadline = start + duration;
                    let mut ok = 0u64;
                    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
                    while Instant::now() < deadline {
                        match connect_once(None, Some(Duration::from_secs(3))) {
                            Ok(()) => ok += 1,
                            Err(e) => *errors.entry(e.desc().to_string()).or_default() += 1,
                        }
                    }
                    (ok, start.elapsed().as_secs_f64(), errors)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("client thread"))
            .collect()
    });
    let cpu = process_cpu() - cpu_before;
    let mut out = Trial {
        rate: 0.0,
        cpu_us: 0.0,
        ok: 0,
        errors: BTreeMap::new(),
    };
    for (ok, secs, errors) in results {
        out.rate += ok as f64 / secs;
        out.ok += ok;
        for (k, v) in errors {
            *out.errors.entry(k).or_default() += v;
        }
    }
    out.cpu_us = cpu.as_secs_f64() * 1e6 / out.ok.max(1) as f64;
    out
}

/// Whether a connection from `src` gets through (one attempt from the client netns).
fn probe(client: &Netns, src: Ipv4Addr) -> Result<(), Errno> {
    std::thread::scope(|s| {
        s.spawn(|| {
            client.enter_current_thread().expect("enter client netns");
            connect_once(Some(src), Some(Duration::from_secs(2)))
        })
        .join()
        .expect("probe thread")
    })
}

// ----- configurations ----------------------------------------------------------------------

enum Firewall {
    None,
    /// Raw `nft -f` text.
    NftText(String),
    /// Raw `iptables-restore` text.
    IptablesText(String),
    /// Through netwarden's dataplane, rendered by it.
    Netwarden(Backend, PodRules),
}

struct Config {
    label: String,
    firewall: Firewall,
    /// Whether a connection from a non-allowed address must be refused.
    filters: bool,
    /// Policy applies in the server netns while the traffic runs.
    churn: Option<Churn>,
}

/// The agent at work beside the traffic: the rulesets applied in turn every [`CHURN_PERIOD`]
/// (the first is the installed one, so every apply changes the rules).
#[derive(Clone)]
struct Churn {
    rules: Vec<PodRules>,
    /// Whether each apply is followed by a revocation pass judged by the new rules.
    revoke: bool,
}

/// How often a churning configuration applies a policy change.
const CHURN_PERIOD: Duration = Duration::from_millis(100);

/// What a churn thread did during one configuration's warm-up and trial.
#[derive(Default)]
struct ChurnStats {
    /// Whether the applies were followed by revocation passes.
    revoke: bool,
    applies: usize,
    /// Revocation passes: conntrack entries listed by each, and its duration.
    listed: Vec<usize>,
    passes: Vec<Duration>,
}

/// Starts applying `churn`'s rulesets to `server` every [`CHURN_PERIOD`] (at once, then on
/// each period) until `stop`; each apply must change the rules and each revocation pass must
/// revoke nothing (the client is allowed by both rulesets).
fn start_churn(
    churn: Churn,
    server: PathBuf,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<ChurnStats> {
    std::thread::spawn(move || {
        let mut dp = NftDataplane::new(RenderOptions::default());
        let rulesets = churn
            .rules
            .iter()
            .map(|r| dp.render(r).expect("renders"))
            .collect::<Vec<_>>();
        let mut stats = ChurnStats {
            revoke: churn.revoke,
            ..ChurnStats::default()
        };
        let start = Instant::now();
        // As the agent: passes coalesced over `REVOCATION_DELAY` after a change, run when due
        // (the loop wakes then, as the agent's does), each scoped against what the previous
        // one judged (see `netwarden_agent::revocations`). The installed rules were judged
        // when the agent installed them.
        let mut revocations = Revocations::new(REVOCATION_DELAY);
        revocations.done(&server, &churn.rules[0], true);
        let mut next_apply = start;
        loop {
            let stopping = stop.load(Ordering::Relaxed);
            if !stopping && Instant::now() >= next_apply {
                let i = (stats.applies + 1) % churn.rules.len();
                let outcome = dp
                    .apply(&server, &rulesets[i])
                    .unwrap_or_else(|e| panic!("churn apply: {e}"));
                assert_eq!(outcome, ApplyOutcome::Applied);
                stats.applies += 1;
                next_apply = start + CHURN_PERIOD * stats.applies as u32;
                if churn.revoke {
                    revocations.changed(
                        churn.rules[i].pod.clone(),
                        server.clone(),
                        churn.rules[i].clone(),
                        Instant::now(),
                    );
                }
            }
            // A trial shorter than the delay (the quick mode) runs its pass when it stops, so
            // that it still measures one; a full trial's pass owed at its end falls outside it
            // either way.
            let flush = stopping && stats.passes.is_empty();
            for pass in revocations.due(Instant::now(), flush) {
                let started = Instant::now();
                let revoked = NftDataplane::revoke_connections(&server, &pass.rules, &pass.scope)
                    .unwrap_or_else(|e| panic!("revocation pass: {e}"));
                revocations.done(&server, &pass.rules, true);
                stats.passes.push(started.elapsed());
                assert!(
                    revoked.flows.is_empty(),
                    "the client is allowed, yet revoked: {:?}",
                    revoked.flows
                );
                stats.listed.push(revoked.listed);
            }
            if stopping {
                break;
            }
            let wake = revocations
                .next_due()
                .map_or(next_apply, |due| due.min(next_apply));
            while !stop.load(Ordering::Relaxed) && Instant::now() < wake {
                std::thread::sleep(Duration::from_millis(2).min(wake - Instant::now()));
            }
        }
        stats
    })
}

/// The server netns with nothing of any firewall: every nft table (iptables-nft tables are
/// nft tables) and, for legacy iptables, empty filter tables.
fn reset_firewall(server: &Path, variant: IptablesVariant) {
    if variant == IptablesVariant::Legacy {
        let empty = netwarden_render::iptables::empty_filter_table();
        run_stdin(server, "iptables-restore", &["-w"], Some(&empty));
        run_stdin(server, "ip6tables-restore", &["-w"], Some(&empty));
    }
    run(server, "nft", &["flush", "ruleset"]);
}

struct Dataplanes {
    nft: NftDataplane,
    iptables: IptablesDataplane,
}

/// Installs `config` in the server netns (after a reset); returns the install time.
fn install(
    config: &Config,
    server: &Path,
    variant: IptablesVariant,
    dps: &mut Dataplanes,
) -> Duration {
    reset_firewall(server, variant);
    let start = Instant::now();
    match &config.firewall {
        Firewall::None => {}
        Firewall::NftText(t) => run_stdin(server, "nft", &["-f", "-"], Some(t)),
        Firewall::IptablesText(t) => run_stdin(server, "iptables-restore", &["-w"], Some(t)),
        Firewall::Netwarden(backend, rules) => {
            // The reset happened behind the dataplane's back.
            let outcome = match backend {
                Backend::Nft => install_with(&mut dps.nft, server, rules),
                Backend::Iptables => install_with(&mut dps.iptables, server, rules),
            };
            assert_eq!(
                outcome.unwrap_or_else(|e| panic!("{}: {e}", config.label)),
                ApplyOutcome::Applied,
                "{}",
                config.label
            );
        }
    }
    start.elapsed()
}

fn install_with<D: Dataplane>(
    dp: &mut D,
    server: &Path,
    rules: &PodRules,
) -> Result<ApplyOutcome, netwarden_dataplane::ApplyError> {
    dp.forget_all();
    let ruleset = dp.render(rules).expect("renders");
    dp.apply(server, &ruleset)
}

fn configs(params: &Params) -> Vec<Config> {
    let n = params.headline_peers();
    let mut out = vec![
        Config {
            label: "no firewall".into(),
            firewall: Firewall::None,
            filters: false,
            churn: None,
        },
        Config {
            label: "conntrack only".into(),
            firewall: Firewall::NftText(CONNTRACK_ONLY.into()),
            filters: false,
            churn: None,
        },
    ];
    let headline = server_rules(n);
    for &k in &params.peer_counts {
        let rules = if k == n {
            headline.clone()
        } else {
            server_rules(k)
        };
        out.push(Config {
            label: format!("netwarden nft, {k} peers"),
            firewall: Firewall::Netwarden(Backend::Nft, rules),
            filters: true,
            churn: None,
        });
    }
    for (would_deny, what) in [
        (false, "monitor active"),
        (true, "monitor, every conn would-deny"),
    ] {
        let rules = server_rules_monitored(n, would_deny);
        for backend in [Backend::Nft, Backend::Iptables] {
            out.push(Config {
                label: format!("netwarden {}, {n} peers, {what}", backend.as_str()),
                firewall: Firewall::Netwarden(backend, rules.clone()),
                filters: true,
                churn: None,
            });
        }
    }
    // Admin policy rules in front of the NetworkPolicy (issue 23).
    let admin = server_rules_admin(n);
    for backend in [Backend::Nft, Backend::Iptables] {
        out.push(Config {
            label: format!(
                "netwarden {}, {n} peers, {ADMIN_RULES} admin rules",
                backend.as_str()
            ),
            firewall: Firewall::Netwarden(backend, admin.clone()),
            filters: true,
            churn: None,
        });
    }
    // Learn mode beside the same enforcement: every new connection also walks the learn rules
    // (a negated lookup in the seen-flow set; the client's flow is logged once per window).
    out.push(Config {
        label: format!("netwarden nft, {n} peers, learn"),
        firewall: Firewall::Netwarden(
            Backend::Nft,
            PodRules {
                learn: true,
                ..headline.clone()
            },
        ),
        filters: true,
        churn: None,
    });
    // Revocation on vs off: the same applies beside the traffic, with or without the pass.
    let churn_rules: Vec<PodRules> = std::iter::once(headline.clone())
        .chain((0..CHURN_RULESETS - 1).map(|k| server_rules_moved(n, k)))
        .collect();
    assert!(
        churn_rules.windows(2).all(|w| w[0] != w[1]),
        "each ruleset differs from the one before"
    );
    for revoke in [false, true] {
        out.push(Config {
            label: format!(
                "netwarden nft, {n} peers, {CHURN_LABEL}{}",
                if revoke { " + revoke" } else { "" }
            ),
            firewall: Firewall::Netwarden(Backend::Nft, headline.clone()),
            filters: true,
            churn: Some(Churn {
                rules: churn_rules.clone(),
                revoke,
            }),
        });
    }
    out.push(Config {
        label: format!("netwarden iptables, {n} peers"),
        firewall: Firewall::Netwarden(Backend::Iptables, headline.clone()),
        filters: true,
        churn: None,
    });
    out.push(Config {
        label: format!("seed layout, {n} peers, client last"),
        firewall: Firewall::IptablesText(seed_text(&peer_list(n, n - 1))),
        filters: true,
        churn: None,
    });
    out.push(Config {
        label: format!("seed layout, {n} peers, client middle"),
        firewall: Firewall::IptablesText(seed_text(&peer_list(n, n / 2))),
        filters: true,
        churn: None,
    });
    out
}

// ----- statistics --------------------------------------------------------------------------

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "NOT met"
    }
}

// ----- 1. data path ------------------------------------------------------------------------

/// Results of the data-path part, by configuration label: one value per round.
struct DataPath {
    /// Wall-clock connections per second.
    rates: BTreeMap<String, Vec<f64>>,
    /// Connections per CPU-second of this process (see [`Trial::cpu_us`]).
    per_cpu: BTreeMap<String, Vec<f64>>,
}

impl DataPath {
    /// Median over rounds of `a`'s value divided by `b`'s in the same round: pairing the
    /// configurations within a round cancels the machine's slower drifts.
    fn paired(values: &BTreeMap<String, Vec<f64>>, a: &str, b: &str) -> f64 {
        let (va, vb) = (&values[a], &values[b]);
        let ratios: Vec<f64> = va.iter().zip(vb).map(|(x, y)| x / y).collect();
        median(&ratios)
    }

    /// (wall-clock ratio, per-CPU-second ratio) of `a` to `b`.
    fn ratios(&self, a: &str, b: &str) -> (f64, f64) {
        (
            Self::paired(&self.rates, a, b),
            Self::paired(&self.per_cpu, a, b),
        )
    }
}

fn data_path(params: &Params, namespaces: &mut Namespaces) -> DataPath {
    let opts = RenderOptions::default();
    let variant = iptables_variant().expect("iptables variant");
    let topo = build_topology(namespaces);
    let server = Server::start(&topo.server, params.acceptor_threads);
    let configs: Vec<Config> = configs(params)
        .into_iter()
        .filter(|c| params.selected(&c.label))
        .collect();
    assert!(
        !configs.is_empty(),
        "no configuration matches {:?}",
        params.only
    );
    let mut dps = Dataplanes {
        nft: NftDataplane::new(opts),
        iptables: IptablesDataplane::new(opts),
    };

    // Sanity first: every configuration lets the client in, and the filtering ones turn away
    // an address they do not allow (otherwise the rates would measure a firewall that does
    // nothing).
    println!("\nsanity (client {CLIENT} allowed, {DENIED} not):");
    for c in &configs {
        let took = install(c, &topo.server_path, variant, &mut dps);
        let allowed = probe(&topo.client, CLIENT);
        let denied = probe(&topo.client, DENIED);
        println!(
            "  {:<40} install {:>7.1} ms | allowed: {:<8} | other: {}",
            c.label,
            ms(took),
            format!("{allowed:?}"),
            match &denied {
                Ok(()) => "connected".to_string(),
                Err(e) => format!("refused ({e})"),
            }
        );
        assert!(allowed.is_ok(), "{}: client refused: {allowed:?}", c.label);
        if c.filters {
            assert_eq!(
                denied,
                Err(Errno::ECONNREFUSED),
                "{}: a non-allowed source must be refused",
                c.label
            );
        } else {
            assert!(denied.is_ok(), "{}: {denied:?}", c.label);
        }
    }

    let mut result = DataPath {
        rates: BTreeMap::new(),
        per_cpu: BTreeMap::new(),
    };
    let mut cpu_us: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut installs: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut churned: BTreeMap<String, ChurnStats> = BTreeMap::new();
    println!(
        "\n{} round(s) x {} configurations (order rotated every round), {:.1} s per trial after {:.1} s warm-up, {} client / {} acceptor threads",
        params.rounds,
        configs.len(),
        params.trial.as_secs_f64(),
        params.warmup.as_secs_f64(),
        params.client_threads,
        params.acceptor_threads
    );
    println!("  per round, in configuration order: wall-clock c/s / CPU µs per connection");
    for round in 0..params.rounds {
        let mut cells: Vec<String> = vec![String::new(); configs.len()];
        // Rotate so that no configuration always follows the same one.
        for k in 0..configs.len() {
            let i = (round + k) % configs.len();
            let c = &configs[i];
            let took = install(c, &topo.server_path, variant, &mut dps);
            installs.entry(c.label.clone()).or_default().push(ms(took));
            // An empty conntrack table for every trial: entries of the previous trial (RST'd
            // connections linger ~10 s) must not slow down or fill up the next one.
            run(&topo.server_path, "conntrack", &["-F"]);
            let stop = Arc::new(AtomicBool::new(false));
            let churn = c
                .churn
                .clone()
                .map(|ch| start_churn(ch, topo.server_path.clone(), stop.clone()));
            if !params.warmup.is_zero() {
                trial(&topo.client, params.client_threads, params.warmup);
            }
            let t = trial(&topo.client, params.client_threads, params.trial);
            stop.store(true, Ordering::Relaxed);
            if let Some(handle) = churn {
                let stats = handle.join().expect("churn thread");
                let all = churned.entry(c.label.clone()).or_default();
                all.revoke = stats.revoke;
                all.applies += stats.applies;
                all.listed.extend(stats.listed);
                all.passes.extend(stats.passes);
            }
            assert!(t.ok > 0, "{}: no connection succeeded", c.label);
            assert!(
                t.errors.is_empty(),
                "{}: connect errors {:?}",
                c.label,
                t.errors
            );
            cells[i] = format!("{:.0}/{:.0}", t.rate, t.cpu_us);
            result
                .rates
                .entry(c.label.clone())
                .or_default()
                .push(t.rate);
            result
                .per_cpu
                .entry(c.label.clone())
                .or_default()
                .push(1e6 / t.cpu_us);
            cpu_us.entry(c.label.clone()).or_default().push(t.cpu_us);
        }
        println!("  round {:>2}: {}", round + 1, cells.join("  "));
    }
    let accepted = server.stop();
    println!("  server accepted {accepted} connections in total");
    reset_firewall(&topo.server_path, variant);

    println!(
        "\n{:<40} {:>10} {:>8} {:>8} {:>11} {:>11} {:>10}",
        "configuration", "median c/s", "min", "max", "CPU µs/conn", "c/CPU-s", "install ms"
    );
    for c in &configs {
        let r = &result.rates[&c.label];
        let (lo, hi) = (
            r.iter().copied().fold(f64::INFINITY, f64::min),
            r.iter().copied().fold(0.0, f64::max),
        );
        println!(
            "{:<40} {:>10.0} {:>8.0} {:>8.0} {:>11.1} {:>11.0} {:>10.1}",
            c.label,
            median(r),
            lo,
            hi,
            median(&cpu_us[&c.label]),
            median(&result.per_cpu[&c.label]),
            median(&installs[&c.label])
        );
    }
    for (label, stats) in &churned {
        let mut passes = stats.passes.clone();
        passes.sort();
        // One apply at the start of each warm-up + trial, then one per period.
        let scheduled = params.rounds
            * (1 + ((params.warmup + params.trial).as_millis() / CHURN_PERIOD.as_millis())
                as usize);
        print!(
            "  {label}: {} of {scheduled} scheduled applies",
            stats.applies
        );
        if !params.quick && stats.applies * 10 < scheduled * 9 {
            // The passes did not keep the period (the machine is busy): this configuration
            // did less work than its pair, its ratio understates the cost.
            print!(" (BEHIND SCHEDULE: its ratio is not valid)");
        }
        assert!(stats.applies > 0, "{label}: no apply during the trials");
        if !stats.revoke {
            println!();
            continue;
        }
        assert!(!passes.is_empty(), "{label}: no revocation pass");
        let listed: u64 = stats.listed.iter().map(|&n| n as u64).sum();
        let spent: Duration = passes.iter().sum();
        let per_entry = match listed {
            0 => "no entry listed".to_string(),
            n => format!(
                "{:.2} µs per listed entry",
                spent.as_secs_f64() * 1e6 / n as f64
            ),
        };
        println!(
            "; {} revocation passes (none revoked anything), entries listed per pass median {:.0} max {}, pass p50 {:.2} ms p99 {:.2} ms max {:.2} ms, {per_entry} (wall-clock, beside the traffic)",
            passes.len(),
            median(&stats.listed.iter().map(|&n| n as f64).collect::<Vec<_>>()),
            stats.listed.iter().max().copied().unwrap_or(0),
            ms(percentile(&passes, 0.5)),
            ms(percentile(&passes, 0.99)),
            ms(*passes.last().expect("passes")),
        );
    }
    result
}

fn report_ratios(params: &Params, dp: &DataPath) {
    let n = params.headline_peers();
    let nft = format!("netwarden nft, {n} peers");
    let ipt = format!("netwarden iptables, {n} peers");
    let ct = "conntrack only";
    let seed = format!("seed layout, {n} peers, client last");
    let seed_mid = format!("seed layout, {n} peers, client middle");
    println!(
        "\nratios (median of per-round ratios)     wall-clock   per CPU-second   target (per CPU-s)"
    );
    let measured = |label: &str| dp.rates.contains_key(label);
    let line = |label: &str, a: &str, b: &str, target: Option<f64>| {
        if !measured(a) || !measured(b) {
            return;
        }
        let (wall, cpu) = dp.ratios(a, b);
        let t = match target {
            Some(_) if params.quick => "(targets: full run only)".to_string(),
            Some(t) => format!(">= {t}x: {}", verdict(cpu >= t)),
            None => String::new(),
        };
        println!("  {label:<38} {wall:>8.2}x {cpu:>14.2}x   {t}");
    };
    line("nft / conntrack-only", &nft, ct, Some(0.9));
    line("nft / seed (client last)", &nft, &seed, Some(4.0));
    line("nft / seed (client middle)", &nft, &seed_mid, None);
    line("iptables / seed (client last)", &ipt, &seed, None);
    line("iptables / conntrack-only", &ipt, ct, None);
    line("conntrack-only / no firewall", ct, "no firewall", None);
    for backend in ["nft", "iptables"] {
        let enforced = format!("netwarden {backend}, {n} peers");
        for what in ["monitor active", "monitor, every conn would-deny"] {
            line(
                &format!("{backend} {what} / {backend}"),
                &format!("netwarden {backend}, {n} peers, {what}"),
                &enforced,
                Some(0.9),
            );
        }
    }
    for backend in ["nft", "iptables"] {
        line(
            &format!("{backend} {ADMIN_RULES} admin rules / {backend}"),
            &format!("netwarden {backend}, {n} peers, {ADMIN_RULES} admin rules"),
            &format!("netwarden {backend}, {n} peers"),
            Some(0.9),
        );
    }
    line(
        "nft learn / nft",
        &format!("netwarden nft, {n} peers, learn"),
        &nft,
        Some(0.9),
    );
    let churn = format!("netwarden nft, {n} peers, {CHURN_LABEL}");
    line(
        "nft revocation on / off (applies)",
        &format!("{churn} + revoke"),
        &churn,
        Some(0.97),
    );
    line("nft applies/100 ms / nft", &churn, &nft, None);
    let first = format!("netwarden nft, {} peers", params.peer_counts[0]);
    let mut flat = true;
    for k in &params.peer_counts[1..] {
        let label = format!("netwarden nft, {k} peers");
        if !measured(&first) || !measured(&label) {
            continue;
        }
        line(
            &format!("nft {k} peers / nft {} peers", params.peer_counts[0]),
            &label,
            &first,
            None,
        );
        // "Does not fall": within the run-to-run noise of this machine (5%).
        flat &= dp.ratios(&label, &first).1 >= 0.95;
    }
    println!(
        "  nft rate does not fall from {} to {n} peers (per CPU-s, within 5%): {}",
        params.peer_counts[0],
        if !params.only.is_empty() {
            "(not measured: --only)"
        } else if params.quick {
            "(full run only)"
        } else {
            verdict(flat)
        }
    );
}

// ----- 2. control --------------------------------------------------------------------------

fn rule_counts(opts: &RenderOptions) {
    println!(
        "\nrules per pod (server pod, one NetworkPolicy rule allowing N peers on TCP {PORT}):"
    );
    println!(
        "  {:>7} {:>10} {:>12} {:>15} {:>14} {:>11}",
        "peers", "nft rules", "nft set elts", "iptables rules", "ipset entries", "seed rules"
    );
    let mut nft_counts = Vec::new();
    let mut ipt_counts = Vec::new();
    for n in [10, 1_000, 10_000] {
        let rules = server_rules(n);
        let nft = render_nft(&rules, opts).expect("renders");
        let ipt = iptables_of(&rules, opts);
        let seed = seed_text(&peer_list(n, n - 1))
            .lines()
            .filter(|l| l.starts_with("-A "))
            .count();
        let (nc, ic) = (rule_count(&nft), iptables_rule_lines(&ipt));
        println!(
            "  {n:>7} {nc:>10} {:>12} {ic:>15} {:>14} {seed:>11}",
            nft_set_elements(&rules, opts),
            ipset_entries(&ipt)
        );
        nft_counts.push(nc);
        ipt_counts.push(ic);
    }
    // The layout's promise: peers live in sets, so the rule count does not depend on them.
    assert!(
        nft_counts.windows(2).all(|w| w[0] == w[1]),
        "{nft_counts:?}"
    );
    assert!(
        ipt_counts.windows(2).all(|w| w[0] == w[1]),
        "{ipt_counts:?}"
    );
}

/// A pod with a handful of policy rules (~20 nft rules) whose main peer set holds 1,000
/// addresses; `variant` moves one peer so that two variants always differ.
fn apply_model(variant: usize) -> PodRules {
    let mut engine = Engine::new(EngineOptions::default());
    for i in 0..1_000 {
        let addr = if i == 0 {
            filler(5_000 + variant)
        } else {
            filler(i)
        };
        engine.set_pod(pod(
            NS,
            &format!("peer-{i}"),
            &[("role", "peer")],
            &[&addr.to_string()],
        ));
    }
    for i in 0..5 {
        engine.set_pod(pod(
            NS,
            &format!("mon-{i}"),
            &[("role", "monitoring")],
            &[&format!("10.98.0.{}", i + 1)],
        ));
    }
    engine.set_pod(pod(
        NS,
        "server",
        &[("app", "server")],
        &[&SERVER.to_string(), "fd00:99::1"],
    ));
    let peers = || pods_peer(Some(selector(&[("role", "peer")])), None);
    let monitoring = || pods_peer(Some(selector(&[("role", "monitoring")])), None);
    let udp = |port| netwarden_engine::PolicyPort {
        protocol: Protocol::Udp,
        port: Some(netwarden_engine::PortRef::Number(port)),
        end_port: None,
    };
    engine.set_policy(netpol(
        NS,
        "server",
        selector(&[("app", "server")]),
        Some(vec![
            rule(vec![peers()], vec![tcp(80), tcp(443)]),
            rule(vec![peers()], vec![udp(5353)]),
            rule(vec![monitoring()], vec![tcp(9090)]),
            rule(
                vec![ip_block("172.16.0.0/12", &["172.16.5.0/24"])],
                vec![tcp(8080)],
            ),
            rule(vec![ip_block("fd00:1::/64", &[])], vec![tcp(8443)]),
        ]),
        Some(vec![
            rule(vec![peers()], vec![tcp(5432)]),
            rule(vec![monitoring()], vec![]),
            rule(
                vec![ip_block("0.0.0.0/0", &["10.0.0.0/8", "192.168.0.0/16"])],
                vec![tcp(443)],
            ),
        ]),
    ));
    engine
        .pod_rules(&PodKey::new(NS, "server"))
        .expect("server pod")
}

fn apply_latency(params: &Params, namespaces: &mut Namespaces, opts: &RenderOptions) {
    let models = [apply_model(0), apply_model(1)];
    let nft_text = render_nft(&models[0], opts).expect("renders");
    println!(
        "\napply latency, one netns: {} nft rules, {} set elements ({} iptables rules, {} ipset entries); {} applies alternating two variants",
        rule_count(&nft_text),
        nft_set_elements(&models[0], opts),
        iptables_rule_lines(&iptables_of(&models[0], opts)),
        ipset_entries(&iptables_of(&models[0], opts)),
        params.apply_iterations
    );
    // What any `nft -f` costs here, to read the figures against: the process alone (an empty
    // transaction), and a transaction that frees an object (its close waits for the kernel to
    // release it; every replace frees the previous rules).
    let floor_path = namespaces.create("apply-floor");
    let floors = [
        ("nft, empty transaction", String::new()),
        (
            "nft, create+delete a table",
            "table inet nwbench_floor {}\ndelete table inet nwbench_floor\n".to_string(),
        ),
    ];
    for (label, text) in floors {
        let mut times: Vec<Duration> = (0..params.apply_iterations)
            .map(|_| {
                let start = Instant::now();
                run_stdin(&floor_path, "nft", &["-f", "-"], Some(&text));
                start.elapsed()
            })
            .collect();
        times.sort();
        println!(
            "  floor: {label:<28} p50 {:>7.2} ms  p99 {:>7.2} ms",
            ms(percentile(&times, 0.5)),
            ms(percentile(&times, 0.99)),
        );
    }
    let nft_path = namespaces.create("apply-nft");
    let times = alternating_applies(NftDataplane::new(*opts), &nft_path, &models, params);
    report_apply_latency(Backend::Nft, times);
    let ipt_path = namespaces.create("apply-iptables");
    let times = alternating_applies(IptablesDataplane::new(*opts), &ipt_path, &models, params);
    report_apply_latency(Backend::Iptables, times);
}

/// Applies the two variants of `models` alternately; the time of each apply.
fn alternating_applies<D: Dataplane>(
    mut dp: D,
    path: &Path,
    models: &[PodRules; 2],
    params: &Params,
) -> Vec<Duration> {
    let rulesets = models
        .iter()
        .map(|m| dp.render(m).expect("renders"))
        .collect::<Vec<_>>();
    assert!(rulesets[0] != rulesets[1]);
    let mut times = Vec::with_capacity(params.apply_iterations);
    for i in 0..params.apply_iterations {
        let start = Instant::now();
        let outcome = dp
            .apply(path, &rulesets[i % 2])
            .unwrap_or_else(|e| panic!("{e}"));
        times.push(start.elapsed());
        assert_eq!(outcome, ApplyOutcome::Applied);
    }
    times
}

fn report_apply_latency(backend: Backend, mut times: Vec<Duration>) {
    times.sort();
    let p50 = percentile(&times, 0.5);
    println!(
        "  {:<9} p50 {:>7.2} ms  p99 {:>7.2} ms  max {:>7.2} ms   (target p50 < 5 ms: {})",
        backend.as_str(),
        ms(p50),
        ms(percentile(&times, 0.99)),
        ms(*times.last().expect("times")),
        verdict(p50 < Duration::from_millis(5))
    );
}

/// `namespaces` × `per_namespace` pods, each in a netns of its own, with a typical policy per
/// namespace (same-namespace ingress on 8080, monitoring namespace on 9090, egress inside the
/// namespace and HTTPS out of the cluster).
fn sync_model(params: &Params, paths: &[PathBuf]) -> (Engine, Vec<PodKey>) {
    let mut engine = Engine::new(EngineOptions::default());
    let mut keys = Vec::new();
    for n in 0..params.sync_namespaces {
        let ns = format!("ns{n}");
        engine.set_namespace(namespace(&ns, &[]));
        for p in 0..params.sync_pods_per_namespace {
            let index = n * params.sync_pods_per_namespace + p;
            let mut pd = pod(
                &ns,
                &format!("pod-{p}"),
                &[("app", &format!("app{}", p % 3))],
                &[&format!("10.50.{n}.{}", p + 1)],
            );
            pd.netns = Some(paths[index].to_string_lossy().into_owned());
            keys.push(pd.key.clone());
            engine.set_pod(pd);
        }
        engine.set_policy(netpol(
            &ns,
            "default",
            LabelSelector::everything(),
            Some(vec![
                rule(
                    vec![pods_peer(Some(LabelSelector::everything()), None)],
                    vec![tcp(8080)],
                ),
                rule(
                    vec![pods_peer(
                        None,
                        Some(selector(&[("kubernetes.io/metadata.name", "ns0")])),
                    )],
                    vec![tcp(9090)],
                ),
            ]),
            Some(vec![
                rule(
                    vec![pods_peer(Some(LabelSelector::everything()), None)],
                    vec![],
                ),
                rule(vec![ip_block("0.0.0.0/0", &["10.0.0.0/8"])], vec![tcp(443)]),
            ]),
        ));
    }
    (engine, keys)
}

fn full_sync(params: &Params, namespaces: &mut Namespaces, opts: &RenderOptions) {
    let total = params.sync_namespaces * params.sync_pods_per_namespace;
    let created = Instant::now();
    let paths: Vec<PathBuf> = (0..total)
        .map(|i| namespaces.create(&format!("pod{i}")))
        .collect();
    println!(
        "\nfull sync of {total} pods, one netns each (created in {:.0} ms), NftDataplane:",
        ms(created.elapsed())
    );
    let (mut engine, keys) = sync_model(params, &paths);
    let mut syncer = Syncer::new(NftDataplane::new(*opts));
    let mut times = Vec::new();
    for rep in 0..params.sync_repeats {
        syncer.dataplane.forget_all();
        let report = syncer.sync(&mut engine, keys.iter().cloned().collect());
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        assert_eq!(report.applied, total, "{report}");
        println!(
            "  run {}: {:>8.1} ms total, {:.2} ms per pod  ({report})",
            rep + 1,
            ms(report.duration),
            ms(report.duration) / total as f64
        );
        times.push(report.duration);
    }
    let again = syncer.sync(&mut engine, keys.iter().cloned().collect());
    assert_eq!(again.unchanged, total, "{again}");
    times.sort();
    let med = times[times.len() / 2];
    println!(
        "  median {:.1} ms (target < 1 s for 110 pods: {}); nothing changed: {:.1} ms",
        ms(med),
        if total < 110 {
            "n/a, fewer pods"
        } else {
            verdict(med < Duration::from_secs(1))
        },
        ms(again.duration)
    );
    let leftovers = syncer.remove_all();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// A policy allowing `blocks` single-address ipBlocks (every third address from 10.64.0.0, so
/// none merge) to TCP 8080 of one pod; `variant` moves the last block.
fn large_policy(blocks: usize, variant: u32) -> netwarden_engine::Policy {
    let base = u32::from(Ipv4Addr::new(10, 64, 0, 0));
    let cidrs: Vec<String> = (0..blocks as u32)
        .map(|i| {
            let i = if i + 1 == blocks as u32 {
                i + variant * 7
            } else {
                i
            };
            format!("{}/32", Ipv4Addr::from(base + 3 * i))
        })
        .collect();
    netpol(
        NS,
        "large",
        selector(&[("app", "server")]),
        Some(vec![rule(
            cidrs.iter().map(|c| ip_block(c, &[])).collect(),
            vec![tcp(8080)],
        )]),
        None,
    )
}

/// The sync of one pod whose policy has many ipBlocks, per phase and backend: the engine's
/// computation, a first sync, a sync after one block changed, a sync with nothing changed —
/// against what `nft -f` alone takes to load the same table.
fn large_policy_sync(params: &Params, namespaces: &mut Namespaces, opts: &RenderOptions) {
    let blocks = params.large_blocks;
    println!(
        "
one pod, a NetworkPolicy of {blocks} ipBlocks (median of {} runs):",
        params.sync_repeats
    );
    let key = PodKey::new(NS, "server");
    let mut computes = Vec::new();
    let mut floors = Vec::new();
    let mut phases: BTreeMap<(&str, usize, &str), Vec<Duration>> = BTreeMap::new();
    for rep in 0..params.sync_repeats {
        for backend in [Backend::Nft, Backend::Iptables] {
            let path = namespaces.create(&format!("large{rep}{}", backend.as_str()));
            let mut engine = Engine::new(EngineOptions::default());
            let mut server = pod(NS, "server", &[("app", "server")], &[&SERVER.to_string()]);
            server.netns = Some(path.to_string_lossy().into_owned());
            engine.set_pod(server);
            let started = Instant::now();
            engine.set_policy(large_policy(blocks, 0));
            let rules = engine.pod_rules(&key).expect("server pod");
            computes.push(started.elapsed());
            if backend == Backend::Nft {
                let text = render_nft(&rules, opts).expect("renders");
                let floor = namespaces.create(&format!("largefloor{rep}"));
                let started = Instant::now();
                run_stdin(&floor, "nft", &["-f", "-"], Some(&text));
                floors.push(started.elapsed());
            }
            let mut syncer: Box<dyn Reconciler> =
                netwarden_agent::sync::for_backend(backend, *opts);
            let mut sync = |engine: &mut Engine, order: usize, phase: &'static str| {
                let report = syncer.sync(engine, [key.clone()].into_iter().collect());
                assert!(report.errors.is_empty(), "{:?}", report.errors);
                phases
                    .entry((backend.as_str(), order, phase))
                    .or_default()
                    .push(report.duration);
            };
            sync(&mut engine, 0, "first sync");
            engine.set_policy(large_policy(blocks, 1));
            sync(&mut engine, 1, "one block changed");
            sync(&mut engine, 2, "nothing changed");
            assert!(syncer.remove_all().is_empty());
        }
    }
    let median = |mut v: Vec<Duration>| {
        v.sort();
        ms(v[v.len() / 2])
    };
    println!(
        "  engine (policy set, pod rules computed): {:>8.1} ms",
        median(computes)
    );
    println!(
        "  nft -f of the rendered table, alone:     {:>8.1} ms",
        median(floors)
    );
    for ((backend, _, phase), times) in phases {
        println!("  {backend:<9} {phase:<18} {:>8.1} ms", median(times));
    }
}

// ----- main --------------------------------------------------------------------------------

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = !args.iter().any(|a| a == "--bench");
    let only: Vec<String> = args
        .windows(2)
        .filter(|w| w[0] == "--only")
        .map(|w| w[1].clone())
        .collect();
    if !root_or_skip() {
        return;
    }
    let params = Params::new(quick, only);
    let opts = RenderOptions::default();
    let started = Instant::now();
    println!(
        "netwarden data-plane benchmark ({} mode; kernel {}, {} CPUs, iptables {:?})",
        if params.quick {
            "quick (pass --bench for the full run)"
        } else {
            "full"
        },
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        iptables_variant().ok(),
    );
    let mut namespaces = Namespaces::new("nwbench-");
    if params.only.is_empty() {
        rule_counts(&opts);
        apply_latency(&params, &mut namespaces, &opts);
        full_sync(&params, &mut namespaces, &opts);
        large_policy_sync(&params, &mut namespaces, &opts);
    } else {
        println!(
            "only the data-path configurations matching {:?}",
            params.only
        );
    }
    let dp = data_path(&params, &mut namespaces);
    report_ratios(&params, &dp);
    drop(namespaces);
    println!("\ndone in {:.1} s", started.elapsed().as_secs_f64());
}
