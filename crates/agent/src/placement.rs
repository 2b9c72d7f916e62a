//! Where the agent's local pods are: each one joined with its network namespace (from the
//! runtime or the objects) and with what the kernel shows there, and the state that says
//! whether it can be programmed.
//!
//! ```text
//!  local pods (objects) ──┐
//!  NetnsSource answers ───┼─> place() ──> Placement { pods for the engine, states, lockdowns }
//!  KernelViews (reads) ───┘
//! ```
//!
//! Everything here decides who owns a netns and what it holds; nothing is trusted that the
//! kernel can say better (SPEC 2, 7; issue 20):
//! - **Interfaces and addresses come from the kernel.** A local pod's interfaces are what its
//!   netns holds ([`merge_discovered`]): an address the objects claim but no interface holds is
//!   not the pod's (a DanmEp naming another pod's address is not used), an interface the
//!   objects do not describe is the pod's anyway (a network of its own).
//! - **The runtime's netns wins.** A path declared in the objects (`netwarden.io/netns`, a
//!   DanmEp's `spec.netns`) is used only for a pod the runtime has no sandbox for; a declared
//!   path naming a netns the runtime gave another pod is refused, the owner programmed.
//! - **A netns two pods claim and nobody can attribute is locked down**: isolated both ways,
//!   nothing allowed ([`netwarden_engine::Engine::set_lockdown`]), so the legitimate pod is
//!   never left open; the claimants are reported.
//! - **"Refused" means one thing**: the pod is not programmed and its netns is not touched (the
//!   rules it has stay) until the reason goes; the agent never syncs a refused pod.
//! - The runtime's sandbox addresses make a pod's primary interface before the API status has
//!   them: a new pod is programmed from the moment its sandbox exists.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use netwarden_dataplane::{DiscoveredInterface, InterfaceWatch, NetnsId};
use netwarden_engine::{NetworkId, NetworkType, Pod, PodInterface, PodKey};
use tracing::warn;

/// Where a local pod's netns path came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetnsOrigin {
    /// The CRI runtime made it for this sandbox.
    Runtime { sandbox: String },
    /// The objects say so (`netwarden.io/netns`, or a DanmEp's `spec.netns`): anyone who can
    /// create pods or DanmEps can write it.
    Declared,
}

impl std::fmt::Display for NetnsOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NetnsOrigin::Runtime { sandbox } => write!(f, "from the runtime (sandbox {sandbox})"),
            NetnsOrigin::Declared => {
                f.write_str("declared in its objects (netwarden.io/netns or a DanmEp's spec.netns)")
            }
        }
    }
}

/// What the netns source says about one local pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetnsAnswer {
    Netns {
        path: String,
        origin: NetnsOrigin,
        /// The sandbox's addresses as the runtime reports them (empty when declared).
        ips: Vec<IpAddr>,
    },
    /// The runtime runs the pod's sandbox in the node's network namespace.
    HostNetwork { sandbox: String },
    /// Not known yet (no sandbox, no declared path), or not readable now: why.
    Unknown(String),
}

/// Where one local pod stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalState {
    /// `spec.hostNetwork`: never isolated.
    HostNetwork,
    /// Its netns is not known yet, or does not exist yet: it is programmed once it does.
    WaitingForNetns(String),
    /// Not programmed, its netns untouched, until the reason goes.
    Refused(String),
    /// Joined with its kernel view: programmed when isolated.
    Placed,
    /// Its netns cannot be attributed: programmed with nothing allowed.
    LockedDown(String),
}

impl LocalState {
    /// The `state` label of the `netwarden_local_pods` gauge.
    pub fn label(&self) -> &'static str {
        match self {
            LocalState::HostNetwork => "host_network",
            LocalState::WaitingForNetns(_) => "waiting_for_netns",
            LocalState::Refused(_) => "refused",
            LocalState::Placed => "placed",
            LocalState::LockedDown(_) => "locked_down",
        }
    }
}

/// What the kernel showed of one pod netns at its last read.
#[derive(Debug, Clone)]
pub enum KernelRead {
    /// The namespace's identity and its interfaces.
    Found {
        id: NetnsId,
        interfaces: Vec<DiscoveredInterface>,
    },
    /// No such file (yet, or any more): the pod is programmed once it exists.
    Missing,
    /// The path exists but is no readable netns: the pod is refused (fail closed).
    Unreadable(String),
}

