//! Rules decoded from random bytes, checked by the kernel's own tools in a throwaway netns:
//! every nft transaction libnftables accepts in JSON (and it loads as the same table as its
//! text form, where nft syntax can spell the names), every iptables ruleset `ipset restore` and
//! `iptables-restore --test` / `ip6tables-restore --test` accept. `NW_FUZZ_CASES` sets how
//! many (default 100).

use netwarden_render::fuzzing::{check_render, pod_rules_from_bytes};
use netwarden_render::RenderOptions;
use netwarden_testing::{Lcg, ScratchNetns};

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
        let data = rng.bytes(256);
        let rules = pod_rules_from_bytes(&data);
        let rendered = check_render(&rules, &RenderOptions::default());
        if let Some((json, text)) = &rendered.nft {
            let (ok, _, stderr) = ns.nft(&["-c", "-j", "-f", "-"], json);
            assert!(ok, "case {case}: JSON refused: {stderr}\n{text}");
            // Loaded for real both ways, the table lists the same (names nft syntax cannot
            // spell, with a quote, are JSON only).
            if !rules.interfaces.iter().any(|i| i.name.contains('"')) {
                let (ok, _, stderr) = ns.nft(&["-j", "-f", "-"], json);
                assert!(ok, "case {case}: {stderr}");
                let (_, from_json, _) = ns.nft(&["list", "table", "inet", "netwarden"], "");
                ns.nft(&["delete", "table", "inet", "netwarden"], "");
                let (ok, _, stderr) = ns.nft(&["-f", "-"], text);
                assert!(ok, "case {case}: text refused: {stderr}\n{text}");
                let (_, from_text, _) = ns.nft(&["list", "table", "inet", "netwarden"], "");
                ns.nft(&["delete", "table", "inet", "netwarden"], "");
                assert_eq!(from_json, from_text, "case {case}");
            }
            nft_checked += 1;
        }
        if let Some(r) = &rendered.iptables {
            let ipset = r.ipset_script();
            if !ipset.is_empty() {
                let out = ns.run("ipset", &["restore"], &ipset);
                assert!(out.0, "case {case}: ipset restore: {}\n{ipset}", out.2);
            }
            for (program, text) in [("iptables-restore", &r.v4), ("ip6tables-restore", &r.v6)] {
                let out = ns.run(program, &["-w", "--test"], text);
                assert!(out.0, "case {case}: {program}: {}\n{text}", out.2);
            }
            ns.run("ipset", &["destroy"], "");
            ipt_checked += 1;
        }
    }
    eprintln!("{cases} cases: {nft_checked} nft transactions and {ipt_checked} iptables rulesets accepted");
}
