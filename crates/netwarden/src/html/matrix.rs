//! The pod × pod matrix page: `reach -o html` (every probe, coloured by verdict) and
//! `diff -o html` (only the flows whose verdict changes).
//!
//! A few hundred pods make a few hundred thousand cells per (network, port, family); one DOM
//! node per cell in the file would make it tens of megabytes. So the file carries a compact
//! data block instead, which the page's script expands into the table it shows:
//! - every distinct cell meaning (state plus explanation, or state plus change) is a **class**,
//!   stored once; a cell is the class number, written in base 62 with the same width for every
//!   cell of the page, 0 meaning "no probe";
//! - runs of one class along a row are written once with `*COUNT;` (policies select by
//!   namespace and labels, so long runs are the rule);
//! - every admin policy rule a class names is stored once too ([`MatrixPage::tier_rules`]),
//!   classes refer to it by number: one rule decides many classes (with every isolating
//!   policy and namespaced rule they differ by), and its text is long.
//!
//! The explanation of a class is `explain`'s data (the isolating policies and the matching
//! rules of the source's egress and the destination's ingress, enforced and staged; where an
//! admin policy took part (SPEC 8), the deciding tier rule, the Admin rule that passed the flow
//! on, and the monitored admin policies of a would-deny) without the pod names and addresses,
//! which the row and column give: so cells that are decided the same way share one class.
//!
//! The fragment `#cell=M.R.T` (matrix index, source and destination member index; with `all&`
//! before it, every matrix drawn) opens the page with that cell's explanation shown: clicking a
//! cell writes it, so a link names the cell.

use std::collections::{BTreeMap, HashMap};

use netwarden_engine::verdict::{AlwaysAllowed, SideVerdict, SideVerdicts};
use netwarden_engine::{
    AdminAction, Direction, Family, FlowVerdict, Mode, PodKey, PolicyRef, Protocol, StagedCause,
    TierOrigin,
};
use serde::Serialize;

use super::{document, escape, script_json};
use crate::diff::Change;
use crate::reach::{Probe, Reach};

/// One end of a cell: a pod's interface on the matrix's network.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Member {
    pub namespace: String,
    pub pod: String,
    pub interface: String,
}

impl Member {
    pub fn new(pod: &PodKey, interface: &str) -> Member {
        Member {
            namespace: pod.namespace.clone(),
            pod: pod.name.clone(),
            interface: interface.to_owned(),
        }
    }
}

/// What a cell shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CellState {
    /// Allowed now and in the staged view.
    Allowed,
    /// Denied now and in the staged view.
    Denied,
    /// Allowed now, denied once the monitored policies are enforced.
    WouldDeny,
    /// Denied now, allowed once the monitored policies are enforced.
    WouldAllow,
    /// (diff) allowed before the change, denied after it.
    NewlyDenied,
    /// (diff) denied before the change, allowed after it.
    NewlyAllowed,
    /// (diff) the enforced verdict stays, the staged one changes.
    StagedChange,
}

impl CellState {
    /// The state of a probe: its enforced and staged verdicts.
    pub fn of_verdict(allowed: bool, staged_allowed: bool) -> CellState {
        match (allowed, staged_allowed) {
            (true, true) => CellState::Allowed,
            (false, false) => CellState::Denied,
            (true, false) => CellState::WouldDeny,
            (false, true) => CellState::WouldAllow,
        }
    }

    /// The state of a changed flow: what happens to the enforced verdict first.
    pub fn of_change(before: bool, after: bool) -> CellState {
        match (before, after) {
            (true, false) => CellState::NewlyDenied,
            (false, true) => CellState::NewlyAllowed,
            _ => CellState::StagedChange,
        }
    }
}

/// A rule that matched, as `explain` names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct RuleModel {
    pub kind: &'static str,
    pub policy: String,
    pub direction: Direction,
    pub index: usize,
    pub mode: Mode,
}

/// An admin policy rule (SPEC 8) as `explain` names it: tier, policy (`Kind/name`), rule
/// index and name, action, priority and mode.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct TierRuleModel {
    pub tier: &'static str,
    pub policy: String,
    pub direction: Direction,
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub action: &'static str,
    pub priority: u32,
    pub mode: Mode,
}

impl TierRuleModel {
    fn of(origin: &TierOrigin, action: AdminAction) -> TierRuleModel {
        TierRuleModel {
            tier: origin.tier.as_str(),
            policy: origin.policy.to_string(),
            direction: origin.direction,
            index: origin.index,
            name: origin.name.clone(),
            action: action.as_str(),
            priority: origin.priority,
            mode: origin.mode,
        }
    }
}