impl KernelRead {
    /// Reads `path`, subscribing to its changes first (`watch`): a change after the read is
    /// then reported, never lost between the two.
    pub fn of(path: &Path, watch: Option<&InterfaceWatch>) -> KernelRead {
        let opened = netwarden_dataplane::Netns::open(path)
            .map_err(netwarden_dataplane::DiscoverError::from);
        let read = opened.and_then(|netns| {
            if let Some(watch) = watch {
                if let Err(e) = watch.watch(&netns) {
                    // The periodic read still follows it; said once per path by the caller.
                    warn!("{}: interface changes not notified: {e}", path.display());
                }
            }
            netwarden_dataplane::interfaces_of(&netns).map(|interfaces| (netns.id(), interfaces))
        });
        match read {
            Ok((id, interfaces)) => KernelRead::Found { id, interfaces },
            Err(netwarden_dataplane::DiscoverError::Netns(e))
                if matches!(&e, netwarden_dataplane::NetnsError::Open { source, .. }
                    if source.kind() == std::io::ErrorKind::NotFound) =>
            {
                KernelRead::Missing
            }
            Err(e) => KernelRead::Unreadable(format!(
                "cannot read the interfaces of {}: {e}",
                path.display()
            )),
        }
    }
}

/// How many threads read local pods' netns at once: each read mostly waits on the kernel
/// (a thread entering the netns, a netlink dump), so a few overlap well on any core count.
const READERS: usize = 4;

/// The last read of each local pod's netns, by path, and the kernel's notifications of their
/// changes.
///
/// Every tick reads them all again ([`KernelViews::refresh`]: a lost notification, an ipset or
/// anything the kernel does not notify). An object event reads only the namespaces not read
/// yet ([`KernelViews::read_new`]); a notification reads the namespaces it names
/// ([`KernelViews::read_changed`]).
#[derive(Default)]
pub struct KernelViews {
    reads: HashMap<PathBuf, KernelRead>,
    watch: Option<InterfaceWatch>,
}

impl KernelViews {
    /// Views that follow the kernel's notifications through `watch`.
    pub fn watched(watch: InterfaceWatch) -> KernelViews {
        KernelViews {
            reads: HashMap::new(),
            watch: Some(watch),
        }
    }

    /// The netns paths named by `answers` that are read at all.
    fn paths(answers: &[(Pod, NetnsAnswer)]) -> BTreeSet<PathBuf> {
        answers
            .iter()
            .filter(|(pod, _)| !pod.host_network)
            .filter_map(|(_, answer)| match answer {
                NetnsAnswer::Netns { path, .. } => Some(PathBuf::from(path)),
                _ => None,
            })
            .collect()
    }

    /// Reads every named netns again; forgets (and stops watching) the others.
    pub fn refresh(&mut self, answers: &[(Pod, NetnsAnswer)]) {
        let paths: Vec<PathBuf> = Self::paths(answers).into_iter().collect();
        self.reads = read_all(&paths, self.watch.as_ref());
        self.unwatch_others();
    }

    /// Reads the named netns not read yet (or missing at the last read); forgets the others.
    pub fn read_new(&mut self, answers: &[(Pod, NetnsAnswer)]) {
        let paths = Self::paths(answers);
        self.reads.retain(|path, _| paths.contains(path));
        let new: Vec<PathBuf> = paths
            .into_iter()
            .filter(|path| {
                self.reads
                    .get(path)
                    .is_none_or(|r| matches!(r, KernelRead::Missing))
            })
            .collect();
        self.reads.extend(read_all(&new, self.watch.as_ref()));
        self.unwatch_others();
    }

    /// The netns the kernel said changed since the last call, read again (only those still
    /// named); whether any was.
    pub fn read_changed(&mut self) -> bool {
        let Some(watch) = &self.watch else {
            return false;
        };
        let changed: Vec<PathBuf> = watch
            .take_changed()
            .into_iter()
            .filter(|path| self.reads.contains_key(path))
            .collect();
        let any = !changed.is_empty();
        self.reads.extend(read_all(&changed, self.watch.as_ref()));
        any
    }

    fn unwatch_others(&mut self) {
        if let Some(watch) = &self.watch {
            for path in watch.paths() {
                if !self.reads.contains_key(&path) {
                    watch.unwatch(&path);
                }
            }
        }
    }

    pub fn get(&self, path: &str) -> Option<&KernelRead> {
        self.reads.get(Path::new(path))
    }
}

