//! The engine's output: for each pod interface and direction, whether it is isolated and which
//! rules allow traffic, in the enforced view and in the staged (monitor) view.
//!
//! This is the typed value the renderers consume unchanged and from which verdicts are computed,
//! so verdicts and kernel rules cannot drift apart.

use std::net::IpAddr;
use std::sync::Arc;

use serde::Serialize;

use crate::addrset::AddrSet;
use crate::admin::{AdminAction, AdminRef, MonitoredRef, Tier};
use crate::model::{Direction, Mode, NetworkId, PodKey, PolicyRef, Protocol};

/// Where an allow rule comes from: `policy`'s `direction` rule number `index` (0-based).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct RuleOrigin {
    pub policy: PolicyRef,
    pub direction: Direction,
    pub index: usize,
    pub mode: Mode,
}

/// The peers a clause accepts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PeerMatch {
    /// Every address (a rule without `from`/`to`).
    Any,
    /// Only these addresses (shared between every pod the policy selects).
    Addrs(Arc<AddrSet>),
}

impl PeerMatch {
    pub fn contains(&self, addr: IpAddr) -> bool {
        match self {
            PeerMatch::Any => true,
            PeerMatch::Addrs(set) => set.contains(addr),
        }
    }
}

/// A protocol with an optional inclusive port range (`None` = every port of the protocol).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct PortRange {
    pub protocol: Protocol,
    pub ports: Option<(u16, u16)>,
}

impl PortRange {
    pub fn matches(&self, protocol: Protocol, port: u16) -> bool {
        self.protocol == protocol && self.ports.is_none_or(|(lo, hi)| port >= lo && port <= hi)
    }
}

/// The destination ports a clause accepts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PortMatch {
    /// Every protocol and port (a rule without `ports`).
    Any,
    /// Only these (never empty: a rule whose ports all fail to resolve has no clause).
    Only(Vec<PortRange>),
}

impl PortMatch {
    pub fn matches(&self, protocol: Protocol, port: u16) -> bool {
        match self {
            PortMatch::Any => true,
            PortMatch::Only(ranges) => ranges.iter().any(|r| r.matches(protocol, port)),
        }
    }
}

/// Peers × ports. A rule is the union of its clauses; it has several when named ports resolve
/// to different numbers on different destination pods (egress) or when Service virtual IPs are
/// added (SPEC 3.2).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Clause {
    pub peers: PeerMatch,
    pub ports: PortMatch,
}

impl Clause {
    pub fn matches(&self, peer: IpAddr, protocol: Protocol, port: u16) -> bool {
        self.peers.contains(peer) && self.ports.matches(protocol, port)
    }
}

/// One policy rule, resolved for one pod interface.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AllowRule {
    pub origin: RuleOrigin,
    /// Empty when nothing can match (e.g. only unresolvable named ports); kept so `explain`
    /// can still name the rule.
    pub clauses: Vec<Clause>,
}

impl AllowRule {
    pub fn matches(&self, peer: IpAddr, protocol: Protocol, port: u16) -> bool {
        self.clauses.iter().any(|c| c.matches(peer, protocol, port))
    }
}

/// Whether a direction is isolated and, if so, what is allowed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Isolation {
    /// No policy isolates this direction: everything is allowed.
    Open,
    /// Only traffic matching one of these rules is allowed. Shared: a direction without a
    /// monitored policy has the same rules in both views, held once.
    Isolated(Arc<[AllowRule]>),
}

impl Isolation {
    pub fn is_isolated(&self) -> bool {
        matches!(self, Isolation::Isolated(_))
    }

    pub fn rules(&self) -> &[AllowRule] {
        match self {
            Isolation::Open => &[],
            Isolation::Isolated(rules) => rules,
        }
    }

    /// Allowed, and the rules that allow it (empty when open).
    pub fn evaluate(&self, peer: IpAddr, protocol: Protocol, port: u16) -> (bool, Vec<&AllowRule>) {
        match self {
            Isolation::Open => (true, Vec::new()),
            Isolation::Isolated(rules) => {
                let matched: Vec<&AllowRule> = rules
                    .iter()
                    .filter(|r| r.matches(peer, protocol, port))
                    .collect();
                (!matched.is_empty(), matched)
            }
        }
    }
}