/// One side (source egress or destination ingress) in one view. The admin fields are left
/// out of the data block when empty, so a cluster without admin policies pays nothing.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct SideModel {
    pub allowed: bool,
    pub isolated: bool,
    /// `Kind ns/name` of every policy isolating the side.
    pub policies: Vec<String>,
    pub rules: Vec<RuleModel>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub always: Option<&'static str>,
    /// The Admin or Baseline rule that decided the side (an index into
    /// [`MatrixPage::tier_rules`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier_rule: Option<u32>,
    /// The Admin rule that matched with Pass, handing the side to the namespaced tier (indices
    /// into [`MatrixPage::tier_rules`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub passed: Vec<u32>,
}

impl SideModel {
    fn of(side: &SideVerdict, tier_rules: &mut Interner<TierRuleModel>) -> SideModel {
        SideModel {
            allowed: side.allowed,
            isolated: side.isolated,
            policies: side.policies.iter().map(policy_name).collect(),
            rules: side
                .matched
                .iter()
                .map(|m| RuleModel {
                    kind: m.policy.kind.as_str(),
                    policy: m.policy.to_string(),
                    direction: m.direction,
                    index: m.index,
                    mode: m.mode,
                })
                .collect(),
            always: side.always_allowed.map(|a| match a {
                AlwaysAllowed::Loopback => "loopback",
                AlwaysAllowed::Dns => "dns",
            }),
            tier_rule: side
                .tier_rule
                .as_ref()
                .map(|d| tier_rules.id(TierRuleModel::of(&d.origin, d.action))),
            passed: side
                .passed
                .iter()
                .map(|o| tier_rules.id(TierRuleModel::of(o, AdminAction::Pass)))
                .collect(),
        }
    }
}

/// A side in both views; `staged` only when it differs from `enforced`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct SideViews {
    pub enforced: SideModel,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub staged: Option<SideModel>,
}

impl SideViews {
    fn of(sides: &SideVerdicts, tier_rules: &mut Interner<TierRuleModel>) -> SideViews {
        SideViews {
            enforced: SideModel::of(&sides.enforced, tier_rules),
            staged: (sides.staged != sides.enforced)
                .then(|| SideModel::of(&sides.staged, tier_rules)),
        }
    }
}

/// Why a probe has its verdict: `explain`'s data without the pods' names and addresses.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Explanation {
    pub egress: SideViews,
    pub ingress: SideViews,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<&'static str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub monitored_policies: Vec<String>,
    /// `Kind/name` of the monitored admin policies with rules on a side of a would-deny.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub monitored_admin: Vec<String>,
}

impl Explanation {
    /// `verdict`'s explanation; the admin policy rules it names go to `tier_rules`.
    pub fn of(verdict: &FlowVerdict, tier_rules: &mut Interner<TierRuleModel>) -> Explanation {
        Explanation {
            egress: SideViews::of(&verdict.egress, tier_rules),
            ingress: SideViews::of(&verdict.ingress, tier_rules),
            cause: verdict.cause.map(StagedCause::as_str),
            monitored_policies: verdict.monitored_policies.iter().map(policy_name).collect(),
            monitored_admin: verdict
                .monitored_admin
                .iter()
                .map(ToString::to_string)
                .collect(),
        }
    }
}

/// The verdicts of a changed flow (a `diff` change row), with the policies responsible.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct ChangeModel {
    pub before: bool,
    pub after: bool,
    pub staged_before: bool,
    pub staged_after: bool,
    pub policies: Vec<String>,
    /// `Kind/name` of the admin policies whose rule decided a changed side (SPEC 8).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub admin_policies: Vec<String>,
}

/// One distinct cell meaning; cells refer to it by number.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct CellClass {
    pub state: CellState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub explanation: Option<Explanation>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub change: Option<ChangeModel>,
}

/// Which matrix a cell belongs to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MatrixKey {
    /// `default` or `ns/name`.
    pub network: String,
    pub port: u16,
    pub protocol: Protocol,
    pub family: Family,
}

/// One matrix: rows are sources, columns destinations (indices into [`MatrixPage::members`],
/// sorted by namespace, pod, interface), cells row-major in the compact encoding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Matrix {
    pub network: String,
    pub port: u16,
    pub protocol: Protocol,
    pub family: Family,
    pub rows: Vec<u32>,
    pub cols: Vec<u32>,
    pub cells: String,
}

/// `reach` or `diff`: which legend and wording the page uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PageKind {
    Reach,
    Diff,
}

/// Everything the matrix page shows; serialized as the page's data block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MatrixPage {
    pub kind: PageKind,
    pub title: String,
    pub members: Vec<Member>,
    /// Class 1 is `classes[0]`; 0 is "no probe".
    pub classes: Vec<CellClass>,
    /// The admin policy rules the classes name, each once.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tier_rules: Vec<TierRuleModel>,
    /// Base-62 digits per cell code.
    pub width: usize,
    pub matrices: Vec<Matrix>,
}

/// Values numbered in the order first seen, each stored once.
#[derive(Debug)]
pub struct Interner<T> {
    values: Vec<T>,
    ids: HashMap<T, u32>,
}

