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

use kube::api::ListParams;
use kube::{Api, Client};
use netwarden_manifest::{ClusterSet, LoadOptions};

use crate::{api_resource, client, served_version, watched, KubeError, RawObject, WatchedKind};

/// Objects per LIST page (the API server's own default page size for kubectl is 500).
pub const DEFAULT_PAGE_SIZE: u32 = 500;

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
    let client = client(options.kubeconfig.as_deref()).await?;
    let mut found = Listed {
        cluster: ClusterSet::new(options.load.clone()),
        listed: Vec::new(),
        skipped: Vec::new(),
    };
    for kind in watched(options.load.network_policy_enabled) {
        let version = if kind.optional {
            match served_version(&client, kind)
                .await
                .map_err(|source| KubeError::Discovery {
                    kind: kind.kind,
                    source,
                })? {
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
        .await?;
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
    loop {
        let page = api.list(&params).await.map_err(|source| KubeError::List {
            kind: kind.kind,
            api_version: resource.api_version.clone(),
            source,
        })?;
        for object in page.items {
            cluster.upsert(&object.into_typed_value(&resource));
        }
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(()),
        }
    }
}