/// Reads every netns of `paths`, [`READERS`] at a time (110 one after the other took 19 ms
/// of the agent loop every `--interval` on the agent benchmark).
fn read_all(paths: &[PathBuf], watch: Option<&InterfaceWatch>) -> HashMap<PathBuf, KernelRead> {
    if paths.is_empty() {
        return HashMap::new();
    }
    let chunk = paths.len().div_ceil(READERS).max(1);
    std::thread::scope(|scope| {
        let readers: Vec<_> = paths
            .chunks(chunk)
            .map(|part| {
                let reader = scope.spawn(move || {
                    part.iter()
                        .map(|path| (path.clone(), KernelRead::of(path, watch)))
                        .collect::<Vec<_>>()
                });
                (part, reader)
            })
            .collect();
        readers
            .into_iter()
            .flat_map(|(part, reader)| {
                // A reader that panicked: its pods are refused (their rules stay) until the
                // next tick reads them, never programmed without their kernel's view.
                reader.join().unwrap_or_else(|_| {
                    part.iter()
                        .map(|path| {
                            let why =
                                format!("reading the interfaces of {} failed", path.display());
                            (path.clone(), KernelRead::Unreadable(why))
                        })
                        .collect()
                })
            })
            .collect()
    })
}

/// What reconciling the kernel's view of a pod with the objects' found worth saying.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct MergeNotes {
    /// Object interfaces (name, addresses) no kernel interface holds (by address or name):
    /// not the pod's, dropped.
    pub unmatched: Vec<(String, Vec<IpAddr>)>,
    /// Addresses the objects give an interface that the kernel does not show on it: dropped.
    pub not_held: Vec<(String, IpAddr)>,
}

/// The name CNI plugins give a pod's cluster-network interface.
const PRIMARY_IFNAME: &str = "eth0";

/// Makes a pod's interfaces what its netns really has (SPEC 2: a pod interface is any kernel
/// interface with an L3 address, except `lo`; the one holding `status.podIPs` is the primary
/// one).
///
/// Each interface the objects describe is found in the kernel by its addresses first (the
/// objects may guess `eth0` for the primary interface when no network-status names it, or
/// name an interface that was renamed since), then by name; it takes the kernel's name and
/// exactly the kernel's addresses. An object interface the kernel does not have is dropped,
/// and an address the kernel does not show is not the pod's: a DanmEp or annotation cannot
/// lend a local pod another pod's address (issue 20, defect 2). A kernel interface the objects
/// do not describe joins with a network of its own (`interface:<name>`), so only policies that
/// isolate every interface (DanmNetworkPolicy) cover it and only peers without a network
/// selector contribute its addresses — except `eth0` when the objects name no primary
/// interface yet (a new pod before the API has its address, without a runtime to say it):
/// it is the primary one, as CNI makes it. Names are taken as the kernel has them: the
/// renderers match any name exactly or refuse the pod.
pub fn merge_discovered(pod: &mut Pod, discovered: &[DiscoveredInterface]) -> MergeNotes {
    let mut notes = MergeNotes::default();
    let mut taken = vec![false; discovered.len()];
    let mut kept = Vec::with_capacity(pod.interfaces.len());
    for mut iface in std::mem::take(&mut pod.interfaces) {
        let by_addr = discovered
            .iter()
            .enumerate()
            .find(|(i, d)| !taken[*i] && d.ips().any(|ip| iface.ips.contains(&ip)));
        let by_name = || {
            discovered
                .iter()
                .enumerate()
                .find(|(i, d)| !taken[*i] && d.name == iface.name)
        };
        let Some((i, found)) = by_addr.or_else(by_name) else {
            if iface.is_primary() {
                // The primary interface the API describes but the netns does not show (yet, or
                // any more): kept as described, so a selected pod keeps its table (its rules
                // name the interface; the base chains reject the unknown ones meanwhile).
                // Dropping it left a pod whose interfaces are all unknown with no table at
                // all: open.
                kept.push(iface);
                continue;
            }
            if !iface.ips.is_empty() {
                notes
                    .unmatched
                    .push((iface.name.clone(), iface.ips.clone()));
            }
            continue;
        };
        taken[i] = true;
        for ip in &iface.ips {
            if !found.ips().any(|held| held == *ip) {
                notes.not_held.push((found.name.clone(), *ip));
            }
        }
        iface.name = found.name.clone();
        iface.ips = found.ips().collect();
        iface.prefix_lens = found.addrs.iter().map(|n| n.prefix_len()).collect();
        kept.push(iface);
    }
    pod.interfaces = kept;
    let has_primary = pod.interfaces.iter().any(PodInterface::is_primary);
    for (found, _) in discovered.iter().zip(&taken).filter(|(_, t)| !**t) {
        let network = if !has_primary && found.name == PRIMARY_IFNAME {
            NetworkId::Primary
        } else {
            NetworkId::Named {
                kind: NetworkType::NetworkAttachmentDefinition,
                namespace: None,
                name: format!("interface:{}", found.name),
            }
        };
        let interface = PodInterface {
            name: found.name.clone(),
            network,
            ips: found.ips().collect(),
            prefix_lens: found.addrs.iter().map(|n| n.prefix_len()).collect(),
        };
        // The primary interface first, as the objects list it.
        if interface.is_primary() {
            pod.interfaces.insert(0, interface);
        } else {
            pod.interfaces.push(interface);
        }
    }
    notes
}

