//! Reading a pod netns's nf_tables without letting libnftables print a table the pod made.
//!
//! # Why not libnftables
//!
//! libnftables 1.0.6 (Debian 12) prints a table that has flags wrongly in JSON
//! (`table_flags_json`: a use after free, and an index past its names for `owner`; fixed
//! upstream in 1.0.9, "json: fix use after free in table_flags_json()"). Listed in JSON by a
//! long-lived process, such a table corrupts its heap: measured here, a third of the terse
//! `list ruleset` listings of a netns holding an `owner` table came back cut short, and with
//! more listings the process aborted (`corrupted double-linked list`). Any pod with NET_ADMIN
//! can create such a table (`flags dormant` is enough) — so a listing that prints every table
//! would let a pod crash the agent of its node at will. The fix is structural, not a check
//! before each listing (a pod can create the table between the check and the listing):
//!
//! - What planning needs (which tables, sets and chains exist: names) and the evidence
//!   counters' values are read here, over nf_tables netlink dumps, parsed by this crate: no
//!   table is printed, and the dumps are cheaper than a listing (no set elements, no
//!   expression decoding).
//! - The comparison of netwarden's rules with the kernel's ([`crate::nft_verify`]) needs the
//!   rules in nft's JSON form; that listing runs in a child process (`nft -j -t list
//!   ruleset`, or netwarden's table alone when a pod's table spoils that, see
//!   [`ruleset_json_here`]): whatever a pod's table does to that process's heap ends with it,
//!   and a listing it could not finish is an unreadable listing — a difference, which the
//!   repair answers (fail closed).
//! - Set elements are listed per set (`list set`), which prints no table.
//!
//! # The dumps
//!
//! `NFT_MSG_GETTABLE`, `NFT_MSG_GETCHAIN`, `NFT_MSG_GETSET`, `NFT_MSG_GETOBJ` with
//! `NLM_F_DUMP` and family `NFPROTO_UNSPEC` (every family), each reply message read for its
//! names (`linux/netfilter/nf_tables.h`). The dumps are one consistent view: the ruleset's
//! generation (`NFT_MSG_GETGEN`) is read before and after, and the whole reading is done again
//! when it moved (or when the kernel flagged a dump interrupted), as libnftables does.

use netlink_packet_core::{NlasIterator, NLA_HEADER_SIZE, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST};

use crate::nfnetlink::{exchange, open_socket, NfnetlinkError, DATAGRAM, NFGENMSG_LEN};
use crate::nft_plan::{KernelTables, NftObjects};
use netwarden_render::nft::TABLE_FAMILY;

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_GETTABLE: u16 = 1;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_GETCHAIN: u16 = 4;
const NFT_MSG_NEWSET: u16 = 9;
const NFT_MSG_GETSET: u16 = 10;
const NFT_MSG_NEWGEN: u16 = 15;
const NFT_MSG_GETGEN: u16 = 16;
const NFT_MSG_NEWOBJ: u16 = 18;
const NFT_MSG_GETOBJ: u16 = 19;

/// `NFTA_TABLE_NAME`, `NFTA_CHAIN_TABLE`, `NFTA_SET_TABLE`, `NFTA_OBJ_TABLE`: the first
/// attribute of each kind of object is its table (or, for a table, its name).
const NFTA_TABLE_NAME: u16 = 1;
const NFTA_TABLE_FLAGS: u16 = 2;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_SET_TABLE: u16 = 1;
const NFTA_SET_NAME: u16 = 2;
const NFTA_OBJ_TABLE: u16 = 1;
const NFTA_OBJ_NAME: u16 = 2;
const NFTA_OBJ_TYPE: u16 = 3;
const NFTA_OBJ_DATA: u16 = 4;
const NFT_OBJECT_COUNTER: u32 = 1;
const NFTA_COUNTER_PACKETS: u16 = 2;
const NFTA_GEN_ID: u16 = 1;

/// How many times a reading is done again when the ruleset changed under it before giving up
/// (a pod changing its own tables in a loop must not stall the agent).
const ATTEMPTS: usize = 5;

/// Why a netns's nf_tables could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ListingError {
    #[error(transparent)]
    Netlink(#[from] NfnetlinkError),
    #[error("the ruleset changed during each of {ATTEMPTS} readings")]
    Unsettled,
    #[error("{0}")]
    Command(String),
}

