//! Text to a file's first pass without holding its parsed tree: each document is reduced
//! ([`FileRead`]) as soon as it is parsed, and the items of a List as soon as each is parsed,
//! so that loading a `kind: List` of 100,000 pods holds one pod's `Value` at a time, not the
//! whole list's (hundreds of MiB).
//!
//! The result is always the one of reading the whole text first and reducing it after
//! ([`read_text_whole`], the reference): same entries, problems and labels, in the
//! same order. Where streaming cannot know it gives that result, the text is read the
//! reference way:
//!
//! - A List's `kind` may follow its `items` (`kubectl get -o json` sorts keys: `apiVersion`,
//!   `items`, `kind`). An item that writes its own kind and apiVersion reads the same in any
//!   List, so it is reduced at once; another one is kept as a `Value` until the List's kind
//!   (and, for a typed list such as `PodList`, its apiVersion) is known. When the document
//!   turns out not to be a List, what was reduced of its items is dropped: no other kind
//!   reads `items`. A `kind` written twice that changes what kept items inherit sends the
//!   document back to the reference.
//! - A JSON syntax error: the reference reports it for the whole file (and, for a `.json`
//!   file, first tries the text as YAML), so nothing read before it is kept.
//! - A bare JSON scalar at the top level (`{} 1`): where it ends is decided by serde_json's
//!   stream reader, which only the reference uses.
//! - A YAML document that fails to parse, or a split chunk holding more than one document
//!   (after `...`): that chunk is read the reference way (which reports its error).

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::documents::{self, parse_yaml_chunk, problem};
use crate::json::{self, KeySeed, Segment, ValueSeed, Walk};
use crate::kinds::ApiVersion;
use crate::read::{self, FileRead};
use crate::Problem;

/// Reads one file's text: JSON (a stream of values) when it starts like JSON, else YAML
/// document by document.
pub(crate) fn read_text(file: &str, text: &str) -> FileRead {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    if matches!(text.trim_start().chars().next(), Some('{' | '[')) {
        return read_json(file, text).unwrap_or_else(|| read_text_whole(file, text));
    }
    read_yaml(file, text)
}

/// Reads one file's text by parsing all of it first, then reducing its documents: the
/// reference that streaming matches, and what it falls back on where it cannot stream (a JSON
/// syntax error, whose report depends on the whole text).
pub(crate) fn read_text_whole(file: &str, text: &str) -> FileRead {
    let mut file_problems = Vec::new();
    let docs = documents::parse_documents(file, text, &mut file_problems);
    read_documents(file, file_problems, &docs)
}

/// Reads one file's parsed documents; `file_problems` are those of parsing it.
pub(crate) fn read_documents(
    file: &str,
    file_problems: Vec<Problem>,
    docs: &[documents::Doc],
) -> FileRead {
    let mut read = FileRead {
        file_problems,
        ..FileRead::default()
    };
    for doc in docs {
        read.add_document(file, doc.index, &doc.value, &doc.duplicate_keys);
    }
    read
}

/// Reads chunk `index` (1-based) of [`documents::split_documents`] the reference way: parsed whole, then
/// reduced; a parse error is a problem of the file.
pub(crate) fn read_yaml_chunk(file: &str, index: usize, chunk: &str, read: &mut FileRead) {
    match parse_yaml_chunk(chunk) {
        Ok(docs) => {
            for doc in docs {
                read.add_document(file, index, &doc, &[]);
            }
        }
        Err(e) => read
            .file_problems
            .push(problem(file, format!("#{index}"), e)),
    }
}

/// A JSON stream, each value reduced as it is parsed; `None` where only the reference knows
/// the answer (a syntax error, a bare scalar, a List whose kind changed under its items).
fn read_json(file: &str, text: &str) -> Option<FileRead> {
    let mut read = FileRead::default();
    let mut de = serde_json::Deserializer::from_str(text);
    let mut index = 0;
    // `end` fails while anything but whitespace is left.
    while de.end().is_err() {
        index += 1;
        let seed = DocSeed {
            file,
            index,
            read: &mut read,
        };
        match seed.deserialize(&mut de) {
            Ok(Doc::Read) => {}
            Ok(Doc::Scalar(_) | Doc::Again) | Err(_) => return None,
        }
    }
    Some(read)
}