/// Where an admin tier rule comes from: `policy`'s `direction` rule number `index`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct TierOrigin {
    pub policy: AdminRef,
    pub tier: Tier,
    pub priority: u32,
    pub direction: Direction,
    pub index: usize,
    /// The rule's `name`, when it has one.
    pub name: Option<String>,
    pub mode: Mode,
}

/// One admin or baseline rule resolved for one pod interface: the first rule of a tier whose
/// clauses match decides with its action (SPEC 8).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TierRule {
    pub origin: TierOrigin,
    pub action: AdminAction,
    /// Empty when nothing can match (an Allow that cannot be implemented, e.g. `domainNames`).
    pub clauses: Vec<Clause>,
}

impl TierRule {
    pub fn matches(&self, peer: IpAddr, protocol: Protocol, port: u16) -> bool {
        self.clauses.iter().any(|c| c.matches(peer, protocol, port))
    }
}

/// The policies of `rules`, each once, in the order met (few per direction: a scan is cheaper
/// than a set).
fn distinct_policies<'a>(rules: impl Iterator<Item = &'a TierRule>) -> Vec<AdminRef> {
    let mut out: Vec<AdminRef> = Vec::new();
    for rule in rules {
        if !out.contains(&rule.origin.policy) {
            out.push(rule.origin.policy.clone());
        }
    }
    out
}

/// The admin policies' rules of one direction, in evaluation order, per view (the staged view
/// adds monitored admin policies and leaves out those they replace).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct TierRules {
    pub enforced: Arc<[TierRule]>,
    pub staged: Arc<[TierRule]>,
}

impl TierRules {
    pub fn view(&self, staged: bool) -> &[TierRule] {
        if staged {
            &self.staged
        } else {
            &self.enforced
        }
    }

    pub fn is_empty(&self) -> bool {
        self.enforced.is_empty() && self.staged.is_empty()
    }

    /// The admin policies with rules here in either view, enforced view first, each once.
    pub fn policies(&self) -> Vec<AdminRef> {
        distinct_policies(self.enforced.iter().chain(self.staged.iter()))
    }

    /// Whether the views differ (the kernel then needs the staged evaluation).
    pub fn differ(&self) -> bool {
        self.enforced != self.staged
    }

    /// The first rule of `view` that matches.
    pub fn first_match(
        &self,
        staged: bool,
        peer: IpAddr,
        protocol: Protocol,
        port: u16,
    ) -> Option<&TierRule> {
        self.view(staged)
            .iter()
            .find(|r| r.matches(peer, protocol, port))
    }
}

/// What decided one direction of a flow (SPEC 8: Admin → namespaced → Baseline → allow).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision<'a> {
    /// An Admin tier rule allowed or denied (Pass goes on, and is not a decision).
    Admin(&'a TierRule),
    /// Section 3's policies isolate the direction: allowed iff one of these rules matches
    /// (empty: denied).
    Namespaced(Vec<&'a AllowRule>),
    /// A Baseline tier rule allowed or denied.
    Baseline(&'a TierRule),
    /// Nothing decided: allowed.
    Default,
}

impl Decision<'_> {
    pub fn allowed(&self) -> bool {
        match self {
            Decision::Admin(rule) | Decision::Baseline(rule) => rule.action == AdminAction::Allow,
            Decision::Namespaced(rules) => !rules.is_empty(),
            Decision::Default => true,
        }
    }

    /// The tier's name as `explain` prints it.
    pub fn tier(&self) -> &'static str {
        match self {
            Decision::Admin(_) => "Admin",
            Decision::Namespaced(_) => "Namespaced",
            Decision::Baseline(_) => "Baseline",
            Decision::Default => "Default",
        }
    }
}

/// Why the staged view denies what the enforced view allows (SPEC 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StagedCause {
    /// No enforced policy isolates this direction; a monitored one would.
    NewIsolation,
    /// The enforced allow came only from a policy a monitored one replaces.
    ReplacedAllow,
    /// A monitored admin policy (or one replacing an enforced admin policy) changes the
    /// Admin or Baseline tier's decision (SPEC 8).
    AdminTier,
}

impl StagedCause {
    pub fn as_str(self) -> &'static str {
        match self {
            StagedCause::NewIsolation => "new-isolation",
            StagedCause::ReplacedAllow => "replaced-allow",
            StagedCause::AdminTier => "admin-tier",
        }
    }
}

