//! The request log: what the server was asked, so that tests can prove how a client talks to
//! the API — e.g. that the node agent keeps one WATCH per kind and never relists in steady
//! state.

use hyper::Method;

use crate::resources::Target;

/// What a request does, in the API's own verbs (a GET with `watch=true` is a watch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verb {
    List,
    Watch,
    Get,
    Create,
    Update,
    Patch,
    Delete,
    /// `/version`, `/api`, `/apis` and the group documents.
    Discovery,
    /// A path nothing is served at, or a method the path does not take.
    Other,
}

impl Verb {
    pub fn of(method: &Method, target: Option<&Target>, watch: bool) -> Verb {
        match (target, method.as_str()) {
            (None, _) => Verb::Other,
            (Some(Target::Collection { .. }), "GET") if watch => Verb::Watch,
            (Some(Target::Collection { .. }), "GET") => Verb::List,
            (Some(Target::Collection { .. }), "POST") => Verb::Create,
            (Some(Target::Object { .. }), "GET") => Verb::Get,
            (Some(Target::Object { .. }), "PUT") => Verb::Update,
            (Some(Target::Object { .. }), "PATCH") => Verb::Patch,
            (Some(Target::Object { .. }), "DELETE") => Verb::Delete,
            (Some(Target::Collection { .. } | Target::Object { .. }), _) => Verb::Other,
            (Some(_), _) => Verb::Discovery,
        }
    }
}

/// One request as the server saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    pub method: String,
    pub path: String,
    /// The raw query string.
    pub query: String,
    pub verb: Verb,
    /// The kind the path names (`Pod`), if it names one that is served.
    pub kind: Option<String>,
    /// Its `apiVersion` (`v1`, `danm.k8s.io/v1`).
    pub api_version: Option<String>,
    /// The HTTP status answered (200 for a watch that started; an ERROR event inside the
    /// stream does not change it).
    pub code: u16,
}

/// Every request since the server started (or since the log was last cleared), in order.
#[derive(Debug, Clone, Default)]
pub struct RequestLog(pub Vec<RequestRecord>);

impl RequestLog {
    /// How many requests of `verb` named `kind`.
    pub fn count(&self, verb: Verb, kind: &str) -> usize {
        self.0
            .iter()
            .filter(|r| r.verb == verb && r.kind.as_deref() == Some(kind))
            .count()
    }

    /// LIST requests of a kind (each page counts: a paged list of 1,200 objects is 3).
    pub fn lists(&self, kind: &str) -> usize {
        self.count(Verb::List, kind)
    }

    /// WATCH requests of a kind.
    pub fn watches(&self, kind: &str) -> usize {
        self.count(Verb::Watch, kind)
    }

    pub fn iter(&self) -> impl Iterator<Item = &RequestRecord> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
