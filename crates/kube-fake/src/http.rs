//! HTTP: one request in, one response out (a WATCH's response is a stream fed by
//! [`crate::watch::run`]). The query parameters kube-rs sends are parsed here and turned into
//! the store's operations; every request is recorded in the request log before it is answered.

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::log::{RequestRecord, Verb};
use crate::resources::{has_status_subresource, resolve, ResourceType, Target};
use crate::selector::{FieldSelector, LabelSelector, Selectors};
use crate::shared::Shared;
use crate::status::ApiError;
use crate::store::{ObjectKey, Stamp, StatusRule};
use crate::watch::{self, as_version, Start, WatchRequest};

pub type ResponseBody = BoxBody<Bytes, io::Error>;

/// A response body fed line by line through a channel; an `Err` aborts the response (hyper
/// closes the connection without the final chunk, so the client sees a broken stream).
struct ChannelBody(mpsc::Receiver<Result<Bytes, io::Error>>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|line| line.map(|r| r.map(Frame::data)))
    }
}

fn full(bytes: impl Into<Bytes>) -> ResponseBody {
    Full::new(bytes.into())
        .map_err(|never: Infallible| match never {})
        .boxed()
}

fn json_response(code: u16, body: &Value) -> Response<ResponseBody> {
    let bytes = serde_json::to_vec(body).expect("a JSON value serializes");
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(full(bytes))
        .expect("a valid response")
}

fn error_response(e: &ApiError) -> Response<ResponseBody> {
    json_response(e.code, &e.to_status())
}

/// Decodes one `application/x-www-form-urlencoded` component (`+` is a space).
pub fn decode_component(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = |b: u8| (b as char).to_digit(16);
                match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The query parameters of list and watch requests.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Query {
    pub watch: bool,
    pub resource_version: Option<String>,
    pub resource_version_match: Option<String>,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    pub allow_watch_bookmarks: bool,
    pub timeout_seconds: Option<u64>,
    pub send_initial_events: Option<bool>,
}

fn parse_bool(name: &str, v: &str) -> Result<bool, ApiError> {
    match v {
        "true" | "1" => Ok(true),
        "false" | "0" | "" => Ok(false),
        _ => Err(ApiError::bad_request(format!(
            "query parameter {name}: {v:?} is not a boolean"
        ))),
    }
}

impl Query {
    pub fn parse(raw: &str) -> Result<Query, ApiError> {
        let mut q = Query::default();
        for pair in raw.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let (k, v) = (decode_component(k), decode_component(v));
            let number = |name: &str| {
                v.parse::<u64>().map_err(|_| {
                    ApiError::bad_request(format!("query parameter {name}: {v:?} is not a number"))
                })
            };
            match k.as_str() {
                "watch" => q.watch = parse_bool("watch", &v)?,
                "resourceVersion" => q.resource_version = Some(v.clone()),
                "resourceVersionMatch" => {
                    q.resource_version_match = Some(v.clone()).filter(|s| !s.is_empty())
                }
                "limit" => q.limit = Some(number("limit")? as usize).filter(|&l| l > 0),
                "continue" => q.continue_token = Some(v.clone()).filter(|s| !s.is_empty()),
                "labelSelector" => q.label_selector = Some(v.clone()),
                "fieldSelector" => q.field_selector = Some(v.clone()),
                "allowWatchBookmarks" => {
                    q.allow_watch_bookmarks = parse_bool("allowWatchBookmarks", &v)?
                }
                "timeoutSeconds" => q.timeout_seconds = Some(number("timeoutSeconds")?),
                "sendInitialEvents" => {
                    q.send_initial_events = Some(parse_bool("sendInitialEvents", &v)?)
                }
                // pretty, fieldManager, dryRun, propagationPolicy, ...: accepted, no effect.
                _ => {}
            }
        }
        Ok(q)
    }

    fn selectors(&self, resource: &ResourceType) -> Result<Selectors, ApiError> {
        let labels = LabelSelector::parse(self.label_selector.as_deref().unwrap_or(""))
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let fields = FieldSelector::parse(
            self.field_selector.as_deref().unwrap_or(""),
            &resource.group,
            &resource.kind,
        )
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
        Ok(Selectors { labels, fields })
    }

    /// The resourceVersion as a number; unset, empty and "0" are `None` ("any"/"most recent").
    fn rv(&self) -> Result<Option<u64>, ApiError> {
        match self.resource_version.as_deref() {
            None | Some("") | Some("0") => Ok(None),
            Some(s) => s.parse::<u64>().map(Some).map_err(|_| {
                ApiError::bad_request(format!(
                    "resourceVersion: Invalid value: {s:?}: must be a number"
                ))
            }),
        }
    }
}

