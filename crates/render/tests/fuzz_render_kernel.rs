//! Rules decoded from random bytes, checked by the kernel's own tools in a throwaway netns:
//! every nft transaction libnftables accepts in JSON (and it loads as the same table as its
//! text form, where nft syntax can spell the names), every iptables ruleset `ipset restore` and
//! `iptables-restore --test` / `ip6tables-restore --test` accept. `NW_FUZZ_CASES` sets how
//! many random cases (default 100); the committed corpus of the `render` fuzz target
//! (`fuzz/seeds/render`) goes through the same checks.

use std::path::Path;

use netwarden_render::fuzzing::{check_render, pod_rules_from_bytes};
use netwarden_render::RenderOptions;
use netwarden_testing::{Lcg, ScratchNetns};

/// Renders the rules decoded from `data` and has the kernel's tools check them; returns
/// whether an nft transaction and an iptables ruleset were checked.
fn kernel_accepts(ns: &ScratchNetns, case: &str, data: &[u8]) -> (bool, bool) {
    let rules = pod_rules_from_bytes(data);
    let rendered = check_render(&rules, &RenderOptions::default());
    if let Some((json, text)) = &rendered.nft {
        let (ok, _, stderr) = ns.nft(&["-c", "-j", "-f", "-"], json);
        assert!(ok, "{case}: JSON refused: {stderr}\n{text}");
        // Loaded for real both ways, the table lists the same (names nft syntax cannot
        // spell, with a quote, are JSON only).
        if !rules.interfaces.iter().any(|i| i.name.contains('"')) {
            let (ok, _, stderr) = ns.nft(&["-j", "-f", "-"], json);
            assert!(ok, "{case}: {stderr}");
            let (_, from_json, _) = ns.nft(&["list", "table", "inet", "netwarden"], "");
            ns.nft(&["delete", "table", "inet", "netwarden"], "");
            let (ok, _, stderr) = ns.nft(&["-f", "-"], text);
            assert!(ok, "{case}: text refused: {stderr}\n{text}");
            let (_, from_text, _) = ns.nft(&["list", "table", "inet", "netwarden"], "");
            ns.nft(&["delete", "table", "inet", "netwarden"], "");
            assert_eq!(from_json, from_text, "{case}");
        }
    }
    if let Some(r) = &rendered.iptables {
        let ipset = r.ipset_script();
        if !ipset.is_empty() {
            let out = ns.run("ipset", &["restore"], &ipset);
            assert!(out.0, "{case}: ipset restore: {}\n{ipset}", out.2);
        }
        for (program, text) in [("iptables-restore", &r.v4), ("ip6tables-restore", &r.v6)] {
            let out = ns.run(program, &["-w", "--test"], text);
            assert!(out.0, "{case}: {program}: {}\n{text}", out.2);
        }
        ns.run("ipset", &["destroy"], "");
    }
    (rendered.nft.is_some(), rendered.iptables.is_some())
}

#[test]
fn random_rulesets_are_accepted_by_the_kernel() {
    let Some(ns) = ScratchNetns::new("nwrt-fuzz") else {
        return;
    };
    let cases: usize = std::env::var("NW_FUZZ_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(100);
    // Deterministic: the cases are the same every run.
    let mut rng = Lcg::new(0x6e77_6675_7a7a);
    let (mut nft_checked, mut ipt_checked) = (0, 0);
    for case in 0..cases {
        let (nft, ipt) = kernel_accepts(&ns, &format!("case {case}"), &rng.bytes(256));
        nft_checked += usize::from(nft);
        ipt_checked += usize::from(ipt);
    }
    eprintln!("{cases} cases: {nft_checked} nft transactions and {ipt_checked} iptables rulesets accepted");
}

/// The committed corpus of the `render` fuzz target (every edge its runs reached), or the
/// directory `NW_FUZZ_CORPUS` names (a run's whole `fuzz/corpus/render`), through the kernel's
/// tools.
#[test]
fn seed_corpus_rulesets_are_accepted_by_the_kernel() {
    let Some(ns) = ScratchNetns::new("nwrt-fuzzseed") else {
        return;
    };
    let dir = match std::env::var_os("NW_FUZZ_CORPUS") {
        Some(dir) => dir.into(),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/render"),
    };
    let mut seeds: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    seeds.sort();
    assert!(
        seeds.len() >= 8,
        "seed corpus missing under {}",
        dir.display()
    );
    let (mut nft_checked, mut ipt_checked) = (0, 0);
    for path in &seeds {
        let data = std::fs::read(path).unwrap();
        let (nft, ipt) = kernel_accepts(&ns, &path.display().to_string(), &data);
        nft_checked += usize::from(nft);
        ipt_checked += usize::from(ipt);
    }
    eprintln!(
        "{} seeds: {nft_checked} nft transactions and {ipt_checked} iptables rulesets accepted",
        seeds.len()
    );
}
