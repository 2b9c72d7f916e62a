//! A long-lived `nft -i` process inside one pod netns, to commit transactions without paying
//! for a new `nft` process each time.
//!
//! Why: when the nfnetlink socket of an `nft` process is closed, the kernel waits for the
//! nf_tables destroy work of the netns (an RCU grace period), which costs a one-shot `nft -f`
//! 12-20 ms on top of the transaction itself. A process that stays open pays that once, when it
//! ends.
//!
//! Protocol, over stdin and one pipe that merges stdout and stderr:
//!
//! - In `nft -i` one input line is one atomic batch (an error anywhere in it applies nothing of
//!   it), so a transaction is sent as ONE line, its commands separated by `; `
//!   ([`OneLine::join`]). No newline of the payload reaches `nft` except the final one.
//! - `nft -i` says nothing on success, so every transaction is followed by
//!   `list table inet nw_sentinel_<n>`, a table that never exists: its error (three lines:
//!   `Error: …`, the echoed command, a caret line) marks the end of the reply. An `Error` line
//!   before it belongs to the transaction ([`ReplyParser`]).
//! - Replies are read on a thread of their own, with a deadline; a timeout, EOF or write error
//!   marks the session broken ([`SessionError::Broken`]) and the caller drops it.
//!
//! The child is started from a thread that entered the netns ([`Netns::run`]), so it lives in
//! that netns (and keeps it alive while it runs: sessions are killed when the pod's netns is
//! forgotten or no longer the one its path names, see [`NftSession::names_same_netns`]).
//! `nft -i` (libedit) keeps every line in its history, in memory, and writes it to
//! `$HOME/.nft.history` when its input ends: `HOME` points where nothing can be written, and a
//! session is retired once it was sent [`MAX_SESSION_INPUT`] bytes.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::ops::Range;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;

use crate::netns::{Netns, NetnsError};

/// How long a transaction may take before the session is declared broken (plus
/// [`TIMEOUT_PER_64K`] per 64 KiB of input: big sets take longer to commit).
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
const TIMEOUT_PER_64K: Duration = Duration::from_secs(1);

/// Input after which a session is replaced: `nft -i` keeps every line in its history.
pub const MAX_SESSION_INPUT: usize = 1 << 20;

/// Sentinel numbers, unique in this process.
static SENTINEL: AtomicU64 = AtomicU64::new(0);

/// The identity of a namespace file: device and inode of what the path names (the nsfs inode
/// for `/run/netns/NAME` bind mounts and `/proc/PID/ns/net` links alike).
pub type NetnsIdentity = (u64, u64);

/// The identity of the namespace `path` names now (`None`: the path is gone or unreadable).
pub fn netns_identity(path: &Path) -> Option<NetnsIdentity> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// A transaction as one `nft -i` line, with where each command lies in it (to point error
/// messages at the command, not at a line of kilobytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OneLine {
    pub line: String,
    pub commands: Vec<Range<usize>>,
}

impl OneLine {
    /// Joins a transaction text (one command per line; a `{ … }` block may span lines) into one
    /// line: a line starting outside any brace starts a new command (`; ` before it); a line
    /// inside braces continues the current one, after a space when the text so far ends with
    /// `{`, `,` or `;` or the line starts with `}` or `,` (an element list, a block's end), else
    /// after `; ` (the next statement of a block). `#` comments outside strings are dropped.
    ///
    /// `None` when the text cannot be sent safely as one line (then use `nft -f`): a string or
    /// a brace left open, control characters, a line ending in `\` (`nft -i` would wait for the
    /// next line), or a first word `nft -i` treats itself (`quit`, `exit`).
    pub fn join(text: &str) -> Option<OneLine> {
        let mut line = String::with_capacity(text.len() + 16);
        let mut commands: Vec<Range<usize>> = Vec::new();
        let mut depth: usize = 0;
        for raw in text.lines() {
            let content = strip_comment(raw)?.trim();
            if content.is_empty() {
                continue;
            }
            if content.ends_with('\\') || content.chars().any(|c| c.is_control() && c != '\t') {
                return None;
            }
            if depth == 0 {
                if !line.is_empty() {
                    line.push_str("; ");
                }
                let start = line.len();
                commands.push(start..start);
            } else {
                let soft = line.ends_with(['{', ',', ';'])
                    || content.starts_with('}')
                    || content.starts_with(',');
                line.push_str(if soft { " " } else { "; " });
            }
            line.push_str(content);
            depth = brace_depth(content, depth)?;
            if let Some(last) = commands.last_mut() {
                last.end = line.len();
            }
        }
        if depth != 0 {
            return None;
        }
        let first = line.split_whitespace().next().unwrap_or_default();
        if matches!(first, "quit" | "exit") {
            return None;
        }
        Some(OneLine { line, commands })
    }

