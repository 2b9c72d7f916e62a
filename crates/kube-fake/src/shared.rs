//! What the request handlers ([`crate::http`], [`crate::watch`]) and the control surface
//! ([`crate::server`]) share: the server's state ([`Shared`]), its options, and how open
//! watches are cut.
//!
//! Its own module, below all three: the server starts the handlers, and the handlers only need
//! the state, so none of them imports the server back.

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;

use crate::log::RequestRecord;
use crate::resources::Catalogue;
use crate::store::Store;

/// How the server behaves; `Default` suits tests.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Where to listen; port 0 takes an ephemeral port (kept across `stop`/`restart`).
    pub listen: SocketAddr,
    /// How often a watch with `allowWatchBookmarks=true` gets a BOOKMARK (the real server sends
    /// one about every minute; tests want it sooner).
    pub bookmark_interval: Duration,
    /// How many changes the history retains (the real server's watch cache window): a watch or
    /// consistent page from before the oldest retained change is 410 Expired.
    pub history_limit: usize,
    /// The duration of a watch that sends no `timeoutSeconds` (the real server picks 30 to 60
    /// minutes at random; kube-rs always sends one).
    pub default_watch_timeout: Duration,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            bookmark_interval: Duration::from_secs(1),
            history_limit: 200_000,
            default_watch_timeout: Duration::from_secs(1800),
        }
    }
}

/// How [`FakeApiServer::drop_watches`](crate::FakeApiServer::drop_watches) /
/// [`FakeApiServer::fail_watches`](crate::FakeApiServer::fail_watches) end the open watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchEnd {
    /// The connection is cut mid-body.
    Abort,
    /// An ERROR event with a 500 Status, then a clean end.
    InternalError,
}

/// What the request handlers share with the control surface.
pub struct Shared {
    pub store: Mutex<Store>,
    /// Locked before `store` when both are needed, never after.
    pub catalogue: Mutex<Catalogue>,
    pub log: Mutex<Vec<RequestRecord>>,
    pub unavailable: AtomicBool,
    /// Kinds every request about is answered 503
    /// ([`FakeApiServer::set_kind_unavailable`](crate::FakeApiServer::set_kind_unavailable)).
    pub unavailable_kinds: Mutex<std::collections::BTreeSet<String>>,
    /// API groups hidden ([`FakeApiServer::hide_group`](crate::FakeApiServer::hide_group)): absent
    /// from discovery, their paths 404, their objects kept.
    pub hidden_groups: Mutex<std::collections::BTreeSet<String>>,
    /// Items added to every LIST of a kind, by kind name
    /// ([`FakeApiServer::inject_in_lists`](crate::FakeApiServer::inject_in_lists)).
    pub injected: Mutex<std::collections::BTreeMap<String, Vec<Value>>>,
    /// Bumped by `drop_watches` and `fail_watches`: every open watch ends its response, as
    /// the last [`WatchEnd`] says.
    pub cut: tokio::sync::watch::Sender<(u64, WatchEnd)>,
    pub options: ServerOptions,
}
