//! libFuzzer target: arbitrary bytes through the monitor's NFLOG path under the invariants of
//! `netwarden_monitor::fuzzing::check_nflog`: as a received netlink buffer and as a packet
//! payload (no panic, fields only from bytes that are there), and as a description of a
//! buffer whose parse must give exactly the described records; every record then becomes an
//! event, or is refused for the right reason, and the event line reads back.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    netwarden_monitor::fuzzing::check_nflog(data);
});
