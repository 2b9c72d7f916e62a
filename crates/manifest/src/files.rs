//! Files and directories to documents: directory walking (sorted, loop-safe), and text to
//! `serde_json::Value` documents (YAML multi-document or JSON), salvaging the good documents of
//! a file where one document is broken.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::{LoadError, Loader, Problem, Severity};

const EXTENSIONS: [&str; 3] = ["yaml", "yml", "json"];

pub(crate) fn add_path(loader: &mut Loader, path: &Path) {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) => return io_problem(loader, path, e),
    };
    if meta.is_dir() {
        let mut files = Vec::new();
        let mut visited = HashSet::new();
        walk(loader, path, &mut files, &mut visited);
        files.sort();
        for f in files {
            add_file(loader, &f);
        }
    } else {
        add_file(loader, path);
    }
}

fn io_problem(loader: &mut Loader, path: &Path, e: std::io::Error) {
    loader.problems.push(Problem {
        file: path.display().to_string(),
        kind: String::new(),
        object: String::new(),
        field: String::new(),
        reason: LoadError::Io(e).to_string(),
        severity: Severity::Error,
    });
}

/// Collects manifest files under `dir`. Entries starting with `.` are skipped: besides hidden
/// files, that avoids reading a ConfigMap volume twice (its files are symlinks into `..data`).
/// Symlinked directories are followed once (canonical paths are remembered, so loops end).
fn walk(loader: &mut Loader, dir: &Path, out: &mut Vec<PathBuf>, visited: &mut HashSet<PathBuf>) {
    match dir.canonicalize() {
        Ok(c) => {
            if !visited.insert(c) {
                return;
            }
        }
        Err(e) => return io_problem(loader, dir, e),
    }
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => return io_problem(loader, dir, e),
    };
    let mut paths: Vec<PathBuf> = Vec::new();
    for entry in entries {
        match entry {
            Ok(e) => paths.push(e.path()),
            Err(e) => io_problem(loader, dir, e),
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
            Ok(m) if m.is_dir() => walk(loader, &p, out, visited),
            Ok(m) if m.is_file() => {
                let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("");
                if EXTENSIONS.iter().any(|x| ext.eq_ignore_ascii_case(x)) {
                    out.push(p);
                }
            }
            Ok(_) => {}
            Err(e) => io_problem(loader, &p, e),
        }
    }
}

fn add_file(loader: &mut Loader, path: &Path) {
    match std::fs::read(path) {
        Ok(bytes) => {
            let label = path.display().to_string();
            match String::from_utf8(bytes) {
                Ok(text) => loader.add_str(&label, &text),
                Err(_) => loader.problems.push(Problem {
                    file: label,
                    kind: String::new(),
                    object: String::new(),
                    field: String::new(),
                    reason: "not UTF-8 text".into(),
                    severity: Severity::Error,
                }),
            }
        }
        Err(e) => io_problem(loader, path, e),
    }
}

fn problem(file: &str, object: String, err: LoadError) -> Problem {
    Problem {
        file: file.to_string(),
        kind: String::new(),
        object,
        field: String::new(),
        reason: err.to_string(),
        severity: Severity::Error,
    }
}

/// Parses one file's text into documents, each with its 1-based index. Empty documents are
/// skipped (their index is still counted, so `#N` matches what an editor shows).
pub(crate) fn parse_documents(
    file: &str,
    text: &str,
    problems: &mut Vec<Problem>,
) -> Vec<(usize, Value)> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let first = text.trim_start().chars().next();
    if matches!(first, Some('{' | '[')) {
        match parse_json_stream(text) {
            Ok(docs) => {
                return docs
                    .into_iter()
                    .enumerate()
                    .map(|(i, d)| (i + 1, d))
                    .collect()
            }
            // JSON is also YAML (flow style): fall back before giving up, but report the JSON
            // error for a .json file since it is the more precise one there.
            Err(json_err) => {
                if file.to_ascii_lowercase().ends_with(".json") {
                    if let Ok(docs) = yaml_documents(text) {
                        return docs;
                    }
                    problems.push(problem(file, String::new(), LoadError::Json(json_err)));
                    return Vec::new();
                }
            }
        }
    }
    // Document by document, so that one broken document does not lose the others.
    salvage_yaml(file, text, problems)
}