/// YAML split at document markers, one chunk after the other, so that a broken document does
/// not lose the others.
fn read_yaml(file: &str, text: &str) -> FileRead {
    let mut read = FileRead::default();
    for (i, chunk) in documents::split_documents(text).iter().enumerate() {
        let index = i + 1;
        let (entries, documents) = (read.entries.len(), read.documents);
        let streamed = serde_saphyr::with_deserializer_from_str_with_options(
            chunk,
            documents::yaml_options(),
            |de| {
                let seed = DocSeed {
                    file,
                    index,
                    read: &mut read,
                };
                seed.deserialize(de)
            },
        );
        match streamed {
            Ok(Doc::Read) => {}
            Ok(Doc::Scalar(Value::Null)) => {}
            Ok(Doc::Scalar(value)) => read.add_document(file, index, &value, &[]),
            Ok(Doc::Again) | Err(_) => {
                read.entries.truncate(entries);
                read.documents = documents;
                read_yaml_chunk(file, index, chunk, &mut read);
            }
        }
    }
    read
}

/// What became of one top-level document.
enum Doc {
    /// Reduced into the file's read.
    Read,
    /// A number, boolean or null: left to the caller.
    Scalar(Value),
    /// Streaming could not tell what the reference reads; nothing was added.
    Again,
}

/// Reads one top-level document into `read`, reducing a List's items one at a time.
struct DocSeed<'r> {
    file: &'r str,
    /// 1-based, as [`FileRead::add_document`] counts.
    index: usize,
    read: &'r mut FileRead,
}

impl<'de> DeserializeSeed<'de> for DocSeed<'_> {
    type Value = Doc;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Doc, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl DocSeed<'_> {
    fn whole(self, value: Value, walk: Walk) -> Doc {
        self.read
            .add_document(self.file, self.index, &value, &walk.duplicates);
        Doc::Read
    }
}