/// One table as the kernel lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableInfo {
    /// nft's name of the family (`inet`, `ip`, `ip6`, …).
    pub family: String,
    pub name: String,
    /// `NFT_TABLE_F_*` (`dormant` 1, `owner` 2, `persist` 4).
    pub flags: u32,
}

/// Everything [`read_here`] lists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ruleset {
    pub tables: Vec<TableInfo>,
    /// Every table with the names of its sets and chains.
    pub objects: KernelTables,
    /// Named counters: (family, table, name) and packets.
    pub counters: Vec<((String, String, String), u64)>,
}

/// nft's name of an `NFPROTO_*` family.
fn family_name(family: u8) -> String {
    match family {
        1 => "inet".into(),
        2 => "ip".into(),
        3 => "arp".into(),
        5 => "netdev".into(),
        7 => "bridge".into(),
        10 => "ip6".into(),
        other => format!("family{other}"),
    }
}

fn message_type(msg: u16) -> u16 {
    (NFNL_SUBSYS_NFTABLES << 8) | msg
}

fn dump_request(msg: u16, seq: u32) -> Vec<u8> {
    crate::nfnetlink::request(message_type(msg), NLM_F_REQUEST | NLM_F_DUMP, seq, 0, &[])
}

/// A NUL-terminated string attribute's value.
fn string(value: &[u8]) -> Result<String, String> {
    let text = value.strip_suffix(&[0]).unwrap_or(value);
    String::from_utf8(text.to_vec()).map_err(|_| "a name that is not UTF-8".to_string())
}

fn be_u32(value: &[u8]) -> Result<u32, String> {
    Ok(u32::from_be_bytes(
        value.try_into().map_err(|_| "a u32 of another length")?,
    ))
}

fn be_u64(value: &[u8]) -> Result<u64, String> {
    Ok(u64::from_be_bytes(
        value.try_into().map_err(|_| "a u64 of another length")?,
    ))
}

/// An attribute's kind and value.
type Attribute<'a> = (u16, &'a [u8]);

/// The family and the attributes of one reply message's payload.
fn attributes(payload: &[u8]) -> Result<(u8, Vec<Attribute<'_>>), String> {
    let family = *payload.first().ok_or("empty message")?;
    let rest = payload.get(NFGENMSG_LEN..).ok_or("short nfgenmsg")?;
    let mut out = Vec::new();
    for nla in NlasIterator::new(rest) {
        let nla = nla.map_err(|e| format!("attribute: {e}"))?;
        let (kind, length) = (nla.kind(), nla.length() as usize);
        // The value borrowed from the payload itself (checked: the header's length fits).
        let value = nla
            .into_inner()
            .get(NLA_HEADER_SIZE..length)
            .ok_or("short attribute")?;
        out.push((kind, value));
    }
    Ok((family, out))
}

fn find<'a>(attrs: &[Attribute<'a>], kind: u16) -> Option<&'a [u8]> {
    attrs.iter().find(|(k, _)| *k == kind).map(|(_, v)| *v)
}

/// Reads one reply message of any of the dumps into `out`.
pub fn read_message(kind: u16, payload: &[u8], out: &mut Ruleset) -> Result<(), String> {
    let Some(msg) = kind
        .checked_sub(NFNL_SUBSYS_NFTABLES << 8)
        .filter(|m| *m < 0x100)
    else {
        return Ok(());
    };
    let (family, attrs) = attributes(payload)?;
    let family = family_name(family);
    let named = |table: u16, name: u16| -> Result<(String, String), String> {
        let table = find(&attrs, table).ok_or("no table")?;
        let name = find(&attrs, name).ok_or("no name")?;
        Ok((string(table)?, string(name)?))
    };
    fn objects<'o>(out: &'o mut Ruleset, family: &str, table: String) -> &'o mut NftObjects {
        out.objects
            .entry((family.to_string(), table))
            .or_insert_with(|| NftObjects {
                table: true,
                ..NftObjects::default()
            })
    }
    match msg {
        NFT_MSG_NEWTABLE => {
            let name = string(find(&attrs, NFTA_TABLE_NAME).ok_or("no table name")?)?;
            let flags = find(&attrs, NFTA_TABLE_FLAGS)
                .map(be_u32)
                .transpose()?
                .unwrap_or(0);
            objects(out, &family, name.clone());
            out.tables.push(TableInfo {
                family: family.clone(),
                name,
                flags,
            });
        }
        NFT_MSG_NEWCHAIN => {
            let (table, name) = named(NFTA_CHAIN_TABLE, NFTA_CHAIN_NAME)?;
            objects(out, &family, table).chains.insert(name);
        }
        NFT_MSG_NEWSET => {
            let (table, name) = named(NFTA_SET_TABLE, NFTA_SET_NAME)?;
            objects(out, &family, table).sets.insert(name);
        }
        NFT_MSG_NEWOBJ => {
            let kind = find(&attrs, NFTA_OBJ_TYPE).map(be_u32).transpose()?;
            if kind != Some(NFT_OBJECT_COUNTER) {
                return Ok(());
            }
            let (table, name) = named(NFTA_OBJ_TABLE, NFTA_OBJ_NAME)?;
            let data = find(&attrs, NFTA_OBJ_DATA).ok_or("a counter without data")?;
            let mut packets = None;
            for nla in NlasIterator::new(data) {
                let nla = nla.map_err(|e| format!("counter attribute: {e}"))?;
                if nla.kind() == NFTA_COUNTER_PACKETS {
                    packets = Some(be_u64(nla.value())?);
                }
            }
            let packets = packets.ok_or("a counter without packets")?;
            out.counters.push(((family.clone(), table, name), packets));
        }
        _ => {}
    }
    Ok(())
}

