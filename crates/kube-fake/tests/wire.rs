//! The exact wire format, read over a raw TCP connection: a 410 inside a watch stream, a
//! BOOKMARK, the clean end of a timed-out watch, the abrupt end of a cut one, and a 410 LIST.

use std::time::Duration;

use netwarden_kube_fake::{FakeApiServer, ServerOptions};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A raw HTTP/1.1 response: status, headers (lower-cased names), the raw body bytes, and the
/// body with chunked encoding removed.
struct Raw {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// Whether the body ended with the last (zero-length) chunk.
    complete: bool,
}

impl Raw {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn lines(&self) -> Vec<Value> {
        std::str::from_utf8(&self.body)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("line {l:?}: {e}")))
            .collect()
    }
}

fn dechunk(mut raw: &[u8]) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    loop {
        let Some(eol) = raw.windows(2).position(|w| w == b"\r\n") else {
            return (out, false);
        };
        let size =
            usize::from_str_radix(std::str::from_utf8(&raw[..eol]).unwrap().trim(), 16).unwrap();
        raw = &raw[eol + 2..];
        if size == 0 {
            return (out, true);
        }
        if raw.len() < size + 2 {
            out.extend_from_slice(&raw[..raw.len().min(size)]);
            return (out, false);
        }
        out.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}

/// Sends a GET with `Connection: close` and reads until the server closes the connection.
async fn get(server: &FakeApiServer, path_and_query: &str) -> Raw {
    let mut stream = TcpStream::connect(server.addr()).await.unwrap();
    let request = format!("GET {path_and_query} HTTP/1.1\r\nHost: fake\r\nAccept: application/json\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(15), async {
        // A cut connection may end with a reset: keep what was read.
        let mut chunk = [0u8; 8192];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await
    .expect("the response ends within the wait");
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a header block");
    let head = std::str::from_utf8(&buf[..split]).unwrap();
    let mut head_lines = head.split("\r\n");
    let status = head_lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = head_lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let rest = &buf[split + 4..];
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v == "chunked");
    let (body, complete) = if chunked {
        dechunk(rest)
    } else {
        (rest.to_vec(), true)
    };
    Raw {
        status,
        headers,
        body,
        complete,
    }
}

async fn server_with_pods() -> FakeApiServer {
    let options = ServerOptions {
        bookmark_interval: Duration::from_millis(300),
        ..ServerOptions::default()
    };
    let server = FakeApiServer::start(options).await.unwrap();
    server
        .create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}}))
        .unwrap();
    for name in ["p1", "p2"] {
        server
            .create(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "a"}}))
            .unwrap();
    }
    server
}

#[tokio::test]
async fn a_watch_from_a_forgotten_version_gets_a_410_error_event() {
    let server = server_with_pods().await;
    let old = server.resource_version() - 1;
    server.compact();
    let current = server.resource_version();
    let raw = get(
        &server,
        &format!("/api/v1/namespaces/a/pods?watch=true&resourceVersion={old}&timeoutSeconds=5"),
    )
    .await;
    // The request succeeds; the failure is the one event in the stream, which then ends.
    assert_eq!(raw.status, 200);
    assert_eq!(raw.header("transfer-encoding"), Some("chunked"));
    assert!(raw.complete);
    assert_eq!(
        raw.lines(),
        [json!({"type": "ERROR", "object": {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("too old resource version: {old} ({current})"),
            "reason": "Expired", "code": 410,
        }})]
    );
    // The same version on a LIST with resourceVersionMatch=Exact is an HTTP 410.
    let list = get(
        &server,
        &format!("/api/v1/pods?resourceVersion={old}&resourceVersionMatch=Exact"),
    )
    .await;
    assert_eq!(list.status, 410);
    let status: Value = serde_json::from_slice(&list.body).unwrap();
    assert_eq!(
        (status["kind"].as_str(), status["reason"].as_str()),
        (Some("Status"), Some("Expired"))
    );
}

#[tokio::test]
async fn bookmarks_carry_only_kind_api_version_and_resource_version_and_timeouts_end_cleanly() {
    let server = server_with_pods().await;
    let rv = server.resource_version();
    let raw = get(
        &server,
        &format!("/api/v1/namespaces/a/pods?watch=1&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=1"),
    )
    .await;
    assert_eq!(raw.status, 200);
    assert!(raw.complete, "a timed-out watch ends with the last chunk");
    let lines = raw.lines();
    assert!(!lines.is_empty(), "at least one bookmark in a second");
    for line in &lines {
        assert_eq!(
            line,
            &json!({"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1",
                    "metadata": {"resourceVersion": rv.to_string()}}})
        );
    }
}

