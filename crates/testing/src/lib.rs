//! What netwarden's tests share, so that each test file does not carry its own copy:
//!
//! - [`root`]: the one root check (with `CI=true`, a missing root fails the test) and the lock
//!   that runs heavy topologies one at a time;
//! - [`netns`]: named network namespaces with a per-test prefix, deleted on drop (also when the
//!   test panics), a scratch namespace for the kernel's tools, veth pairs between namespaces,
//!   commands run inside them;
//! - [`tcp`]: TCP from inside a namespace (a refusal must be a reset, never a timeout);
//! - [`udp`]: UDP flows between namespaces, and whether datagrams still pass both ways;
//! - [`files`]: temporary directories of manifests, written atomically, removed on drop;
//! - [`fuzz`]: the cargo-fuzz targets' seed corpora replayed under `cargo test`;
//! - [`http`]: the agent's `/readyz` and `/metrics`, read with one plain GET;
//! - [`process`]: the binary under test and `netwarden run` as a child process (killed on
//!   drop, with its log; `run --kube`'s usual arguments), what a process holds (for leak
//!   checks), polling;
//! - [`records`]: what netwarden prints, read back (`lab check --json` probes, `sync:` lines),
//!   and `lab check --then` over whole states (written as changes over the first);
//! - [`installed`]: what netwarden left in a namespace, as the system tools show it;
//! - [`random`]: a deterministic random source;
//! - [`admin_corpus`]: the admin-policy conformance corpus transcribed from upstream, typed;
//! - [`admin_reference`]: an independent reference evaluator of admin policies for that corpus;
//! - [`containerd`]: a real containerd with a private root and CNI bridge, pod sandboxes
//!   through CRI (as kubelet makes them), everything removed on drop.
//!
//! It uses no netwarden crate: it drives the system (`ip`, `nft`, ...) and the binary under
//! test, so the tests check netwarden from the outside. (Builders of the engine's types — pods,
//! policies, rules — live with those types, in `netwarden_engine::testing`.) Traffic only flows
//! between namespaces a test created. It does depend on the libraries, only to turn on their
//! test-only modules (`netwarden_engine::testing`, each `fuzzing`) for every crate that has it
//! as a dev-dependency, while `cargo build -p netwarden` compiles none of them.

pub mod admin_corpus;
pub mod admin_reference;
pub mod containerd;
pub mod files;
pub mod fuzz;
pub mod heap;
pub mod http;
pub mod installed;
pub mod netns;
pub mod process;
pub mod random;
pub mod records;
pub mod root;
pub mod rules;
pub mod tcp;
pub mod udp;

pub use containerd::{
    containerd_or_skip, reap_stale_instances, CniNetwork, Containerd, SandboxSpec, SharedBridge,
};
pub use files::{docs_text, TempDir};
pub use fuzz::{check_reporting, replay_seeds, seed_files};
pub use http::{free_port, http_get, metric, ready};
pub use installed::{netwarden_leftovers, rules_snapshot};
pub use netns::{
    add_address, in_netns, ip, mac_of, named_netns_with_prefix, pin_neighbours, run, run_in,
    run_in_with_input, unique_prefix, veth, Namespaces, ScratchNetns,
};
pub use process::{
    kube_agent_args, output_within, this_test_in_a_child, wait_until, AgentProcess, ProcessStats,
};
pub use random::Lcg;
pub use records::{
    lab_check, lab_check_states, layer, successful_syncs, successful_syncs_in, sync_lines,
    sync_lines_in, Fields, LabProbe, SyncLine,
};
pub use root::{
    assert_no_failures, heavy_lock, is_root, lab_slot, per_backend, root_or_skip, LabSlot,
    LAB_SLOTS,
};
pub use tcp::{
    assert_connects, assert_refused, assert_refused_fast, close_with_reset, connect, connect_timed,
    listen, probe, wait_reachable,
};
pub use udp::{udp_flow, udp_server, UdpFlow};