/// The ruleset's generation (`NFT_MSG_GETGEN`).
fn generation(
    socket: &netlink_sys::Socket,
    seq: u32,
    buffer: &mut [u8],
) -> Result<u32, NfnetlinkError> {
    // Acknowledged: the reply is one message, not a dump; the ack ends it.
    let request = crate::nfnetlink::request(
        message_type(NFT_MSG_GETGEN),
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        0,
        &[],
    );
    let mut id = None;
    exchange(
        socket,
        "nf_tables generation",
        &request,
        seq,
        buffer,
        |kind, payload| {
            if kind == message_type(NFT_MSG_NEWGEN) {
                let (_, attrs) = attributes(payload)?;
                id = find(&attrs, NFTA_GEN_ID).map(be_u32).transpose()?;
            }
            Ok(())
        },
    )?;
    id.ok_or_else(|| NfnetlinkError::Malformed("no generation id".into()))
}

/// The ruleset generation of the calling thread's netns: every nf_tables commit there moves
/// it (see `NftDataplane::verify`).
pub fn generation_here() -> Result<u32, ListingError> {
    let socket = open_socket()?;
    let mut buffer = vec![0; 8 << 10];
    Ok(generation(&socket, 1, &mut buffer)?)
}

static READINGS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many times this process read a netns with [`read_here`] (tests assert on it: what a
/// restart costs).
pub fn readings() -> u64 {
    READINGS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Reads the calling thread's netns (run it on a [`crate::netns::Netns::run`] thread): its
/// tables, their sets and chains, and the named counters, one consistent view.
pub fn read_here() -> Result<Ruleset, ListingError> {
    READINGS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let socket = open_socket()?;
    let mut buffer = vec![0; DATAGRAM];
    let mut seq = 0u32;
    for _ in 0..ATTEMPTS {
        seq += 1;
        let before = generation(&socket, seq, &mut buffer)?;
        let mut out = Ruleset::default();
        let mut interrupted = false;
        for (what, msg) in [
            ("nf_tables table dump", NFT_MSG_GETTABLE),
            ("nf_tables chain dump", NFT_MSG_GETCHAIN),
            ("nf_tables set dump", NFT_MSG_GETSET),
            ("nf_tables object dump", NFT_MSG_GETOBJ),
        ] {
            seq += 1;
            interrupted |= exchange(
                &socket,
                what,
                &dump_request(msg, seq),
                seq,
                &mut buffer,
                |kind, payload| read_message(kind, payload, &mut out),
            )?;
        }
        seq += 1;
        if !interrupted && generation(&socket, seq, &mut buffer)? == before {
            return Ok(out);
        }
    }
    Err(ListingError::Unsettled)
}

/// The terse JSON listing of the calling thread's netns that shows netwarden's table `inet
/// TABLE`, made by a child process started from this thread (it inherits the thread's
/// netns): see the module doc.
///
/// First `nft -j -t list ruleset` (cheap: no set elements). When a pod's table with flags
/// spoils it (output that is not whole JSON, or the process died), netwarden's table alone:
/// `nft -j -t list table inet TABLE` prints no other table (it fetches set elements, so it
/// costs more: at 20,000 elements, 60 ms against under 10). No table of that name: a listing
/// without it. A listing that still fails is an error (the caller counts the rules unreadable).
pub fn ruleset_json_here(table: &str) -> Result<String, ListingError> {
    if let Ok(listing) = nft_json(&["list", "ruleset"]) {
        return Ok(listing);
    }
    let key = (TABLE_FAMILY.to_string(), table.to_string());
    if !read_here()?.objects.contains_key(&key) {
        return Ok(r#"{"nftables": []}"#.to_string());
    }
    nft_json(&["list", "table", TABLE_FAMILY, table])
}

static COMMANDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many `nft` listing processes this process started (tests assert on it: what a
/// comparison costs).
pub fn commands() -> u64 {
    COMMANDS.load(std::sync::atomic::Ordering::Relaxed)
}

/// What `nft -j -t ARGS` prints, when it succeeds and prints whole JSON.
fn nft_json(args: &[&str]) -> Result<String, ListingError> {
    COMMANDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let output = std::process::Command::new("nft")
        .args(["-j", "-t"])
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| ListingError::Command(format!("could not run nft: {e}")))?;
    let command = format!("`nft -j -t {}`", args.join(" "));
    if !output.status.success() {
        return Err(ListingError::Command(format!(
            "{command}: {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    let listing = String::from_utf8(output.stdout)
        .map_err(|_| ListingError::Command(format!("{command}: output that is not UTF-8")))?;
    if serde_json::from_str::<serde::de::IgnoredAny>(&listing).is_err() {
        return Err(ListingError::Command(format!(
            "{command}: output that is not whole JSON ({} bytes)",
            listing.len()
        )));
    }
    Ok(listing)
}

#[cfg(test)]
mod tests {
    //! Reply messages in the layout the kernel sends (`nf_tables_fill_*_info`: nfgenmsg, then
    //! attributes), built attribute by attribute; the kernel tests (`tests/tamper_root.rs`,
    //! `tests/nft_restart_root.rs`) read real dumps with the same parser.
    use super::*;
    use crate::nfnetlink::{attr, read_datagram, request};

    fn name(value: &str) -> Vec<u8> {
        let mut v = value.as_bytes().to_vec();
        v.push(0);
        v
    }

    fn reply(msg: u16, family: u8, attrs: &[u8]) -> Vec<u8> {
        let mut m = request(message_type(msg), 2, 1, family, attrs);
        m.resize(m.len().next_multiple_of(4), 0);
        m
    }

    fn table(family: u8, table: &str, flags: Option<u32>) -> Vec<u8> {
        let mut a = Vec::new();
        attr(&mut a, NFTA_TABLE_NAME, &name(table));
        if let Some(flags) = flags {
            attr(&mut a, NFTA_TABLE_FLAGS, &flags.to_be_bytes());
        }
        reply(NFT_MSG_NEWTABLE, family, &a)
    }

    fn owned(msg: u16, family: u8, table: &str, kind: u16, object: &str) -> Vec<u8> {
        let mut a = Vec::new();
        attr(&mut a, 1, &name(table));
        attr(&mut a, kind, &name(object));
        reply(msg, family, &a)
    }

    fn counter(table: &str, object: &str, packets: u64) -> Vec<u8> {
        let mut data = Vec::new();
        attr(&mut data, 1, &(packets * 60).to_be_bytes());
        attr(&mut data, NFTA_COUNTER_PACKETS, &packets.to_be_bytes());
        let mut a = Vec::new();
        attr(&mut a, NFTA_OBJ_TABLE, &name(table));
        attr(&mut a, NFTA_OBJ_NAME, &name(object));
        attr(&mut a, NFTA_OBJ_TYPE, &NFT_OBJECT_COUNTER.to_be_bytes());
        attr(&mut a, NFTA_OBJ_DATA | 0x8000, &data);
        reply(NFT_MSG_NEWOBJ, 1, &a)
    }

    fn read(bytes: &[u8]) -> Result<Ruleset, String> {
        let mut out = Ruleset::default();
        read_datagram(bytes, 1, |kind, payload| {
            read_message(kind, payload, &mut out)
        })?;
        Ok(out)
    }

    #[test]
    fn dumps_give_tables_flags_sets_chains_and_counters() {
        let mut bytes = table(1, "netwarden", None);
        bytes.extend(table(1, "netwarden_0123456789abcdef", Some(2)));
        bytes.extend(table(2, "filter", None));
        bytes.extend(owned(
            NFT_MSG_NEWCHAIN,
            1,
            "netwarden",
            NFTA_CHAIN_NAME,
            "input",
        ));
        bytes.extend(owned(
            NFT_MSG_NEWCHAIN,
            2,
            "filter",
            NFTA_CHAIN_NAME,
            "DANM_IN",
        ));
        bytes.extend(owned(NFT_MSG_NEWSET, 1, "netwarden", NFTA_SET_NAME, "p4_a"));
        bytes.extend(counter("netwarden", "nw_cn_0000002a", 12));
        // A quota object (type 2) is not a counter.
        let mut quota = Vec::new();
        attr(&mut quota, NFTA_OBJ_TABLE, &name("netwarden"));
        attr(&mut quota, NFTA_OBJ_NAME, &name("q"));
        attr(&mut quota, NFTA_OBJ_TYPE, &2u32.to_be_bytes());
        bytes.extend(reply(NFT_MSG_NEWOBJ, 1, &quota));
        let r = read(&bytes).unwrap();
        assert_eq!(
            r.tables,
            vec![
                TableInfo {
                    family: "inet".into(),
                    name: "netwarden".into(),
                    flags: 0
                },
                TableInfo {
                    family: "inet".into(),
                    name: "netwarden_0123456789abcdef".into(),
                    flags: 2
                },
                TableInfo {
                    family: "ip".into(),
                    name: "filter".into(),
                    flags: 0
                },
            ]
        );
        let nw = &r.objects[&("inet".to_string(), "netwarden".to_string())];
        assert!(nw.table);
        assert_eq!(nw.chains, ["input".to_string()].into());
        assert_eq!(nw.sets, ["p4_a".to_string()].into());
        assert_eq!(
            r.objects[&("ip".to_string(), "filter".to_string())].chains,
            ["DANM_IN".to_string()].into()
        );
        assert_eq!(
            r.counters,
            vec![(
                (
                    "inet".to_string(),
                    "netwarden".to_string(),
                    "nw_cn_0000002a".to_string()
                ),
                12
            )]
        );
    }

    #[test]
    fn the_requests_dump_every_family() {
        for msg in [
            NFT_MSG_GETTABLE,
            NFT_MSG_GETCHAIN,
            NFT_MSG_GETSET,
            NFT_MSG_GETOBJ,
        ] {
            let r = dump_request(msg, 3);
            let h = netlink_packet_core::NetlinkBuffer::new_checked(&r[..]).unwrap();
            assert_eq!(h.message_type(), (10 << 8) | msg);
            assert_eq!(h.flags(), NLM_F_REQUEST | NLM_F_DUMP);
            assert_eq!(h.payload(), &[0, 0, 0, 0]);
        }
    }

    #[test]
    fn other_subsystems_are_skipped_and_bad_messages_refused() {
        // A ctnetlink message in the reply is not ours to read.
        let other = request(1 << 8, 2, 1, 2, &[1, 2, 3, 4]);
        assert_eq!(read(&other).unwrap(), Ruleset::default());
        // A chain without its table, a name that is not UTF-8, a short flags value.
        let mut a = Vec::new();
        attr(&mut a, NFTA_CHAIN_NAME, &name("c"));
        assert!(read(&reply(NFT_MSG_NEWCHAIN, 1, &a)).is_err());
        let mut a = Vec::new();
        attr(&mut a, NFTA_TABLE_NAME, &[0xff, 0xfe, 0]);
        assert!(read(&reply(NFT_MSG_NEWTABLE, 1, &a)).is_err());
        let mut a = Vec::new();
        attr(&mut a, NFTA_TABLE_NAME, &name("t"));
        attr(&mut a, NFTA_TABLE_FLAGS, &[1, 2]);
        assert!(read(&reply(NFT_MSG_NEWTABLE, 1, &a)).is_err());
    }

    #[test]
    fn any_bytes_give_a_ruleset_or_an_error_never_a_panic() {
        let mut bytes = table(1, "netwarden", Some(1));
        bytes.extend(owned(NFT_MSG_NEWSET, 1, "netwarden", NFTA_SET_NAME, "p4_a"));
        bytes.extend(counter("netwarden", "nw_cn_0000002a", 12));
        for cut in 0..bytes.len() {
            let _ = read(&bytes[..cut]);
            let mut flipped = bytes.clone();
            flipped[cut] ^= 0xff;
            let _ = read(&flipped);
        }
    }
}