/// A continue token: the snapshot version and the key of the last object sent. Opaque to
/// clients (hex of `rv/namespace/name`), like the real server's base64 tokens.
pub fn encode_continue(rv: u64, last: &ObjectKey) -> String {
    format!("{rv}/{}/{}", last.0, last.1)
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub fn decode_continue(token: &str) -> Result<(u64, ObjectKey), ApiError> {
    let bad = || ApiError::bad_request(format!("continue key is not valid: {token:?}"));
    if !token.len().is_multiple_of(2) || !token.is_ascii() {
        return Err(bad());
    }
    let bytes: Vec<u8> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&token[i..i + 2], 16))
        .collect::<Result<_, _>>()
        .map_err(|_| bad())?;
    let text = String::from_utf8(bytes).map_err(|_| bad())?;
    let mut parts = text.splitn(3, '/');
    let (Some(rv), Some(ns), Some(name)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(bad());
    };
    let rv = rv.parse().map_err(|_| bad())?;
    Ok((rv, (ns.to_string(), name.to_string())))
}

/// Entry point for every request.
pub async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<ResponseBody>, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let raw_query = req.uri().query().unwrap_or("").to_string();
    let content_type = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let target = {
        let catalogue = shared.catalogue.lock().expect("catalogue lock");
        resolve(&catalogue, &path)
    };
    // A hidden group's paths are those of a group nobody serves.
    let target = target.filter(|t| {
        let hidden = shared.hidden_groups.lock().expect("groups lock");
        match t {
            Target::Group(g) | Target::Resources { group: g, .. } => !hidden.contains(g),
            Target::Collection { resource, .. } | Target::Object { resource, .. } => {
                !hidden.contains(&resource.group)
            }
            _ => true,
        }
    });
    let query = Query::parse(&raw_query);
    let watch = query.as_ref().is_ok_and(|q| q.watch);
    let verb = Verb::of(&method, target.as_ref(), watch);
    let kind = match &target {
        Some(Target::Collection { resource, .. } | Target::Object { resource, .. }) => {
            Some(resource.clone())
        }
        _ => None,
    };
    let record = |code: u16| RequestRecord {
        method: method.to_string(),
        path: path.clone(),
        query: raw_query.clone(),
        verb,
        kind: kind.as_ref().map(|r| r.kind.clone()),
        api_version: kind.as_ref().map(|r| r.api_version()),
        code,
    };

    let kind_unavailable = kind.as_ref().is_some_and(|r| {
        shared
            .unavailable_kinds
            .lock()
            .expect("kinds lock")
            .contains(&r.kind)
    });
    let response = if shared.unavailable.load(Ordering::SeqCst) || kind_unavailable {
        error_response(&ApiError::unavailable())
    } else {
        let body = match req.into_body().collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => {
                return Ok(error_response(&ApiError::bad_request(format!(
                    "reading the request body: {e}"
                ))))
            }
        };
        match (query, target) {
            (Err(e), _) => error_response(&e),
            (_, None) => error_response(&ApiError::no_such_path()),
            (Ok(q), Some(t)) => route(&shared, &method, t, q, &content_type, &body)
                .await
                .unwrap_or_else(|e| error_response(&e)),
        }
    };
    shared
        .log
        .lock()
        .expect("log lock")
        .push(record(response.status().as_u16()));
    Ok(response)
}

