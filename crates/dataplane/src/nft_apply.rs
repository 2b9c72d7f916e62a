//! The nftables dataplane: `nft -f -` inside the pod netns, one transaction per apply.
//!
//! The rendered text ([`netwarden_render::nft`]) updates table `inet netwarden` in place: every
//! chain is flushed and refilled, and peer sets are named by their content, so the sets the
//! rules in force look into are never emptied or deleted by the transaction that replaces
//! those rules (a packet still walking the old rules after the commit looks into sets with the
//! *new* generation: anything deleted would look absent, see the renderer's module doc).
//!
//! What the text cannot do is delete what became unused, because that depends on what the
//! kernel holds. This applier adds it, in the same transaction ([`plan_update`]):
//!
//! - chains no longer declared (an interface that left, a direction no longer isolated) are
//!   flushed then deleted, after the chains that jumped to them were flushed;
//! - a set is deleted only when neither the new ruleset nor the PREVIOUS one references it: the
//!   rules using it were replaced one apply earlier, so no packet can still be walking them.
//!
//! It therefore remembers per netns what the kernel holds and which sets the last applied rules
//! use ([`NftNetnsState`]). When it does not know (first apply in this process, after a failure
//! or `forget`) it reads the table back once and treats every set found as possibly in use.
//!
//! `nft -f` commits the whole file in one netlink batch, so a failure leaves the previous
//! table in place and packets never see a half-built table. Nothing here touches another table:
//! removal deletes `inet netwarden` only, and only when it exists (the pod is open then, so no
//! packet depends on what goes).
//!
//! Sessions (off by default, see [`SESSIONS_BY_DEFAULT`]; [`NftDataplane::with_sessions`]):
//! transactions go through a long-lived `nft -i` per netns
//! ([`NftSession`](crate::nft_session::NftSession): one input line is one batch, same
//! all-or-nothing semantics), which saves the 12-20 ms every `nft` process costs when it ends.
//! At most [`MAX_SESSIONS`] are kept (least recently used closed first); beyond, for a text
//! that cannot be sent as one line, or when a session breaks (then re-planned against the
//! kernel), the transaction goes through a one-shot `nft -f -`. A session holds its netns
//! alive, so it is closed when the netns is removed or forgotten, and dropped when the path no
//! longer names the namespace it runs in (checked before each use and at each batch).

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Mutex;

use netwarden_render::nft::{render_removal, TABLE_FAMILY, TABLE_NAME};

use crate::apply::{
    netns_gone, run_parallel, ApplyError, ApplyOutcome, Backend, Dataplane, RenderedRuleset,
    APPLY_WORKERS,
};
use crate::netns::{exec_in, exec_in_unchecked, NetnsError};
use crate::nft_session::{netns_identity, NftSession, OneLine, SessionError};

/// The named sets and chains of netwarden's table (or of a transaction), by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NftObjects {
    pub sets: BTreeSet<String>,
    pub chains: BTreeSet<String>,
}

/// The object name after `<verb> <kind> inet netwarden ` on a transaction line.
fn object_of<'a>(line: &'a str, verb: &str, kind: &str) -> Option<&'a str> {
    let rest = line
        .trim()
        .strip_prefix(verb)?
        .strip_prefix(' ')?
        .strip_prefix(kind)?
        .strip_prefix(' ')?
        .strip_prefix(TABLE_FAMILY)?
        .strip_prefix(' ')?
        .strip_prefix(TABLE_NAME)?
        .strip_prefix(' ')?;
    rest.split_whitespace().next()
}

/// Whether a transaction line deletes (or flushes) the whole table.
fn is_table_wide(line: &str) -> bool {
    let l = line.trim();
    let t = format!("{TABLE_FAMILY} {TABLE_NAME}");
    l == format!("delete table {t}") || l == format!("flush table {t}")
}

impl NftObjects {
    /// The sets and chains a rendered transaction declares (`add set` / `add chain` lines; the
    /// renderer declares exactly the sets its rules use).
    pub fn declared_by(text: &str) -> NftObjects {
        let mut out = NftObjects::default();
        for line in text.lines() {
            if let Some(name) = object_of(line, "add", "set") {
                out.sets.insert(name.to_string());
            } else if let Some(name) = object_of(line, "add", "chain") {
                out.chains.insert(name.to_string());
            }
        }
        out
    }

