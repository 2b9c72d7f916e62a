//! The one place a `kube::Client` is built: the client configuration read as kubectl reads
//! it, with timeouts, and a layer that tells the watchers when the API server accepted one of
//! their watch requests.
//!
//! Timeouts: kube's own configuration has no read timeout, so an API server that accepts TCP
//! and never answers held every `--kube` command forever. A one-shot command (`validate
//! --kube`, ...) uses [`ClientTimeouts::one_shot`]; the agent's watches stay open for kube's
//! watch timeout (290 s) and may be quiet for all of it, so its read timeout
//! ([`ClientTimeouts::watching`]) is longer than that.
//!
//! Accepted watches: kube's watcher yields nothing when a watch request succeeds (only the
//! events that follow), so a quiet kind that failed once (an `ERROR` event, an outage) stayed
//! "failing" until its next event — hours on a quiet cluster. [`WatchAccepted`] sees every
//! HTTP 200 to a `watch=true` request and notifies whoever registered that path.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use kube::client::{Body, ClientBuilder};
use kube::Client;
use tokio::sync::Notify;

use crate::KubeError;

/// How long the client waits for the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientTimeouts {
    /// To open a connection (TCP and TLS).
    pub connect: Duration,
    /// Between two reads of a response (its headers, then each chunk of its body).
    pub read: Duration,
}

impl ClientTimeouts {
    /// For a command that lists once and exits.
    pub fn one_shot(request: Duration) -> ClientTimeouts {
        ClientTimeouts {
            connect: request.min(Duration::from_secs(10)),
            read: request,
        }
    }

    /// For the agent's watchers: a watch may be quiet for its whole timeout (kube sends
    /// `timeoutSeconds=290` and expects the server to end it then), so reads may wait longer
    /// than that before the connection is judged dead.
    pub fn watching() -> ClientTimeouts {
        ClientTimeouts {
            connect: Duration::from_secs(10),
            read: Duration::from_secs(290 + 30),
        }
    }
}

/// Who wants to hear of accepted watch requests, by request path (`/api/v1/pods`).
#[derive(Debug, Default)]
pub(crate) struct WatchAccepted {
    by_path: Mutex<HashMap<String, Arc<Notify>>>,
}

impl WatchAccepted {
    /// The notification for watches of `path` (registering it).
    pub(crate) fn register(&self, path: &str) -> Arc<Notify> {
        crate::lock(&self.by_path)
            .entry(path.to_string())
            .or_default()
            .clone()
    }

    fn accepted(&self, path: &str) {
        if let Some(notify) = crate::lock(&self.by_path).get(path) {
            // A permit is stored when nobody waits: the next wait sees it.
            notify.notify_one();
        }
    }
}

/// The tower layer of [`WatchAccepted`].
#[derive(Clone)]
struct AcceptedLayer(Arc<WatchAccepted>);

impl<S> tower::Layer<S> for AcceptedLayer {
    type Service = AcceptedService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        AcceptedService {
            inner,
            accepted: self.0.clone(),
        }
    }
}

#[derive(Clone)]
struct AcceptedService<S> {
    inner: S,
    accepted: Arc<WatchAccepted>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> tower::Service<Request<Body>> for AcceptedService<S>
where
    S: tower::Service<Request<Body>, Response = Response<B>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    B: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let watch = req
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
        let path = watch.then(|| req.uri().path().to_string());
        let accepted = self.accepted.clone();
        let response = self.inner.call(req);
        Box::pin(async move {
            let response = response.await;
            if let (Some(path), Ok(r)) = (path, &response) {
                if r.status() == http::StatusCode::OK {
                    accepted.accepted(&path);
                }
            }
            response
        })
    }
}

/// The server URL a kubeconfig (or the environment) names, for messages.
pub(crate) type Server = String;

/// Reads the client configuration (`kubeconfig`, or as kubectl finds it) and builds a client
/// with `timeouts`; with `accepted`, watch requests the server accepts are reported there.
pub(crate) async fn client(
    kubeconfig: Option<&std::path::Path>,
    timeouts: ClientTimeouts,
    accepted: Option<Arc<WatchAccepted>>,
) -> Result<(Client, Server), KubeError> {
    let mut config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path).map_err(|source| {
                KubeError::Kubeconfig {
                    path: path.to_path_buf(),
                    source,
                }
            })?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|source| KubeError::Kubeconfig {
                    path: path.to_path_buf(),
                    source,
                })?
        }
        None => kube::Config::infer().await.map_err(KubeError::Infer)?,
    };
    config.connect_timeout = Some(timeouts.connect);
    config.read_timeout = Some(timeouts.read);
    config.write_timeout = Some(timeouts.read);
    // The read timeout counts from each request, not from when its pooled connection last
    // carried something.
    config.reset_reader_on_write = true;
    let server = config.cluster_url.to_string();
    let builder = ClientBuilder::try_from(config).map_err(KubeError::Client)?;
    let client = match accepted {
        Some(accepted) => builder.with_layer(&AcceptedLayer(accepted)).build(),
        None => builder.build(),
    };
    Ok((client, server))
}

/// The server a user command talks to and how long it waits for each answer: turns the
/// client's timeouts into [`KubeError::Timeout`] naming the server and what was asked.
#[derive(Debug, Clone)]
pub(crate) struct Asked {
    pub server: Server,
    pub timeout: std::time::Duration,
}

impl Asked {
    /// `source` as a timeout of `what` when it is one of ours, else as `otherwise` says.
    pub fn error(
        &self,
        what: impl FnOnce() -> String,
        source: kube::Error,
        otherwise: impl FnOnce(kube::Error) -> KubeError,
    ) -> KubeError {
        if is_timeout(&source) {
            KubeError::Timeout {
                server: self.server.clone(),
                timeout: self.timeout,
                what: what(),
                source: Box::new(source),
            }
        } else {
            otherwise(source)
        }
    }

    /// A discovery of `kind` that failed: a timeout, or [`KubeError::Discovery`].
    pub fn discovery_error(&self, kind: &'static str, source: kube::Error) -> KubeError {
        self.error(
            || format!("discovery of {kind}"),
            source,
            |source| KubeError::Discovery { kind, source },
        )
    }
}

/// Whether a client error is one of our timeouts (connect or read).
pub(crate) fn is_timeout(error: &kube::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::TimedOut {
                return true;
            }
        }
        if e.to_string().contains("timed out") {
            return true;
        }
        source = e.source();
    }
    false
}