async fn route(
    shared: &Arc<Shared>,
    method: &Method,
    target: Target,
    q: Query,
    content_type: &str,
    body: &[u8],
) -> Result<Response<ResponseBody>, ApiError> {
    let only_get = |doc: Option<Value>| -> Result<Response<ResponseBody>, ApiError> {
        if method != Method::GET {
            return Err(ApiError::method_not_allowed(method.as_str()));
        }
        doc.map(|d| json_response(200, &d))
            .ok_or_else(ApiError::no_such_path)
    };
    match target {
        Target::Version => only_get(Some(version_doc())),
        Target::CoreVersions => only_get(Some(
            shared
                .catalogue
                .lock()
                .expect("catalogue lock")
                .core_versions(),
        )),
        Target::Groups => {
            let mut list = shared
                .catalogue
                .lock()
                .expect("catalogue lock")
                .group_list();
            let hidden = shared.hidden_groups.lock().expect("groups lock").clone();
            if let Some(groups) = list["groups"].as_array_mut() {
                groups.retain(|g| !g["name"].as_str().is_some_and(|n| hidden.contains(n)));
            }
            only_get(Some(list))
        }
        Target::Group(g) => only_get(shared.catalogue.lock().expect("catalogue lock").group(&g)),
        Target::Resources { group, version } => only_get(
            shared
                .catalogue
                .lock()
                .expect("catalogue lock")
                .resource_list(&group, &version),
        ),
        Target::Collection {
            resource,
            namespace,
        } => match *method {
            Method::GET if q.watch => watch_response(shared, resource, namespace, &q),
            Method::GET => list(shared, &resource, namespace.as_deref(), &q),
            Method::POST => create(shared, &resource, namespace.as_deref(), body),
            _ => Err(ApiError::method_not_allowed(method.as_str())),
        },
        Target::Object {
            resource,
            namespace,
            name,
            status,
        } => {
            let ns = namespace.as_deref().unwrap_or("");
            match *method {
                Method::GET => {
                    let store = shared.store.lock().expect("store lock");
                    let obj = store
                        .get(&resource.storage_key(), ns, &name)
                        .ok_or_else(|| {
                            ApiError::not_found(&resource.group, &resource.plural, &name)
                        })?;
                    Ok(json_response(200, &as_version(&obj, &resource)))
                }
                Method::PUT => replace(shared, &resource, ns, &name, status, body),
                Method::PATCH => patch(shared, &resource, ns, &name, status, content_type, body),
                Method::DELETE => {
                    let gone = shared
                        .store
                        .lock()
                        .expect("store lock")
                        .delete(&resource, ns, &name)?;
                    Ok(json_response(200, &as_version(&gone, &resource)))
                }
                _ => Err(ApiError::method_not_allowed(method.as_str())),
            }
        }
    }
}

/// `/version`: what kube's `Client::apiserver_version` reads.
fn version_doc() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0-netwarden-kube-fake",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

fn list(
    shared: &Shared,
    resource: &ResourceType,
    namespace: Option<&str>,
    q: &Query,
) -> Result<Response<ResponseBody>, ApiError> {
    let selectors = q.selectors(resource)?;
    let store = shared.store.lock().expect("store lock");
    let current = store.current_rv();
    let (at, start_after) = match &q.continue_token {
        Some(token) => {
            if q.resource_version
                .as_deref()
                .is_some_and(|rv| !rv.is_empty())
            {
                return Err(ApiError::bad_request(
                    "specifying resource version is not allowed when using continue".into(),
                ));
            }
            let (rv, last) = decode_continue(token)?;
            if rv < store.oldest_rv() {
                return Err(ApiError::continue_expired(encode_continue(current, &last)));
            }
            (rv, Some(last))
        }
        None => {
            let rv = q.rv()?;
            match (q.resource_version_match.as_deref(), rv) {
                (Some(_), None) if q.resource_version.is_none() => {
                    return Err(ApiError::bad_request(
                        "resourceVersionMatch is forbidden unless resourceVersion is provided".into(),
                    ))
                }
                (Some("Exact"), Some(rv)) => {
                    if rv > current {
                        return Err(ApiError::too_large(rv, current));
                    }
                    (rv, None)
                }
                (Some("Exact"), None) => {
                    return Err(ApiError::bad_request(
                        "resourceVersionMatch \"Exact\" is forbidden for resourceVersion \"0\"".into(),
                    ))
                }
                (None | Some("NotOlderThan"), Some(rv)) if rv > current => return Err(ApiError::too_large(rv, current)),
                (None | Some("NotOlderThan"), _) => (current, None),
                (Some(other), _) => {
                    return Err(ApiError::bad_request(format!(
                        "resourceVersionMatch: Unsupported value: {other:?}: supported values: \"Exact\", \"NotOlderThan\""
                    )))
                }
            }
        }
    };
    let page = store.page(
        &resource.storage_key(),
        at,
        namespace,
        &selectors,
        start_after.as_ref(),
        q.limit,
    )?;
    drop(store);

    let mut metadata = json!({"resourceVersion": at.to_string()});
    if let Some(next) = &page.next {
        metadata["continue"] = json!(encode_continue(at, next));
    }
    // The list is written item by item into one buffer: no `Value` of the whole list.
    let head = json!({"kind": resource.list_kind(), "apiVersion": resource.api_version(), "metadata": metadata});
    let head = serde_json::to_string(&head).expect("a JSON value serializes");
    let mut buf = Vec::with_capacity(256 + page.items.len() * 1024);
    buf.extend_from_slice(&head.as_bytes()[..head.len() - 1]);
    buf.extend_from_slice(b",\"items\":[");
    for (i, item) in page.items.iter().enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        serde_json::to_writer(&mut buf, &*as_version(item, resource))
            .expect("a JSON value serializes");
    }
    let injected = shared
        .injected
        .lock()
        .expect("injected lock")
        .get(&resource.kind)
        .cloned()
        .unwrap_or_default();
    for (i, item) in injected.iter().enumerate() {
        if i > 0 || !page.items.is_empty() {
            buf.push(b',');
        }
        serde_json::to_writer(&mut buf, item).expect("a JSON value serializes");
    }
    buf.extend_from_slice(b"]}");
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(full(buf))
        .expect("a valid response"))
}

