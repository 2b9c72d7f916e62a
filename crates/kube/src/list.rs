//! One look at the cluster, for the analysis commands (`reach`, `explain`, `validate
//! --kube`): every kind of [`watched`] listed once (in pages), no watch, each object reduced
//! into a [`ClusterSet`] exactly as the watchers of `run --kube` do — so a question asked of
//! the live cluster gets the answer the agent would enforce.
//!
//! An optional kind (a CRD) the cluster does not serve is skipped and reported in
//! [`Listed::skipped`]; any other failure (a kind that must be served is not, a page that
//! cannot be read) is an error: an analysis of half a cluster would answer with confidence
//! about traffic it never saw.

use std::path::PathBuf;
use std::time::Duration;

use std::collections::HashMap;

use kube::api::{ApiResource, ListParams};
use kube::{Api, Client};
use netwarden_manifest::{ClusterKey, ClusterSet, LoadOptions, Problem, Severity, CLUSTER_SOURCE};

use crate::client::{client, Asked, ClientTimeouts};
use crate::{api_resource, served_version, watched, KubeError, RawObject, WatchedKind};

/// Objects per LIST page (the API server's own default page size for kubectl is 500).
pub const DEFAULT_PAGE_SIZE: u32 = 500;

/// How long a one-shot command waits for each answer of the API server by default.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How to reach the cluster and what to list.
#[derive(Debug, Clone)]
pub struct ListOptions {
    /// A kubeconfig file; `None`: `KUBECONFIG`, `~/.kube/config`, then in-cluster (as kubectl).
    pub kubeconfig: Option<PathBuf>,
    /// `network_policy_enabled: false` leaves NetworkPolicies out of the listing, as
    /// `--no-network-policy` does for the watchers.
    pub load: LoadOptions,
    /// Objects per page: a kind with more objects is listed in several requests.
    pub page_size: u32,
    /// How long to wait for each answer (and at most 10 s to connect): a server that accepts
    /// the connection and never answers fails the command then, naming itself.
    pub request_timeout: Duration,
}

/// What one listing found.
#[derive(Debug)]
pub struct Listed {
    /// Every object listed, reduced; problems name the source `cluster`.
    pub cluster: ClusterSet,
    /// The kinds listed, with the version they were listed at.
    pub listed: Vec<(&'static WatchedKind, &'static str)>,
    /// Optional kinds the cluster does not serve (CRD not installed): not listed.
    pub skipped: Vec<&'static WatchedKind>,
}

impl Listed {
    /// One line per skipped kind, for the user (e.g. on stderr).
    pub fn notes(&self) -> Vec<String> {
        self.skipped
            .iter()
            .map(|kind| {
                format!(
                    "{} ({}) is not served by the cluster (CRD not installed?): skipped",
                    kind.kind,
                    kind.versions
                        .iter()
                        .map(|v| kind.api_version(v))
                        .collect::<Vec<_>>()
                        .join(" or ")
                )
            })
            .collect()
    }
}

/// Lists the cluster once (blocking: the analysis commands are synchronous). Reads the
/// client configuration as `run --kube` does.
pub fn list_once(options: &ListOptions) -> Result<Listed, KubeError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(KubeError::Runtime)?;
    runtime.block_on(list_all(options))
}

async fn list_all(options: &ListOptions) -> Result<Listed, KubeError> {
    let timeouts = ClientTimeouts::one_shot(options.request_timeout);
    let (client, server) = client(options.kubeconfig.as_deref(), timeouts, None).await?;
    let asked = Asked {
        server,
        timeout: timeouts.read,
    };
    let mut found = Listed {
        cluster: ClusterSet::new(options.load.clone()),
        listed: Vec::new(),
        skipped: Vec::new(),
    };
    for kind in watched(options.load.network_policy_enabled) {
        let version = if kind.optional {
            match served_version(&client, kind)
                .await
                .map_err(|source| asked.discovery_error(kind.kind, source))?
            {
                Some(version) => version,
                None => {
                    found.skipped.push(kind);
                    continue;
                }
            }
        } else {
            kind.versions[0]
        };
        list_kind(
            &client,
            kind,
            version,
            options.page_size,
            &mut found.cluster,
        )
        .await
        .map_err(|e| match e {
            KubeError::List {
                kind,
                api_version,
                source,
            } => asked.error(
                || format!("list of {kind} ({api_version})"),
                source,
                |source| KubeError::List {
                    kind,
                    api_version: api_version.clone(),
                    source,
                },
            ),
            e => e,
        })?;
        found.listed.push((kind, version));
    }
    Ok(found)
}

