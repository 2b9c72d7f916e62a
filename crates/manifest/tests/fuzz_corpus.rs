//! The fuzzing invariants ([`check_load`]) under `cargo test`: over a seed corpus (the
//! repository's examples and conformance cases, and the manifests embedded in the latter) and
//! mutations of it, and over generated documents. The cargo-fuzz target
//! (`fuzz/fuzz_targets/manifest.rs`) explores further from the same function; this keeps the
//! invariants checked in CI, within a few seconds.

use std::path::{Path, PathBuf};

use netwarden_manifest::fuzzing::check_load;
use proptest::prelude::*;
use serde_json::{json, Value};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            yaml_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "yaml" || x == "yml") {
            out.push(p);
        }
    }
}

/// Every object with a kind found anywhere in a parsed value (conformance cases embed
/// manifests in their steps).
fn embedded_objects(v: &Value, out: &mut Vec<Value>) {
    match v {
        Value::Object(m) => {
            if m.get("kind").is_some_and(Value::is_string) && m.contains_key("metadata") {
                out.push(v.clone());
            } else {
                m.values().for_each(|x| embedded_objects(x, out));
            }
        }
        Value::Array(l) => l.iter().for_each(|x| embedded_objects(x, out)),
        _ => {}
    }
}

/// A seed: its name, its bytes, and whether it is a file of the repository as it is (derived
/// seeds are truncated more coarsely, to keep the run short).
struct Seed {
    name: String,
    data: Vec<u8>,
    original: bool,
}

/// The seeds: each file as it is, and the manifests it holds as one multi-document YAML text
/// and as a JSON List.
fn seeds() -> Vec<Seed> {
    let root = repo_root();
    let mut files = Vec::new();
    yaml_files(&root.join("examples"), &mut files);
    yaml_files(&root.join("conformance"), &mut files);
    assert!(
        files.len() > 10,
        "seed corpus not found under {}",
        root.display()
    );
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let name = f.strip_prefix(&root).unwrap().display().to_string();
        let docs: Vec<Value> =
            serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut objects = Vec::new();
        docs.iter().for_each(|d| embedded_objects(d, &mut objects));
        if !objects.is_empty() {
            let yaml = objects
                .iter()
                .map(|o| serde_json::to_string_pretty(o).unwrap())
                .collect::<Vec<_>>()
                .join("\n---\n");
            let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
            out.push(Seed {
                name: format!("{name} (objects)"),
                data: yaml.into_bytes(),
                original: false,
            });
            out.push(Seed {
                name: format!("{name} (List)"),
                data: list.to_string().into_bytes(),
                original: false,
            });
        }
        out.push(Seed {
            name,
            data: text.into_bytes(),
            original: true,
        });
    }
    out
}

fn check(label: &str, data: &[u8]) {
    if let Err(panic) = std::panic::catch_unwind(|| check_load(data)) {
        let input = String::from_utf8_lossy(data);
        eprintln!("input that broke an invariant ({label}):\n{input}");
        std::panic::resume_unwind(panic);
    }
}

/// The mutations of one seed; each is checked. `every`: the step between truncation points
/// (and, doubled, between changed bytes).
fn mutations(seed: &[u8], every: usize) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    // Truncated: a file caught mid-write.
    for cut in (0..seed.len()).step_by(every) {
        out.push((format!("truncated at {cut}"), seed[..cut].to_vec()));
    }
    // Byte flips: structure characters where text was, or a high bit set (invalid UTF-8).
    for (n, at) in (0..seed.len()).step_by(2 * every - 31).enumerate() {
        let mut m = seed.to_vec();
        if n % 4 == 3 {
            m[at] ^= 0x80;
        } else {
            m[at] = b":-{}[]\"'\n #&*!|>"[n % 16];
        }
        out.push((format!("byte {at} changed"), m));
    }
    let text = String::from_utf8_lossy(seed).into_owned();
    // Unquoted YAML 1.1 booleans and numbers where strings belong.
    for key in [
        "name: ",
        "namespace: ",
        "app: ",
        "pod: ",
        "ns: ",
        "interface: ",
    ] {
        for (i, (at, _)) in text.match_indices(key).take(6).enumerate() {
            let value = ["y", "n", "yes", "off", "on", "0x1F", "1e3"][i % 7];
            let end = text[at..]
                .find(['\n', ',', '}'])
                .map_or(text.len(), |e| at + e);
            let m = format!("{}{key}{value}{}", &text[..at], &text[end..]);
            out.push((format!("{key:?} #{i} = {value}"), m.into_bytes()));
        }
    }
    // Duplicate keys: a metadata line written twice.
    if let Some(at) = text.find("\n  name: ") {
        let line_end = text[at + 1..].find('\n').map_or(text.len(), |e| at + 1 + e);
        let line = &text[at..line_end];
        let m = format!("{}{line}{}", &text[..line_end], &text[line_end..]);
        out.push(("duplicate key".into(), m.into_bytes()));
    }
    if text.starts_with('{') {
        let m = text.replacen("{\"", "{\"kind\":\"Pod\",\"", 2);
        out.push(("duplicate JSON key".into(), m.into_bytes()));
    }
    // Huge and odd numbers where ports and prefixes go.
    for number in [
        "1e400",
        "18446744073709551616",
        "-1",
        "0",
        "65536",
        "80.5",
        ".inf",
    ] {
        let m = text
            .replace("port: 80", &format!("port: {number}"))
            .replace("/24", &format!("/{number}"));
        out.push((format!("numbers = {number}"), m.into_bytes()));
    }
    out
}