impl<T> Default for Interner<T> {
    fn default() -> Self {
        Interner {
            values: Vec::new(),
            ids: HashMap::new(),
        }
    }
}

impl<T: Clone + Eq + std::hash::Hash> Interner<T> {
    /// `value`'s number (from 0).
    pub fn id(&mut self, value: T) -> u32 {
        if let Some(&id) = self.ids.get(&value) {
            return id;
        }
        let id = self.values.len() as u32;
        self.values.push(value.clone());
        self.ids.insert(value, id);
        id
    }
}

/// Collects cells in any order, interning members, classes and the admin rules they name.
#[derive(Default)]
pub struct MatrixPageBuilder {
    members: Interner<Member>,
    classes: Interner<CellClass>,
    /// For [`Explanation::of`].
    pub tier_rules: Interner<TierRuleModel>,
    cells: BTreeMap<MatrixKey, Vec<(u32, u32, u32)>>,
}

impl MatrixPageBuilder {
    /// Adds one cell; a later cell for the same (matrix, from, to) replaces an earlier one.
    pub fn add(&mut self, key: MatrixKey, from: Member, to: Member, class: CellClass) {
        // Classes are numbered from 1: 0 is "no probe".
        let (f, t, c) = (
            self.members.id(from),
            self.members.id(to),
            self.classes.id(class) + 1,
        );
        self.cells.entry(key).or_default().push((f, t, c));
    }

    /// The page: members sorted (namespace grouping), matrices in (network, port, protocol,
    /// family) order, cells encoded.
    pub fn finish(self, kind: PageKind, title: &str) -> MatrixPage {
        // Renumber members in sorted order so rows and columns group by namespace.
        let (members, classes) = (self.members.values, self.classes.values);
        let mut order: Vec<u32> = (0..members.len() as u32).collect();
        order.sort_by(|a, b| members[*a as usize].cmp(&members[*b as usize]));
        let mut new_id = vec![0u32; order.len()];
        for (new, old) in order.iter().enumerate() {
            new_id[*old as usize] = new as u32;
        }
        let members: Vec<Member> = order
            .iter()
            .map(|old| members[*old as usize].clone())
            .collect();
        let width = digits_for(classes.len());
        let matrices = self
            .cells
            .into_iter()
            .map(|(key, cells)| {
                let cells: Vec<(u32, u32, u32)> = cells
                    .into_iter()
                    .map(|(f, t, c)| (new_id[f as usize], new_id[t as usize], c))
                    .collect();
                let mut rows: Vec<u32> = cells.iter().map(|c| c.0).collect();
                let mut cols: Vec<u32> = cells.iter().map(|c| c.1).collect();
                for v in [&mut rows, &mut cols] {
                    v.sort_unstable();
                    v.dedup();
                }
                let row_of: HashMap<u32, usize> =
                    rows.iter().enumerate().map(|(i, m)| (*m, i)).collect();
                let col_of: HashMap<u32, usize> =
                    cols.iter().enumerate().map(|(i, m)| (*m, i)).collect();
                let row_len = cols.len().max(1);
                let mut grid = vec![0u32; rows.len() * cols.len()];
                for (f, t, c) in cells {
                    grid[row_of[&f] * cols.len() + col_of[&t]] = c;
                }
                Matrix {
                    network: key.network,
                    port: key.port,
                    protocol: key.protocol,
                    family: key.family,
                    rows,
                    cols,
                    cells: encode_cells(&grid, row_len, width),
                }
            })
            .collect();
        MatrixPage {
            kind,
            title: title.to_owned(),
            members,
            classes,
            tier_rules: self.tier_rules.values,
            width,
            matrices,
        }
    }
}

const DIGITS: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// How many base-62 digits encode every code from 0 to `classes`.
fn digits_for(classes: usize) -> usize {
    let mut width = 1;
    let mut capacity = 62usize;
    while classes >= capacity {
        width += 1;
        capacity = capacity.saturating_mul(62);
    }
    width
}

fn push_code(out: &mut String, mut code: u32, width: usize) {
    let mut digits = vec![b'0'; width];
    for d in digits.iter_mut().rev() {
        *d = DIGITS[(code % 62) as usize];
        code /= 62;
    }
    out.extend(digits.into_iter().map(char::from));
}

/// Row-major codes, `width` digits each; a run of n > 2 equal codes within a row is written
/// as the code then `*n;`. Runs stop at a row's end: the decoder would not care, but rows are
/// what people read, and the encoding stays easy to check by hand.
pub fn encode_cells(grid: &[u32], row_len: usize, width: usize) -> String {
    let mut out = String::new();
    for row in grid.chunks(row_len) {
        let mut i = 0;
        while i < row.len() {
            let run = row[i..].iter().take_while(|c| **c == row[i]).count();
            push_code(&mut out, row[i], width);
            if run > 2 {
                out.push('*');
                out.push_str(&run.to_string());
                out.push(';');
                i += run;
            } else {
                i += 1;
            }
        }
    }
    out
}