    /// The sets and chains of an `nft [-t] list table inet netwarden` listing (`set NAME {` and
    /// `chain NAME {` lines).
    pub fn listed_in(listing: &str) -> NftObjects {
        let mut out = NftObjects::default();
        for line in listing.lines() {
            let l = line.trim();
            let Some(head) = l.strip_suffix('{') else {
                continue;
            };
            let mut words = head.split_whitespace();
            match (words.next(), words.next(), words.next()) {
                (Some("set"), Some(name), None) => {
                    out.sets.insert(name.to_string());
                }
                (Some("chain"), Some(name), None) => {
                    out.chains.insert(name.to_string());
                }
                _ => {}
            }
        }
        out
    }

    /// Applies a transaction to this model, names only, with the kernel's all-or-nothing
    /// semantics and its refusals for what matters here: touching an object that does not
    /// exist, or deleting a set the transaction's own rules use. Other lines are ignored. Used by the
    /// [`FakeDataplane`](crate::fake::FakeDataplane) and by tests of [`plan_update`].
    pub fn apply_transaction(&mut self, text: &str) -> Result<(), String> {
        let mut next = self.clone();
        let mut table = true;
        let mut used_sets = BTreeSet::new();
        for line in text.lines() {
            let l = line.trim();
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            // `table inet netwarden {…}` declares the table (its block's content is not
            // modelled: the renderer declares everything with `add` lines).
            if l.starts_with(&format!("table {TABLE_FAMILY} {TABLE_NAME}"))
                || l == format!("add table {TABLE_FAMILY} {TABLE_NAME}")
            {
                table = true;
            } else if is_table_wide(l) && l.starts_with("delete") {
                next = NftObjects::default();
                used_sets.clear();
                table = false;
            } else if !table {
                return Err(format!("{l:?}: table does not exist"));
            } else if let Some(name) = object_of(l, "add", "set") {
                next.sets.insert(name.to_string());
            } else if let Some(name) = object_of(l, "add", "chain") {
                next.chains.insert(name.to_string());
            } else if let Some(name) = object_of(l, "delete", "set") {
                if used_sets.contains(name) {
                    return Err(format!("{l:?}: set in use by a rule of this transaction"));
                }
                if !next.sets.remove(name) {
                    return Err(format!("{l:?}: no such set"));
                }
            } else if let Some(name) = object_of(l, "delete", "chain") {
                if !next.chains.remove(name) {
                    return Err(format!("{l:?}: no such chain"));
                }
            } else if let Some(name) = object_of(l, "add", "element")
                .or_else(|| object_of(l, "flush", "chain"))
                .or_else(|| object_of(l, "add", "rule"))
            {
                let kind_is_set = l.starts_with("add element");
                let known = if kind_is_set {
                    next.sets.contains(name)
                } else {
                    next.chains.contains(name)
                };
                if !known {
                    return Err(format!("{l:?}: no such object"));
                }
                if l.starts_with("add rule") {
                    used_sets.extend(
                        l.split_whitespace()
                            .filter_map(|w| w.strip_prefix('@'))
                            .map(str::to_string),
                    );
                }
            }
        }
        *self = next;
        Ok(())
    }
}

/// What the applier knows of netwarden's table in one netns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NftNetnsState {
    /// What the kernel holds after the last transaction.
    pub kernel: NftObjects,
    /// The sets the rules of the last applied ruleset use: packets may still be walking those
    /// rules while the next apply commits, so the next apply keeps these sets.
    pub in_use: BTreeSet<String>,
}

impl NftNetnsState {
    /// The state when only the kernel's content is known (no history): every set found may be
    /// used by the rules in force.
    pub fn from_kernel(kernel: NftObjects) -> NftNetnsState {
        NftNetnsState {
            in_use: kernel.sets.clone(),
            kernel,
        }
    }
}

/// One transaction to send and the state once it committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftUpdate {
    pub text: String,
    pub after: NftNetnsState,
}