/// Outgoing DNS allowed without a rule (SPEC 3.1, [`DnsMode`](crate::engine::DnsMode)), in each
/// view. Only ever set on egress, and only in a view that is isolated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
pub struct ImplicitDns {
    pub enforced: bool,
    pub staged: bool,
}

impl ImplicitDns {
    pub fn in_view(self, staged: bool) -> bool {
        if staged {
            self.staged
        } else {
            self.enforced
        }
    }
}

/// One direction of one pod interface.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DirectionRules {
    /// What the kernel enforces.
    pub enforced: Isolation,
    /// "If the monitored policies were enforced now" (equal to `enforced` when no monitored
    /// policy concerns this direction).
    pub staged: Isolation,
    /// Enforced policies isolating this direction.
    pub enforced_policies: Vec<PolicyRef>,
    /// Monitored policies isolating this direction.
    pub monitored_policies: Vec<PolicyRef>,
    /// Enforced policies here that leave the staged view (`netwarden.io/replaces`).
    pub replaced_policies: Vec<PolicyRef>,
    /// Log enforced denies (`netwarden.io/log` on an isolating policy, or the global switch).
    pub log_denies: bool,
    /// Outgoing DNS allowed without a rule, per view (egress only).
    pub implicit_dns: ImplicitDns,
    /// The Admin tier's rules, evaluated before `enforced`/`staged` (SPEC 8).
    pub admin: TierRules,
    /// The Baseline tier's rules, evaluated when no namespaced policy isolates the direction.
    pub baseline: TierRules,
}

impl DirectionRules {
    pub fn open() -> Self {
        DirectionRules {
            enforced: Isolation::Open,
            staged: Isolation::Open,
            enforced_policies: Vec::new(),
            monitored_policies: Vec::new(),
            replaced_policies: Vec::new(),
            log_denies: false,
            implicit_dns: ImplicitDns::default(),
            admin: TierRules::default(),
            baseline: TierRules::default(),
        }
    }

    /// The namespaced tier of `view`.
    pub fn isolation(&self, staged: bool) -> &Isolation {
        if staged {
            &self.staged
        } else {
            &self.enforced
        }
    }

    /// The monitored admin policies with rules here (either tier), in evaluation order.
    pub fn monitored_admin(&self) -> Vec<AdminRef> {
        let staged = self.admin.staged.iter().chain(self.baseline.staged.iter());
        distinct_policies(staged.filter(|rule| rule.origin.mode == Mode::Monitor))
    }

    /// The enforced admin policies with rules here (either tier), in evaluation order: those a
    /// deny here may come from, named beside the enforced namespaced policies in events.
    pub fn enforced_admin(&self) -> Vec<AdminRef> {
        distinct_policies(
            self.admin
                .enforced
                .iter()
                .chain(self.baseline.enforced.iter()),
        )
    }

    /// Every monitored policy judging this direction: the namespaced ones isolating it, then
    /// the admin ones with rules here.
    pub fn monitored(&self) -> Vec<MonitoredRef> {
        let namespaced = self
            .monitored_policies
            .iter()
            .cloned()
            .map(MonitoredRef::from);
        namespaced
            .chain(self.monitored_admin().into_iter().map(MonitoredRef::from))
            .collect()
    }

    /// Whether any admin policy (either tier, either view) has rules here.
    pub fn has_tiers(&self) -> bool {
        !self.admin.is_empty() || !self.baseline.is_empty()
    }

    /// Whether the kernel must evaluate anything here: isolated by a namespaced policy in
    /// either view, or an admin rule in either tier.
    pub fn needs_rules(&self) -> bool {
        self.enforced.is_isolated() || self.staged.is_isolated() || self.has_tiers()
    }