/// Lists one kind cluster-wide, page by page, into `cluster`.
async fn list_kind(
    client: &Client,
    kind: &'static WatchedKind,
    version: &'static str,
    page_size: u32,
    cluster: &mut ClusterSet,
) -> Result<(), KubeError> {
    let resource = api_resource(kind, version);
    let api: Api<RawObject> = Api::all_with(client.clone(), &resource);
    let mut params = ListParams::default().limit(page_size.max(1));
    let mut screen = ListScreen::default();
    cluster.clear_list_problems(kind.kind);
    loop {
        let page = api.list(&params).await.map_err(|source| KubeError::List {
            kind: kind.kind,
            api_version: resource.api_version.clone(),
            source,
        })?;
        for object in page.items {
            match screen.screen(&object, &resource) {
                Ok(()) => {
                    cluster.upsert(&object.into_typed_value(&resource));
                }
                Err(problem) => {
                    cluster.report_list_problem(kind.kind, *problem);
                }
            }
        }
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(()),
        }
    }
}

/// Screens the items of one LIST of a kind (all its pages) before they are reduced. A list
/// names each object once and holds only the kind asked for; an API server (or something
/// between) that breaks that is not followed silently:
/// - an object named a second time (whatever its uid) is ignored, the first kept, and an
///   Error reported: replacing the first with the second dropped its pod's rules unreported;
/// - an item that says it is of another kind (or another apiVersion) is ignored and reported:
///   it would otherwise be read as the listed kind.
#[derive(Debug, Default)]
pub(crate) struct ListScreen {
    /// Namespace and name of each object kept, with its uid.
    seen: HashMap<(String, String), Option<String>>,
}

impl ListScreen {
    /// `Ok`: reduce the object; `Err`: skip it, reporting the problem.
    pub(crate) fn screen(
        &mut self,
        object: &crate::RawObject,
        resource: &ApiResource,
    ) -> Result<(), Box<Problem>> {
        let (namespace, name) = object.namespace_and_name();
        let (api_version, stated_kind) = object.stated_type();
        if stated_kind.is_some_and(|k| k != resource.kind)
            || api_version.is_some_and(|v| v != resource.api_version)
        {
            let kind = stated_kind.unwrap_or(&resource.kind);
            return Err(Box::new(Problem {
                file: CLUSTER_SOURCE.to_string(),
                kind: kind.to_string(),
                object: ClusterKey::new(kind, namespace, name).object(),
                field: "kind".to_string(),
                reason: format!(
                    "an item of kind {kind} ({}) in the list of {} ({}): ignored",
                    api_version.unwrap_or("no apiVersion"),
                    resource.kind,
                    resource.api_version
                ),
                severity: Severity::Error,
            }));
        }
        let uid = object.uid_str().map(str::to_owned);
        match self.seen.get(&(namespace.to_string(), name.to_string())) {
            Some(first) => Err(Box::new(Problem {
                file: CLUSTER_SOURCE.to_string(),
                kind: resource.kind.clone(),
                object: ClusterKey::new(&resource.kind, namespace, name).object(),
                field: "metadata.name".to_string(),
                reason: format!(
                    "listed twice in one list (uid {}, then uid {}): the first is kept, the \
                     second ignored",
                    first.as_deref().unwrap_or("none"),
                    uid.as_deref().unwrap_or("none")
                ),
                severity: Severity::Error,
            })),
            None => {
                self.seen
                    .insert((namespace.to_string(), name.to_string()), uid);
                Ok(())
            }
        }
    }
}