/// Plans the transaction bringing a netns in `state` to the `desired` rendered text: the text
/// itself, then the deletion of chains it no longer declares (flushed first, all of them, then
/// deleted, since a stale base chain may jump to a stale chain), then of the sets used neither
/// by the desired rules nor by the previous ones. Pure.
///
/// A desired text that deletes or flushes the whole table itself is sent as it is.
pub fn plan_update(desired: &str, state: &NftNetnsState) -> NftUpdate {
    let declared = NftObjects::declared_by(desired);
    let mut text = desired.to_string();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    if desired.lines().any(is_table_wide) {
        return NftUpdate {
            text,
            after: NftNetnsState {
                in_use: declared.sets.clone(),
                kernel: declared,
            },
        };
    }
    let t = format!("{TABLE_FAMILY} {TABLE_NAME}");
    // Peer sets are named by their content: a set the kernel already holds already has these
    // elements, so re-adding them (the bulk of a transaction: ~17 ms for 1,000 interval
    // elements) is skipped. A new set name is a new content and is created in full.
    let held: BTreeSet<&str> = declared
        .sets
        .iter()
        .filter(|s| state.kernel.sets.contains(*s))
        .map(String::as_str)
        .collect();
    if !held.is_empty() {
        let creates_held_set = |line: &str| {
            ["add set ", "add element "].iter().any(|verb| {
                line.strip_prefix(verb)
                    .and_then(|rest| rest.strip_prefix(t.as_str()))
                    .and_then(|rest| rest.strip_prefix(' '))
                    .and_then(|rest| rest.split_whitespace().next())
                    .is_some_and(|name| held.contains(name))
            })
        };
        text = desired.lines().filter(|line| !creates_held_set(line)).fold(
            String::with_capacity(text.len()),
            |mut acc, line| {
                acc.push_str(line);
                acc.push('\n');
                acc
            },
        );
    }
    let stale_chains: Vec<&String> = state.kernel.chains.difference(&declared.chains).collect();
    for c in &stale_chains {
        let _ = writeln!(text, "flush chain {t} {c}");
    }
    for c in &stale_chains {
        let _ = writeln!(text, "delete chain {t} {c}");
    }
    let stale_sets: BTreeSet<&String> = state
        .kernel
        .sets
        .iter()
        .filter(|s| !declared.sets.contains(*s) && !state.in_use.contains(*s))
        .collect();
    for s in &stale_sets {
        let _ = writeln!(text, "delete set {t} {s}");
    }
    let mut sets: BTreeSet<String> = state
        .kernel
        .sets
        .iter()
        .filter(|s| !stale_sets.contains(s))
        .cloned()
        .collect();
    sets.extend(declared.sets.iter().cloned());
    NftUpdate {
        text,
        after: NftNetnsState {
            kernel: NftObjects {
                sets,
                chains: declared.chains,
            },
            in_use: declared.sets,
        },
    }
}

/// How many `nft -i` sessions (one per netns) an [`NftDataplane`] with sessions keeps open.
pub const MAX_SESSIONS: usize = 128;

/// Whether [`NftDataplane::new`] uses sessions: a long-lived `nft -i` per netns avoids the
/// kernel's wait when an `nft` process closes its netlink socket (~15 ms per apply here).
pub const SESSIONS_BY_DEFAULT: bool = true;

/// How one transaction is to be sent.
#[derive(Debug)]
enum Lease {
    /// Through this open session.
    Session(NftSession),
    /// Through a session to start (a slot is reserved for it).
    Spawn,
    /// Through a one-shot `nft -f -`.
    OneShot,
}

/// The open sessions, by netns path, least recently used closed first.
#[derive(Debug)]
struct SessionPool {
    max: usize,
    open: HashMap<PathBuf, (NftSession, u64)>,
    /// Sessions (or slots) handed out to a running apply: they count against `max`.
    lent: usize,
    tick: u64,
}

impl SessionPool {
    fn new(max: usize) -> SessionPool {
        SessionPool {
            max,
            open: HashMap::new(),
            lent: 0,
            tick: 0,
        }
    }

    /// How the next transaction for `netns` goes; hand the lease back with [`Self::give_back`].
    fn take(&mut self, netns: &Path) -> Lease {
        if self.max == 0 {
            return Lease::OneShot;
        }
        if let Some((mut session, _)) = self.open.remove(netns) {
            if session.usable() {
                self.lent += 1;
                return Lease::Session(session);
            }
            // Dead, spent, or its netns is gone or replaced: dropping it kills it.
        }
        // A path naming no namespace gets the one-shot path and its error.
        if netns_identity(netns).is_none() {
            return Lease::OneShot;
        }
        while self.open.len() + self.lent >= self.max {
            let Some(oldest) = self
                .open
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(path, _)| path.clone())
            else {
                return Lease::OneShot;
            };
            self.open.remove(&oldest);
        }
        self.lent += 1;
        Lease::Spawn
    }

    fn give_back(&mut self, netns: &Path, lease: Lease) {
        match lease {
            Lease::OneShot => return,
            Lease::Spawn => {}
            Lease::Session(session) => {
                self.tick += 1;
                self.open.insert(netns.to_owned(), (session, self.tick));
            }
        }
        self.lent = self.lent.saturating_sub(1);
    }

    fn close(&mut self, netns: &Path) {
        self.open.remove(netns);
    }

    fn close_all(&mut self) {
        self.open.clear();
    }

    /// Closes the sessions whose netns path no longer names their namespace (deleted pods).
    fn prune(&mut self) {
        self.open
            .retain(|_, (session, _)| session.names_same_netns());
    }
}