/// Gives a pod whose objects name no primary address yet the runtime's sandbox addresses
/// as its primary interface (the runtime made the sandbox and ran CNI in it; the API's
/// `status.podIPs` follows later, when the kubelet writes it).
pub fn adopt_runtime_addresses(pod: &mut Pod, ips: &[IpAddr]) {
    if ips.is_empty()
        || pod
            .interfaces
            .iter()
            .any(|i| i.is_primary() && !i.ips.is_empty())
    {
        return;
    }
    pod.interfaces.retain(|i| !i.is_primary());
    pod.interfaces.insert(
        0,
        PodInterface {
            name: PRIMARY_IFNAME.to_string(),
            network: NetworkId::Primary,
            ips: ips.to_vec(),
            prefix_lens: ips
                .iter()
                .map(|ip| if ip.is_ipv4() { 32 } else { 128 })
                .collect(),
        },
    );
}

/// The local pods, placed.
#[derive(Debug, Default)]
pub struct Placement {
    /// The pods to set in the engine: placed ones with their netns and kernel interfaces, the
    /// others as the objects describe them (peers), without a netns.
    pub pods: Vec<Pod>,
    /// Each local pod's state.
    pub states: BTreeMap<PodKey, LocalState>,
    /// Things worth a warning (each said once by the caller while it holds).
    pub notes: BTreeSet<String>,
}