fn watch_response(
    shared: &Arc<Shared>,
    resource: ResourceType,
    namespace: Option<String>,
    q: &Query,
) -> Result<Response<ResponseBody>, ApiError> {
    let selectors = q.selectors(&resource)?;
    let rv = q.rv()?;
    let start = if q.send_initial_events == Some(true) {
        if q.resource_version_match.as_deref() != Some("NotOlderThan") {
            return Err(ApiError::invalid(
                "ListOptions",
                "",
                "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan".into(),
            ));
        }
        if !q.allow_watch_bookmarks {
            return Err(ApiError::invalid(
                "ListOptions",
                "",
                "allowWatchBookmarks: Forbidden: sendInitialEvents requires setting allowWatchBookmarks to true".into(),
            ));
        }
        Start::InitialEvents
    } else {
        match rv {
            None => Start::Now,
            Some(rv) => Start::After(rv),
        }
    };
    let timeout = q
        .timeout_seconds
        .map(Duration::from_secs)
        .unwrap_or(shared.options.default_watch_timeout);
    let request = WatchRequest {
        resource,
        namespace,
        selectors,
        bookmarks: q.allow_watch_bookmarks,
        timeout,
        start,
    };
    let (tx, rx) = mpsc::channel(256);
    tokio::spawn(watch::run(shared.clone(), request, tx));
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .header("transfer-encoding", "chunked")
        .body(ChannelBody(rx).boxed())
        .expect("a valid response"))
}

/// What an HTTP write does with `status`: the status subresource writes only the status; the
/// main resource of a kind that has one keeps the stored status.
fn status_rule(resource: &ResourceType, status_subresource: bool) -> StatusRule {
    match (status_subresource, has_status_subresource(resource)) {
        (true, _) => StatusRule::OnlyStatus,
        (false, true) => StatusRule::KeepStored,
        (false, false) => StatusRule::Whole,
    }
}

fn parse_json_body(body: &[u8], what: &str) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the {what} is not valid JSON: {e}")))
}

/// The body's apiVersion/kind, when given, must be the path's; the namespace likewise.
fn check_identity(
    resource: &ResourceType,
    namespace: Option<&str>,
    obj: &mut Value,
) -> Result<(), ApiError> {
    let name = obj["metadata"]["name"].as_str().unwrap_or("").to_string();
    for (field, want) in [
        ("apiVersion", resource.api_version()),
        ("kind", resource.kind.clone()),
    ] {
        match obj[field].as_str() {
            Some(got) if !got.is_empty() && got != want => {
                return Err(ApiError::bad_request(format!(
                    "the {field} of the provided object ({got}) does not match the {field} of the request ({want})"
                )))
            }
            _ => {}
        }
    }
    if let Some(ns) = namespace {
        match obj["metadata"]["namespace"].as_str() {
            Some(got) if !got.is_empty() && got != ns => {
                return Err(ApiError::bad_request(format!(
                    "the namespace of the provided object ({got}) does not match the namespace sent on the request ({ns}) for {} \"{name}\"",
                    resource.kind
                )))
            }
            _ => {
                if obj["metadata"].is_object() {
                    obj["metadata"]["namespace"] = json!(ns);
                }
            }
        }
    }
    Ok(())
}