/// The inverse of [`encode_cells`] (the page's script does the same; tests use this one).
pub fn decode_cells(cells: &str, width: usize) -> Option<Vec<u32>> {
    let bytes = cells.as_bytes();
    let mut out = Vec::new();
    let mut p = 0;
    while p < bytes.len() {
        let mut code = 0u32;
        for b in bytes.get(p..p + width)? {
            code = code * 62 + DIGITS.iter().position(|d| d == b)? as u32;
        }
        p += width;
        let mut run = 1;
        if bytes.get(p) == Some(&b'*') {
            let end = p + cells[p..].find(';')?;
            run = cells[p + 1..end].parse().ok()?;
            p = end + 1;
        }
        out.extend(std::iter::repeat_n(code, run));
    }
    Some(out)
}

fn policy_name(p: &PolicyRef) -> String {
    format!("{} {}", p.kind, p)
}

fn key_of(probe: &Probe) -> MatrixKey {
    MatrixKey {
        network: probe.network.display_name(),
        port: probe.port,
        protocol: probe.protocol,
        family: probe.family,
    }
}

/// The `reach` page: every probe of `reach`, with its explanation.
pub fn reach_page(reach: &Reach<'_>, title: &str) -> MatrixPage {
    let mut builder = MatrixPageBuilder::default();
    for (probe, verdict) in reach.explained_probes() {
        let class = CellClass {
            state: CellState::of_verdict(probe.allowed, probe.staged_allowed),
            explanation: Some(Explanation::of(&verdict, &mut builder.tier_rules)),
            change: None,
        };
        builder.add(
            key_of(&probe),
            Member::new(&probe.from, &probe.from_interface),
            Member::new(&probe.to, &probe.to_interface),
            class,
        );
    }
    builder.finish(PageKind::Reach, title)
}

/// The `diff` page: only the changed flows, each a "changed" cell (newly denied, newly allowed
/// or a staged-view change); rows and columns are the pods that take part in a change.
pub fn diff_page<'a>(changes: impl IntoIterator<Item = &'a Change>, title: &str) -> MatrixPage {
    let mut builder = MatrixPageBuilder::default();
    for c in changes {
        let class = CellClass {
            state: CellState::of_change(c.before, c.after),
            explanation: None,
            change: Some(ChangeModel {
                before: c.before,
                after: c.after,
                staged_before: c.staged_before,
                staged_after: c.staged_after,
                policies: c
                    .policies
                    .iter()
                    .map(|p| format!("{} {}", p.kind.as_str(), p.key))
                    .collect(),
                admin_policies: c.admin_policies.iter().map(ToString::to_string).collect(),
            }),
        };
        builder.add(
            MatrixKey {
                network: c.network.to_string(),
                port: c.port,
                protocol: c.protocol,
                family: c.family,
            },
            Member::new(&c.from, &c.from_interface),
            Member::new(&c.to, &c.to_interface),
            class,
        );
    }
    builder.finish(PageKind::Diff, title)
}

const MATRIX_JS: &str = include_str!("matrix.js");