#[test]
fn seed_corpus_and_its_mutations_keep_the_invariants() {
    let seeds = seeds();
    let mut runs = 0;
    for seed in &seeds {
        check(&seed.name, &seed.data);
        runs += 1;
        let every = if seed.original { 64 } else { 768 };
        for (what, m) in mutations(&seed.data, every) {
            check(&format!("{}: {what}", seed.name), &m);
            runs += 1;
        }
    }
    // Deep nesting, in YAML and JSON, inside a document that is otherwise fine.
    for depth in [10, 200, 5_000] {
        let deep = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: a, labels: {}x{}}}\n",
            "[".repeat(depth),
            "]".repeat(depth)
        );
        check("deep YAML", deep.as_bytes());
        let lists = format!(
            "{}{{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{{\"name\":\"a\"}}}}{}",
            "{\"apiVersion\":\"v1\",\"kind\":\"List\",\"items\":[".repeat(depth),
            "]}".repeat(depth)
        );
        check("nested Lists", lists.as_bytes());
        runs += 2;
    }
    assert!(runs > 1000, "{runs} inputs checked");
}

/// Keys and values the loader looks at, so generated documents reach deep into it.
const KEYS: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata",
    "name",
    "namespace",
    "labels",
    "annotations",
    "spec",
    "status",
    "podIPs",
    "ip",
    "podIP",
    "hostNetwork",
    "containers",
    "ports",
    "containerPort",
    "protocol",
    "port",
    "endPort",
    "podSelector",
    "namespaceSelector",
    "ipBlock",
    "cidr",
    "except",
    "ingress",
    "egress",
    "from",
    "to",
    "policyTypes",
    "matchLabels",
    "matchExpressions",
    "key",
    "operator",
    "values",
    "networkSelector",
    "type",
    "items",
    "Pod",
    "NetworkName",
    "apiType",
    "Interface",
    "Name",
    "Address",
    "selector",
    "clusterIPs",
    "targetPort",
    "endpoints",
    "addresses",
    "conditions",
    "ready",
    "k8s.v1.cni.cncf.io/network-status",
    "k8s.v1.cni.cncf.io/policy-for",
    "netwarden.io/mode",
    "kubernetes.io/service-name",
];

const KINDS: &[(&str, &str)] = &[
    ("v1", "Pod"),
    ("v1", "Namespace"),
    ("v1", "Service"),
    ("v1", "List"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
    ("danm.k8s.io/v1", "DanmNetworkPolicy"),
    ("danm.k8s.io/v1", "DanmEp"),
    ("k8s.cni.cncf.io/v1beta1", "MultiNetworkPolicy"),
    ("discovery.k8s.io/v1", "EndpointSlice"),
    ("networking.k8s.io/v1", "Networkpolicy"),
    ("networking.k8s.io/v2", "NetworkPolicy"),
];

const STRINGS: &[&str] = &[
    "a",
    "ns",
    "default",
    "10.0.0.1",
    "10.0.0.0/8",
    "fd00::/64",
    "TCP",
    "UDP",
    "In",
    "Exists",
    "Ingress",
    "Egress",
    "eth0",
    "net1",
    "a\"b;+",
    "monitor",
    "http",
    "",
    "x/y",
    "ClusterNetwork",
    "y",
    "[{\"name\":\"m\",\"interface\":\"net1\",\"ips\":[\"1.2.3.4\"]}]",
];

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (0u32..70_000).prop_map(|n| json!(n)),
        any::<i64>().prop_map(|n| json!(n)),
        prop::sample::select(STRINGS).prop_map(|s| json!(s)),
        "[a-z0-9./-]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(KEYS), inner), 0..6).prop_map(|kv| {
                Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
            }),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn generated_documents_keep_the_invariants(
        kind in prop::sample::select(KINDS),
        name in "[a-z]{1,3}",
        body in value(),
    ) {
        let mut doc = json!({"apiVersion": kind.0, "kind": kind.1, "metadata": {"name": name}});
        if let Value::Object(extra) = body {
            for (k, v) in extra {
                doc[k] = v;
            }
        }
        let text = serde_json::to_string_pretty(&doc).unwrap();
        check("generated", text.as_bytes());
    }
}