#[tokio::test]
async fn send_initial_events_gives_added_then_the_annotated_bookmark() {
    let server = server_with_pods().await;
    let raw = get(
        &server,
        "/api/v1/pods?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&resourceVersion=0&timeoutSeconds=1",
    )
    .await;
    let lines = raw.lines();
    let types: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert_eq!(&types[..3], ["ADDED", "ADDED", "BOOKMARK"]);
    assert_eq!(
        lines[2]["object"]["metadata"]["annotations"],
        json!({"k8s.io/initial-events-end": "true"})
    );
    assert_eq!(
        lines[2]["object"]["metadata"]["resourceVersion"],
        server.resource_version().to_string()
    );
    // Without bookmarks the request is invalid, as on the real server.
    let bad = get(
        &server,
        "/api/v1/pods?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
    )
    .await;
    assert_eq!(bad.status, 422);
}

#[tokio::test]
async fn drop_watches_cuts_the_stream_without_its_last_chunk() {
    let server = server_with_pods().await;
    let rv = server.resource_version();
    let path =
        format!("/api/v1/namespaces/a/pods?watch=true&resourceVersion={rv}&timeoutSeconds=30");
    let reading = tokio::spawn({
        let addr = server.addr();
        async move {
            // Re-create a handle-free client: the server object stays with the test.
            let mut stream = TcpStream::connect(addr).await.unwrap();
            let request = format!("GET {path} HTTP/1.1\r\nHost: fake\r\nConnection: close\r\n\r\n");
            stream.write_all(request.as_bytes()).await.unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            loop {
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            buf
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    server
        .create(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p3", "namespace": "a"}}))
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.drop_watches();
    let buf = tokio::time::timeout(Duration::from_secs(10), reading)
        .await
        .unwrap()
        .unwrap();
    let split = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let (body, complete) = dechunk(&buf[split + 4..]);
    assert!(!complete, "a cut watch must not look like a clean end");
    let line: Value = serde_json::from_slice(body.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!(
        (
            line["type"].as_str(),
            line["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("p3"))
    );
}

#[tokio::test]
async fn discovery_and_not_installed_crds_on_the_wire() {
    let server = server_with_pods().await;
    let raw = get(&server, "/apis/danm.k8s.io/v1/namespaces/a/danmeps").await;
    assert_eq!(raw.status, 404);
    let status: Value = serde_json::from_slice(&raw.body).unwrap();
    assert_eq!(
        (status["kind"].as_str(), status["reason"].as_str()),
        (Some("Status"), Some("NotFound"))
    );
    server.install_crd("danm.k8s.io", "v1", "DanmEp");
    assert_eq!(
        get(&server, "/apis/danm.k8s.io/v1/namespaces/a/danmeps")
            .await
            .status,
        200
    );
    let list: Value =
        serde_json::from_slice(&get(&server, "/apis/danm.k8s.io/v1").await.body).unwrap();
    assert_eq!(list["kind"], "APIResourceList");
    assert_eq!(list["resources"][0]["name"], "danmeps");
    let groups: Value = serde_json::from_slice(&get(&server, "/apis").await.body).unwrap();
    assert!(groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .any(|g| g["name"] == "danm.k8s.io"));
}

/// `hide_group`: the group leaves discovery and its paths are 404, as for a CRD not
/// installed; its objects come back with it.
#[tokio::test]
async fn a_hidden_group_is_absent_then_back_with_its_objects() {
    let server = server_with_pods().await;
    server.install_crd("danm.k8s.io", "v1", "DanmEp");
    server
        .create(json!({"apiVersion": "danm.k8s.io/v1", "kind": "DanmEp",
                       "metadata": {"name": "ep", "namespace": "a"}}))
        .unwrap();
    server.hide_group("danm.k8s.io", true);
    for path in [
        "/apis/danm.k8s.io",
        "/apis/danm.k8s.io/v1",
        "/apis/danm.k8s.io/v1/danmeps",
        "/apis/danm.k8s.io/v1/namespaces/a/danmeps/ep",
        "/apis/danm.k8s.io/v1/danmeps?watch=true",
    ] {
        assert_eq!(get(&server, path).await.status, 404, "{path}");
    }
    let groups: Value = serde_json::from_slice(&get(&server, "/apis").await.body).unwrap();
    assert!(!groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .any(|g| g["name"] == "danm.k8s.io"));
    // Other groups are served.
    assert_eq!(get(&server, "/api/v1/pods").await.status, 200);
    server.hide_group("danm.k8s.io", false);
    let list: Value =
        serde_json::from_slice(&get(&server, "/apis/danm.k8s.io/v1/danmeps").await.body).unwrap();
    assert_eq!(list["items"][0]["metadata"]["name"], "ep");
}

/// `delete_crd`: as kube-apiserver's CRD finalizer, the objects are deleted first (a DELETED
/// event each on an open watch), then the watch ends cleanly, the kind's paths are 404 and its
/// version leaves discovery (the group stays while another of its CRDs is served).
#[tokio::test]
async fn a_deleted_crd_deletes_its_objects_with_events_then_leaves() {
    let server = server_with_pods().await;
    let group = "policy.networking.k8s.io";
    server.install_crd(group, "v1alpha2", "ClusterNetworkPolicy");
    server.install_crd(group, "v1alpha1", "AdminNetworkPolicy");
    let cnp = |name: &str| {
        json!({"apiVersion": "policy.networking.k8s.io/v1alpha2",
               "kind": "ClusterNetworkPolicy", "metadata": {"name": name}})
    };
    for name in ["p1", "p2"] {
        server.create(cnp(name)).unwrap();
    }
    let path = "/apis/policy.networking.k8s.io/v1alpha2/clusternetworkpolicies";
    let watch = format!(
        "{path}?watch=true&resourceVersion={}",
        server.resource_version()
    );
    let deleting = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        server.delete_crd(group, "ClusterNetworkPolicy")
    };
    let (raw, deleted) = tokio::join!(get(&server, &watch), deleting);
    assert_eq!((raw.status, deleted), (200, 2));
    assert!(raw.complete, "the watch ends cleanly");
    let events: Vec<(String, String)> = raw
        .lines()
        .iter()
        .map(|l| {
            let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
            (text(&l["type"]), text(&l["object"]["metadata"]["name"]))
        })
        .collect();
    let want = [("DELETED", "p1"), ("DELETED", "p2")].map(|(t, n)| (t.to_string(), n.to_string()));
    assert_eq!(events, want);

    for gone in [
        path,
        "/apis/policy.networking.k8s.io/v1alpha2",
        &format!("{path}/p1"),
    ] {
        assert_eq!(get(&server, gone).await.status, 404, "{gone}");
    }
    let doc: Value =
        serde_json::from_slice(&get(&server, "/apis/policy.networking.k8s.io").await.body).unwrap();
    assert_eq!(
        doc["versions"],
        json!([{"groupVersion": "policy.networking.k8s.io/v1alpha1", "version": "v1alpha1"}])
    );
    assert!(server.create(cnp("p3")).is_err(), "no kind to create in");
    assert!(server.objects("ClusterNetworkPolicy").is_empty());
    // Installed again, it has no object.
    server.install_crd(group, "v1alpha2", "ClusterNetworkPolicy");
    let list: Value = serde_json::from_slice(&get(&server, path).await.body).unwrap();
    assert_eq!(list["items"], json!([]));
    assert_eq!(server.delete_crd("example.com", "Widget"), 0, "no such CRD");
}

/// `inject_in_lists`: raw items after the stored ones, on every page; watches unaffected.
#[tokio::test]
async fn injected_items_end_every_list_page() {
    let server = server_with_pods().await;
    server.inject_in_lists(
        "Pod",
        vec![json!({"metadata": {"name": "p1", "namespace": "a", "uid": "twin"}})],
    );
    let list: Value =
        serde_json::from_slice(&get(&server, "/api/v1/pods?limit=1").await.body).unwrap();
    let names: Vec<_> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["uid"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(names.len(), 2, "{list}");
    assert_eq!(names[1], "twin");
    server.inject_in_lists("Pod", Vec::new());
    let list: Value = serde_json::from_slice(&get(&server, "/api/v1/pods").await.body).unwrap();
    assert_eq!(list["items"].as_array().unwrap().len(), 2);
}