    /// The command at byte `at` of the line, and where it starts. A position in the `; `
    /// after a command is that command's (a parser error at its end: "unexpected semicolon"
    /// where `nft -f` says "unexpected newline").
    fn command_at(&self, at: usize) -> Option<(usize, &str)> {
        self.commands
            .iter()
            .rev()
            .find(|r| r.start <= at)
            .map(|r| (r.start, &self.line[r.clone()]))
    }
}

/// The line without a `#` comment outside double quotes; `None` when a string stays open.
fn strip_comment(raw: &str) -> Option<&str> {
    let mut quoted = false;
    for (i, c) in raw.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '#' if !quoted => return Some(&raw[..i]),
            _ => {}
        }
    }
    (!quoted).then_some(raw)
}

/// The brace depth after `content` (braces inside strings do not count); `None` when more
/// braces close than were open.
fn brace_depth(content: &str, mut depth: usize) -> Option<usize> {
    let mut quoted = false;
    for c in content.chars() {
        match c {
            '"' => quoted = !quoted,
            '{' if !quoted => depth += 1,
            '}' if !quoted => depth = depth.checked_sub(1)?,
            _ => {}
        }
    }
    Some(depth)
}

/// Whether `line` is the caret line `nft` prints under an echoed command.
fn is_caret_line(line: &str) -> bool {
    line.contains('^') && line.chars().all(|c| matches!(c, ' ' | '\t' | '^' | '~'))
}

/// Whether `line` opens an error report (`Error: …`, or `<input>:L:C: Error: …`).
fn is_error_line(line: &str) -> bool {
    line.starts_with("Error:") || line.contains(": Error:")
}

/// What a reply told about the transaction, once the sentinel's error was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// No error before the sentinel: the transaction committed.
    Committed,
    /// Errors before the sentinel: the batch was refused as a whole (nothing applied). The
    /// lines as `nft` printed them.
    Refused(Vec<String>),
}

/// Reads the reply to one transaction line by line: everything up to the sentinel's three-line
/// error block. The sentinel's own `Error:` line is the one right before its echoed command;
/// every other `Error` line belongs to the transaction.
#[derive(Debug)]
pub struct ReplyParser {
    sentinel_command: String,
    lines: Vec<String>,
    /// The sentinel's echo was seen: the next line is its caret line.
    awaiting_caret: bool,
}

impl ReplyParser {
    pub fn new(sentinel_command: &str) -> ReplyParser {
        ReplyParser {
            sentinel_command: sentinel_command.to_string(),
            lines: Vec::new(),
            awaiting_caret: false,
        }
    }

    /// Feeds one line (without its newline). `Ok(Some(_))` once the reply is complete;
    /// `Err` when the output does not follow the protocol (the session cannot be trusted).
    pub fn feed(&mut self, line: &str) -> Result<Option<Reply>, String> {
        if self.awaiting_caret {
            if !is_caret_line(line) {
                return Err(format!("expected the sentinel's caret line, got {line:?}"));
            }
            let lines = std::mem::take(&mut self.lines);
            return Ok(Some(if lines.iter().any(|l| is_error_line(l)) {
                Reply::Refused(lines)
            } else {
                Reply::Committed
            }));
        }
        if line.trim_end() == self.sentinel_command {
            match self.lines.pop() {
                Some(header) if is_error_line(&header) => {}
                other => {
                    return Err(format!(
                        "the sentinel was echoed without its error (before it: {other:?})"
                    ))
                }
            }
            self.awaiting_caret = true;
            return Ok(None);
        }
        self.lines.push(line.to_string());
        Ok(None)
    }
}

