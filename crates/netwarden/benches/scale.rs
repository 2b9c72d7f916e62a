//! The scale curve (issue 10): the full computation, loading included, on generated clusters
//! of 10,000, 20,000, 50,000 and 100,000 pods (policies at a fifth of the pods, the three kinds,
//! a third of the pods on a secondary network: [`netwarden_engine::generate::cluster`]).
//! Run: `cargo bench -p netwarden --bench scale`. Under `cargo test --all-targets` (no
//! `--bench` argument) it runs a quick mode on 1,000 and 2,000 pods.
//!
//! Each size is written as manifest files (`netwarden::synthetic::write_files`), then the real
//! command runs on them as a user would: `netwarden reach -f DIR --from ns0/pod0 --port 80/TCP`
//! — which loads every object, feeds the engine and computes every pod's rules (the
//! destinations' ingress rules are needed), as an agent's initial sync does on every node. The
//! time is the command's wall time (best of `NETWARDEN_BENCH_STEPS`, 1 by default); the memory
//! is its peak resident size (`getrusage` of the children, in a small child process whose only
//! child is the command: Linux counts a process's pre-`exec` peak in its children's, so neither
//! the generated cluster nor an earlier run may be in the measuring process). The time per
//! doubling is printed (the target is at most 2.2×).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use netwarden::synthetic::write_files;
use netwarden_engine::generate::cluster;

const BIN: &str = env!("CARGO_BIN_EXE_netwarden");

/// Peak resident size of the largest child reaped so far, in MiB.
fn children_peak_mib() -> f64 {
    nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .map(|u| u.max_rss() as f64 / 1024.0)
        .unwrap_or(f64::NAN)
}

/// One run of `reach` on `dir`, measured in a child process of its own (this benchmark with
/// `--measure`), whose only child is the command: its wall time and peak resident size.
fn measured_reach(dir: &Path) -> (Duration, f64) {
    let out = Command::new(std::env::current_exe().expect("the benchmark binary"))
        .arg("--measure")
        .arg(dir)
        .output()
        .expect("run the measuring child");
    assert!(
        out.status.success(),
        "measuring reach on {} failed",
        dir.display()
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut fields = text
        .split_whitespace()
        .map(|f| f.parse::<f64>().expect("a figure"));
    let (Some(secs), Some(peak)) = (fields.next(), fields.next()) else {
        panic!("unexpected measurement {text:?}");
    };
    (Duration::from_secs_f64(secs), peak)
}

/// One run of `reach` on `dir`: its wall time.
fn reach(dir: &Path) -> Duration {
    let start = Instant::now();
    let status = Command::new(BIN)
        .args(["reach", "-f"])
        .arg(dir)
        .args(["--from", "ns0/pod0", "--port", "80/TCP"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run netwarden reach");
    let elapsed = start.elapsed();
    assert!(
        status.success(),
        "netwarden reach on {} failed",
        dir.display()
    );
    elapsed
}

/// Writes the cluster of `pods` pods into `dir` in a child process (this same benchmark with
/// `--generate`): the generated objects never live in this process, whose resident size a
/// spawned command would otherwise inherit in its peak (Linux carries the pre-`exec` peak into
/// the child's `ru_maxrss`).
fn generate(dir: &Path, pods: usize) {
    let status = Command::new(std::env::current_exe().expect("the benchmark binary"))
        .arg("--generate")
        .arg(dir)
        .arg(pods.to_string())
        .status()
        .expect("run the generator");
    assert!(status.success(), "generating {pods} pods failed");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.as_slice() {
        [_, flag, dir, pods] if flag == "--generate" => {
            let pods: usize = pods.parse().expect("a pod count");
            write_files(Path::new(dir), &cluster(pods, pods / 5, 1)).expect("write the cluster");
            return;
        }
        [_, flag, dir] if flag == "--measure" => {
            let elapsed = reach(Path::new(dir));
            println!("{} {}", elapsed.as_secs_f64(), children_peak_mib());
            return;
        }
        _ => {}
    }
    let full = args.iter().any(|a| a == "--bench");
    let sizes: &[usize] = if full {
        &[10_000, 20_000, 50_000, 100_000]
    } else {
        &[1_000, 2_000]
    };
    let steps: usize = std::env::var("NETWARDEN_BENCH_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
        .max(1);
    let root = std::env::temp_dir().join(format!("netwarden-scale-{}", std::process::id()));
    let mut previous: Option<(usize, Duration)> = None;
    for &pods in sizes {
        let dir = root.join(pods.to_string());
        generate(&dir, pods);
        let bytes: u64 = std::fs::read_dir(&dir)
            .expect("the cluster directory")
            .filter_map(|e| e.ok()?.metadata().ok())
            .map(|m| m.len())
            .sum();
        let runs: Vec<(Duration, f64)> = (0..steps).map(|_| measured_reach(&dir)).collect();
        let best = runs.iter().map(|r| r.0).min().expect("one step");
        let peak = runs.iter().map(|r| r.1).fold(0.0, f64::max);
        let growth = previous
            .map(|(n, t)| {
                format!(
                    " | {:.2}x the time of {n} pods ({:.2}x per doubling)",
                    best.as_secs_f64() / t.as_secs_f64(),
                    (best.as_secs_f64() / t.as_secs_f64())
                        .powf(1.0 / (pods as f64 / n as f64).log2())
                )
            })
            .unwrap_or_default();
        println!(
            "pods={pods:6} policies={:5} files={:5.1} MB: reach (load + every pod's rules) {:7.2} s, peak {:7.1} MiB{growth}",
            pods / 5,
            bytes as f64 / 1e6,
            best.as_secs_f64(),
            peak
        );
        previous = Some((pods, best));
        let _ = std::fs::remove_dir_all(&dir);
    }
    let _ = std::fs::remove_dir_all(&root);
}