impl Placement {
    /// The pods that must not be synced (refused).
    pub fn refused(&self) -> BTreeSet<PodKey> {
        self.states
            .iter()
            .filter(|(_, s)| matches!(s, LocalState::Refused(_)))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// The pods locked down, with why.
    pub fn locked(&self) -> impl Iterator<Item = (&PodKey, &str)> {
        self.states.iter().filter_map(|(k, s)| match s {
            LocalState::LockedDown(why) => Some((k, why.as_str())),
            _ => None,
        })
    }
}

/// Joins each local pod with its netns answer and the kernel's view (see the module doc).
pub fn place(answers: Vec<(Pod, NetnsAnswer)>, kernel: &KernelViews) -> Placement {
    let mut out = Placement::default();
    // Per netns identity, the pods claiming it, with where their claim comes from.
    let mut claims: BTreeMap<NetnsId, Vec<(PodKey, NetnsOrigin, String)>> = BTreeMap::new();
    // The pods joined with a netns found, by key, until the claims are settled.
    let mut found: BTreeMap<PodKey, Pod> = BTreeMap::new();
    for (mut pod, answer) in answers {
        let key = pod.key.clone();
        if pod.host_network {
            pod.netns = None;
            out.states.insert(key, LocalState::HostNetwork);
            out.pods.push(pod);
            continue;
        }
        let (path, origin, ips) = match answer {
            NetnsAnswer::Netns { path, origin, ips } => (path, origin, ips),
            NetnsAnswer::HostNetwork { sandbox } => {
                // The API says the pod has a network of its own; the runtime says it shares
                // the node's. Either is wrong, and there is nothing to program: refused,
                // loudly (issue 20, defect 11), never taken as "not isolated".
                pod.netns = None;
                out.states.insert(
                    key,
                    LocalState::Refused(format!(
                        "the runtime runs its sandbox {sandbox} in the node's network \
                         namespace, but its spec.hostNetwork is false"
                    )),
                );
                out.pods.push(pod);
                continue;
            }
            NetnsAnswer::Unknown(why) => {
                pod.netns = None;
                out.states.insert(key, LocalState::WaitingForNetns(why));
                out.pods.push(pod);
                continue;
            }
        };
        adopt_runtime_addresses(&mut pod, &ips);
        pod.netns = Some(path.clone());
        match kernel.get(&path) {
            Some(KernelRead::Found { id, interfaces }) => {
                let notes = merge_discovered(&mut pod, interfaces);
                for (name, ips) in notes.unmatched {
                    let ips: Vec<String> = ips.iter().map(ToString::to_string).collect();
                    out.notes.insert(format!(
                        "{key}: its objects describe interface {name:?} ({}), which its netns \
                         {path} does not have: not used",
                        ips.join(", ")
                    ));
                }
                for (name, ip) in notes.not_held {
                    out.notes.insert(format!(
                        "{key}: its objects give interface {name:?} address {ip}, which the \
                         kernel does not show there: not used"
                    ));
                }
                claims
                    .entry(*id)
                    .or_default()
                    .push((key.clone(), origin, path));
                found.insert(key, pod);
            }
            Some(KernelRead::Unreadable(why)) => {
                let why = format!("{why} (its netns {origin})");
                pod.netns = None;
                out.states.insert(key, LocalState::Refused(why));
                out.pods.push(pod);
            }
            // Not there yet (or any more): set with its netns, whose sync fails and is
            // retried until it exists.
            Some(KernelRead::Missing) | None => {
                let why = format!("its netns {path} does not exist (yet)");
                out.states.insert(key, LocalState::WaitingForNetns(why));
                out.pods.push(pod);
            }
        }
    }
    for (id, claimants) in claims {
        settle(id, claimants, &mut found, &mut out);
    }
    out
}

/// Decides who a netns claimed by `claimants` belongs to (see the module doc).
fn settle(
    id: NetnsId,
    mut claimants: Vec<(PodKey, NetnsOrigin, String)>,
    found: &mut BTreeMap<PodKey, Pod>,
    out: &mut Placement,
) {
    // In key order: who holds a contested netns never depends on who came first.
    claimants.sort_by(|a, b| a.0.cmp(&b.0));
    let mut take = |key: &PodKey, state: LocalState, keep_netns: bool| {
        if let Some(mut pod) = found.remove(key) {
            if !keep_netns {
                pod.netns = None;
            }
            out.states.insert(key.clone(), state);
            out.pods.push(pod);
        }
    };
    if let [(key, _, _)] = claimants.as_slice() {
        take(key, LocalState::Placed, true);
        return;
    }
    let by_runtime: Vec<&(PodKey, NetnsOrigin, String)> = claimants
        .iter()
        .filter(|(_, origin, _)| matches!(origin, NetnsOrigin::Runtime { .. }))
        .collect();
    if let [(owner, NetnsOrigin::Runtime { sandbox }, _)] = by_runtime.as_slice() {
        let owner = owner.clone();
        let sandbox = sandbox.clone();
        for (key, origin, path) in &claimants {
            if *key == owner {
                continue;
            }
            take(
                key,
                LocalState::Refused(format!(
                    "its netns {path} ({origin}) is pod {owner}'s, made by the runtime for \
                     sandbox {sandbox}: not programmed"
                )),
                false,
            );
        }
        take(&owner, LocalState::Placed, true);
        return;
    }
    // Nobody can say whose it is (two declared claims, or a runtime that gave one netns to
    // two sandboxes): the first claimant holds it locked down, the others are refused.
    let names: Vec<String> = claimants
        .iter()
        .map(|(key, origin, _)| format!("{key} ({origin})"))
        .collect();
    let why = format!(
        "pods {} all claim network namespace {id}; none can be told to be its owner, so it \
         allows nothing until only one does",
        names.join(", ")
    );
    let holder = by_runtime
        .first()
        .map(|(k, _, _)| k.clone())
        .unwrap_or_else(|| claimants[0].0.clone());
    for (key, _, _) in &claimants {
        if *key != holder {
            take(key, LocalState::Refused(why.clone()), false);
        }
    }
    take(&holder, LocalState::LockedDown(why), true);
}

/// Counts local pods per gauge state: the placement's, except that a placed pod is
/// `programmed` when the syncer holds rules for it, `selected_not_programmed` when its rules
/// isolate it but they are not in place, and `not_selected` when nothing isolates it.
pub fn count_states(
    states: &BTreeMap<PodKey, LocalState>,
    programmed: &BTreeMap<PodKey, PathBuf>,
    mut needs_rules: impl FnMut(&PodKey) -> bool,
) -> BTreeMap<&'static str, usize> {
    let mut counts: BTreeMap<&'static str, usize> = [
        "host_network",
        "waiting_for_netns",
        "refused",
        "locked_down",
        "programmed",
        "selected_not_programmed",
        "not_selected",
    ]
    .into_iter()
    .map(|s| (s, 0))
    .collect();
    for (key, state) in states {
        let label = match state {
            LocalState::Placed if programmed.contains_key(key) => "programmed",
            LocalState::Placed if needs_rules(key) => "selected_not_programmed",
            LocalState::Placed => "not_selected",
            other => other.label(),
        };
        *counts.entry(label).or_insert(0) += 1;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;
    use netwarden_engine::testing::pod;

    fn found(name: &str, addrs: &[&str]) -> DiscoveredInterface {
        DiscoveredInterface {
            name: name.into(),
            index: 2,
            addrs: addrs.iter().map(|a| a.parse().unwrap()).collect(),
            link_local: Vec::new(),
            up: true,
        }
    }

    #[test]
    fn kernel_interfaces_make_the_model() {
        let mut p = pod("x", "a", &[], &["10.0.0.1"]);
        merge_discovered(
            &mut p,
            &[
                found("eth0", &["10.0.0.1/24", "10.0.0.9/24"]),
                found("net7", &["192.168.7.1/24"]),
            ],
        );
        assert_eq!(p.interfaces.len(), 2);
        assert_eq!(p.interfaces[0].network, NetworkId::Primary);
        assert_eq!(
            p.interfaces[0].ips.len(),
            2,
            "the kernel's extra address is added"
        );
        assert_eq!(p.interfaces[1].name, "net7");
        assert_eq!(p.interfaces[1].network.to_string(), "interface:net7");
        assert_eq!(p.interfaces[1].prefix_lens, vec![24]);
    }

    /// Defect: with no network-status annotation the objects guess `eth0` for the primary
    /// interface; the kernel decides which interface holds the pod IP.
    #[test]
    fn the_primary_interface_is_the_one_holding_the_pod_ip() {
        let mut p = pod("x", "a", &[], &["10.0.0.1"]);
        assert_eq!(p.interfaces[0].name, "eth0");
        let notes = merge_discovered(
            &mut p,
            &[
                found("eth0", &["192.168.9.9/24"]),
                found("ens5", &["10.0.0.1/24"]),
            ],
        );
        assert_eq!(notes, MergeNotes::default());
        assert_eq!(p.interfaces[0].name, "ens5");
        assert_eq!(p.interfaces[0].network, NetworkId::Primary);
        assert_eq!(p.interfaces[1].name, "eth0");
        assert_eq!(p.interfaces[1].network.to_string(), "interface:eth0");
    }

    /// Defect: kernel-legal names outside a small alphabet were dropped, so a policy covering
    /// every interface did not cover them. They are kept as they are.
    #[test]
    fn unusual_kernel_names_are_kept() {
        let mut p = pod("x", "a", &[], &["10.0.0.1"]);
        merge_discovered(
            &mut p,
            &[
                found("eth0", &["10.0.0.1/24"]),
                found("a\"b;+", &["192.168.8.1/24"]),
            ],
        );
        assert_eq!(p.interfaces.len(), 2);
        assert_eq!(p.interfaces[1].name, "a\"b;+");
    }

    /// Issue 20, defect 2: an address the objects give a local pod that no interface of its
    /// netns holds is not used (a DanmEp lending it another pod's address, say).
    #[test]
    fn a_primary_interface_the_netns_lacks_is_kept() {
        // The netns has no eth0 yet (or only a loopback): the pod keeps the primary interface
        // the API describes, so a selected pod still gets its table.
        let mut p = pod("x", "web", &[], &["10.0.0.2"]);
        let notes = merge_discovered(&mut p, &[found("net9", &["192.168.9.1/24"])]);
        assert_eq!(p.interfaces[0].name, "eth0");
        assert_eq!(p.interfaces[0].network, NetworkId::Primary);
        assert_eq!(p.interfaces[0].ips, ["10.0.0.2".parse::<IpAddr>().unwrap()]);
        assert_eq!(p.interfaces[1].network.to_string(), "interface:net9");
        assert!(notes.unmatched.is_empty());
    }

    #[test]
    fn addresses_the_kernel_does_not_show_are_not_the_pods() {
        let mut p = pod("x", "cli", &[], &["10.0.0.2"]);
        p.interfaces.push(PodInterface {
            name: "net5".into(),
            network: NetworkId::nad("x", "n5"),
            ips: vec!["10.0.0.1".parse().unwrap()],
            prefix_lens: vec![32],
        });
        p.interfaces[0].ips.push("10.0.0.7".parse().unwrap());
        p.interfaces[0].prefix_lens.push(32);
        let notes = merge_discovered(&mut p, &[found("eth0", &["10.0.0.2/24"])]);
        let ips: Vec<IpAddr> = p.interfaces.iter().flat_map(|i| i.ips.clone()).collect();
        assert_eq!(ips, ["10.0.0.2".parse::<IpAddr>().unwrap()]);
        assert_eq!(
            notes.unmatched,
            [("net5".to_string(), vec!["10.0.0.1".parse().unwrap()])]
        );
        assert_eq!(
            notes.not_held,
            [("eth0".to_string(), "10.0.0.7".parse().unwrap())]
        );
    }

    /// Issue 20, defect 7: a new pod without `status.podIP` had its eth0 filed under
    /// `interface:eth0`, which no NetworkPolicy isolates.
    #[test]
    fn a_pod_without_an_address_yet_has_eth0_as_its_primary_interface() {
        let mut p = pod("x", "new", &[], &[]);
        p.interfaces.clear();
        merge_discovered(
            &mut p,
            &[
                found("net1", &["192.168.1.5/24"]),
                found("eth0", &["10.0.0.5/24"]),
            ],
        );
        assert_eq!(p.interfaces[0].name, "eth0");
        assert_eq!(p.interfaces[0].network, NetworkId::Primary);
        assert_eq!(p.interfaces[1].network.to_string(), "interface:net1");
        // The runtime's addresses, when it says them, find the primary interface whatever
        // its name.
        let mut p = pod("x", "new", &[], &[]);
        adopt_runtime_addresses(&mut p, &["10.0.0.5".parse().unwrap()]);
        merge_discovered(
            &mut p,
            &[
                found("ens3", &["10.0.0.5/24"]),
                found("eth0", &["192.168.1.5/24"]),
            ],
        );
        assert_eq!(p.interfaces[0].name, "ens3");
        assert_eq!(p.interfaces[0].network, NetworkId::Primary);
        assert_eq!(p.interfaces[0].prefix_lens, [24]);
        assert_eq!(p.interfaces[1].network.to_string(), "interface:eth0");
        // The objects' own primary address stays the authority when they have one.
        let mut p = pod("x", "old", &[], &["10.0.0.9"]);
        adopt_runtime_addresses(&mut p, &["10.0.0.5".parse().unwrap()]);
        assert_eq!(p.interfaces[0].ips, ["10.0.0.9".parse::<IpAddr>().unwrap()]);
    }

    fn views(reads: &[(&str, KernelRead)]) -> KernelViews {
        KernelViews {
            reads: reads
                .iter()
                .map(|(p, r)| (PathBuf::from(p), r.clone()))
                .collect(),
            watch: None,
        }
    }

    fn in_netns(id: u64) -> KernelRead {
        KernelRead::Found {
            id: NetnsId { dev: 4, ino: id },
            interfaces: vec![found("eth0", &["10.0.0.1/24"])],
        }
    }

    fn answer(path: &str, origin: NetnsOrigin) -> NetnsAnswer {
        NetnsAnswer::Netns {
            path: path.into(),
            origin,
            ips: Vec::new(),
        }
    }

    fn runtime(sandbox: &str) -> NetnsOrigin {
        NetnsOrigin::Runtime {
            sandbox: sandbox.into(),
        }
    }

    fn key(name: &str) -> PodKey {
        PodKey::new("x", name)
    }

    /// Issue 20, defect 8: a pod (no sandbox, Pending or Failed) annotated with a victim's
    /// netns made both refused, and the new victim never got rules.
    #[test]
    fn the_runtime_says_whose_a_netns_is() {
        let kernel = views(&[
            ("/run/netns/cni-1", in_netns(1)),
            ("/run/netns/x", in_netns(1)),
        ]);
        let placed = place(
            vec![
                (
                    pod("x", "victim", &[], &["10.0.0.1"]),
                    answer("/run/netns/cni-1", runtime("s1")),
                ),
                (
                    pod("x", "intruder", &[], &[]),
                    answer("/run/netns/x", NetnsOrigin::Declared),
                ),
            ],
            &kernel,
        );
        assert_eq!(placed.states[&key("victim")], LocalState::Placed);
        let LocalState::Refused(why) = &placed.states[&key("intruder")] else {
            panic!("{:?}", placed.states)
        };
        assert!(
            why.contains("x/victim's") && why.contains("sandbox s1"),
            "{why}"
        );
        assert!(why.contains("declared in its objects"), "{why}");
        let victim = placed.pods.iter().find(|p| p.key == key("victim")).unwrap();
        assert_eq!(victim.netns.as_deref(), Some("/run/netns/cni-1"));
        let intruder = placed
            .pods
            .iter()
            .find(|p| p.key == key("intruder"))
            .unwrap();
        assert_eq!(
            intruder.netns, None,
            "never programmed into the victim's netns"
        );
        assert_eq!(placed.refused(), BTreeSet::from([key("intruder")]));
    }

    /// Without a runtime to say whose a netns is, two claims lock it down: the legitimate pod
    /// is cut off, never left open, whoever came first.
    #[test]
    fn a_netns_nobody_can_attribute_is_locked_down() {
        let kernel = views(&[("/run/netns/a", in_netns(1)), ("/run/netns/b", in_netns(1))]);
        for order in [["a", "b"], ["b", "a"]] {
            let answers = order
                .iter()
                .map(|n| {
                    let p = pod("x", n, &[], &["10.0.0.1"]);
                    (p, answer(&format!("/run/netns/{n}"), NetnsOrigin::Declared))
                })
                .collect();
            let placed = place(answers, &kernel);
            let locked: Vec<&PodKey> = placed.locked().map(|(k, _)| k).collect();
            assert_eq!(
                locked,
                [&key("a")],
                "the first claimant in key order holds it"
            );
            assert!(matches!(placed.states[&key("b")], LocalState::Refused(_)));
        }
    }

    /// Issue 20, defect 11: the runtime's "host network" no longer overrides the API.
    #[test]
    fn the_runtimes_host_network_against_the_api_is_a_refusal() {
        let placed = place(
            vec![(
                pod("x", "web", &[], &["10.0.0.1"]),
                NetnsAnswer::HostNetwork {
                    sandbox: "s1".into(),
                },
            )],
            &KernelViews::default(),
        );
        let LocalState::Refused(why) = &placed.states[&key("web")] else {
            panic!("{:?}", placed.states)
        };
        assert!(why.contains("spec.hostNetwork is false"), "{why}");
        let mut host = pod("x", "h", &[], &["192.168.0.1"]);
        host.host_network = true;
        let placed = place(
            vec![(host, answer("/run/netns/h", runtime("s2")))],
            &KernelViews::default(),
        );
        assert_eq!(placed.states[&key("h")], LocalState::HostNetwork);
    }

    #[test]
    fn an_unreadable_netns_refuses_and_a_missing_one_waits() {
        let kernel = views(&[
            (
                "/run/netns/bad",
                KernelRead::Unreadable("not a netns".into()),
            ),
            ("/run/netns/later", KernelRead::Missing),
        ]);
        let placed = place(
            vec![
                (
                    pod("x", "bad", &[], &["10.0.0.1"]),
                    answer("/run/netns/bad", NetnsOrigin::Declared),
                ),
                (
                    pod("x", "later", &[], &["10.0.0.2"]),
                    answer("/run/netns/later", runtime("s")),
                ),
                (
                    pod("x", "none", &[], &["10.0.0.3"]),
                    NetnsAnswer::Unknown("no sandbox".into()),
                ),
            ],
            &kernel,
        );
        assert_eq!(placed.states[&key("bad")].label(), "refused");
        assert_eq!(placed.states[&key("later")].label(), "waiting_for_netns");
        assert_eq!(placed.states[&key("none")].label(), "waiting_for_netns");
        let later = placed.pods.iter().find(|p| p.key == key("later")).unwrap();
        assert_eq!(
            later.netns.as_deref(),
            Some("/run/netns/later"),
            "retried until it exists"
        );
        let counts = count_states(&placed.states, &BTreeMap::new(), |_| true);
        assert_eq!((counts["refused"], counts["waiting_for_netns"]), (1, 2));
    }
}
