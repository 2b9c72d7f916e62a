//! Golden tests of the nft renderer: every scenario of `common::scenarios` against
//! `tests/golden/<name>.nft` (compared ignoring line order and indentation), every golden
//! text accepted by `nft -c -f -` inside a throwaway netns, and applied for real there both
//! onto no table and onto an existing one (the text updates the table in place).
//!
//! `UPDATE_GOLDEN=1 cargo test -p netwarden-render --test nft_golden` rewrites the files; review
//! the diff before committing.

mod common;

use std::path::PathBuf;

use common::*;
use netwarden_engine::Direction;
use netwarden_engine::PodRules;
use netwarden_render::nft::{build_table, set_name, Table, Transaction};
use netwarden_render::{log_key_for, log_prefix, rule_count, LogAction, RenderOptions};
use netwarden_testing::ScratchNetns;

/// The nft text of a scenario (every scenario renders).
fn render_nft(rules: &PodRules, opts: &RenderOptions) -> String {
    netwarden_render::render_nft(rules, opts).expect("scenario renders")
}

/// The table of a scenario that isolates something.
fn table_of(rules: &PodRules, opts: &RenderOptions) -> Table {
    build_table(rules, opts)
        .expect("scenario renders")
        .expect("scenario isolates")
}

fn removal_text() -> String {
    Transaction::removal().to_text()
}

fn is_removal(text: &str) -> bool {
    text == removal_text()
}

fn golden_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.nft"))
}

fn normalized(text: &str) -> Vec<String> {
    let mut lines: Vec<String> = text
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    lines.sort();
    lines
}