/// The error text of a refused transaction, like `nft -f` prints it: an echoed command is
/// narrowed from the whole line to the command the carets point at.
pub fn describe_refusal(lines: &[String], sent: &OneLine) -> String {
    const MAX_ECHO: usize = 400;
    let mut out = String::new();
    let mut i = 0;
    while i < lines.len() {
        let line = &lines[i];
        let caret = lines.get(i + 1).filter(|c| is_caret_line(c));
        if let (true, Some(caret)) = (*line == sent.line, caret) {
            let at = caret.find('^').unwrap_or(0);
            if let Some((start, command)) = sent.command_at(at) {
                out.push_str(command);
                out.push('\n');
                out.push_str(caret.get(start..).unwrap_or_default().trim_end());
                out.push('\n');
                i += 2;
                continue;
            }
        }
        if line.len() > MAX_ECHO {
            let mut cut = MAX_ECHO;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            out.push_str(&line[..cut]);
            out.push_str(" […]\n");
        } else {
            out.push_str(line);
            out.push('\n');
        }
        i += 1;
    }
    out
}

/// Why a session could not run a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionError {
    /// `nft` refused the transaction (nothing of it applied); its error text. The session is
    /// still good.
    Refused(String),
    /// The session is unusable (no reply in time, `nft` died, protocol out of step): drop it.
    /// Whether the transaction committed is unknown.
    Broken(String),
}

/// A running `nft -i` in one netns.
#[derive(Debug)]
pub struct NftSession {
    path: PathBuf,
    identity: NetnsIdentity,
    child: Child,
    stdin: Option<ChildStdin>,
    /// Lines of the merged stdout/stderr, from the reader thread (`Err`: read error).
    replies: Receiver<Result<String, String>>,
    /// Bytes sent so far (see [`MAX_SESSION_INPUT`]).
    sent: usize,
    /// The child was killed and waited for.
    reaped: bool,
}