fn create(
    shared: &Shared,
    resource: &ResourceType,
    namespace: Option<&str>,
    body: &[u8],
) -> Result<Response<ResponseBody>, ApiError> {
    let mut obj = parse_json_body(body, "object")?;
    check_identity(resource, namespace, &mut obj)?;
    let stamp = Stamp { now: now_rfc3339() };
    let created = shared
        .store
        .lock()
        .expect("store lock")
        .create(resource, obj, &stamp)?;
    Ok(json_response(201, &as_version(&created, resource)))
}

fn replace(
    shared: &Shared,
    resource: &ResourceType,
    ns: &str,
    name: &str,
    status: bool,
    body: &[u8],
) -> Result<Response<ResponseBody>, ApiError> {
    let mut obj = parse_json_body(body, "object")?;
    check_identity(resource, Some(ns).filter(|_| resource.namespaced), &mut obj)?;
    if let Some(got) = obj["metadata"]["name"].as_str() {
        if got != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({got}) does not match the name on the URL ({name})"
            )));
        }
    }
    let expected = obj["metadata"]["resourceVersion"]
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_string);
    let rule = status_rule(resource, status);
    let updated = shared.store.lock().expect("store lock").replace(
        resource,
        ns,
        name,
        obj,
        expected.as_deref(),
        rule,
    )?;
    Ok(json_response(200, &as_version(&updated, resource)))
}

fn patch(
    shared: &Shared,
    resource: &ResourceType,
    ns: &str,
    name: &str,
    status: bool,
    content_type: &str,
    body: &[u8],
) -> Result<Response<ResponseBody>, ApiError> {
    let media = content_type.split(';').next().unwrap_or("").trim();
    let apply = media == "application/apply-patch+yaml";
    let patch = match media {
        "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
            parse_json_body(body, "patch")?
        }
        // Server-side apply, taken as a merge patch that may create (kube sends JSON, which is
        // YAML too; real YAML is accepted as well).
        "application/apply-patch+yaml" => match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(_) => {
                let text = std::str::from_utf8(body)
                    .map_err(|_| ApiError::bad_request("the patch is not UTF-8".into()))?;
                serde_saphyr::from_str::<Value>(text).map_err(|e| {
                    ApiError::bad_request(format!("the patch is not valid YAML: {e}"))
                })?
            }
        },
        other => return Err(ApiError::unsupported_media_type(other)),
    };
    if !patch.is_object() {
        return Err(ApiError::bad_request(
            "the patch must be a JSON object".into(),
        ));
    }
    let rule = status_rule(resource, status);
    let mut store = shared.store.lock().expect("store lock");
    if apply && store.get(&resource.storage_key(), ns, name).is_none() {
        let mut obj = patch;
        check_identity(resource, Some(ns).filter(|_| resource.namespaced), &mut obj)?;
        obj["metadata"]["name"] = json!(name);
        let created = store.create(resource, obj, &Stamp { now: now_rfc3339() })?;
        return Ok(json_response(201, &as_version(&created, resource)));
    }
    let updated = store.patch(resource, ns, name, &patch, rule)?;
    Ok(json_response(200, &as_version(&updated, resource)))
}

/// The current time as the real server writes `creationTimestamp` (RFC 3339, seconds, UTC).
pub fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parameters_as_kube_sends_them() {
        let q = Query::parse(
            "watch=true&timeoutSeconds=290&labelSelector=app+in+%28a%2Cb%29&fieldSelector=spec.nodeName%3Dn1&allowWatchBookmarks=true&resourceVersion=12",
        )
        .unwrap();
        assert!(q.watch && q.allow_watch_bookmarks);
        assert_eq!(q.timeout_seconds, Some(290));
        assert_eq!(q.label_selector.as_deref(), Some("app in (a,b)"));
        assert_eq!(q.field_selector.as_deref(), Some("spec.nodeName=n1"));
        assert_eq!(q.rv().unwrap(), Some(12));
        assert!(Query::parse("watch=1").unwrap().watch);
        assert!(Query::parse("limit=x").is_err());
        assert_eq!(
            Query::parse("resourceVersion=0").unwrap().rv().unwrap(),
            None
        );
        assert_eq!(decode_component("a%2"), "a%2");
    }

    #[test]
    fn continue_tokens_round_trip_and_reject_garbage() {
        let key = ("ns".to_string(), "a/b".to_string());
        let t = encode_continue(42, &key);
        assert_eq!(decode_continue(&t).unwrap(), (42, key));
        assert_eq!(decode_continue("zz").unwrap_err().code, 400);
        assert_eq!(decode_continue("abc").unwrap_err().code, 400);
    }
}
