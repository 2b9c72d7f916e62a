//! Text to `serde_json::Value` documents (YAML multi-document or JSON), salvaging the good
//! documents of a file where one document is broken.
//!
//! Apart from [`crate::files`] (the disk: listing, walking, reading bytes) because it sits
//! below the first pass ([`crate::read`] reduces what it parses), while the disk side sits
//! above it (a file read from disk goes through [`crate::stream`] to a `FileRead`).

use std::borrow::Cow;

use serde_json::Value;

use crate::{json, validate, LoadError, Problem, Severity};

/// A problem of the file as a whole, or of its document `object` (`#N`).
pub(crate) fn problem(file: &str, object: String, err: LoadError) -> Problem {
    Problem {
        file: file.to_string(),
        kind: String::new(),
        object,
        field: String::new(),
        reason: err.to_string(),
        severity: Severity::Error,
    }
}

/// One parsed document.
#[derive(Debug)]
pub(crate) struct Doc {
    /// 1-based, as an editor counts documents.
    pub index: usize,
    pub value: Value,
    /// Paths of keys written twice in one object (JSON only: YAML refuses them).
    pub duplicate_keys: Vec<String>,
}

impl Doc {
    fn yaml(index: usize, value: Value) -> Self {
        Self {
            index,
            value,
            duplicate_keys: Vec::new(),
        }
    }
}