impl NftSession {
    /// Starts `program -i` inside the netns at `path`.
    pub fn spawn(path: &Path, program: &str) -> Result<NftSession, NetnsError> {
        let open_err = |source| NetnsError::Open {
            path: path.to_owned(),
            source,
        };
        let before = std::fs::metadata(path).map_err(open_err)?;
        let netns = Netns::open(path)?;
        let identity = (before.dev(), before.ino());
        // The path must still name what we opened (it may have been replaced in between).
        if netns_identity(path) != Some(identity) {
            return Err(open_err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "the namespace changed while it was opened",
            )));
        }
        let spawn_err = |source| NetnsError::Spawn {
            program: program.to_owned(),
            source,
        };
        let (read_end, write_end) =
            nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| spawn_err(std::io::Error::from(e)))?;
        let write_end2: OwnedFd = write_end.try_clone().map_err(spawn_err)?;
        let program_owned = program.to_owned();
        let mut child = netns
            .run(move || {
                Command::new(program_owned)
                    .arg("-i")
                    // Nowhere to read or write `.nft.history` (see the module doc).
                    .env("HOME", "/dev/null")
                    .stdin(Stdio::piped())
                    .stdout(Stdio::from(write_end))
                    .stderr(Stdio::from(write_end2))
                    .spawn()
                // The Command, and with it our copies of the write end, is dropped here: the
                // reader sees EOF when the child ends.
            })?
            .map_err(spawn_err)?;
        let stdin = child.stdin.take();
        let (tx, replies) = mpsc::channel();
        let reader = File::from(read_end);
        let spawned = std::thread::Builder::new()
            .name("nft-session".into())
            .stack_size(64 * 1024)
            .spawn(move || {
                let mut reader = BufReader::new(reader);
                let mut buf = Vec::new();
                loop {
                    buf.clear();
                    let msg = match reader.read_until(b'\n', &mut buf) {
                        Ok(0) => break,
                        Ok(_) => {
                            if buf.last() == Some(&b'\n') {
                                buf.pop();
                            }
                            Ok(String::from_utf8_lossy(&buf).into_owned())
                        }
                        Err(e) => Err(e.to_string()),
                    };
                    let stop = msg.is_err();
                    if tx.send(msg).is_err() || stop {
                        break;
                    }
                }
            });
        let mut session = NftSession {
            path: path.to_owned(),
            identity,
            child,
            stdin,
            replies,
            sent: 0,
            reaped: false,
        };
        if let Err(e) = spawned {
            session.kill_and_wait();
            return Err(NetnsError::Thread {
                path: path.to_owned(),
                source: e,
            });
        }
        Ok(session)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The process id of the `nft -i` child.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the netns path still names the namespace this session runs in.
    pub fn names_same_netns(&self) -> bool {
        netns_identity(&self.path) == Some(self.identity)
    }

    /// Whether the session can take another transaction: the child runs, the path names the
    /// same namespace and the input budget is not spent.
    pub fn usable(&mut self) -> bool {
        !self.reaped
            && self.sent < MAX_SESSION_INPUT
            && matches!(self.child.try_wait(), Ok(None))
            && self.names_same_netns()
    }

    /// Commits `tx` (see [`OneLine::join`]) in one batch and waits for the verdict.
    pub fn run(&mut self, tx: &OneLine) -> Result<(), SessionError> {
        let n = SENTINEL.fetch_add(1, Ordering::Relaxed);
        let sentinel = format!("list table inet nw_sentinel_{n}");
        let mut input = String::with_capacity(tx.line.len() + sentinel.len() + 2);
        if !tx.line.is_empty() {
            input.push_str(&tx.line);
            input.push('\n');
        }
        input.push_str(&sentinel);
        input.push('\n');
        // Output left over from an earlier exchange would be read as this reply.
        if let Ok(stray) = self.replies.try_recv() {
            return Err(SessionError::Broken(format!("unexpected output {stray:?}")));
        }
        let Some(stdin) = self.stdin.as_mut() else {
            return Err(SessionError::Broken("stdin closed".into()));
        };
        self.sent += input.len();
        stdin
            .write_all(input.as_bytes())
            .and_then(|()| stdin.flush())
            .map_err(|e| SessionError::Broken(format!("writing to nft: {e}")))?;
        let timeout = REPLY_TIMEOUT + TIMEOUT_PER_64K * (input.len() / 65536) as u32;
        let deadline = Instant::now() + timeout;
        let mut parser = ReplyParser::new(&sentinel);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match self.replies.recv_timeout(left) {
                Ok(Ok(line)) => line,
                Ok(Err(e)) => return Err(SessionError::Broken(format!("reading nft: {e}"))),
                Err(RecvTimeoutError::Timeout) => {
                    return Err(SessionError::Broken(format!("no reply within {timeout:?}")))
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(SessionError::Broken("nft exited".into()))
                }
            };
            match parser.feed(&line) {
                Ok(None) => {}
                Ok(Some(Reply::Committed)) => return Ok(()),
                Ok(Some(Reply::Refused(lines))) => {
                    return Err(SessionError::Refused(describe_refusal(&lines, tx)))
                }
                Err(e) => return Err(SessionError::Broken(e)),
            }
        }
    }

    /// Kills the child (no-op when already done).
    pub fn kill(&mut self) {
        if !self.reaped {
            self.stdin = None;
            let _ = self.child.kill();
        }
    }

    /// Kills the child and waits for it to end (its netns is released when this returns).
    pub fn kill_and_wait(&mut self) {
        if !self.reaped {
            self.kill();
            let _ = self.child.wait();
            self.reaped = true;
        }
    }
}