    /// What decides a packet of this direction from/to `peer` in `view` (SPEC 8): the first
    /// matching Admin rule (Pass goes on), the namespaced tier if it isolates, the first
    /// matching Baseline rule, else allowed. The implicit DNS allowance belongs to the
    /// namespaced tier and is not seen here (see `verdict`).
    pub fn decide(
        &self,
        staged: bool,
        peer: IpAddr,
        protocol: Protocol,
        port: u16,
    ) -> Decision<'_> {
        if let Some(rule) = self.admin.first_match(staged, peer, protocol, port) {
            if rule.action != AdminAction::Pass {
                return Decision::Admin(rule);
            }
        }
        match self.isolation(staged) {
            Isolation::Isolated(_) => {
                let (_, rules) = self.isolation(staged).evaluate(peer, protocol, port);
                Decision::Namespaced(rules)
            }
            // A Pass in the Baseline tier (refused at the edge) decides nothing.
            Isolation::Open => match self
                .baseline
                .view(staged)
                .iter()
                .find(|r| r.action != AdminAction::Pass && r.matches(peer, protocol, port))
            {
                Some(rule) => Decision::Baseline(rule),
                None => Decision::Default,
            },
        }
    }

    /// Whether the staged view differs from the enforced one, so the kernel needs the monitor
    /// evaluation. Pods without it carry no extra rules.
    pub fn has_monitor(&self) -> bool {
        !self.monitored_policies.is_empty()
            || !self.replaced_policies.is_empty()
            || self.admin.differ()
            || self.baseline.differ()
    }

    /// The cause recorded on a would-deny event.
    pub fn staged_cause(&self) -> StagedCause {
        let namespaced_monitor =
            !self.monitored_policies.is_empty() || !self.replaced_policies.is_empty();
        if !namespaced_monitor && (self.admin.differ() || self.baseline.differ()) {
            StagedCause::AdminTier
        } else if self.enforced.is_isolated() {
            StagedCause::ReplacedAllow
        } else {
            StagedCause::NewIsolation
        }
    }
}

/// One interface of a pod with its rules.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InterfaceRules {
    pub name: String,
    pub network: NetworkId,
    pub ips: Vec<IpAddr>,
    pub ingress: DirectionRules,
    pub egress: DirectionRules,
}

impl InterfaceRules {
    pub fn direction(&self, direction: Direction) -> &DirectionRules {
        match direction {
            Direction::Ingress => &self.ingress,
            Direction::Egress => &self.egress,
        }
    }

    /// Whether the kernel must evaluate anything on this interface (a namespaced policy
    /// isolates it, or an admin policy has rules for it).
    pub fn is_isolated(&self) -> bool {
        [&self.ingress, &self.egress]
            .iter()
            .any(|d| d.needs_rules())
    }
}

/// Everything netwarden programs into one pod's netns.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodRules {
    pub pod: PodKey,
    pub netns: Option<String>,
    pub interfaces: Vec<InterfaceRules>,
    /// Learn mode: every interface logs each distinct new flow once per window, whatever the
    /// policies decide (the pod's or its namespace's `netwarden.io/learn`, or `--learn`).
    pub learn: bool,
}

impl PodRules {
    /// A pod locked down ([`crate::Engine::set_lockdown`]): every interface isolated in both
    /// directions in both views, allowing nothing; no policy stands behind it, nothing logs.
    pub fn lockdown(pod: &crate::model::Pod) -> PodRules {
        let closed = || {
            let shut = Isolation::Isolated(Arc::from(Vec::new()));
            DirectionRules {
                enforced: shut.clone(),
                staged: shut,
                ..DirectionRules::open()
            }
        };
        PodRules {
            pod: pod.key.clone(),
            netns: pod.netns.clone(),
            interfaces: pod
                .interfaces
                .iter()
                .map(|iface| InterfaceRules {
                    name: iface.name.clone(),
                    network: iface.network.clone(),
                    ips: iface.ips.clone(),
                    ingress: closed(),
                    egress: closed(),
                })
                .collect(),
            learn: false,
        }
    }

    /// True when the pod needs a table at all: an isolated interface, or learn mode (which
    /// programs only logging rules).
    pub fn needs_rules(&self) -> bool {
        self.learn || self.is_isolated()
    }

    /// True when any interface is isolated in either view: the pod then gets rules at all,
    /// and forwarding through its netns is rejected (SPEC 3.1).
    pub fn is_isolated(&self) -> bool {
        self.interfaces.iter().any(InterfaceRules::is_isolated)
    }

    /// True when the pod's rules send NFLOG messages: learn mode, a monitored view, or logged
    /// denies (the agent then listens in its netns).
    pub fn logs(&self) -> bool {
        self.learn
            || self.interfaces.iter().any(|i| {
                [&i.ingress, &i.egress]
                    .iter()
                    .any(|d| d.has_monitor() || d.log_denies)
            })
    }

    pub fn interface(&self, name: &str) -> Option<&InterfaceRules> {
        self.interfaces.iter().find(|i| i.name == name)
    }
}
