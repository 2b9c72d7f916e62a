//! What netwarden installed in a namespace, read with the system tools (`nft`,
//! `iptables-save`, `ip6tables-save`, `ipset`), never through the dataplane under test. The
//! backend is named as on the command line: `nft` or `iptables`.

use std::path::Path;

use crate::netns::run_in;

/// The stdout of `program args` in `netns`; panics when it cannot run or fails.
fn stdout_in(netns: &Path, program: &str, args: &[&str]) -> String {
    let out = run_in(netns, program, args);
    assert!(
        out.status.success(),
        "{program} {args:?} in {}: {}",
        netns.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Everything of netwarden's that the system tools show in `netns`, one line per finding
/// (empty: nothing left). nft: table `inet netwarden` in `nft list tables`. iptables: any
/// `DANM_` line of `iptables-save`/`ip6tables-save`, and any set named `nw4-`/`nw6-`/`nwt4-`/
/// `nwt6-` in `ipset list -n`.
pub fn netwarden_leftovers(backend: &str, netns: &Path) -> Vec<String> {
    let mut found = Vec::new();
    match backend {
        "nft" => {
            for line in stdout_in(netns, "nft", &["list", "tables"]).lines() {
                if line.trim() == "table inet netwarden" {
                    found.push(format!("nft: {}", line.trim()));
                }
            }
        }
        "iptables" => {
            for (tag, program) in [("v4", "iptables-save"), ("v6", "ip6tables-save")] {
                for line in stdout_in(netns, program, &[]).lines() {
                    if line.contains("DANM_") {
                        found.push(format!("{tag}: {line}"));
                    }
                }
            }
            for name in stdout_in(netns, "ipset", &["list", "-n"]).lines() {
                let name = name.trim();
                if ["nw4-", "nw6-", "nwt4-", "nwt6-"]
                    .iter()
                    .any(|p| name.starts_with(p))
                {
                    found.push(format!("ipset: {name}"));
                }
            }
        }
        other => panic!("no backend {other:?}"),
    }
    found
}

/// Netwarden's rules in `netns` as the tools print them, with the packet/byte counters
/// zeroed (so two listings of the same rules compare equal).
pub fn rules_snapshot(backend: &str, netns: &Path) -> String {
    let text = match backend {
        "nft" => {
            let out = run_in(netns, "nft", &["list", "table", "inet", "netwarden"]);
            if out.status.success() {
                String::from_utf8_lossy(&out.stdout).into_owned()
            } else {
                String::new()
            }
        }
        "iptables" => {
            let mut text = String::new();
            for program in ["iptables-save", "ip6tables-save"] {
                for line in stdout_in(netns, program, &["-t", "filter"]).lines() {
                    if !line.starts_with('#') {
                        text.push_str(line);
                        text.push('\n');
                    }
                }
            }
            let mut sets: Vec<String> = stdout_in(netns, "ipset", &["save"])
                .lines()
                .filter(|l| l.contains(" nw"))
                .map(str::to_string)
                .collect();
            sets.sort();
            text + &sets.join("\n")
        }
        other => panic!("no backend {other:?}"),
    };
    zero_counters(&text)
}

/// `packets N bytes M` → `packets 0 bytes 0`, `[N:M]` → `[0:0]`, `initval X` → `initval 0`.
fn zero_counters(text: &str) -> String {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut words: Vec<String> = line.split(' ').map(str::to_string).collect();
        for i in 1..words.len() {
            if (words[i - 1] == "packets" || words[i - 1] == "bytes")
                && words[i].chars().all(|c| c.is_ascii_digit())
            {
                words[i] = "0".into();
            }
            if words[i].starts_with('[') && words[i].ends_with(']') && words[i].contains(':') {
                words[i] = "[0:0]".into();
            }
            // ipset's random hash seed, chosen anew each time a set is created.
            if words[i - 1] == "initval" {
                words[i] = "0".into();
            }
        }
        out.push(words.join(" "));
    }
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::zero_counters;

    #[test]
    fn counters_are_zeroed() {
        assert_eq!(
            zero_counters(
                ":INPUT ACCEPT [12:3400]\ncounter packets 5 bytes 600\ncreate s initval 0x1f"
            ),
            ":INPUT ACCEPT [0:0]\ncounter packets 0 bytes 0\ncreate s initval 0"
        );
    }
}