impl Drop for NftSession {
    /// Kills the child; it is waited for on a thread of its own (its exit waits for the kernel
    /// to release what the transactions freed, which the caller need not wait for).
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        self.kill();
        self.reaped = true;
        // A `Child` can be moved out only by swapping: wait on the pid instead.
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let reap = move || {
            let _ = nix::sys::wait::waitpid(pid, None);
        };
        if std::thread::Builder::new()
            .name("nft-reap".into())
            .stack_size(64 * 1024)
            .spawn(reap)
            .is_err()
        {
            // No thread: wait here rather than leave a zombie.
            let _ = self.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_command_per_line_becomes_one_line() {
        let text = "add table inet netwarden\nadd set inet netwarden p4_a { type ipv4_addr; flags interval; }\n\nadd element inet netwarden p4_a { 10.0.0.1, 10.0.0.2 }\nflush chain inet netwarden in_0\n";
        let j = OneLine::join(text).unwrap();
        assert_eq!(
            j.line,
            "add table inet netwarden; add set inet netwarden p4_a { type ipv4_addr; flags interval; }; add element inet netwarden p4_a { 10.0.0.1, 10.0.0.2 }; flush chain inet netwarden in_0"
        );
        let cmds: Vec<&str> = j.commands.iter().map(|r| &j.line[r.clone()]).collect();
        assert_eq!(
            cmds,
            [
                "add table inet netwarden",
                "add set inet netwarden p4_a { type ipv4_addr; flags interval; }",
                "add element inet netwarden p4_a { 10.0.0.1, 10.0.0.2 }",
                "flush chain inet netwarden in_0",
            ]
        );
        assert!(!j.line.contains('\n'));
    }

    #[test]
    fn blocks_and_element_lists_spanning_lines_are_joined() {
        let text = "add element inet netwarden p4_a {\n  10.0.0.1,\n  10.0.0.2\n  , 10.0.0.3\n}\ntable inet other {\n\tchain c {\n\t\ttype filter hook input priority 10; policy accept;\n\t\tip saddr 1.2.3.4 accept\n\t\tip daddr 1.2.3.4 accept\n\t}\n}\ndelete table inet other\n";
        let j = OneLine::join(text).unwrap();
        assert_eq!(
            j.line,
            "add element inet netwarden p4_a { 10.0.0.1, 10.0.0.2 , 10.0.0.3 }; table inet other { chain c { type filter hook input priority 10; policy accept; ip saddr 1.2.3.4 accept; ip daddr 1.2.3.4 accept } }; delete table inet other"
        );
        assert_eq!(j.commands.len(), 3);
        assert_eq!(&j.line[j.commands[2].clone()], "delete table inet other");
    }

    #[test]
    fn comments_strings_and_unsafe_texts() {
        // A comment goes; a `#` or a brace inside a string stays and does not count.
        let j = OneLine::join(
            "# header\nadd rule inet t c log prefix \"a#b{\" accept # why\nadd chain inet t d\n",
        )
        .unwrap();
        assert_eq!(
            j.line,
            "add rule inet t c log prefix \"a#b{\" accept; add chain inet t d"
        );
        assert_eq!(OneLine::join("").unwrap().line, "");
        assert_eq!(OneLine::join("# only\n\n").unwrap().commands.len(), 0);
        for bad in [
            "add rule inet t c log prefix \"open\n",
            "add element inet t s {\n 10.0.0.1\n",
            "add table inet t }\n",
            "add table inet t \\\n",
            "add table inet t\rdelete table inet t\n",
            "quit\n",
            "exit\n",
        ] {
            assert_eq!(OneLine::join(bad), None, "{bad:?}");
        }
    }

    fn feed_all(parser: &mut ReplyParser, lines: &[&str]) -> Result<Option<Reply>, String> {
        let mut last = Ok(None);
        for l in lines {
            last = parser.feed(l);
            if !matches!(last, Ok(None)) {
                break;
            }
        }
        last
    }

    const S: &str = "list table inet nw_sentinel_7";
    const CARET: &str = "                ^^^^^^^^^^^^^";

    #[test]
    fn reply_with_only_the_sentinel_is_a_commit() {
        let mut p = ReplyParser::new(S);
        let r = feed_all(&mut p, &["Error: No such file or directory", S, CARET]);
        assert_eq!(r, Ok(Some(Reply::Committed)));
        // The sentinel's suggestion variant is still the sentinel's.
        let mut p = ReplyParser::new(S);
        let r = feed_all(
            &mut p,
            &[
                "Error: No such file or directory; did you mean table 'netwarden' in family inet?",
                S,
                CARET,
            ],
        );
        assert_eq!(r, Ok(Some(Reply::Committed)));
        // Other output (a warning, a listing) is no error.
        let mut p = ReplyParser::new(S);
        let r = feed_all(
            &mut p,
            &[
                "table inet x {",
                "}",
                "Error: No such file or directory",
                S,
                CARET,
            ],
        );
        assert_eq!(r, Ok(Some(Reply::Committed)));
    }

    #[test]
    fn errors_before_the_sentinel_belong_to_the_transaction() {
        let sent = OneLine::join("add table inet t\nadd rule inet t c bogus\nadd chain inet t d\n")
            .unwrap();
        let echo = sent.line.clone();
        let at = echo.find("bogus").unwrap();
        let caret = format!("{}^", " ".repeat(at));
        let mut p = ReplyParser::new(S);
        let lines = [
            "Error: syntax error, unexpected newline",
            echo.as_str(),
            caret.as_str(),
            "Error: No such file or directory",
            S,
            CARET,
        ];
        let Ok(Some(Reply::Refused(got))) = feed_all(&mut p, &lines) else {
            panic!("not refused");
        };
        assert_eq!(got, lines[..3]);
        // The message points at the failing command, not the whole line.
        let text = describe_refusal(&got, &sent);
        assert_eq!(
            text,
            format!(
                "Error: syntax error, unexpected newline\nadd rule inet t c bogus\n{}^\n",
                " ".repeat("add rule inet t c ".len())
            )
        );
        // A caret on the separator after a command points past that command's end.
        let at = echo.find("; add chain").unwrap();
        let lines = vec![
            "Error: syntax error, unexpected semicolon".to_string(),
            echo.clone(),
            format!("{}^", " ".repeat(at)),
        ];
        assert_eq!(
            describe_refusal(&lines, &sent),
            format!(
                "Error: syntax error, unexpected semicolon\nadd rule inet t c bogus\n{}^\n",
                " ".repeat("add rule inet t c bogus".len())
            )
        );
    }

    #[test]
    fn out_of_step_output_is_a_protocol_error() {
        // The sentinel echoed without an error line before it.
        let mut p = ReplyParser::new(S);
        assert!(feed_all(&mut p, &[S]).is_err());
        // No caret line after the sentinel's echo.
        let mut p = ReplyParser::new(S);
        assert!(feed_all(
            &mut p,
            &["Error: No such file or directory", S, "table x {"]
        )
        .is_err());
        // Another sentinel's block is not ours: still waiting.
        let mut p = ReplyParser::new(S);
        let r = feed_all(
            &mut p,
            &[
                "Error: No such file or directory",
                "list table inet nw_sentinel_70",
                CARET,
            ],
        );
        assert_eq!(r, Ok(None));
    }

    #[test]
    fn long_unrelated_echoes_are_cut() {
        let sent = OneLine::join("add table inet t\n").unwrap();
        let long = "x".repeat(1000);
        let text = describe_refusal(&["Error: boom".into(), long], &sent);
        assert!(text.starts_with("Error: boom\nxxx"));
        assert!(text.len() < 500, "{}", text.len());
    }
}