impl<'de> Visitor<'de> for DocSeed<'_> {
    type Value = Doc;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a document")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Doc, E> {
        Ok(Doc::Scalar(Value::Bool(v)))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Doc, E> {
        Ok(Doc::Scalar(Value::Number(v.into())))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Doc, E> {
        Ok(Doc::Scalar(Value::Number(v.into())))
    }

    fn visit_i128<E: serde::de::Error>(self, v: i128) -> Result<Doc, E> {
        json::int128(v).map(Doc::Scalar)
    }

    fn visit_u128<E: serde::de::Error>(self, v: u128) -> Result<Doc, E> {
        json::uint128(v).map(Doc::Scalar)
    }

    fn visit_f64<E>(self, v: f64) -> Result<Doc, E> {
        Ok(Doc::Scalar(json::float(v)))
    }

    fn visit_unit<E>(self) -> Result<Doc, E> {
        Ok(Doc::Scalar(Value::Null))
    }

    fn visit_none<E>(self) -> Result<Doc, E> {
        Ok(Doc::Scalar(Value::Null))
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Doc, D::Error> {
        self.deserialize(deserializer)
    }

    fn visit_str<E>(self, v: &str) -> Result<Doc, E> {
        Ok(self.whole(Value::String(v.to_string()), Walk::default()))
    }

    fn visit_string<E>(self, v: String) -> Result<Doc, E> {
        Ok(self.whole(Value::String(v), Walk::default()))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Doc, A::Error> {
        let mut walk = Walk::default();
        let value = ValueSeed { walk: &mut walk }.visit_seq(seq)?;
        Ok(self.whole(value, walk))
    }

    /// An object: every field but `items` is kept as a `Value`; `items`, when it is a list,
    /// is reduced item by item (see the module documentation).
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Doc, A::Error> {
        let label = format!("#{}", self.index);
        let mut walk = Walk::default();
        let mut fields = Map::new();
        let mut streamed: Option<Streamed> = None;
        while let Some(key) = map.next_key_seed(KeySeed)? {
            // As for any key written twice, the last `items` is the one read.
            let is_items = key == "items";
            let written_before = fields.contains_key(&key) || (is_items && streamed.is_some());
            if is_items {
                streamed = None;
                fields.remove("items");
            }
            walk.path.push(Segment::Key(key));
            let value = if is_items {
                let seed = ItemsSeed {
                    file: self.file,
                    label: &label,
                    walk: &mut walk,
                    written: Written {
                        kind: fields.get("kind").cloned(),
                        api_version: fields.get("apiVersion").cloned(),
                    },
                };
                map.next_value_seed(seed)
            } else {
                map.next_value_seed(ValueSeed { walk: &mut walk })
                    .map(Items::Value)
            };
            let Some(Segment::Key(key)) = walk.path.pop() else {
                unreachable!("the segment pushed above")
            };
            let value = value?;
            if written_before {
                let path = walk.path_of(&key);
                walk.duplicates.push(path);
            }
            match value {
                Items::Value(value) => {
                    fields.insert(key, value);
                }
                Items::Streamed(items) => streamed = Some(items),
            }
        }
        let doc = Value::Object(fields);
        let Some(items) = streamed else {
            return Ok(self.whole(doc, walk));
        };
        let Some(inherited) = read::top_level_list_items(doc.get("kind"), doc.get("apiVersion"))
        else {
            // Not a List: no other kind reads `items`, so what was reduced of them goes.
            return Ok(self.whole(doc, walk));
        };
        let unchanged = items.written.kind.as_ref() == doc.get("kind")
            && items.written.api_version.as_ref() == doc.get("apiVersion");
        if items.assumed && !unchanged {
            return Ok(Doc::Again);
        }
        // The reference reads a List document as its items' entries, in order, after the
        // document's duplicate keys.
        let (file, read) = (self.file, self.read);
        read.begin_document(file, self.index, &walk.duplicates);
        let mut kept = items.kept.into_iter().peekable();
        for (at, entry) in items.read.entries.into_iter().enumerate() {
            while let Some(k) = kept.next_if(|k| k.at == at) {
                read.add_list_item(file, &label, k.index, &k.value, inherited);
            }
            read.entries.push(entry);
        }
        for k in kept {
            read.add_list_item(file, &label, k.index, &k.value, inherited);
        }
        Ok(Doc::Read)
    }
}

/// A top-level document's `kind` and `apiVersion` as written before its `items`.
struct Written {
    kind: Option<Value>,
    api_version: Option<Value>,
}

/// An `items` field: a list read item by item, or any other value (kept as written).
enum Items {
    Value(Value),
    Streamed(Streamed),
}

/// The items of a top-level document, read while its kind may not be known yet.
struct Streamed {
    /// What the items reduced so far gave.
    read: FileRead,
    /// Items that need their List's kind to be read, in order.
    kept: Vec<Kept>,
    /// The kind and apiVersion the document had written when its items began.
    written: Written,
    /// Whether an item was read with what `written` says it inherits.
    assumed: bool,
}

/// An item kept until its List is known.
struct Kept {
    /// Its entries go before `read.entries[at]`.
    at: usize,
    /// Its position in `items`.
    index: usize,
    value: Value,
}

/// Reads an `items` field of a top-level document.
struct ItemsSeed<'a, 'w> {
    file: &'a str,
    /// The document's label (`#1`).
    label: &'a str,
    walk: &'w mut Walk,
    written: Written,
}

impl<'de> DeserializeSeed<'de> for ItemsSeed<'_, '_> {
    type Value = Items;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Items, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ItemsSeed<'_, '_> {
    type Value = Items;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Items, E> {
        Ok(Items::Value(Value::Bool(v)))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Items, E> {
        Ok(Items::Value(Value::Number(v.into())))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Items, E> {
        Ok(Items::Value(Value::Number(v.into())))
    }

    fn visit_i128<E: serde::de::Error>(self, v: i128) -> Result<Items, E> {
        json::int128(v).map(Items::Value)
    }

    fn visit_u128<E: serde::de::Error>(self, v: u128) -> Result<Items, E> {
        json::uint128(v).map(Items::Value)
    }

    fn visit_f64<E>(self, v: f64) -> Result<Items, E> {
        Ok(Items::Value(json::float(v)))
    }

    fn visit_str<E>(self, v: &str) -> Result<Items, E> {
        Ok(Items::Value(Value::String(v.to_string())))
    }

    fn visit_string<E>(self, v: String) -> Result<Items, E> {
        Ok(Items::Value(Value::String(v)))
    }

    fn visit_unit<E>(self) -> Result<Items, E> {
        Ok(Items::Value(Value::Null))
    }

    fn visit_none<E>(self) -> Result<Items, E> {
        Ok(Items::Value(Value::Null))
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Items, D::Error> {
        self.deserialize(deserializer)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Items, A::Error> {
        ValueSeed { walk: self.walk }
            .visit_map(map)
            .map(Items::Value)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Items, A::Error> {
        let (kind, api_version) = (&self.written.kind, &self.written.api_version);
        // What the items inherit, if the document is the List its fields so far say.
        let assumed = match kind {
            None => None,
            Some(_) => match read::top_level_list_items(kind.as_ref(), api_version.as_ref()) {
                // Not a List (unless a second `kind` follows): the items are never read, but
                // kept as written, as the reference keeps them.
                None => {
                    return ValueSeed {
                        walk: &mut *self.walk,
                    }
                    .visit_seq(seq)
                    .map(Items::Value)
                }
                // A typed list's items inherit its apiVersion, which may still come.
                Some(Some(_)) if api_version.is_none() => None,
                Some(inherited) => Some(inherited),
            },
        };
        let mut read = FileRead::default();
        let mut kept = Vec::new();
        let mut used_assumption = false;
        for index in 0.. {
            self.walk.path.push(Segment::Index(index));
            let next = seq.next_element_seed(ValueSeed {
                walk: &mut *self.walk,
            });
            self.walk.path.pop();
            let Some(item) = next? else { break };
            // An item of another kind than its typed List's is reported by the reader, which
            // must then know the List's kind (see `FileRead::add_value_at`).
            let stray = |listed: Option<(ApiVersion<'_>, &str)>| {
                listed.is_some_and(|(_, k)| item.get("kind").and_then(Value::as_str) != Some(k))
            };
            match assumed {
                Some(inherited) if !read::self_describing(&item) || stray(inherited) => {
                    used_assumption = true;
                    read.add_list_item(self.file, self.label, index, &item, inherited);
                }
                Some(_) => read.add_list_item(self.file, self.label, index, &item, None),
                None => kept.push(Kept {
                    at: read.entries.len(),
                    index,
                    value: item,
                }),
            }
        }
        Ok(Items::Streamed(Streamed {
            read,
            kept,
            written: self.written,
            assumed: used_assumption,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::Outcome;
    use crate::Severity;

    /// Reads `text` as file `label` while parsing it, checking the result against the
    /// reference.
    fn streamed(label: &str, text: &str) -> FileRead {
        let read = read_text(label, text);
        assert_eq!(read, read_text_whole(label, text), "{label}: {text}");
        read
    }

    /// `kind ns/name` of every loaded object, in order.
    fn loaded(read: &FileRead) -> Vec<String> {
        read.objects()
            .map(|o| format!("{} {}", o.id.kind, o.label))
            .collect()
    }

    /// (object, field, severity) of every problem, file problems first.
    fn problems(read: &FileRead) -> Vec<(String, String, Severity)> {
        read.file_problems
            .iter()
            .chain(read.entries.iter().flat_map(|e| &e.problems))
            .map(|p| (p.object.clone(), p.field.clone(), p.severity))
            .collect()
    }

    fn pod(name: &str) -> String {
        format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}","namespace":"x"}}}}"#
        )
    }

    fn list(fields_before: &str, items: &[String], fields_after: &str) -> String {
        format!(
            r#"{{{fields_before}"items":[{}]{fields_after}}}"#,
            items.join(",")
        )
    }

    #[test]
    fn a_list_streams_whether_kind_comes_before_or_after_its_items() {
        let items = [pod("a"), pod("b")];
        for text in [
            list(r#""apiVersion":"v1","kind":"List","#, &items, ""),
            // As `kubectl get -o json` writes it: keys sorted.
            list(
                r#""apiVersion":"v1","#,
                &items,
                r#","kind":"List","metadata":{"resourceVersion":""}"#,
            ),
            list("", &items, r#","kind":"List""#),
        ] {
            for label in ["l.json", "l.yaml"] {
                let read = streamed(label, &text);
                assert_eq!(loaded(&read), ["Pod x/a", "Pod x/b"], "{text}");
                assert_eq!(problems(&read), [], "{text}");
                assert_eq!(read.documents, 1);
            }
        }
    }

    #[test]
    fn typed_list_items_inherit_kind_and_api_version_written_before_or_after() {
        let item = r#"{"metadata":{"name":"d","namespace":"x"}}"#.to_string();
        let items = [item.clone(), pod("e")];
        for text in [
            list(r#""kind":"PodList","apiVersion":"v1","#, &items, ""),
            list(r#""kind":"PodList","#, &items, r#","apiVersion":"v1""#),
            list("", &items, r#","apiVersion":"v1","kind":"PodList""#),
        ] {
            let read = streamed("t.json", &text);
            assert_eq!(loaded(&read), ["Pod x/d", "Pod x/e"], "{text}");
        }
        // Without an apiVersion the kind-less item is a near miss; the other loads.
        let read = streamed("t.json", &list("", &items, r#","kind":"PodList""#));
        assert_eq!(loaded(&read), ["Pod x/e"]);
        assert_eq!(
            problems(&read),
            [("x/d".into(), "apiVersion".into(), Severity::Error)]
        );
        // A `List`'s items inherit nothing, wherever its kind is written.
        for text in [
            list(r#""kind":"List","#, std::slice::from_ref(&item), ""),
            list("", std::slice::from_ref(&item), r#","kind":"List""#),
        ] {
            let read = streamed("t.json", &text);
            assert_eq!(loaded(&read), Vec::<String>::new());
            assert_eq!(
                problems(&read),
                [("#1.items[0]".into(), "kind".into(), Severity::Error)]
            );
        }
    }

    #[test]
    fn duplicate_keys_inside_an_item_are_reported_first_with_their_path() {
        let dup = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"b","namespace":"x",
                      "labels":{"app":"old","app":"new"}}}"#
            .to_string();
        for text in [
            list(r#""kind":"List","#, &[pod("a"), dup.clone()], ""),
            list("", &[pod("a"), dup.clone()], r#","kind":"List""#),
        ] {
            let read = streamed("d.json", &text);
            assert_eq!(loaded(&read), ["Pod x/a", "Pod x/b"]);
            assert_eq!(
                problems(&read),
                [(
                    "#1".into(),
                    "items[1].metadata.labels.app".into(),
                    Severity::Warning
                )]
            );
            let Outcome::Loaded(b) = &read.entries[2].outcome else {
                panic!("{:?}", read.entries)
            };
            let crate::read::Object::Pod(b) = &b.object else {
                panic!("{b:?}")
            };
            assert_eq!(b.pod.labels["app"], "new", "the last value is used");
        }
    }

    #[test]
    fn a_broken_item_is_reported_and_the_others_load() {
        let broken = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"b","namespace":7}}"#;
        let items = [pod("a"), "42".into(), broken.into(), pod("c")];
        for text in [
            list(r#""kind":"List","#, &items, ""),
            list("", &items, r#","kind":"List""#),
        ] {
            let read = streamed("b.json", &text);
            assert_eq!(loaded(&read), ["Pod x/a", "Pod x/c"]);
            assert_eq!(
                problems(&read),
                [
                    ("#1.items[1]".into(), "".into(), Severity::Error),
                    ("b".into(), "metadata.namespace".into(), Severity::Error),
                ]
            );
        }
    }

    #[test]
    fn a_json_syntax_error_mid_stream_loses_the_file_as_before() {
        let cut = list(r#""kind":"List","#, &[pod("a"), pod("b")], "");
        let cut = &cut[..cut.len() - 20];
        let second = format!("{}\n{}", pod("a"), r#"{"kind": "#);
        for text in [cut, second.as_str()] {
            for label in ["e.json", "e.yaml"] {
                let read = streamed(label, text);
                assert_eq!(loaded(&read), Vec::<String>::new(), "{label}: {text}");
                assert_eq!(read.file_problems.len(), 1, "{label}: {text}");
                let reason = &read.file_problems[0].reason;
                let expected = if label.ends_with(".json") {
                    "invalid JSON"
                } else {
                    "invalid YAML"
                };
                assert!(reason.starts_with(expected), "{label}: {reason}");
            }
        }
    }

    #[test]
    fn keys_written_twice_around_items_read_as_the_last_value() {
        let kindless = r#"{"metadata":{"name":"d","namespace":"x"}}"#.to_string();
        // The second kind changes what the kind-less item inherits.
        let text = list(
            r#""kind":"List","apiVersion":"v1","#,
            &[kindless],
            r#","kind":"PodList""#,
        );
        let read = streamed("k.json", &text);
        assert_eq!(loaded(&read), ["Pod x/d"]);
        assert_eq!(
            problems(&read),
            [("#1".into(), "kind".into(), Severity::Warning)]
        );
        // The second items replaces the first.
        let text = format!(
            r#"{{"kind":"List","items":[{}],"items":[{}]}}"#,
            pod("a"),
            pod("b")
        );
        let read = streamed("i.json", &text);
        assert_eq!(loaded(&read), ["Pod x/b"]);
        assert_eq!(
            problems(&read),
            [("#1".into(), "items".into(), Severity::Warning)]
        );
        // A kind that is not a List after all: its items are not read.
        let text = list(
            r#""apiVersion":"v1","#,
            &[pod("a")],
            r#","kind":"Pod","metadata":{"name":"p","namespace":"x"}"#,
        );
        assert_eq!(loaded(&streamed("p.json", &text)), ["Pod x/p"]);
        let text = list(
            r#""kind":"List","#,
            &[pod("a")],
            r#","kind":"ConfigMapList""#,
        );
        assert_eq!(loaded(&streamed("c.json", &text)), Vec::<String>::new());
    }

    #[test]
    fn nested_lists_and_their_depth_limit_read_as_before() {
        let mut nested = pod("a");
        let mut depths = Vec::new();
        for _ in 0..12 {
            nested = list(r#""kind":"List","#, &[nested, pod("b")], "");
            let read = streamed("n.json", &nested);
            depths.push(problems(&read).iter().any(|p| p.1 == "items"));
        }
        // Eight levels read; the ninth is refused.
        assert_eq!(depths.iter().filter(|too_deep| !**too_deep).count(), 8);
        assert!(depths[8..].iter().all(|too_deep| *too_deep));
    }

    #[test]
    fn other_documents_read_as_before() {
        for (label, text) in [
            ("s.json", r#"{} null 1 "s" [1] {"kind":"List","items":null} {"kind":"List","items":{}}"#),
            ("s.json", r#"[{"kind":"List","items":[]}] {"kind":"List","items":3}"#),
            ("s.json", "{}1true"),
            ("y.yaml", "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Pod, metadata: {name: a}}\n- {metadata: {name: b}}\n"),
            ("y.yaml", "apiVersion: v1\nitems:\n- metadata: {name: a}\nkind: PodList\n---\n[unclosed\n---\nkind: List\nitems: [{apiVersion: v1, kind: Pod, metadata: {name: c}}]\n"),
            ("y.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\n...\napiVersion: v1\nkind: Pod\nmetadata: {name: b}\n"),
            ("y.yaml", "# only a comment\n---\n---\n~\n---\n7\n---\nbig: 123456789012345678901234567890\n"),
        ] {
            streamed(label, text);
        }
    }
}
