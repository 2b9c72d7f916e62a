//! `netwarden promote --kube`: read one policy from the cluster and change its annotations
//! with a JSON merge patch (RFC 7386).
//!
//! This is a user command run with the user's kubeconfig (as kubectl), not the agent: the
//! agent's ClusterRole stays read-only plus Events. The patch carries the `resourceVersion`
//! the decision was made on as a precondition, so a policy changed in between (by someone
//! else, or its mode already switched) is refused with a conflict instead of being promoted
//! on a stale reading.

use std::path::Path;

use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::Value;

use crate::client::{client, ClientTimeouts};
use crate::list::DEFAULT_REQUEST_TIMEOUT;
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

async fn api(
    kubeconfig: Option<&Path>,
    kind: &'static WatchedKind,
    namespace: &str,
) -> Result<(Api<RawObject>, kube::api::ApiResource), KubeError> {
    let (client, _): (Client, _) = client(
        kubeconfig,
        ClientTimeouts::one_shot(DEFAULT_REQUEST_TIMEOUT),
        None,
    )
    .await?;
    let version = served_version(&client, kind)
        .await
        .map_err(|source| KubeError::Discovery {
            kind: kind.kind,
            source,
        })?
        .ok_or(KubeError::NotServed { kind: kind.kind })?;
    let resource = api_resource(kind, version);
    Ok((Api::namespaced_with(client, namespace, &resource), resource))
}

/// The object `namespace/name` of `kind` as JSON (with apiVersion and kind), or `None` when
/// the cluster has no such object.
pub fn get_object(
    kubeconfig: Option<&Path>,
    kind: &'static WatchedKind,
    namespace: &str,
    name: &str,
) -> Result<Option<Value>, KubeError> {
    block_on(async {
        let (api, resource) = api(kubeconfig, kind, namespace).await?;
        let object = api
            .get_opt(name)
            .await
            .map_err(|source| KubeError::Object {
                kind: kind.kind,
                name: format!("{namespace}/{name}"),
                source,
            })?;
        Ok(object.map(|o| o.into_typed_value(&resource)))
    })
}

/// Sends `patch` (a JSON merge patch) to `namespace/name` of `kind`; returns the object after.
pub fn merge_patch(
    kubeconfig: Option<&Path>,
    kind: &'static WatchedKind,
    namespace: &str,
    name: &str,
    patch: &Value,
) -> Result<Value, KubeError> {
    block_on(async {
        let (api, resource) = api(kubeconfig, kind, namespace).await?;
        let object = api
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|source| KubeError::Object {
                kind: kind.kind,
                name: format!("{namespace}/{name}"),
                source,
            })?;
        Ok(object.into_typed_value(&resource))
    })
}
