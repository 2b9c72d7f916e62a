//! `netwarden promote --kube`: read one policy from the cluster and change its annotations
//! with a JSON merge patch (RFC 7386). A namespaced kind's object is named with its namespace,
//! a cluster-scoped kind's (the admin policies of SPEC 8) without one.
//!
//! This is a user command run with the user's kubeconfig (as kubectl), not the agent: the
//! agent's ClusterRole stays read-only plus Events. The patch carries the `resourceVersion`
//! the decision was made on as a precondition, so a policy changed in between (by someone
//! else, or its mode already switched) is refused with a conflict instead of being promoted
//! on a stale reading.

use std::path::Path;
use std::time::Duration;

use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::Value;

use crate::client::{client, Asked, ClientTimeouts};
use crate::{api_resource, served_version, KubeError, RawObject, WatchedKind};

/// Blocking: one current-thread runtime per call (a user command does one or two calls).
fn block_on<T>(
    future: impl std::future::Future<Output = Result<T, KubeError>>,
) -> Result<T, KubeError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(KubeError::Runtime)?
        .block_on(future)
}

/// The API of `kind` (in `namespace` when it is namespaced, cluster-wide when not) at its
/// served version, and who answers. A namespace given for a cluster-scoped kind, or missing
/// for a namespaced one, is refused before anything is asked.
async fn api(
    kubeconfig: Option<&Path>,
    request_timeout: Duration,
    kind: &'static WatchedKind,
    namespace: Option<&str>,
) -> Result<(Api<RawObject>, kube::api::ApiResource, Asked), KubeError> {
    if kind.namespaced != namespace.is_some() {
        return Err(KubeError::Scope {
            kind: kind.kind,
            namespaced: kind.namespaced,
        });
    }
    let timeouts = ClientTimeouts::one_shot(request_timeout);
    let (client, server): (Client, _) = client(kubeconfig, timeouts, None).await?;
    let asked = Asked {
        server,
        timeout: timeouts.read,
    };
    let version = served_version(&client, kind)
        .await
        .map_err(|source| asked.discovery_error(kind.kind, source))?
        .ok_or(KubeError::NotServed { kind: kind.kind })?;
    let resource = api_resource(kind, version);
    let api = match namespace {
        Some(namespace) => Api::namespaced_with(client, namespace, &resource),
        None => Api::all_with(client, &resource),
    };
    Ok((api, resource, asked))
}

/// The error of a request about `namespace/name` (or `name`) of `kind`.
fn object_error(
    asked: &Asked,
    verb: &str,
    kind: &'static WatchedKind,
    namespace: Option<&str>,
    name: &str,
) -> impl FnOnce(kube::Error) -> KubeError {
    let name = match namespace {
        Some(namespace) => format!("{namespace}/{name}"),
        None => name.to_string(),
    };
    let (asked, verb) = (asked.clone(), verb.to_string());
    move |source| {
        let what = format!("{verb} of {} {name}", kind.kind);
        asked.error(
            || what,
            source,
            |source| KubeError::Object {
                kind: kind.kind,
                name,
                source,
            },
        )
    }
}

/// The object `namespace/name` of `kind` (`name` alone, `namespace` `None`, for a
/// cluster-scoped kind) as JSON (with apiVersion and kind), or `None` when the cluster has no
/// such object. Each answer of the API server is awaited at most `request_timeout`.
pub fn get_object(
    kubeconfig: Option<&Path>,
    request_timeout: Duration,
    kind: &'static WatchedKind,
    namespace: Option<&str>,
    name: &str,
) -> Result<Option<Value>, KubeError> {
    block_on(async {
        let (api, resource, asked) = api(kubeconfig, request_timeout, kind, namespace).await?;
        let object = api
            .get_opt(name)
            .await
            .map_err(object_error(&asked, "get", kind, namespace, name))?;
        Ok(object.map(|o| o.into_typed_value(&resource)))
    })
}

/// Sends `patch` (a JSON merge patch) to `namespace/name` of `kind` (`name` alone for a
/// cluster-scoped kind); returns the object after.
/// Each answer of the API server is awaited at most `request_timeout`.
pub fn merge_patch(
    kubeconfig: Option<&Path>,
    request_timeout: Duration,
    kind: &'static WatchedKind,
    namespace: Option<&str>,
    name: &str,
    patch: &Value,
) -> Result<Value, KubeError> {
    block_on(async {
        let (api, resource, asked) = api(kubeconfig, request_timeout, kind, namespace).await?;
        let object = api
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(object_error(&asked, "patch", kind, namespace, name))?;
        Ok(object.into_typed_value(&resource))
    })
}