impl Drop for SessionPool {
    /// Kills every child, then waits for them all (they end in parallel), so that their netns
    /// are released when the dataplane is gone.
    fn drop(&mut self) {
        for (session, _) in self.open.values_mut() {
            session.kill();
        }
        for (session, _) in self.open.values_mut() {
            session.kill_and_wait();
        }
    }
}

/// What running a transaction through a session gave.
enum SessionRun {
    /// Committed, or refused with this error (nothing applied).
    Done(Result<(), NetnsError>),
    /// Not sent (no session, or a text that is not safe as one line): use `nft -f`.
    NotRun,
    /// The session broke mid-way: whether the transaction committed is unknown.
    Broken,
}

/// Running `nft` (the parts the parallel workers need; shared by reference).
#[derive(Debug, Clone)]
struct Nft {
    program: String,
}

impl Nft {
    fn table_exists(&self, netns: &Path) -> Result<bool, NetnsError> {
        let out = exec_in(
            netns,
            &self.program,
            &["list", "tables", TABLE_FAMILY],
            None,
        )?;
        let wanted = format!("table {TABLE_FAMILY} {TABLE_NAME}");
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l.trim() == wanted))
    }

    fn kernel_objects(&self, netns: &Path) -> Result<NftObjects, NetnsError> {
        let args = ["-t", "list", "table", TABLE_FAMILY, TABLE_NAME];
        let out = exec_in_unchecked(netns, &self.program, &args, None)?;
        if out.status.success() {
            return Ok(NftObjects::listed_in(&String::from_utf8_lossy(&out.stdout)));
        }
        // Failing because the table does not exist is an answer; anything else is an error.
        if !self.table_exists(netns)? {
            return Ok(NftObjects::default());
        }
        exec_in(netns, &self.program, &args, None)
            .map(|out| NftObjects::listed_in(&String::from_utf8_lossy(&out.stdout)))
    }

    fn run_transaction(&self, netns: &Path, text: &str) -> Result<(), NetnsError> {
        exec_in(netns, &self.program, &["-f", "-"], Some(text.as_bytes())).map(|_| ())
    }

    /// Sends `text` through the lease's session (starting it if the lease says so).
    fn run_in_session(&self, netns: &Path, text: &str, lease: &mut Lease) -> SessionRun {
        if matches!(lease, Lease::OneShot) {
            return SessionRun::NotRun;
        }
        let Some(line) = OneLine::join(text) else {
            return SessionRun::NotRun;
        };
        if matches!(lease, Lease::Spawn) {
            *lease = match NftSession::spawn(netns, &self.program) {
                Ok(session) => Lease::Session(session),
                // The one-shot path reports whatever is wrong.
                Err(_) => Lease::OneShot,
            };
        }
        let Lease::Session(session) = lease else {
            return SessionRun::NotRun;
        };
        match session.run(&line) {
            Ok(()) => SessionRun::Done(Ok(())),
            Err(SessionError::Refused(stderr)) => SessionRun::Done(Err(NetnsError::Command {
                program: self.program.clone(),
                args: vec!["-i".into()],
                // What `nft -f` exits with when it refuses a transaction.
                status: ExitStatus::from_raw(1 << 8),
                stderr,
            })),
            Err(SessionError::Broken(_)) => {
                // Make sure it no longer runs before looking at what the kernel holds.
                session.kill_and_wait();
                *lease = Lease::OneShot;
                SessionRun::Broken
            }
        }
    }

    /// Plans against `state` (reading the kernel when unknown) and commits; returns the state
    /// after the commit.
    fn plan_and_run(
        &self,
        netns: &Path,
        desired: &str,
        state: Option<NftNetnsState>,
        lease: &mut Lease,
    ) -> Result<NftNetnsState, NetnsError> {
        let state = match state {
            Some(s) => s,
            None => NftNetnsState::from_kernel(self.kernel_objects(netns)?),
        };
        let plan = plan_update(desired, &state);
        match self.run_in_session(netns, &plan.text, lease) {
            SessionRun::Done(result) => result.map(|()| plan.after),
            SessionRun::NotRun => {
                self.run_transaction(netns, &plan.text)?;
                Ok(plan.after)
            }
            SessionRun::Broken => {
                // The transaction may or may not have committed: plan again against what the
                // kernel holds (every set found counts as in use), then send it with `nft -f`.
                let state = NftNetnsState::from_kernel(self.kernel_objects(netns)?);
                let plan = plan_update(desired, &state);
                self.run_transaction(netns, &plan.text)?;
                Ok(plan.after)
            }
        }
    }
}