#[test]
fn goldens_match() {
    let update = std::env::var("UPDATE_GOLDEN").as_deref() == Ok("1");
    let mut failures = Vec::new();
    for (name, rules, opts) in scenarios() {
        let text = render_nft(&rules, &opts);
        // Deterministic: the same input renders the same bytes, whatever the interface order.
        let mut reversed = rules.clone();
        reversed.interfaces.reverse();
        assert_eq!(
            text,
            render_nft(&reversed, &opts),
            "{name}: depends on interface order"
        );
        let path = golden_path(name);
        if update {
            std::fs::write(&path, &text).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run with UPDATE_GOLDEN=1)", path.display()));
        if normalized(&expected) != normalized(&text) {
            failures.push(format!(
                "--- {name} expected\n{expected}\n--- {name} got\n{text}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn goldens_are_accepted_by_nft_check() {
    let Some(ns) = ScratchNetns::new("nwrt-check") else {
        return;
    };
    for (name, rules, opts) in scenarios() {
        let text = render_nft(&rules, &opts);
        let (ok, _, stderr) = ns.nft(&["-c", "-f", "-"], &text);
        assert!(ok, "{name}: nft -c rejected the ruleset:\n{stderr}\n{text}");
        // The golden file on disk too (it is what reviewers read).
        let golden = std::fs::read_to_string(golden_path(name)).unwrap();
        let (ok, _, stderr) = ns.nft(&["-c", "-f", "-"], &golden);
        assert!(ok, "{name}: golden rejected:\n{stderr}");
    }
    // Check mode changed nothing.
    let (ok, listed, _) = ns.nft(&["list", "ruleset"], "");
    assert!(ok);
    assert!(
        listed.trim().is_empty(),
        "nft -c left something behind: {listed}"
    );
}

/// The text must work whether the table exists or not (`nft -c` in a fresh netns only shows
/// the first): apply every scenario twice for real, and every scenario over the previous one's
/// table. Applying twice leaves each rule once (chains are flushed) and each set once.
#[test]
fn goldens_apply_onto_empty_and_existing_tables() {
    let Some(ns) = ScratchNetns::new("nwrt-apply") else {
        return;
    };
    let list = |ns: &ScratchNetns| {
        let (ok, listed, stderr) = ns.nft(&["list", "table", "inet", "netwarden"], "");
        assert!(ok, "{stderr}");
        listed
    };
    for (name, rules, opts) in scenarios() {
        let text = render_nft(&rules, &opts);
        if is_removal(&text) {
            continue;
        }
        for round in 0..2 {
            let (ok, _, stderr) = ns.nft(&["-f", "-"], &text);
            assert!(ok, "{name} round {round}: {stderr}\n{text}");
            let listed = list(&ns);
            assert_eq!(
                rule_count(&listed),
                rule_count(&text),
                "{name} round {round}: rules duplicated or missing:\n{listed}"
            );
            let table = table_of(&rules, &opts);
            for set in &table.sets {
                assert_eq!(
                    listed.matches(&format!("set {} {{", set.name)).count(),
                    1,
                    "{name}: set {} missing:\n{listed}",
                    set.name
                );
            }
        }
        let (ok, _, stderr) = ns.nft(&["delete", "table", "inet", "netwarden"], "");
        assert!(ok, "{stderr}");
    }
    // Each scenario over whatever the previous one left (its chains and sets stay: deleting
    // what became unused is the dataplane's part).
    for (name, rules, opts) in scenarios() {
        let text = render_nft(&rules, &opts);
        let (ok, _, stderr) = ns.nft(&["-f", "-"], &text);
        assert!(ok, "{name} over the previous scenario: {stderr}\n{text}");
    }
    let (ok, _, stderr) = ns.nft(&["-f", "-"], &removal_text());
    assert!(ok, "{stderr}");
    let (ok, listed, _) = ns.nft(&["list", "tables"], "");
    assert!(ok && listed.trim().is_empty(), "left behind: {listed}");
}

#[test]
fn no_anonymous_sets_and_no_table_deletion() {
    for (name, rules, opts) in scenarios() {
        let text = render_nft(&rules, &opts);
        if is_removal(&text) {
            continue;
        }
        for line in text.lines() {
            if line.starts_with("add rule ") {
                // `{` in a rule is an anonymous set or map: its elements are looked up with the
                // generation current at lookup time (the window this layout closes). Learn
                // mode's `add @lrn… { key }` is a statement writing a named set, not one.
                let without_learn = match line.split_once(" add @lrn") {
                    Some((head, tail)) => {
                        format!("{head}{}", tail.split_once('}').map_or("", |(_, t)| t))
                    }
                    None => line.to_string(),
                };
                assert!(
                    !without_learn.contains('{'),
                    "{name}: anonymous set in {line:?}"
                );
                assert!(!line.contains(" vmap "), "{name}: map in {line:?}");
            }
            assert!(!line.starts_with("delete "), "{name}: {line:?}");
            assert!(!line.starts_with("flush table"), "{name}: {line:?}");
        }
        // Sets are named by content: the same peers give the same name in another pod.
        let table = table_of(&rules, &opts);
        for set in &table.sets {
            assert_eq!(set.name, set_name(set.family, &set.ranges), "{name}");
        }
    }
}

#[test]
fn open_pod_only_deletes() {
    let (_, rules, opts) = scenarios().into_iter().find(|s| s.0 == "open").unwrap();
    let text = render_nft(&rules, &opts);
    assert_eq!(
        text,
        "add table inet netwarden\ndelete table inet netwarden\n"
    );
    assert!(is_removal(&text));
    assert!(build_table(&rules, &opts).unwrap().is_none());
    assert_eq!(rule_count(&text), 0);
}

#[test]
fn no_object_names_in_text() {
    for (name, rules, opts) in scenarios() {
        let text = render_nft(&rules, &opts);
        for policy in [
            "allow-web",
            "egress",
            "to-http",
            "danm",
            "mon",
            "enf",
            "old",
            "new",
            "logged",
            "ranges",
        ] {
            // Policy names never appear (chain/set names are generated).
            assert!(
                !text.contains(&format!("\"{policy}")) && !text.contains(&format!("ns/{policy}")),
                "{name}: policy name {policy} leaked"
            );
        }
        assert!(!text.contains("ns/pod"), "{name}: pod name leaked");
        // Every quoted string is an interface name of the pod, "lo", a limit, a counter or a
        // log prefix.
        let ifnames: Vec<&str> = rules.interfaces.iter().map(|i| i.name.as_str()).collect();
        for (i, quoted) in text.split('"').enumerate() {
            if i % 2 == 0 {
                continue;
            }
            let ok = quoted == "lo"
                || ifnames.contains(&quoted)
                || quoted == "lim_in"
                || quoted == "lim_out"
                || quoted == netwarden_render::nft::LEARN_FULL_COUNTER
                || netwarden_render::parse_counter_name(quoted).is_some()
                || (quoted.starts_with("nw:")
                    && netwarden_render::parse_log_prefix(quoted).is_some());
            assert!(ok, "{name}: unexpected quoted string {quoted:?}");
        }
        assert_eq!(
            text.matches('"').count() % 2,
            0,
            "{name}: unbalanced quotes"
        );
        assert!(text.is_ascii(), "{name}: non-ASCII text");
    }
}

/// Kernel interface names may hold any byte but `/`, `:`, whitespace and NUL. The applied JSON
/// carries them as one string value, matched exactly (a trailing `*` escaped so it is no
/// wildcard); the text shown to people escapes the quote, so it can never read as nft syntax.
#[test]
fn hostile_ifname_stays_one_exact_string() {
    let (_, mut rules, opts) = scenarios().into_iter().find(|s| s.0 == "sctp").unwrap();
    let hostile = "e\"th0;flush*";
    rules.interfaces[0].name = hostile.into();
    let table = table_of(&rules, &opts);
    let json: serde_json::Value =
        serde_json::from_str(&Transaction::create(&table).to_json()).unwrap();
    let names: Vec<&str> = json["nftables"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["add"]["rule"]["expr"].as_array())
        .flatten()
        .filter(|e| e["match"]["left"]["meta"]["key"] == "iifname")
        .filter_map(|e| e["match"]["right"].as_str())
        .filter(|n| *n != "lo")
        .collect();
    assert_eq!(names, ["e\"th0;flush\\*"]);
    let text = render_nft(&rules, &opts);
    assert!(
        text.contains(r#"iifname "e\"th0;flush\*" jump in_0"#),
        "{text}"
    );
    // A name nft cannot spell exactly is refused, not rendered to match something else.
    rules.interfaces[0].name = "a\\b*".into();
    assert!(matches!(
        build_table(&rules, &opts),
        Err(netwarden_render::RenderError::UnmatchableInterface { .. })
    ));
}

#[test]
fn sets_are_shared_and_rule_count_is_independent_of_peers() {
    let (_, rules, opts) = scenarios()
        .into_iter()
        .find(|s| s.0 == "ingress_pods_ports")
        .unwrap();
    let table = table_of(&rules, &opts);
    assert_eq!(table.sets.len(), 1, "identical peer sets are shared");

    // 1000 peers render as many rules as 4.
    let many: Vec<String> = (0..1000)
        .map(|i| format!("10.{}.{}.{}", 1 + i / 65536, (i / 256) % 256, i % 256))
        .collect();
    let many_refs: Vec<&str> = many.iter().map(String::as_str).collect();
    let mut big = rules.clone();
    let netwarden_engine::Isolation::Isolated(r) = &mut big.interfaces[0].ingress.enforced else {
        unreachable!()
    };
    for rule in std::sync::Arc::make_mut(r).iter_mut() {
        rule.clauses[0].peers = addrs(&many_refs);
    }
    big.interfaces[0].ingress.staged = big.interfaces[0].ingress.enforced.clone();
    assert_eq!(
        rule_count(&render_nft(&big, &opts)),
        rule_count(&render_nft(&rules, &opts))
    );
}

#[test]
fn log_prefixes_use_the_pod_keys() {
    let (_, rules, opts) = scenarios()
        .into_iter()
        .find(|s| s.0 == "log_denies")
        .unwrap();
    let text = render_nft(&rules, &opts);
    for dir in [Direction::Ingress, Direction::Egress] {
        let key = log_key_for(&rules, "eth0", dir).unwrap();
        assert!(
            text.contains(&log_prefix(LogAction::Deny, key)),
            "{dir}: {text}"
        );
        assert!(!text.contains(&log_prefix(LogAction::WouldDeny, key)));
    }
    assert!(text.contains("log group 7 prefix"));
    assert!(text.contains("rate 30/minute burst 5 packets"));
}

#[test]
fn no_mark_rules_without_monitor() {
    for (name, rules, opts) in scenarios() {
        let has_monitor = rules
            .interfaces
            .iter()
            .any(|i| i.ingress.has_monitor() || i.egress.has_monitor());
        let text = render_nft(&rules, &opts);
        assert_eq!(text.contains("meta mark"), has_monitor, "{name}");
        assert_eq!(text.contains("nw:wd:"), has_monitor, "{name}");
    }
}

#[test]
fn forward_rejected_only_with_enforced_isolation() {
    for (name, rules, opts) in scenarios() {
        let text = render_nft(&rules, &opts);
        let enforced = rules
            .interfaces
            .iter()
            .any(|i| i.ingress.enforced.is_isolated() || i.egress.enforced.is_isolated());
        assert_eq!(
            text.contains("hook forward"),
            enforced && opts.reject_forward,
            "{name}"
        );
    }
    let opts = RenderOptions::default();
    let (_, rules, _) = scenarios()
        .into_iter()
        .find(|s| s.0 == "monitor_only")
        .unwrap();
    assert!(!render_nft(&rules, &opts).contains("hook forward"));
}

#[test]
fn rule_count_counts_rules_only() {
    let (_, rules, opts) = scenarios()
        .into_iter()
        .find(|s| s.0 == "multi_interface")
        .unwrap();
    let table = table_of(&rules, &opts);
    let expected: usize = table.chains.iter().map(|c| c.rules.len()).sum();
    assert_eq!(rule_count(&render_nft(&rules, &opts)), expected);
}

/// The dataplane applies the JSON printing of a transaction, people read the text printing: both
/// must load as the same kernel table. Each scenario is loaded both ways into two netns and the
/// kernel's listings compared.
#[test]
fn json_and_text_load_as_the_same_table() {
    let (Some(by_text), Some(by_json)) = (
        ScratchNetns::new("nwrt-text"),
        ScratchNetns::new("nwrt-json"),
    ) else {
        return;
    };
    for (name, rules, opts) in scenarios() {
        let Some(table) = build_table(&rules, &opts).unwrap() else {
            continue;
        };
        let tx = Transaction::create(&table);
        let (ok, _, stderr) = by_text.nft(&["-f", "-"], &tx.to_text());
        assert!(ok, "{name} text: {stderr}");
        let (ok, _, stderr) = by_json.nft(&["-j", "-f", "-"], &tx.to_json());
        assert!(ok, "{name} json: {stderr}\n{}", tx.to_json());
        let list = |ns: &ScratchNetns| {
            let (ok, listed, stderr) = ns.nft(&["list", "table", "inet", "netwarden"], "");
            assert!(ok, "{name}: {stderr}");
            listed
        };
        assert_eq!(list(&by_text), list(&by_json), "{name}");
        for ns in [&by_text, &by_json] {
            let (ok, _, stderr) = ns.nft(&["delete", "table", "inet", "netwarden"], "");
            assert!(ok, "{stderr}");
        }
    }
}
