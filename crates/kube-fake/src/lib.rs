//! A fake Kubernetes API server that speaks the real list/watch protocol over HTTP, for the
//! node agent's tests and benchmarks (no kube-apiserver can be installed where they run).
//! Clients are meant to be unmodified: kube-rs's `Client`, `Api` and `runtime::watcher` talk
//! to it through an ordinary kubeconfig ([`FakeApiServer::write_kubeconfig`]).
//!
//! ```text
//!  kube::Client ──HTTP/1.1──▶ http (routing, query parameters, Status errors, request log)
//!                               │            └─▶ watch (one task per WATCH: events, bookmarks, cut)
//!                               ▼                        ▲
//!  tests ──FakeApiServer──▶ store (objects, resourceVersion, history) ──changes──┘
//!                           resources (kinds, CRDs installed or not, discovery)
//! ```
//!
//! # Faithful to kube-apiserver
//! - Paths, discovery (`/version`, `/api`, `/api/v1`, `/apis`, `/apis/{g}`, `/apis/{g}/{v}`),
//!   cluster-scoped Namespaces and namespaced everything else; a CRD that is not installed is
//!   a 404 `Status` and absent from discovery, and appears when installed.
//! - One global resourceVersion counter (a string on the wire); uid, creationTimestamp and
//!   `generation` (bumped on changes outside metadata and status) set by the server; a write
//!   that changes nothing takes no version and sends no event.
//! - LIST: `limit` + `continue` pages, all consistent at the first page's resourceVersion
//!   (past states are rebuilt from the history, so they are exact); an expired continue token
//!   is 410 Expired (with a fresh token in the Status); `resourceVersion` +
//!   `resourceVersionMatch` (`NotOlderThan`, `Exact`: 410 when older than the history, 504
//!   "Too large resource version" when newer than the server), the parameter combinations the
//!   real server refuses are refused (400/422).
//! - Label selectors (full grammar) and field selectors (`=`, `==`, `!=`) on the fields the
//!   real server supports per kind (`metadata.name`, `metadata.namespace`, `spec.nodeName`,
//!   ...), others refused with 400. In a watch, an object that stops matching is sent as
//!   DELETED (its previous content at the new version) and one that starts matching as ADDED.
//! - WATCH (`watch=true`/`1`): newline-delimited JSON events in a chunked response; from a
//!   resourceVersion, the retained history is replayed; unset or `"0"`, the current objects come
//!   as ADDED first; from a version older than the history, an `ERROR` event carrying the 410
//!   `Status` (reason `Expired`, "too old resource version: X (Y)") then the end of the stream;
//!   `allowWatchBookmarks` gives periodic BOOKMARKs whose object has only kind, apiVersion and
//!   metadata.resourceVersion, never ahead of an event not yet sent; `sendInitialEvents=true`
//!   (with `resourceVersionMatch=NotOlderThan` and bookmarks, as required) gives the current
//!   state as ADDED and a BOOKMARK annotated `k8s.io/initial-events-end: "true"`;
//!   `timeoutSeconds` ends the response cleanly.
//! - Writes: POST (201; 409 AlreadyExists; 404 for a missing namespace), PUT (409 Conflict on a
//!   stale `metadata.resourceVersion`), PATCH, DELETE (404 NotFound), GET; the status
//!   subresource of Pods, Services, Namespaces and DanmNetworkPolicies (the main resource keeps
//!   the stored status, `/status` writes only the status).
//!
//! # Simplified, and why
//! - No authentication, authorization, admission or schema validation: the agent's tests are
//!   about the protocol; RBAC is checked against `deploy/` separately.
//! - PATCH: JSON merge patch; strategic merge patch and server-side apply are taken as merge
//!   patches (apply creates a missing object) — enough for kube-runtime's event recorder and
//!   for objects without list-merge keys. JSON patch is refused with 415.
//! - Deletion is immediate: no finalizers, no grace period, no Terminating namespace (a
//!   Namespace's objects are deleted with it, each with its own event).
//! - Core v1 Events and events.k8s.io/v1 Events are separate collections (the real server
//!   stores them once); the versions of one CRD share their objects and are converted by
//!   `apiVersion` alone (the CRD "None" strategy).
//! - `limit` is honoured with `resourceVersion="0"` too (the real server serves such a list
//!   from its cache, unpaged; kube-rs never combines them).
//! - A watch never lags: each has an unbounded queue, where the real server closes a watcher
//!   that falls too far behind. Open watches outlive `compact()` and `set_unavailable`; tests
//!   cut them with `drop_watches()` or `stop()`.
//! - History is bounded by a count (`history_limit`), not by etcd's five minutes.
//!
//! # Control ([`FakeApiServer`])
//! `start`, `url`, `write_kubeconfig`, `create`/`update`/`apply`/`delete`, `install_crd`/
//! `uninstall_crd` (one version gone, its objects without an event)/`delete_crd` (a CRD deleted
//! as the real server does: its objects deleted one by one first), `compact`, `drop_watches`,
//! `stop`/`restart`, `set_unavailable`, `set_kind_unavailable`, `hide_group` (a group gone from discovery and its paths for a moment),
//! `inject_in_lists` (extra items in LIST responses: duplicates, strays),
//! `requests` (the [`RequestLog`]: verb, kind, path, query, code of every request), `objects`,
//! `object`, `resource_version`. The binary `netwarden-kube-fake` serves a directory of
//! manifests ([`manifests::load_dir`]).

#![forbid(unsafe_code)]

pub mod http;
pub mod log;
pub mod manifests;
pub mod resources;
pub mod selector;
pub mod server;
pub mod shared;
pub mod status;
pub mod store;
pub mod watch;

pub use log::{RequestLog, RequestRecord, Verb};
pub use server::{kubeconfig_for, FakeApiServer, ServerOptions};
pub use status::ApiError;