fn parse_json_stream(text: &str) -> Result<Vec<Value>, serde_json::Error> {
    serde_json::Deserializer::from_str(text)
        .into_iter::<Value>()
        .collect()
}

fn yaml_options() -> serde_saphyr::Options {
    let mut o = serde_saphyr::Options::default();
    // Problems are one line each; the snippet rendering would break that.
    o.with_snippet = false;
    // The default budget suits config files; a `kubectl get -A -o yaml` dump of a large
    // cluster is one List document with millions of nodes. Depth and alias limits (stack and
    // alias-bomb protection) stay as they are.
    let mut budget = serde_saphyr::Budget::default();
    budget.max_events = budget.max_events.max(50_000_000);
    budget.max_nodes = budget.max_nodes.max(20_000_000);
    // Manifests hardly use anchors; a small cap makes alias bombs fail fast.
    budget.max_recorded_anchor_events = budget.max_recorded_anchor_events.min(100_000);
    budget.max_recorded_anchor_bytes = budget.max_recorded_anchor_bytes.min(8 << 20);
    o.budget = Some(budget);
    o
}

fn yaml_error(e: serde_saphyr::Error) -> LoadError {
    let msg = e.to_string();
    let msg = msg
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    LoadError::Yaml(msg)
}

/// The whole text at once, numbering documents as the splitter would.
fn yaml_documents(text: &str) -> Result<Vec<(usize, Value)>, LoadError> {
    let chunks = split_documents(text);
    let mut out = Vec::new();
    for (i, chunk) in chunks.iter().enumerate() {
        for doc in parse_yaml_chunk(chunk)? {
            out.push((i + 1, doc));
        }
    }
    Ok(out)
}

fn parse_yaml_chunk(chunk: &str) -> Result<Vec<Value>, LoadError> {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple_with_options(chunk, yaml_options()).map_err(yaml_error)?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

fn salvage_yaml(file: &str, text: &str, problems: &mut Vec<Problem>) -> Vec<(usize, Value)> {
    let mut out = Vec::new();
    for (i, chunk) in split_documents(text).iter().enumerate() {
        match parse_yaml_chunk(chunk) {
            Ok(docs) => out.extend(docs.into_iter().map(|d| (i + 1, d))),
            Err(e) => problems.push(problem(file, format!("#{}", i + 1), e)),
        }
    }
    out
}

/// Splits a YAML stream at document start markers (`---` at column 0, alone or followed by a
/// space or tab). In YAML such a line always starts a new document, even inside a block
/// scalar, so splitting here never cuts through a document. Directives (`%YAML`) preceding a
/// marker stay with the document they introduce.
fn split_documents(text: &str) -> Vec<String> {
    let mut chunks: Vec<String> = Vec::new();
    let mut cur = String::new();
    let mut directives = String::new();
    for line in text.split_inclusive('\n') {
        let bare = line.trim_end_matches(['\n', '\r']);
        let is_marker = bare == "---" || bare.starts_with("--- ") || bare.starts_with("---\t");
        if is_marker {
            // A leading run of comments before the first marker is not a document of its own.
            if !chunks.is_empty() || !is_only_comments(&cur) {
                chunks.push(std::mem::take(&mut cur));
            } else {
                cur.clear();
            }
            cur.push_str(&directives);
            directives.clear();
            cur.push_str(line);
        } else if bare.starts_with('%') && is_only_comments(&cur) {
            directives.push_str(line);
        } else {
            cur.push_str(line);
        }
    }
    cur.push_str(&directives);
    chunks.push(cur);
    chunks
}

fn is_only_comments(s: &str) -> bool {
    s.lines().all(|l| {
        let t = l.trim();
        t.is_empty() || t.starts_with('#') || t == "..."
    })
}