/// Parses one file's text into documents. Empty documents are skipped (their index is still
/// counted, so `#N` matches what an editor shows).
pub(crate) fn parse_documents(file: &str, text: &str, problems: &mut Vec<Problem>) -> Vec<Doc> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let first = text.trim_start().chars().next();
    if matches!(first, Some('{' | '[')) {
        match json::stream(text) {
            Ok(docs) => {
                return docs
                    .into_iter()
                    .enumerate()
                    .filter(|(_, d)| !d.value.is_null())
                    .map(|(i, d)| Doc {
                        index: i + 1,
                        value: d.value,
                        duplicate_keys: d.duplicate_keys,
                    })
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

pub(crate) fn yaml_options() -> serde_saphyr::Options {
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
    LoadError::Yaml(bound_parser_message(&msg))
}

/// The longest parser message kept whole.
const MAX_PARSER_MESSAGE: usize = 400;

/// A parser's message as one short line. The parser quotes the input it chokes on between
/// backticks, however long (a scalar of a megabyte, control characters included): each
/// quote is escaped and shortened like any user input, so the position that follows it
/// (`at line 3, column 7`) stays; a message still too long loses its middle.
fn bound_parser_message(msg: &str) -> String {
    let mut out = String::new();
    for (i, part) in msg.split('`').enumerate() {
        if i > 0 {
            out.push('`');
        }
        if i % 2 == 1 {
            out.push_str(&validate::shorten(part));
        } else {
            out.extend(part.chars().map(|c| if c.is_control() { ' ' } else { c }));
        }
    }
    if out.len() <= MAX_PARSER_MESSAGE {
        return out;
    }
    let half = MAX_PARSER_MESSAGE / 2;
    let head: String = out.chars().take(half).collect();
    let tail: Vec<char> = out.chars().rev().take(half).collect();
    format!("{head}...{}", tail.into_iter().rev().collect::<String>())
}

/// The whole text at once, numbering documents as the splitter would.
fn yaml_documents(text: &str) -> Result<Vec<Doc>, LoadError> {
    let chunks = split_documents(text);
    let mut out = Vec::new();
    for (i, chunk) in chunks.iter().enumerate() {
        for doc in parse_yaml_chunk(chunk)? {
            out.push(Doc::yaml(i + 1, doc));
        }
    }
    Ok(out)
}

pub(crate) fn parse_yaml_chunk(chunk: &str) -> Result<Vec<Value>, LoadError> {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple_with_options(chunk, yaml_options()).map_err(yaml_error)?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

fn salvage_yaml(file: &str, text: &str, problems: &mut Vec<Problem>) -> Vec<Doc> {
    let mut out = Vec::new();
    for (i, chunk) in split_documents(text).iter().enumerate() {
        match parse_yaml_chunk(chunk) {
            Ok(docs) => out.extend(docs.into_iter().map(|d| Doc::yaml(i + 1, d))),
            Err(e) => problems.push(problem(file, format!("#{}", i + 1), e)),
        }
    }
    out
}

/// Splits a YAML stream at document start markers (`---` at column 0, alone or followed by a
/// space or tab). In YAML such a line always starts a new document, even inside a block
/// scalar, so splitting here never cuts through a document. Directives (`%YAML`) preceding a
/// marker stay with the document they introduce.
///
/// Chunks are slices of the text (a large file is not copied), except where directives are
/// moved to their document.
pub(crate) fn split_documents(text: &str) -> Vec<Cow<'_, str>> {
    if has_leading_directive(text) {
        return split_moving_directives(text)
            .into_iter()
            .map(Cow::Owned)
            .collect();
    }
    let mut chunks = Vec::new();
    let mut start = 0;
    let mut at = 0;
    // Whether the current chunk holds more than comments (always, after a marker).
    let mut has_content = false;
    for line in text.split_inclusive('\n') {
        if is_marker(line) {
            // A leading run of comments before the first marker is not a document of its own.
            if has_content {
                chunks.push(Cow::Borrowed(&text[start..at]));
            }
            start = at;
            has_content = true;
        } else {
            has_content = has_content || !is_only_comments(line);
        }
        at += line.len();
    }
    chunks.push(Cow::Borrowed(&text[start..]));
    chunks
}

/// Whether a line is a document start marker.
fn is_marker(line: &str) -> bool {
    let bare = line.trim_end_matches(['\n', '\r']);
    bare == "---" || bare.starts_with("--- ") || bare.starts_with("---\t")
}

/// Whether a directive line comes before the first marker with nothing but comments before
/// it: the one case where [`split_moving_directives`] moves text.
fn has_leading_directive(text: &str) -> bool {
    for line in text.split_inclusive('\n') {
        if is_marker(line) {
            return false;
        }
        if line.starts_with('%') {
            return true;
        }
        if !is_only_comments(line) {
            return false;
        }
    }
    false
}

/// [`split_documents`] for a text with leading directives, moving them to the document they
/// introduce.
fn split_moving_directives(text: &str) -> Vec<String> {
    let mut chunks: Vec<String> = Vec::new();
    let mut cur = String::new();
    // Whether `cur` holds more than comments: tracked line by line, since rescanning `cur`
    // for every directive line would be quadratic.
    let mut cur_has_content = false;
    let mut directives = String::new();
    for line in text.split_inclusive('\n') {
        let bare = line.trim_end_matches(['\n', '\r']);
        if is_marker(line) {
            // A leading run of comments before the first marker is not a document of its own.
            if !chunks.is_empty() || cur_has_content {
                chunks.push(std::mem::take(&mut cur));
            } else {
                cur.clear();
            }
            cur.push_str(&directives);
            directives.clear();
            cur.push_str(line);
            cur_has_content = true;
        } else if bare.starts_with('%') && !cur_has_content {
            directives.push_str(line);
        } else {
            cur_has_content = cur_has_content || !is_only_comments(line);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_split_as_slices_as_when_copied() {
        for text in [
            "",
            "# only a comment\n",
            "a: 1\n",
            "# c\n---\na: 1\n---\nb: 2\n",
            "a: 1\n--- \nb: 2\n---\t\n---\n",
            "a: |\n  x\n---\nb: 2\r\n---\r\nc: 3",
            "# c\n%YAML 1.2\n---\na: 1\n",
            "a: 1\n%TAG ! x\n---\nb: 2\n",
            "%YAML 1.2\n",
        ] {
            let split: Vec<String> = split_documents(text)
                .into_iter()
                .map(Cow::into_owned)
                .collect();
            assert_eq!(split, split_moving_directives(text), "{text:?}");
            let borrowed = split_documents(text)
                .iter()
                .all(|c| matches!(c, Cow::Borrowed(_)));
            assert_eq!(borrowed, !has_leading_directive(text), "{text:?}");
        }
    }
}
