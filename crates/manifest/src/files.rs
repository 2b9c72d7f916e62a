//! Files and directories to first passes: directory walking (sorted, loop-safe), reading
//! regular files, and their bytes to a [`FileRead`] ([`crate::stream`]; the text to documents
//! part is [`crate::documents`]).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::read::FileRead;
use crate::{LoadError, Problem, Severity};

const EXTENSIONS: [&str; 3] = ["yaml", "yml", "json"];

/// The largest manifest file read (larger ones are refused, not read into memory): ten times
/// a 100,000-pod inventory in one file.
pub const MAX_FILE_BYTES: u64 = 1 << 30;

/// Reads a manifest file: only a regular file (a FIFO would block the reader forever, a
/// device such as `/dev/zero` never ends), opened without blocking, and at most
/// [`MAX_FILE_BYTES`].
pub(crate) fn read_regular(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    // Judged before opening, so that a device's open handler never runs; judged again on the
    // open file, in case the path was swapped in between (then at worst a non-blocking open).
    let before = std::fs::metadata(path)?;
    if !before.is_file() {
        return Err(not_regular(&before));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(not_regular(&meta));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // The file may grow while it is read: never read past the limit.
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large());
    }
    Ok(bytes)
}

fn not_regular(meta: &std::fs::Metadata) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("not a regular file ({})", file_type_name(meta)),
    )
}

fn too_large() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("larger than {} MiB", MAX_FILE_BYTES >> 20),
    )
}

/// What a non-regular file is, for messages.
fn file_type_name(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    match () {
        _ if t.is_dir() => "a directory",
        _ if t.is_fifo() => "a FIFO",
        _ if t.is_socket() => "a socket",
        _ if t.is_char_device() => "a character device",
        _ if t.is_block_device() => "a block device",
        _ => "not a regular file",
    }
}

/// One step of a listing of the input paths, in load order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Listed {
    /// A file to read (a file named twice, explicitly and under a directory, is listed twice).
    File(PathBuf),
    /// A path that does not exist (any more): nothing under it is loaded.
    Missing { path: PathBuf, problem: Problem },
    /// A path that exists but cannot be listed or examined: what was found under it before
    /// is kept by [`crate::ManifestSet`].
    Unlistable { path: PathBuf, problem: Problem },
    /// A problem that removes nothing (a directory without manifest files).
    Note(Problem),
}

/// Lists the files to read under `paths` (files as given, directories walked).
pub(crate) fn list(paths: &[PathBuf]) -> Vec<Listed> {
    let mut out = Vec::new();
    for path in paths {
        list_path(path, &mut out);
    }
    out
}

fn list_path(path: &Path, out: &mut Vec<Listed>) {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) => return out.push(io_listed(path, e)),
    };
    if !meta.is_dir() {
        return out.push(Listed::File(path.to_path_buf()));
    }
    let start = out.len();
    let mut visited = HashSet::new();
    walk(path, out, &mut visited);
    let listed_anything = out[start..]
        .iter()
        .any(|l| matches!(l, Listed::File(_) | Listed::Unlistable { .. }));
    if !listed_anything {
        out.push(Listed::Note(Problem::untyped(
            Severity::Warning,
            path.display().to_string(),
            "",
            "",
            "no manifest files (*.yaml, *.yml, *.json) in this directory",
        )));
    }
}

fn io_problem(path: &Path, e: std::io::Error) -> Problem {
    Problem::untyped(
        Severity::Error,
        path.display().to_string(),
        "",
        "",
        LoadError::Io(e).to_string(),
    )
}

fn io_listed(path: &Path, e: std::io::Error) -> Listed {
    let path = path.to_path_buf();
    if e.kind() == std::io::ErrorKind::NotFound {
        let problem = io_problem(&path, e);
        Listed::Missing { path, problem }
    } else {
        let problem = io_problem(&path, e);
        Listed::Unlistable { path, problem }
    }
}

/// Collects manifest files under `dir`. Entries starting with `.` are skipped: besides hidden
/// files, that avoids reading a ConfigMap volume twice (its files are symlinks into `..data`).
/// Symlinked directories are followed once (canonical paths are remembered, so loops end).
fn walk(dir: &Path, out: &mut Vec<Listed>, visited: &mut HashSet<PathBuf>) {
    match dir.canonicalize() {
        Ok(c) => {
            if !visited.insert(c) {
                return;
            }
        }
        Err(e) => return out.push(io_listed(dir, e)),
    }
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => return out.push(io_listed(dir, e)),
    };
    let mut paths: Vec<PathBuf> = Vec::new();
    for entry in entries {
        match entry {
            Ok(e) => paths.push(e.path()),
            // The directory cannot be listed completely: keep what was under it.
            Err(e) => {
                let problem = io_problem(dir, e);
                return out.push(Listed::Unlistable {
                    path: dir.to_path_buf(),
                    problem,
                });
            }
        }
    }
    paths.sort();
    for p in paths {
        if p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with('.'))
        {
            continue;
        }
        match std::fs::metadata(&p) {
            Ok(m) if m.is_dir() => walk(&p, out, visited),
            Ok(m) => {
                let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("");
                if !EXTENSIONS.iter().any(|x| ext.eq_ignore_ascii_case(x)) {
                    continue;
                }
                if m.is_file() {
                    out.push(Listed::File(p));
                } else {
                    // Named like a manifest but a FIFO, socket or device: never opened.
                    out.push(Listed::Note(Problem::untyped(
                        Severity::Warning,
                        p.display().to_string(),
                        "",
                        "",
                        format!("{} named like a manifest; skipped", file_type_name(&m)),
                    )));
                }
            }
            Err(e) => out.push(io_listed(&p, e)),
        }
    }
}

/// A file's bytes to its first pass; the label names it in problems.
pub(crate) fn read_bytes(label: &str, bytes: Vec<u8>) -> FileRead {
    match String::from_utf8(bytes) {
        Ok(text) => crate::stream::read_text(label, &text),
        Err(_) => FileRead::unreadable(Problem::untyped(
            Severity::Error,
            label.to_string(),
            "",
            "",
            "not UTF-8 text",
        )),
    }
}

/// Reads a listed file (for [`crate::load_paths`], which keeps no state).
pub(crate) fn read_file(path: &Path) -> FileRead {
    match read_regular(path) {
        Ok(bytes) => read_bytes(&path.display().to_string(), bytes),
        Err(e) => FileRead::unreadable(io_problem(path, e)),
    }
}
