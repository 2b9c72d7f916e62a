//! Stopping the agent on SIGTERM or SIGINT within its grace period, whatever it is doing
//! (issue 20, defect 6).
//!
//! The first signal sets the stop flag and wakes the agent loop: the loop stops at its next
//! pass, and a sync under way stops between two netns applies (the dataplane checks the same
//! flag before each). A netns apply already in libnftables is never interrupted: its
//! transaction is one batch the kernel commits whole or not at all.
//!
//! As a last resort a watchdog ends the process once [`AgentConfig::shutdown_timeout`]
//! passed after the signal (a kernel call that does not return, a listing of a huge ruleset),
//! and a second signal ends it at once. Exiting is fail-closed: the rules stay in the kernel,
//! where a new agent finds and replaces them atomically.
//!
//! [`AgentConfig::shutdown_timeout`]: crate::agent::AgentConfig::shutdown_timeout

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use tracing::{info, warn};

/// Exit status when the watchdog or a second signal ends the process (the rules stay).
pub const FORCED_EXIT: i32 = 1;

/// Installs the handlers: the flag they set, which the agent and its dataplane poll. `wake`
/// interrupts the agent loop's wait for its source.
pub fn install(
    deadline: Duration,
    wake: Box<dyn Fn() + Send + Sync>,
) -> std::io::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut signals = Signals::new([SIGTERM, SIGINT])?;
    let flag = stop.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                if flag.swap(true, Ordering::SeqCst) {
                    warn!("signal {signal} again: exiting now; the rules in place stay");
                    std::process::exit(FORCED_EXIT);
                }
                info!(
                    "signal {signal}: stopping within {:.1} s; the rules in place stay",
                    deadline.as_secs_f64()
                );
                wake();
                // The watchdog: a thread of its own, so that a second signal is still heard.
                let _ = std::thread::Builder::new()
                    .name("shutdown-watchdog".into())
                    .spawn(move || {
                        std::thread::sleep(deadline);
                        warn!(
                            "still running {:.1} s after the stop signal: exiting; the rules in \
                             place stay",
                            deadline.as_secs_f64()
                        );
                        std::process::exit(FORCED_EXIT);
                    });
            }
        })?;
    Ok(stop)
}