/// Applies nft rulesets, skipping those identical to the last successful apply of the netns.
#[derive(Debug)]
pub struct NftDataplane {
    /// Hash of the ruleset last applied successfully, per netns path. Dropped on any failure,
    /// so the next sync of that netns is a full one.
    last_applied: HashMap<PathBuf, u64>,
    /// What the table holds, per netns, as of our last transaction. Dropped on any failure or
    /// `forget` (then read back from the kernel before the next apply).
    state: HashMap<PathBuf, NftNetnsState>,
    /// The `nft` program (a path in tests or unusual installs).
    nft: Nft,
    /// Open `nft -i` sessions.
    sessions: SessionPool,
}

impl Default for NftDataplane {
    fn default() -> Self {
        Self::new()
    }
}

impl NftDataplane {
    /// The default: sessions when [`SESSIONS_BY_DEFAULT`], else one-shot `nft -f`.
    pub fn new() -> Self {
        Self::with_program("nft")
    }

    /// Every transaction through a one-shot `nft -f -` (no sessions).
    pub fn one_shot() -> Self {
        Self::new().with_max_sessions(0)
    }

    /// Transactions through `nft -i` sessions (up to [`MAX_SESSIONS`]), else `nft -f`.
    pub fn with_sessions() -> Self {
        Self::new().with_max_sessions(MAX_SESSIONS)
    }

    /// Uses another `nft` binary (sessions as [`NftDataplane::new`]).
    pub fn with_program(program: impl Into<String>) -> Self {
        NftDataplane {
            last_applied: HashMap::new(),
            state: HashMap::new(),
            nft: Nft {
                program: program.into(),
            },
            sessions: SessionPool::new(if SESSIONS_BY_DEFAULT { MAX_SESSIONS } else { 0 }),
        }
    }