/// The page: the data block, the controls, and the script that draws the matrices.
pub fn render(page: &MatrixPage) -> String {
    let legend: &[(&str, &str)] = match page.kind {
        PageKind::Reach => &[
            ("allowed", "allowed"),
            ("denied", "denied"),
            (
                "would-deny",
                "would-deny (allowed now, denied by monitored policies)",
            ),
            (
                "would-allow",
                "would-allow (denied now, allowed by monitored policies)",
            ),
            ("none", "no probe"),
        ],
        PageKind::Diff => &[
            ("newly-denied", "newly denied"),
            ("newly-allowed", "newly allowed"),
            ("staged-change", "staged view changes"),
            ("none", "unchanged"),
        ],
    };
    let mut legend_html = String::new();
    for (class, text) in legend {
        legend_html.push_str(&format!(
            "<span><i class=\"sw {class}\"></i>{}</span>",
            escape(text)
        ));
    }
    let cells: usize = page
        .matrices
        .iter()
        .map(|m| m.rows.len() * m.cols.len())
        .sum();
    let body = format!(
        "<h1>{title}</h1>\
<p class=\"muted\">{pods} pod interface(s), {matrices} matrix(es), {cells} cell(s). \
Rows: source; columns: destination. Hover a cell for its explanation, click to keep it (the address then links to that cell).</p>\
<div class=\"bar\"><label>Network <select id=\"network\"></select></label>\
<label>Port <select id=\"matrix\"></select></label>\
<fieldset id=\"namespaces\"><legend>Namespaces</legend></fieldset>\
<div class=\"legend\">{legend_html}</div></div>\
<div id=\"detail\">Click a cell.</div><div id=\"matrices\"></div><div id=\"tip\"></div>\
<script type=\"application/json\" id=\"data\">{data}</script><script>{MATRIX_JS}</script>",
        title = escape(&page.title),
        pods = page.members.len(),
        matrices = page.matrices.len(),
        data = script_json(page),
    );
    document(&page.title, "", &body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reach::ReachQuery;
    use netwarden_engine::testing::{netpol, pod, selector};
    use netwarden_engine::{Engine, EngineOptions};

    /// x/a, x/b (dual-stack), y/c (IPv4); x/b only accepts from itself, a monitored policy
    /// would close y/c.
    fn engine() -> Engine {
        let mut e = Engine::new(EngineOptions::default());
        e.set_pod(pod("x", "a", &[("app", "a")], &["10.0.0.1", "fd00::1"]));
        e.set_pod(pod("x", "b", &[("app", "b")], &["10.0.0.2", "fd00::2"]));
        e.set_pod(pod("y", "c", &[("app", "c")], &["10.0.0.3"]));
        e.set_policy(netpol(
            "x",
            "b",
            selector(&[("app", "b")]),
            Some(vec![]),
            None,
        ));
        let mut monitored = netpol("y", "c", selector(&[("app", "c")]), Some(vec![]), None);
        monitored.mode = Mode::Monitor;
        e.set_policy(monitored);
        e
    }

    #[test]
    fn cells_round_trip_with_runs() {
        let grid = [1, 1, 1, 1, 2, 0, 0, 3, 3, 3];
        let text = encode_cells(&grid, 5, 1);
        // Row 1: four 1s then a 2; row 2: two 0s (too short for a run) then three 3s.
        assert_eq!(text, "1*4;2003*3;");
        assert_eq!(decode_cells(&text, 1).unwrap(), grid);
        let wide = [0, 61, 62, 3843, 3843, 3843];
        let text = encode_cells(&wide, 6, 2);
        assert_eq!(text, "000z10zz*3;");
        assert_eq!(decode_cells(&text, 2).unwrap(), wide);
        assert_eq!((digits_for(0), digits_for(61), digits_for(62)), (1, 1, 2));
        assert_eq!(decode_cells("1*x;", 1), None);
    }

    #[test]
    fn reach_page_cells_are_the_probes() {
        let mut e = engine();
        let rules = e.all_pod_rules();
        let q = ReachQuery {
            ports: vec!["80/TCP".parse().unwrap(), "53/UDP".parse().unwrap()],
            ..ReachQuery::default()
        };
        let reach = Reach::new(&e, &rules, &q);
        let page = reach_page(&reach, "t");
        // (IPv4: 3×3, IPv6: 2×2) × 2 ports.
        assert_eq!(page.matrices.len(), 4);
        let mut seen = 0;
        for probe in reach.probes() {
            let m = page
                .matrices
                .iter()
                .find(|m| {
                    m.port == probe.port && m.protocol == probe.protocol && m.family == probe.family
                })
                .unwrap();
            let cells = decode_cells(&m.cells, page.width).unwrap();
            let index = |list: &[u32], key: &PodKey| {
                list.iter()
                    .position(|i| {
                        let mem = &page.members[*i as usize];
                        mem.namespace == key.namespace && mem.pod == key.name
                    })
                    .unwrap()
            };
            let (r, c) = (index(&m.rows, &probe.from), index(&m.cols, &probe.to));
            let code = cells[r * m.cols.len() + c] as usize;
            let class = &page.classes[code - 1];
            assert_eq!(
                class.state,
                CellState::of_verdict(probe.allowed, probe.staged_allowed)
            );
            seen += 1;
        }
        assert_eq!(seen, 2 * (9 + 4));
        // Namespace grouping: members sorted, x before y.
        let names: Vec<String> = page
            .members
            .iter()
            .map(|m| format!("{}/{}", m.namespace, m.pod))
            .collect();
        assert_eq!(names, ["x/a", "x/b", "y/c"]);
        // Cells decided the same way share a class: far fewer classes than cells.
        assert!(page.classes.len() < 10, "{:?}", page.classes);
        let would_deny = page
            .classes
            .iter()
            .find(|c| c.state == CellState::WouldDeny)
            .expect("x/a -> y/c is a would-deny");
        let x = would_deny.explanation.as_ref().unwrap();
        assert_eq!(x.cause, Some("new-isolation"));
        assert_eq!(x.monitored_policies, ["NetworkPolicy y/c"]);
        let staged = x.ingress.staged.as_ref().expect("staged ingress differs");
        assert!(staged.isolated && !staged.allowed && staged.rules.is_empty());
        let denied = page
            .classes
            .iter()
            .find(|c| c.state == CellState::Denied)
            .unwrap();
        assert_eq!(
            denied
                .explanation
                .as_ref()
                .unwrap()
                .ingress
                .enforced
                .policies,
            ["NetworkPolicy x/b"]
        );
    }

    /// The class of the cell `from` → `to` (`ns/name`) of the first matrix having it.
    fn class_of<'p>(page: &'p MatrixPage, from: &str, to: &str) -> &'p CellClass {
        let member = |s: &str| {
            page.members
                .iter()
                .position(|m| format!("{}/{}", m.namespace, m.pod) == s)
                .unwrap() as u32
        };
        let (f, t) = (member(from), member(to));
        let m = page
            .matrices
            .iter()
            .find(|m| m.rows.contains(&f) && m.cols.contains(&t))
            .unwrap();
        let cells = decode_cells(&m.cells, page.width).unwrap();
        let r = m.rows.iter().position(|x| *x == f).unwrap();
        let c = m.cols.iter().position(|x| *x == t).unwrap();
        &page.classes[cells[r * m.cols.len() + c] as usize - 1]
    }

    /// Admin policies (SPEC 8): x's ingress denies y (`guard` rule 0) and passes z on
    /// (`guard` rule 1); a monitored `audit` would deny x into y.
    fn admin_engine() -> Engine {
        use netwarden_engine::testing::{admin_policy, admin_rule, in_namespaces, namespace};
        use netwarden_engine::{AdminAction, AdminKind, AdminPeer};
        let mut e = Engine::new(EngineOptions::default());
        for ns in ["x", "y", "z"] {
            e.set_namespace(namespace(ns, &[("team", ns)]));
        }
        for (i, (ns, name)) in [("x", "a"), ("x", "b"), ("y", "c"), ("y", "d"), ("z", "e")]
            .into_iter()
            .enumerate()
        {
            e.set_pod(pod(ns, name, &[], &[&format!("10.0.0.{}", i + 1)]));
        }
        let rule = |action, from: &str, name: &str| {
            let mut r = admin_rule(
                action,
                vec![AdminPeer::Pods(in_namespaces(&[("team", from)]))],
                None,
            );
            r.name = Some(name.to_owned());
            r
        };
        e.set_admin_policy(admin_policy(
            AdminKind::AdminNetworkPolicy,
            "guard",
            10,
            in_namespaces(&[("team", "x")]),
            vec![
                rule(AdminAction::Deny, "y", "deny-y"),
                rule(AdminAction::Pass, "z", "pass-z"),
            ],
            vec![],
        ));
        let mut audit = admin_policy(
            AdminKind::AdminNetworkPolicy,
            "audit",
            1,
            in_namespaces(&[("team", "y")]),
            vec![rule(AdminAction::Deny, "x", "no-x")],
            vec![],
        );
        audit.mode = Mode::Monitor;
        e.set_admin_policy(audit);
        e
    }

    #[test]
    fn classes_name_the_admin_tier() {
        let mut e = admin_engine();
        let rules = e.all_pod_rules();
        let q = ReachQuery {
            ports: vec!["80/TCP".parse().unwrap()],
            ..ReachQuery::default()
        };
        let page = reach_page(&Reach::new(&e, &rules, &q), "t");

        // An Admin Deny decides: the rule is named, and every cell it decides alike is one
        // class.
        let denied = class_of(&page, "y/c", "x/a");
        assert_eq!(denied.state, CellState::Denied);
        assert!(std::ptr::eq(denied, class_of(&page, "y/d", "x/b")));
        let x = denied.explanation.as_ref().unwrap();
        assert_eq!(x.ingress.staged, None, "the views agree");
        let rule = |id: Option<u32>| id.map(|i| page.tier_rules[i as usize].clone());
        assert_eq!(
            rule(x.ingress.enforced.tier_rule),
            Some(TierRuleModel {
                tier: "Admin",
                policy: "AdminNetworkPolicy/guard".into(),
                direction: Direction::Ingress,
                index: 0,
                name: Some("deny-y".into()),
                action: "Deny",
                priority: 10,
                mode: Mode::Enforce,
            })
        );
        assert!(x.egress.enforced.tier_rule.is_none() && x.egress.enforced.passed.is_empty());

        // A Pass hands over to the namespaced tier (nothing isolates x: allowed).
        let passed = class_of(&page, "z/e", "x/a");
        assert_eq!(passed.state, CellState::Allowed);
        let side = &passed.explanation.as_ref().unwrap().ingress.enforced;
        assert_eq!(side.tier_rule, None);
        assert_eq!(side.passed.len(), 1);
        let pass = rule(Some(side.passed[0])).unwrap();
        assert_eq!(
            (pass.policy.as_str(), pass.index, pass.action),
            ("AdminNetworkPolicy/guard", 1, "Pass")
        );

        // A monitored admin policy's would-deny names it, with its cause.
        let would = class_of(&page, "x/a", "y/c");
        assert_eq!(would.state, CellState::WouldDeny);
        assert!(std::ptr::eq(would, class_of(&page, "x/b", "y/d")));
        let x = would.explanation.as_ref().unwrap();
        assert_eq!(x.cause, Some("admin-tier"));
        assert_eq!(x.monitored_admin, ["AdminNetworkPolicy/audit"]);
        assert!(x.monitored_policies.is_empty());
        let staged = x.ingress.staged.as_ref().expect("the staged view differs");
        let audit = rule(staged.tier_rule).unwrap();
        assert_eq!(
            (
                audit.policy.as_str(),
                audit.action,
                audit.mode,
                staged.allowed
            ),
            ("AdminNetworkPolicy/audit", "Deny", Mode::Monitor, false)
        );
        assert_eq!(x.ingress.enforced.tier_rule, None);

        // 25 cells, few ways to decide them; each rule stored once (guard's two, audit's).
        assert!(page.classes.len() <= 6, "{:#?}", page.classes);
        assert_eq!(page.tier_rules.len(), 3, "{:#?}", page.tier_rules);
        let html = render(&page);
        assert!(html.contains("\"tier_rules\":[{\"tier\":\"Admin\""));
    }

    /// An admin policy's and its rule's names are data: escaped in the data block, never
    /// markup (the script writes them with `textContent`).
    #[test]
    fn hostile_admin_rule_names_stay_text() {
        use netwarden_engine::testing::{admin_policy, admin_rule, in_namespaces};
        use netwarden_engine::{AdminAction, AdminKind, AdminPeer};
        let hostile = "</script><img src=x onerror=alert(1)><!--";
        let mut e = admin_engine();
        let mut r = admin_rule(
            AdminAction::Deny,
            vec![AdminPeer::Pods(in_namespaces(&[("team", "z")]))],
            None,
        );
        r.name = Some(hostile.to_owned());
        e.set_admin_policy(admin_policy(
            AdminKind::ClusterNetworkPolicy,
            hostile,
            0,
            in_namespaces(&[("team", "y")]),
            vec![r],
            vec![],
        ));
        let rules = e.all_pod_rules();
        let q = ReachQuery {
            ports: vec!["80/TCP".parse().unwrap()],
            ..ReachQuery::default()
        };
        let page = reach_page(&Reach::new(&e, &rules, &q), "t");
        let named = page
            .tier_rules
            .iter()
            .find(|r| r.name.as_deref() == Some(hostile))
            .expect("z -> y is decided by the hostile rule");
        assert_eq!(named.policy, format!("ClusterNetworkPolicy/{hostile}"));
        let html = render(&page);
        assert!(
            !html.contains("<img") && !html.contains("<!--"),
            "markup injected"
        );
        assert_eq!(html.matches("</script>").count(), 2);
    }

    #[test]
    fn without_admin_policies_the_data_block_has_no_admin_fields() {
        let mut e = engine();
        let rules = e.all_pod_rules();
        let q = ReachQuery {
            ports: vec!["80/TCP".parse().unwrap()],
            ..ReachQuery::default()
        };
        let html = render(&reach_page(&Reach::new(&e, &rules, &q), "t"));
        let start = html.find("id=\"data\">").unwrap();
        let data = &html[start..start + html[start..].find("</script>").unwrap()];
        assert!(data.contains("\"isolated\""), "{data}");
        // (`tier_rules` too: it starts with `tier_rule`.)
        for field in ["tier_rule", "passed", "monitored_admin", "admin_policies"] {
            assert!(!data.contains(field), "{field} in the data block");
        }
    }

    /// The generated cluster (300 pods, 60 policies) with and without 50 admin policies of the
    /// generator (whole-namespace subjects, 5 rules per direction): the admin tier's rules make
    /// more ways to decide a cell, but cells decided alike still share a class and each rule
    /// is stored once, so the page grows by less than a quarter, not with the cells.
    #[test]
    fn admin_policies_keep_the_page_compact() {
        use netwarden_engine::generate::{admin_policies, cluster};
        let c = cluster(300, 60, 7);
        let page = |admin: bool| {
            let inventory = netwarden_manifest::Inventory {
                namespaces: c.namespaces.clone(),
                pods: c.pods.clone(),
                policies: c.policies.clone(),
                services: c.services.clone(),
                admin_policies: if admin {
                    admin_policies(50, 7)
                } else {
                    Vec::new()
                },
                ..Default::default()
            };
            let mut e = crate::inventory::engine_from(&inventory, EngineOptions::default());
            let rules = e.all_pod_rules();
            let q = ReachQuery {
                ports: vec!["80/TCP".parse().unwrap()],
                ..ReachQuery::default()
            };
            let page = reach_page(&Reach::new(&e, &rules, &q), "t");
            let cells: usize = page
                .matrices
                .iter()
                .map(|m| m.rows.len() * m.cols.len())
                .sum();
            (render(&page).len(), page.classes.len(), cells)
        };
        let (without, classes_without, cells) = page(false);
        let (with, classes_with, _) = page(true);
        eprintln!(
            "{cells} cells: {without} bytes, {classes_without} classes; with 50 admin policies {with} bytes, {classes_with} classes"
        );
        assert!(classes_with > classes_without, "the admin tier takes part");
        // Measured: 182,926 bytes without, 199,721 with (the rules stored once).
        assert!(with * 4 < without * 5, "{with} bytes against {without}");
        assert!(with < cells * 4, "{with} bytes for {cells} cells");
    }

    fn change(from: &str, to: &str, before: bool, after: bool, policies: &[&str]) -> Change {
        let key = |s: &str| {
            let (ns, name) = s.rsplit_once('/').unwrap();
            PodKey::new(ns, name)
        };
        let staged_after = !before || after;
        Change {
            from: key(from),
            to: key(to),
            from_interface: "eth0".into(),
            to_interface: "eth0".into(),
            network: netwarden_engine::NetworkId::Primary,
            port: 80,
            protocol: Protocol::Tcp,
            family: Family::Ipv4,
            before,
            after,
            staged_before: before,
            staged_after,
            kind: crate::diff::ChangeKind::of(before, after),
            admin_policies: Vec::new(),
            policies: policies
                .iter()
                .map(|s| {
                    let name = s.strip_prefix("NetworkPolicy ").unwrap_or(s);
                    let (ns, name) = name.split_once('/').unwrap_or(("x", name));
                    netwarden_engine::PolicyRef {
                        kind: netwarden_engine::PolicyKind::NetworkPolicy,
                        key: netwarden_engine::ObjectKey::new(ns, name),
                    }
                })
                .collect(),
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
        }
    }

    #[test]
    fn diff_page_marks_only_changed_cells() {
        let page = diff_page(
            &[
                change("x/a", "x/b", true, false, &["NetworkPolicy x/lock"]),
                change("y/c", "x/a", false, true, &["NetworkPolicy x/open"]),
                change("x/b", "x/a", true, true, &["NetworkPolicy x/m"]),
            ],
            "diff",
        );
        assert_eq!(page.kind, PageKind::Diff);
        assert_eq!(page.matrices.len(), 1);
        let m = &page.matrices[0];
        // Rows: sources x/a, x/b, y/c; columns: destinations x/a, x/b.
        let name = |i: &u32| page.members[*i as usize].pod.clone();
        assert_eq!(m.rows.iter().map(name).collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!(m.cols.iter().map(name).collect::<Vec<_>>(), ["a", "b"]);
        let cells = decode_cells(&m.cells, page.width).unwrap();
        let state = |code: u32| (code > 0).then(|| page.classes[code as usize - 1].state);
        let states: Vec<Option<CellState>> = cells.into_iter().map(state).collect();
        assert_eq!(
            states,
            [
                None,
                Some(CellState::NewlyDenied),
                Some(CellState::StagedChange),
                None,
                Some(CellState::NewlyAllowed),
                None
            ]
        );
        let newly_denied = &page.classes[0];
        assert_eq!(
            newly_denied.change.as_ref().unwrap().policies,
            ["NetworkPolicy x/lock"]
        );
    }

    #[test]
    fn diff_page_names_admin_policies() {
        let mut c = change("x/a", "x/b", true, false, &[]);
        c.admin_policies = vec![netwarden_engine::AdminRef {
            kind: netwarden_engine::AdminKind::ClusterNetworkPolicy,
            name: "lock/<all>".into(),
        }];
        let page = diff_page(&[c], "diff");
        let change = page.classes[0].change.as_ref().unwrap();
        assert_eq!(change.admin_policies, ["ClusterNetworkPolicy/lock/<all>"]);
        let html = render(&page);
        assert!(
            html.contains("ClusterNetworkPolicy/lock/\\u003call\\u003e"),
            "{html}"
        );
        assert!(!html.contains("<all>"));
    }

    #[test]
    fn hostile_names_stay_text() {
        let hostile = "</script><img src=x onerror=alert(1)><!--";
        let page = diff_page(
            &[change(
                &format!("{hostile}/a"),
                "x/b",
                true,
                false,
                &[hostile],
            )],
            hostile,
        );
        let html = render(&page);
        assert!(!html.contains("<img"), "markup injected");
        assert!(!html.contains("<!--"), "comment injected");
        // The only `</script>` ends are the page's own two scripts.
        assert_eq!(html.matches("</script>").count(), 2);
        assert!(html
            .contains("<title>&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;&lt;!--</title>"));
        // The data block still holds the names unchanged.
        let start = html.find("id=\"data\">").unwrap() + "id=\"data\">".len();
        let end = start + html[start..].find("</script>").unwrap();
        let data: serde_json::Value = serde_json::from_str(&html[start..end]).unwrap();
        assert_eq!(data["members"][0]["namespace"], hostile);
        assert_eq!(
            data["classes"][0]["change"]["policies"][0],
            format!("NetworkPolicy {hostile}")
        );
    }
}