    /// Keeps at most `max` `nft -i` sessions open (0: none, every transaction by `nft -f`).
    /// Sessions already open beyond the new bound are closed.
    pub fn with_max_sessions(mut self, max: usize) -> Self {
        self.sessions.max = max;
        while self.sessions.open.len() > max {
            let Some(oldest) = self
                .sessions
                .open
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(path, _)| path.clone())
            else {
                break;
            };
            self.sessions.close(&oldest);
        }
        self
    }

    /// How many `nft -i` sessions are open.
    pub fn sessions_open(&self) -> usize {
        self.sessions.open.len()
    }

    /// The process id of the `nft -i` session of `netns`, if one is open.
    pub fn session_pid(&self, netns: &Path) -> Option<u32> {
        self.sessions.open.get(netns).map(|(s, _)| s.pid())
    }

    /// The netns this dataplane believes are programmed (applied and not forgotten).
    pub fn known(&self) -> impl Iterator<Item = &Path> {
        self.last_applied.keys().map(PathBuf::as_path)
    }

    /// What this dataplane believes the table in `netns` holds (`None`: unknown, read back at
    /// the next apply).
    pub fn state(&self, netns: &Path) -> Option<&NftNetnsState> {
        self.state.get(netns)
    }

    /// Whether table `inet netwarden` exists in `netns`.
    pub fn table_exists(&self, netns: &Path) -> Result<bool, NetnsError> {
        self.nft.table_exists(netns)
    }

    /// The sets and chains the table in `netns` holds (empty when there is no table). Terse
    /// listing: set elements are not printed.
    pub fn kernel_objects(&self, netns: &Path) -> Result<NftObjects, NetnsError> {
        self.nft.kernel_objects(netns)
    }

    /// Runs `nft -c -f -` (check only, nothing changes) on `text` inside `netns`.
    pub fn check(&self, netns: &Path, text: &str) -> Result<(), NetnsError> {
        exec_in(
            netns,
            &self.nft.program,
            &["-c", "-f", "-"],
            Some(text.as_bytes()),
        )
        .map(|_| ())
    }

    /// Removal: the session goes first (netwarden owns nothing left in the netns, and a
    /// vanished pod's netns must not be kept alive by it).
    fn remove_inner(&mut self, netns: &Path) -> Result<(), NetnsError> {
        self.sessions.close(netns);
        match self.nft.table_exists(netns) {
            // The removal transaction (declare + delete) also succeeds if the table vanished
            // since we looked, and never names any other table.
            Ok(true) => self.nft.run_transaction(netns, &render_removal()),
            Ok(false) => Ok(()),
            // The pod and its netns are gone: so are its rules.
            Err(e) if netns_gone(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl Dataplane for NftDataplane {
    fn apply(
        &mut self,
        netns: &Path,
        ruleset: &RenderedRuleset,
    ) -> Result<ApplyOutcome, ApplyError> {
        if ruleset.backend != Backend::Nft {
            return Err(ApplyError::WrongBackend {
                backend: "nft",
                got: ruleset.backend.as_str(),
            });
        }
        let hash = ruleset.content_hash();
        if self.last_applied.get(netns) == Some(&hash) {
            return Ok(ApplyOutcome::Unchanged);
        }
        // Forget first: whatever happens below, a failure must leave no stale hash behind.
        self.last_applied.remove(netns);
        if ruleset.is_removal() {
            self.state.remove(netns);
            self.remove_inner(netns)
                .map_err(|source| ApplyError::Remove {
                    netns: netns.to_owned(),
                    source,
                })?;
            self.last_applied.insert(netns.to_owned(), hash);
            return Ok(ApplyOutcome::Removed);
        }
        let text = ruleset.nft.as_deref().unwrap_or_default();
        // Taken out: on failure the state stays unknown and the next apply reads the kernel.
        let state = self.state.remove(netns);
        let mut lease = self.sessions.take(netns);
        let result = self.nft.plan_and_run(netns, text, state, &mut lease);
        self.sessions.give_back(netns, lease);
        let after = result.map_err(|source| ApplyError::Apply {
            netns: netns.to_owned(),
            source,
        })?;
        self.state.insert(netns.to_owned(), after);
        self.last_applied.insert(netns.to_owned(), hash);
        Ok(ApplyOutcome::Applied)
    }

    /// Applies the changed rulesets of a batch to several netns at once (each `nft -f` mostly
    /// waits on the kernel); removals and unchanged rulesets are handled in order first. Each
    /// netns still gets exactly one transaction, planned against its own state.
    fn apply_many(
        &mut self,
        batch: &[(PathBuf, RenderedRuleset)],
    ) -> Vec<Result<ApplyOutcome, ApplyError>> {
        // Sessions of pods deleted since the last batch go now (each holds a netns alive).
        self.sessions.prune();
        let mut results: Vec<Option<Result<ApplyOutcome, ApplyError>>> =
            Vec::with_capacity(batch.len());
        // Each worker owns its item's session while it runs (the Mutex is never contended).
        let mut todo: Vec<(usize, Option<NftNetnsState>, Mutex<Lease>)> = Vec::new();
        for (i, (netns, ruleset)) in batch.iter().enumerate() {
            let direct = ruleset.backend != Backend::Nft
                || ruleset.is_removal()
                || self.last_applied.get(netns) == Some(&ruleset.content_hash());
            if direct {
                results.push(Some(self.apply(netns, ruleset)));
            } else {
                // Forget first: if the apply fails, the next sync must re-apply in full.
                self.last_applied.remove(netns);
                let lease = self.sessions.take(netns);
                todo.push((i, self.state.remove(netns), Mutex::new(lease)));
                results.push(None);
            }
        }
        let nft = &self.nft;
        let outcomes = run_parallel(&todo, APPLY_WORKERS, |(i, state, lease)| {
            let (netns, r) = &batch[*i];
            let mut lease = lease.lock().unwrap_or_else(|p| p.into_inner());
            nft.plan_and_run(
                netns,
                r.nft.as_deref().unwrap_or_default(),
                state.clone(),
                &mut lease,
            )
        });
        for ((i, _, lease), outcome) in todo.into_iter().zip(outcomes) {
            let (netns, ruleset) = &batch[i];
            let lease = lease.into_inner().unwrap_or_else(|p| p.into_inner());
            self.sessions.give_back(netns, lease);
            results[i] = Some(match outcome {
                Ok(after) => {
                    self.state.insert(netns.to_owned(), after);
                    self.last_applied
                        .insert(netns.to_owned(), ruleset.content_hash());
                    Ok(ApplyOutcome::Applied)
                }
                Err(source) => Err(ApplyError::Apply {
                    netns: netns.to_owned(),
                    source,
                }),
            });
        }
        results
            .into_iter()
            .map(|r| r.expect("every item has a result"))
            .collect()
    }

    fn remove(&mut self, netns: &Path) -> Result<(), ApplyError> {
        self.last_applied.remove(netns);
        self.state.remove(netns);
        self.remove_inner(netns)
            .map_err(|source| ApplyError::Remove {
                netns: netns.to_owned(),
                source,
            })
    }

    fn read_back(&self, netns: &Path) -> Result<Option<String>, ApplyError> {
        let err = |source| ApplyError::ReadBack {
            netns: netns.to_owned(),
            source,
        };
        if !self.table_exists(netns).map_err(err)? {
            return Ok(None);
        }
        let out = exec_in(
            netns,
            &self.nft.program,
            &["list", "table", TABLE_FAMILY, TABLE_NAME],
            None,
        )
        .map_err(err)?;
        Ok(Some(String::from_utf8_lossy(&out.stdout).into_owned()))
    }

    fn forget(&mut self, netns: &Path) {
        self.last_applied.remove(netns);
        self.state.remove(netns);
        self.sessions.close(netns);
    }

    fn forget_all(&mut self) {
        self.last_applied.clear();
        self.state.clear();
        self.sessions.close_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rendered-like transaction declaring `chains` and one set per name in `sets`, each
    /// used by a rule.
    fn desired(chains: &[&str], sets: &[&str]) -> String {
        let t = "inet netwarden";
        let mut s = format!("add table {t}\n");
        for set in sets {
            s += &format!("add set {t} {set} {{ type ipv4_addr; flags interval; }}\n");
            s += &format!("add element {t} {set} {{ 10.0.0.1 }}\n");
        }
        for c in chains {
            s += &format!("add chain {t} {c}\n");
        }
        for c in chains {
            s += &format!("flush chain {t} {c}\n");
        }
        for set in sets {
            s += &format!("add rule {t} {} ip saddr @{set} accept\n", chains[0]);
        }
        s
    }

    fn names(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_declared_and_listed_names() {
        let d = NftObjects::declared_by(&desired(&["input", "in_0"], &["p4_a", "p6_b"]));
        assert_eq!(d.sets, names(&["p4_a", "p6_b"]));
        assert_eq!(d.chains, names(&["input", "in_0"]));
        let listing = "table inet netwarden {\n\tlimit lim_in {\n\t\trate 10/minute burst 10 packets\n\t}\n\n\tset p4_a {\n\t\ttype ipv4_addr\n\t\tflags interval\n\t}\n\n\tchain input {\n\t\ttype filter hook input priority filter; policy accept;\n\t\tiifname \"eth0\" jump in_0\n\t}\n\n\tchain in_0 {\n\t}\n}\n";
        let l = NftObjects::listed_in(listing);
        assert_eq!(l.sets, names(&["p4_a"]));
        assert_eq!(l.chains, names(&["input", "in_0"]));
    }

    #[test]
    fn sets_go_two_applies_after_their_last_use_and_chains_at_once() {
        let mut kernel = NftObjects::default();
        let mut state = NftNetnsState::from_kernel(kernel.clone());

        // 1: A on eth0 + net1.
        let p = plan_update(&desired(&["input", "in_0", "in_1"], &["p4_a"]), &state);
        assert!(!p.text.contains("delete"), "{}", p.text);
        kernel.apply_transaction(&p.text).unwrap();
        state = p.after;
        assert_eq!(state.kernel, kernel);

        // 2: peers changed (B), net1 left: in_1 goes now, A stays (the rules being replaced
        // use it).
        let p = plan_update(&desired(&["input", "in_0"], &["p4_b"]), &state);
        assert!(p.text.contains("flush chain inet netwarden in_1\n"));
        assert!(p.text.contains("delete chain inet netwarden in_1\n"));
        assert!(!p.text.contains("delete set"), "{}", p.text);
        kernel.apply_transaction(&p.text).unwrap();
        state = p.after;
        assert_eq!(kernel.sets, names(&["p4_a", "p4_b"]));
        assert_eq!(kernel.chains, names(&["input", "in_0"]));

        // 3: C: A is two applies stale and goes; B stays.
        let p = plan_update(&desired(&["input", "in_0"], &["p4_c"]), &state);
        assert!(
            p.text.ends_with("delete set inet netwarden p4_a\n"),
            "{}",
            p.text
        );
        kernel.apply_transaction(&p.text).unwrap();
        state = p.after;
        assert_eq!(kernel.sets, names(&["p4_b", "p4_c"]));

        // 4: back to B (still there): C stays one more apply, nothing deleted.
        let p = plan_update(&desired(&["input", "in_0"], &["p4_b"]), &state);
        assert!(!p.text.contains("delete"), "{}", p.text);
        kernel.apply_transaction(&p.text).unwrap();
        state = p.after;

        // 5: same again: C goes.
        let p = plan_update(&desired(&["input", "in_0"], &["p4_b"]), &state);
        assert!(p.text.contains("delete set inet netwarden p4_c\n"));
        kernel.apply_transaction(&p.text).unwrap();
        assert_eq!(kernel.sets, names(&["p4_b"]));
        assert_eq!(p.after.kernel, kernel);
    }

    #[test]
    fn sets_the_kernel_holds_are_not_refilled() {
        let state = NftNetnsState::from_kernel(NftObjects {
            sets: names(&["p4_a"]),
            chains: names(&["input", "in_0"]),
        });
        let p = plan_update(&desired(&["input", "in_0"], &["p4_a", "p6_b"]), &state);
        assert!(
            !p.text.contains("add set inet netwarden p4_a "),
            "{}",
            p.text
        );
        assert!(
            !p.text.contains("add element inet netwarden p4_a "),
            "{}",
            p.text
        );
        assert!(
            p.text.contains("add set inet netwarden p6_b "),
            "{}",
            p.text
        );
        assert!(p.after.kernel.sets.contains("p4_a") && p.after.kernel.sets.contains("p6_b"));
    }

    #[test]
    fn unknown_state_keeps_every_set_found_once() {
        // A restarted agent finds sets in the kernel it knows nothing about.
        let kernel = NftObjects {
            sets: names(&["p4_old", "p4_a"]),
            chains: names(&["input", "in_0", "in_3"]),
        };
        let state = NftNetnsState::from_kernel(kernel.clone());
        let p = plan_update(&desired(&["input", "in_0"], &["p4_a"]), &state);
        assert!(!p.text.contains("delete set"), "{}", p.text);
        assert!(p.text.contains("delete chain inet netwarden in_3\n"));
        let mut k = kernel;
        k.apply_transaction(&p.text).unwrap();
        let p2 = plan_update(&desired(&["input", "in_0"], &["p4_a"]), &p.after);
        assert!(p2.text.contains("delete set inet netwarden p4_old\n"));
        k.apply_transaction(&p2.text).unwrap();
        assert_eq!(k.sets, names(&["p4_a"]));
    }

    #[test]
    fn stale_chains_are_all_flushed_before_any_is_deleted() {
        let state = NftNetnsState::from_kernel(NftObjects {
            sets: BTreeSet::new(),
            chains: names(&["input", "in_0", "output", "out_0"]),
        });
        let p = plan_update(&desired(&["input", "in_0"], &[]), &state);
        let tail: Vec<&str> = p.text.lines().rev().take(4).collect();
        assert_eq!(
            tail,
            [
                "delete chain inet netwarden output",
                "delete chain inet netwarden out_0",
                "flush chain inet netwarden output",
                "flush chain inet netwarden out_0",
            ]
        );
    }

    #[test]
    fn whole_table_texts_are_sent_as_they_are() {
        let state = NftNetnsState::from_kernel(NftObjects {
            sets: names(&["p4_x"]),
            chains: names(&["in_9"]),
        });
        let text = "table inet netwarden {}\ndelete table inet netwarden\n";
        let p = plan_update(text, &state);
        assert_eq!(p.text, text);
        assert_eq!(p.after, NftNetnsState::default());
    }

    #[test]
    fn model_refuses_what_the_kernel_refuses() {
        let mut k = NftObjects::default();
        assert!(k
            .apply_transaction("add table inet netwarden\ndelete set inet netwarden p4_x\n")
            .is_err());
        k.apply_transaction(&desired(&["input"], &["p4_a"]))
            .unwrap();
        let before = k.clone();
        // Deleting a set the transaction's rules use fails, and changes nothing.
        let bad = format!(
            "{}delete set inet netwarden p4_a\n",
            desired(&["input"], &["p4_a"])
        );
        assert!(k.apply_transaction(&bad).is_err());
        assert_eq!(k, before);
    }
}
