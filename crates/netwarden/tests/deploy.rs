//! `deploy/` is what a cluster runs, and nothing runs it here (no API server, no kubelet): these
//! tests check it against the code instead. Every document parses into its Kubernetes type
//! without losing a field; `crds.yaml` is exactly `netwarden crd`; the CRD schemas are
//! structural and accept every policy of `examples/` and `conformance/`; the ClusterRole grants
//! exactly what `kinds.rs` says the agent uses; the DaemonSet mounts what `node_paths.rs` says
//! the agent opens and passes only flags `netwarden run` has; the image installs what the binary
//! loads and runs.

#[path = "deploy_support/schema.rs"]
mod schema;
#[allow(dead_code)] // the helpers serve the conformance runners; this file reads cases with them
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps,
};
use netwarden::kinds::{EVENT_RESOURCES, EVENT_VERBS, WATCHED_KINDS, WATCH_VERBS};
use netwarden_agent::node_paths::{unix_socket_path, DEFAULT_CRI_ENDPOINTS, NETNS_DIR};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use support::case::{conformance_dir, load_cases, load_objects};
use support::variant::{self, Variant};

fn repo_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn deploy_dir() -> PathBuf {
    repo_dir().join("deploy")
}

/// The YAML files of `deploy/`, by file name.
fn deploy_yaml_files() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(deploy_dir())
        .expect("deploy/ exists")
        .map(|e| e.expect("deploy/ entry").file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    names.sort();
    names
}

/// The documents of `deploy/<name>`.
fn deploy_docs(name: &str) -> Vec<Value> {
    load_objects(&deploy_dir().join(name)).unwrap_or_else(|e| panic!("{e}"))
}

/// Deserializes `doc` into `T` and checks that serializing it back gives the same document: a
/// field the Kubernetes type does not know (a typo, a field indented one level off) would be
/// dropped by the API server, so it must not be in the file.
fn typed<T: DeserializeOwned + Serialize>(doc: &Value, what: &str) -> T {
    let object: T = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{what}: not a valid {}: {e}", std::any::type_name::<T>()));
    let back = serde_json::to_value(&object).unwrap();
    let lost = schema::differences(doc, &back, "");
    assert!(
        lost.is_empty(),
        "{what}: fields the Kubernetes type does not read or changes:\n  {}",
        lost.join("\n  ")
    );
    object
}

fn name_of(doc: &Value) -> String {
    format!(
        "{} {}",
        doc["kind"].as_str().unwrap_or("?"),
        doc["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// The one object of `kind` named `name` in `deploy/<file>`, typed.
fn deploy_object<T: DeserializeOwned + Serialize>(file: &str, kind: &str) -> T {
    let docs: Vec<Value> = deploy_docs(file)
        .into_iter()
        .filter(|d| d["kind"] == kind)
        .collect();
    assert_eq!(docs.len(), 1, "deploy/{file}: expected one {kind}");
    typed(&docs[0], &format!("deploy/{file}: {}", name_of(&docs[0])))
}

#[test]
fn every_document_parses_into_its_kubernetes_type() {
    let mut seen = BTreeMap::<String, usize>::new();
    for file in deploy_yaml_files() {
        if file == "kustomization.yaml" {
            continue; // not a Kubernetes object: `kustomization_lists_every_manifest`
        }
        for doc in deploy_docs(&file) {
            let what = format!("deploy/{file}: {}", name_of(&doc));
            let kind = doc["kind"].as_str().unwrap_or_default().to_string();
            match kind.as_str() {
                "CustomResourceDefinition" => drop(typed::<CustomResourceDefinition>(&doc, &what)),
                "ServiceAccount" => drop(typed::<ServiceAccount>(&doc, &what)),
                "ClusterRole" => drop(typed::<ClusterRole>(&doc, &what)),
                "ClusterRoleBinding" => drop(typed::<ClusterRoleBinding>(&doc, &what)),
                "DaemonSet" => drop(typed::<DaemonSet>(&doc, &what)),
                other => panic!("{what}: kind {other:?} has no check here; add its type"),
            }
            *seen.entry(kind).or_default() += 1;
        }
    }
    let expected: BTreeMap<String, usize> = [
        ("ClusterRole", 1),
        ("ClusterRoleBinding", 1),
        ("CustomResourceDefinition", 2),
        ("DaemonSet", 1),
        ("ServiceAccount", 1),
    ]
    .into_iter()
    .map(|(k, n)| (k.to_string(), n))
    .collect();
    assert_eq!(seen, expected);
}

#[test]
fn crds_yaml_is_the_output_of_netwarden_crd() {
    let out = Command::new(env!("CARGO_BIN_EXE_netwarden"))
        .arg("crd")
        .output()
        .expect("run netwarden crd");
    assert!(out.status.success(), "netwarden crd failed: {out:?}");
    let printed = String::from_utf8(out.stdout).expect("UTF-8");
    assert_eq!(printed, netwarden::crd::render_yaml().unwrap());
    let checked_in = std::fs::read_to_string(deploy_dir().join("crds.yaml")).unwrap();
    assert!(
        checked_in == printed,
        "deploy/crds.yaml differs from `netwarden crd` output: regenerate it with `{}`",
        netwarden::crd::REGENERATE
    );
}

/// The CRD of `kind`, as `netwarden crd` prints it.
fn crd(kind: &str) -> CustomResourceDefinition {
    netwarden::crd::crds()
        .into_iter()
        .find(|c| c.spec.names.kind == kind)
        .unwrap_or_else(|| panic!("no CRD for {kind}"))
}

#[test]
fn crds_serve_the_kinds_the_agent_watches() {
    let crds = netwarden::crd::crds();
    // Every CRD is watched, under its group, plural, scope and every served version.
    for c in &crds {
        let kind = netwarden::kinds::by_kind(&c.spec.names.kind)
            .unwrap_or_else(|| panic!("CRD {} is not watched", c.spec.names.kind));
        assert!(
            kind.optional,
            "{}: a CRD kind is marked optional",
            kind.kind
        );
        assert_eq!(c.spec.group, kind.group, "{}: group", kind.kind);
        assert_eq!(c.spec.names.plural, kind.plural, "{}: plural", kind.kind);
        assert_eq!(
            c.spec.scope,
            if kind.namespaced {
                "Namespaced"
            } else {
                "Cluster"
            },
            "{}: scope",
            kind.kind
        );
        assert_eq!(
            c.metadata.name.as_deref(),
            Some(format!("{}.{}", kind.plural, kind.group).as_str())
        );
        let served: BTreeSet<&str> = c
            .spec
            .versions
            .iter()
            .filter(|v| v.served)
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(
            served,
            kind.versions.iter().copied().collect(),
            "{}: served versions",
            kind.kind
        );
        let stored: Vec<&str> = c
            .spec
            .versions
            .iter()
            .filter(|v| v.storage)
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(stored, [kind.versions[0]], "{}: storage version", kind.kind);
    }

    let danm = crd("DanmNetworkPolicy");
    assert_eq!(
        danm.spec.names.short_names,
        Some(vec!["dnetpol".to_string()])
    );
    let v1 = &danm.spec.versions[0];
    assert!(
        v1.subresources.as_ref().is_some_and(|s| s.status.is_some()),
        "DanmNetworkPolicy has a status subresource"
    );
    let columns: Vec<(&str, &str)> = v1
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| (c.name.as_str(), c.json_path.as_str()))
        .collect();
    assert_eq!(
        columns,
        [
            ("Pod-Selector", ".spec.podSelector"),
            ("Policy-Types", ".spec.policyTypes"),
            ("Mode", ".metadata.annotations.netwarden\\.io/mode"),
            ("Age", ".metadata.creationTimestamp"),
        ]
    );
    // The networkSelector entry's type defaults to DanmNet (SPEC 1).
    let network_type = schema::at(
        spec_schema(&danm, "v1"),
        &[
            "ingress",
            "[]",
            "from",
            "[]",
            "networkSelector",
            "[]",
            "type",
        ],
    );
    assert_eq!(
        network_type.default.as_ref().map(|d| &d.0),
        Some(&Value::from("DanmNet"))
    );

    let multi = crd("MultiNetworkPolicy");
    assert_eq!(
        multi.spec.names.short_names,
        Some(vec!["multi-policy".to_string()])
    );
    // The two versions are the same API (no conversion webhook: see crd.rs).
    assert_eq!(
        spec_schema(&multi, "v1beta1"),
        spec_schema(&multi, "v1beta2")
    );
}

/// `spec` of the openAPIV3Schema of `version`.
fn spec_schema<'a>(crd: &'a CustomResourceDefinition, version: &str) -> &'a JSONSchemaProps {
    let root = root_schema(crd, version);
    root.properties
        .as_ref()
        .and_then(|p| p.get("spec"))
        .unwrap_or_else(|| panic!("{}: no spec in the schema", crd.spec.names.kind))
}

fn root_schema<'a>(crd: &'a CustomResourceDefinition, version: &str) -> &'a JSONSchemaProps {
    crd.spec
        .versions
        .iter()
        .find(|v| v.name == version)
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .unwrap_or_else(|| panic!("{} {version}: no schema", crd.spec.names.kind))
}

#[test]
fn crd_schemas_are_structural() {
    for c in netwarden::crd::crds() {
        for v in &c.spec.versions {
            let root = root_schema(&c, &v.name);
            let problems = schema::structural_problems(root);
            assert!(
                problems.is_empty(),
                "{} {}: the API server would refuse this schema:\n  {}",
                c.spec.names.kind,
                v.name,
                problems.join("\n  ")
            );
            // The only place unknown fields are kept is none: every field is declared, so the
            // API server prunes nothing a user wrote and netwarden reads.
            assert!(
                !serde_json::to_string(root)
                    .unwrap()
                    .contains("x-kubernetes-preserve-unknown-fields"),
                "{} {}: no field needs x-kubernetes-preserve-unknown-fields",
                c.spec.names.kind,
                v.name
            );
        }
    }
}

#[test]
fn the_structural_checker_finds_what_the_api_server_refuses() {
    let schema: JSONSchemaProps = serde_json::from_value(serde_json::json!({
        "type": "object",
        "properties": {
            "metadata": {"type": "object", "properties": {"labels": {"type": "object"}}},
            "spec": {
                "type": "object",
                "properties": {
                    "untyped": {"description": "no type"},
                    "referenced": {"$ref": "#/definitions/Other", "type": "object"},
                    "port": {"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}]},
                    "choice": {"type": "object", "anyOf": [{"properties": {"hidden": {"type": "string"}}}]},
                    "count": {"type": "integer", "default": "three"},
                },
            },
        },
    }))
    .unwrap();
    assert_eq!(
        schema::structural_problems(&schema),
        [
            "metadata: only name and generateName may be restricted",
            "spec.choice: hidden is only specified inside a junctor",
            "spec.choice.hidden: type inside anyOf/allOf/oneOf/not",
            "spec.count: default is invalid: spec.count: expected integer",
            "spec.referenced: $ref is not allowed",
            "spec.untyped: no type",
        ]
    );
}

/// Every DanmNetworkPolicy and MultiNetworkPolicy netwarden's own files hold: the examples, the
/// multi-network conformance cases, and the upstream NetworkPolicy cases moved to both kinds the
/// way the conformance runner moves them. `(where, object)`.
fn policies_of_the_repository() -> Vec<(String, Value)> {
    fn ours(v: &Value) -> bool {
        v["kind"] == "DanmNetworkPolicy" || v["kind"] == "MultiNetworkPolicy"
    }
    let mut found = Vec::new();
    let examples = repo_dir().join("examples");
    let mut files: Vec<PathBuf> = Vec::new();
    for dir in std::fs::read_dir(&examples).unwrap() {
        let dir = dir.unwrap().path();
        for f in std::fs::read_dir(&dir).into_iter().flatten() {
            files.push(f.unwrap().path());
        }
    }
    files.sort();
    for f in files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "yaml"))
    {
        for doc in load_objects(f).unwrap().into_iter().filter(ours) {
            found.push((f.display().to_string(), doc));
        }
    }
    let conformance = conformance_dir();
    for case in load_cases(&conformance.join("multinet")).unwrap() {
        for (i, step) in case.steps.iter().enumerate() {
            for p in step.policies.iter().filter(|p| ours(p)) {
                found.push((format!("{} step {i}", case.file.display()), p.clone()));
            }
        }
    }
    for case in load_cases(&conformance.join("netpol")).unwrap() {
        for (i, step) in case.steps.iter().enumerate() {
            for v in [Variant::MultiNetworkPolicy, Variant::Danm] {
                for p in variant::policies(v, &step.policies).unwrap() {
                    assert!(ours(&p), "{}: variant {}", case.name, v.name());
                    let at = format!("{} step {i} as {}", case.file.display(), v.name());
                    found.push((at, p));
                }
            }
        }
    }
    found
}

/// The schema of `kind` at the version of `apiVersion`.
fn schema_for(object: &Value) -> JSONSchemaProps {
    let kind = object["kind"].as_str().unwrap();
    let version = object["apiVersion"]
        .as_str()
        .and_then(|v| v.rsplit_once('/'))
        .map(|(_, v)| v)
        .unwrap();
    root_schema(&crd(kind), version).clone()
}

#[test]
fn crd_schemas_accept_every_policy_of_the_repository() {
    let policies = policies_of_the_repository();
    let count = |kind: &str| policies.iter().filter(|(_, p)| p["kind"] == kind).count();
    // The upstream suite alone moves about fifty cases to each kind.
    assert!(count("DanmNetworkPolicy") > 50 && count("MultiNetworkPolicy") > 50);
    let mut failures = Vec::new();
    for (at, policy) in &policies {
        let problems = schema::validate(&schema_for(policy), policy);
        if !problems.is_empty() {
            failures.push(format!(
                "{at}: {}\n    {}",
                name_of(policy),
                problems.join("\n    ")
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} policies refused or pruned by their CRD schema:\n{}",
        failures.len(),
        policies.len(),
        failures.join("\n")
    );
}

#[test]
fn crd_schemas_reject_wrong_types_and_unknown_fields() {
    let danm = |spec: Value| {
        serde_json::json!({
            "apiVersion": "danm.k8s.io/v1", "kind": "DanmNetworkPolicy",
            "metadata": {"name": "p", "namespace": "n"}, "spec": spec,
        })
    };
    let multi = |version: &str, spec: Value| {
        serde_json::json!({
            "apiVersion": format!("k8s.cni.cncf.io/{version}"), "kind": "MultiNetworkPolicy",
            "metadata": {"name": "p", "namespace": "n"}, "spec": spec,
        })
    };
    let accepted = danm(serde_json::json!({
        "podSelector": {"matchLabels": {"app": "db"}},
        "ingress": [{"from": [{"networkSelector": [{"name": "storage"},
                                                    {"name": "n/att", "type": "NAD"},
                                                    {"name": "cn", "type": "ClusterNetwork"}]}],
                     "ports": [{"port": "http"}, {"port": 80, "endPort": 90, "protocol": "TCP"}]}],
    }));
    assert_eq!(
        schema::validate(&schema_for(&accepted), &accepted),
        Vec::<String>::new()
    );
    let refused = [
        (
            danm(serde_json::json!({"podSelector": "app=db"})),
            "spec.podSelector: expected object",
        ),
        (
            danm(serde_json::json!({"ingress": [{"ports": [{"port": [80]}]}]})),
            "spec.ingress[0].ports[0].port: expected an integer or a string",
        ),
        (
            danm(serde_json::json!({"ingress": [{"ports": [{"port": 80, "endPort": "90"}]}]})),
            "spec.ingress[0].ports[0].endPort: expected integer",
        ),
        (
            danm(serde_json::json!({"egress": [{"to": [{"networkSelector": [{"type": "DanmNet"}]}]}]})),
            "spec.egress[0].to[0].networkSelector[0]: missing required field name",
        ),
        (
            danm(serde_json::json!({"ingress": [{"form": [{"podSelector": {}}]}]})),
            "spec.ingress[0].form: unknown field (the API server would prune it)",
        ),
        (
            danm(serde_json::json!({"podSelector": {"matchLabels": {"app": 1}}})),
            "spec.podSelector.matchLabels.app: expected string",
        ),
        (
            multi(
                "v1beta1",
                serde_json::json!({"ingress": [{"from": [{"networkSelector": [{"name": "x"}]}]}]}),
            ),
            "spec.ingress[0].from[0].networkSelector: unknown field (the API server would prune it)",
        ),
        (
            multi("v1beta2", serde_json::json!({"policyTypes": "Ingress"})),
            "spec.policyTypes: expected array",
        ),
        (
            multi("v1beta2", serde_json::json!({"ingress": [{"from": [{"ipBlock": {"except": []}}]}]})),
            "spec.ingress[0].from[0].ipBlock: missing required field cidr",
        ),
        // The values Kubernetes validates are enums (issue 20, defect 5): the API server
        // refuses them instead of storing a policy the agent cannot read.
        (
            danm(serde_json::json!({"policyTypes": ["Ingress", "Sideways"]})),
            "spec.policyTypes[1]: \"Sideways\" is not one of the allowed values",
        ),
        (
            multi("v1beta2", serde_json::json!({"podSelector": {"matchExpressions": [
                {"key": "app", "operator": "Maybe", "values": ["a"]}]}})),
            "spec.podSelector.matchExpressions[0].operator: \"Maybe\" is not one of the allowed values",
        ),
        (
            multi("v1beta1", serde_json::json!({"egress": [{"to": [{"namespaceSelector": {
                "matchExpressions": [{"key": "team", "operator": "in"}]}}]}]})),
            "spec.egress[0].to[0].namespaceSelector.matchExpressions[0].operator: \"in\" is not one of the allowed values",
        ),
        (
            danm(serde_json::json!({"ingress": [{"ports": [{"protocol": "ICMP", "port": 1}]}]})),
            "spec.ingress[0].ports[0].protocol: \"ICMP\" is not one of the allowed values",
        ),
        (
            danm(serde_json::json!({"ingress": [{"from": [{"networkSelector": [
                {"name": "storage", "type": "Bridge"}]}]}]})),
            "spec.ingress[0].from[0].networkSelector[0].type: \"Bridge\" is not one of the allowed values",
        ),
    ];
    for (object, problem) in refused {
        assert_eq!(
            schema::validate(&schema_for(&object), &object),
            [problem.to_string()],
            "{object}"
        );
    }
}

#[test]
fn cluster_role_grants_exactly_what_the_agent_uses() {
    let role: ClusterRole = deploy_object("rbac.yaml", "ClusterRole");
    let mut granted = BTreeSet::new();
    for rule in role.rules.iter().flatten() {
        assert!(
            rule.resource_names.is_none() && rule.non_resource_urls.is_none(),
            "{rule:?}: only whole resources are granted"
        );
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    assert!(
                        granted.insert((group.clone(), resource.clone(), verb.clone())),
                        "{group}/{resource} {verb}: granted twice"
                    );
                }
            }
        }
    }
    let mut used = BTreeSet::new();
    for kind in WATCHED_KINDS {
        for verb in WATCH_VERBS {
            used.insert((kind.group.into(), kind.plural.into(), verb.into()));
        }
    }
    for (group, resource) in EVENT_RESOURCES {
        for verb in EVENT_VERBS {
            used.insert((group.into(), resource.into(), verb.into()));
        }
    }
    let extra: Vec<_> = granted.difference(&used).collect();
    let missing: Vec<_> = used.difference(&granted).collect();
    assert!(
        extra.is_empty() && missing.is_empty(),
        "deploy/rbac.yaml and crates/kube/src/kinds.rs disagree:\n  granted, unused: \
         {extra:?}\n  used, not granted: {missing:?}"
    );

    // The binding gives this role to the DaemonSet's service account.
    let account: ServiceAccount = deploy_object("rbac.yaml", "ServiceAccount");
    let binding: ClusterRoleBinding = deploy_object("rbac.yaml", "ClusterRoleBinding");
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    assert_eq!(Some(&binding.role_ref.name), role.metadata.name.as_ref());
    let subjects = binding.subjects.unwrap_or_default();
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0].kind, "ServiceAccount");
    assert_eq!(Some(&subjects[0].name), account.metadata.name.as_ref());
    assert_eq!(subjects[0].namespace, account.metadata.namespace);
    let ds: DaemonSet = deploy_object("daemonset.yaml", "DaemonSet");
    let pod = ds.spec.template.spec.unwrap();
    assert_eq!(pod.service_account_name, account.metadata.name);
    assert_eq!(ds.metadata.namespace, account.metadata.namespace);
}

/// `deploy/kustomization.yaml`, read strictly: a misspelled key is an error, not ignored.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Kustomization {
    api_version: String,
    kind: String,
    namespace: String,
    resources: Vec<String>,
    images: Vec<KustomizeImage>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct KustomizeImage {
    name: String,
    new_name: String,
    new_tag: String,
}

#[test]
fn kustomization_lists_every_manifest() {
    let text = std::fs::read_to_string(deploy_dir().join("kustomization.yaml")).unwrap();
    let k: Kustomization = serde_saphyr::from_str(&text).expect("deploy/kustomization.yaml");
    assert_eq!(k.api_version, "kustomize.config.k8s.io/v1beta1");
    assert_eq!(k.kind, "Kustomization");
    let mut listed = k.resources.clone();
    listed.sort();
    let manifests: Vec<String> = deploy_yaml_files()
        .into_iter()
        .filter(|f| f != "kustomization.yaml")
        .collect();
    assert_eq!(
        listed, manifests,
        "deploy/kustomization.yaml must list every manifest of deploy/"
    );
    // The CRDs come first: kubectl applies in order, and nothing else may need them before.
    assert_eq!(k.resources[0], "crds.yaml");
    let ds: DaemonSet = deploy_object("daemonset.yaml", "DaemonSet");
    assert_eq!(Some(&k.namespace), ds.metadata.namespace.as_ref());
    // The DaemonSet's image is the one `images` rewrites.
    let image = agent_container(&ds).image.clone().unwrap();
    let (name, _tag) = image.split_once(':').unwrap();
    assert_eq!(k.images.len(), 1);
    assert_eq!(k.images[0].name, name);
    assert!(!k.images[0].new_name.is_empty() && !k.images[0].new_tag.is_empty());
}

fn agent_container(ds: &DaemonSet) -> &Container {
    let containers = &ds.spec.template.spec.as_ref().unwrap().containers;
    assert_eq!(containers.len(), 1, "one container");
    &containers[0]
}

/// The value following `flag` in `args`.
fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

#[test]
fn daemonset_mounts_the_cri_socket_and_netns_and_passes_the_node_name() {
    let ds: DaemonSet = deploy_object("daemonset.yaml", "DaemonSet");
    let pod = ds.spec.template.spec.as_ref().unwrap();
    let c = agent_container(&ds);
    let args = c.args.clone().unwrap_or_default();
    assert_eq!(c.command.as_deref(), Some(&["netwarden".to_string()][..]));
    assert_eq!(args[..2], ["run", "--kube"]);

    // NODE_NAME comes from the downward API and is what --node-name gets.
    let env = c.env.as_ref().unwrap();
    let node = env
        .iter()
        .find(|e| e.name == "NODE_NAME")
        .expect("NODE_NAME");
    let field = node
        .value_from
        .as_ref()
        .and_then(|v| v.field_ref.as_ref())
        .expect("NODE_NAME from a fieldRef");
    assert_eq!(field.field_path, "spec.nodeName");
    assert_eq!(flag_value(&args, "--node-name"), Some("$(NODE_NAME)"));

    // The host paths mounted, by the path the container sees them at.
    let volumes: BTreeMap<&str, &str> = pod
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| Some((v.name.as_str(), v.host_path.as_ref()?.path.as_str())))
        .collect();
    let mounts = c.volume_mounts.as_deref().unwrap_or_default();
    let host_mount = |dir: &str| {
        mounts.iter().find(|m| {
            m.mount_path == dir
                && volumes
                    .get(m.name.as_str())
                    .is_some_and(|host| *host == dir)
        })
    };

    // The CRI socket: the endpoint passed (or the first default), its directory mounted at the
    // same path (the directory, so a restarted runtime's new socket is seen).
    let endpoint = flag_value(&args, "--cri-endpoint").unwrap_or(DEFAULT_CRI_ENDPOINTS[0]);
    assert!(
        DEFAULT_CRI_ENDPOINTS.contains(&endpoint),
        "--cri-endpoint {endpoint}: one of the runtimes the agent knows"
    );
    let socket = Path::new(unix_socket_path(endpoint).expect("a unix socket"));
    let socket_dir = socket.parent().unwrap().to_str().unwrap();
    let m = host_mount(socket_dir).unwrap_or_else(|| panic!("{socket_dir} is not mounted"));
    assert_eq!(m.read_only, Some(true), "{socket_dir}: read-only");

    // Pod netns: mounted with HostToContainer propagation, or netns created after the agent
    // started would not be seen.
    let m = host_mount(NETNS_DIR).unwrap_or_else(|| panic!("{NETNS_DIR} is not mounted"));
    assert_eq!(m.read_only, Some(true), "{NETNS_DIR}: read-only");
    assert_eq!(m.mount_propagation.as_deref(), Some("HostToContainer"));

    // Nothing of the host is writable.
    for m in mounts {
        if volumes.contains_key(m.name.as_str()) {
            assert_eq!(
                m.read_only,
                Some(true),
                "{}: host mounts are read-only",
                m.mount_path
            );
        }
    }
}

#[test]
fn daemonset_flags_are_flags_of_netwarden_run() {
    let out = Command::new(env!("CARGO_BIN_EXE_netwarden"))
        .args(["run", "--help"])
        .output()
        .expect("run netwarden run --help");
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    let known: BTreeSet<&str> = help
        .split(|c: char| c.is_whitespace() || c == ',' || c == '=' || c == '[' || c == '<')
        .filter(|w| w.starts_with("--"))
        .collect();
    let ds: DaemonSet = deploy_object("daemonset.yaml", "DaemonSet");
    let args = agent_container(&ds).args.clone().unwrap();
    for flag in args.iter().filter(|a| a.starts_with("--")) {
        assert!(
            known.contains(flag.as_str()),
            "deploy/daemonset.yaml passes {flag}, which `netwarden run` does not have"
        );
    }
    // The probes ask the port the metrics server listens on.
    let addr: std::net::SocketAddr = flag_value(&args, "--metrics-addr")
        .expect("--metrics-addr")
        .parse()
        .unwrap();
    let c = agent_container(&ds);
    let port = c
        .ports
        .as_ref()
        .unwrap()
        .iter()
        .find(|p| p.container_port == i32::from(addr.port()));
    let port_name = port
        .and_then(|p| p.name.clone())
        .expect("the metrics port is declared");
    for (probe, path) in [
        (&c.liveness_probe, "/healthz"),
        (&c.readiness_probe, "/readyz"),
    ] {
        let get = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .expect("an HTTP probe");
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(
            serde_json::to_value(&get.port).unwrap(),
            Value::from(port_name.clone())
        );
    }
}

#[test]
fn daemonset_holds_only_the_justified_privileges() {
    let ds: DaemonSet = deploy_object("daemonset.yaml", "DaemonSet");
    let spec = &ds.spec;
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(pod.host_pid, None, "no hostPID: netns are opened by path");
    assert_eq!(pod.host_ipc, None);
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    // Every node, whatever its taints.
    let tolerations = pod.tolerations.as_deref().unwrap_or_default();
    assert!(tolerations
        .iter()
        .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none() && t.effect.is_none()));
    let update = spec.update_strategy.as_ref().unwrap();
    assert_eq!(update.type_.as_deref(), Some("RollingUpdate"));
    assert_eq!(
        serde_json::to_value(&update.rolling_update.as_ref().unwrap().max_unavailable).unwrap(),
        Value::from(1)
    );

    let c = agent_container(&ds);
    let sc = c.security_context.as_ref().expect("a securityContext");
    assert_eq!(sc.privileged, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    let caps = sc.capabilities.as_ref().unwrap();
    assert_eq!(caps.drop, Some(vec!["ALL".to_string()]));
    assert_eq!(
        caps.add,
        Some(vec!["NET_ADMIN".to_string(), "SYS_ADMIN".to_string()])
    );
    let resources = c.resources.as_ref().expect("resources");
    for what in ["cpu", "memory"] {
        assert!(resources
            .requests
            .as_ref()
            .is_some_and(|r| r.contains_key(what)));
        assert!(resources
            .limits
            .as_ref()
            .is_some_and(|r| r.contains_key(what)));
    }

    // Every privilege is justified in a comment right above it.
    let text = std::fs::read_to_string(deploy_dir().join("daemonset.yaml")).unwrap();
    for privileged in [
        "hostNetwork: true",
        "- NET_ADMIN",
        "- SYS_ADMIN",
        "runAsUser: 0",
        "priorityClassName:",
        "tolerations:",
        "allowPrivilegeEscalation: true",
    ] {
        let lines: Vec<&str> = text.lines().collect();
        let i = lines
            .iter()
            .position(|l| l.trim_start().starts_with(privileged))
            .unwrap_or_else(|| panic!("{privileged} not found"));
        assert!(
            i > 0 && lines[i - 1].trim_start().starts_with('#'),
            "deploy/daemonset.yaml: `{privileged}` needs a comment saying why"
        );
    }
}

/// `deploy/Dockerfile`'s stages: the base image of each (`FROM IMAGE [AS NAME]`) and the
/// instructions that follow it, comments dropped and continued lines joined.
fn dockerfile_stages() -> Vec<(String, Vec<String>)> {
    let text = std::fs::read_to_string(deploy_dir().join("Dockerfile")).unwrap();
    let joined = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
        .replace("\\\n", " ");
    let mut stages: Vec<(String, Vec<String>)> = Vec::new();
    for line in joined.lines().map(str::trim).filter(|l| !l.is_empty()) {
        match line.strip_prefix("FROM ") {
            Some(from) => {
                let image = from.split_whitespace().next().unwrap().to_string();
                stages.push((image, Vec::new()));
            }
            None => stages
                .last_mut()
                .expect("deploy/Dockerfile starts with FROM")
                .1
                .push(line.to_string()),
        }
    }
    stages
}

/// The packages the `apt-get install` commands of a stage install.
fn apt_installed(instructions: &[String]) -> BTreeSet<String> {
    let mut packages = BTreeSet::new();
    for run in instructions.iter().filter_map(|l| l.strip_prefix("RUN ")) {
        for command in run.split("&&") {
            let words: Vec<&str> = command.split_whitespace().collect();
            if words.starts_with(&["apt-get", "install"]) {
                let names = words[2..].iter().filter(|w| !w.starts_with('-'));
                packages.extend(names.map(|w| w.to_string()));
            }
        }
    }
    packages
}

/// The Debian package owning `path` on this machine. dpkg knows a file by the path its package
/// ships, which may be the path as given (`/usr/sbin/ipset`), the file behind an alternatives
/// symlink (`iptables-restore` → `xtables-nft-multi`), or the path before /usr was merged
/// (`/lib/x86_64-linux-gnu/libgcc_s.so.1`, found at `/usr/lib/...`).
fn debian_package_of(path: &str) -> String {
    let real = std::fs::canonicalize(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let real = real.to_str().unwrap();
    let candidates = [path, real, real.strip_prefix("/usr").unwrap_or(real)];
    for candidate in candidates {
        let out = Command::new("dpkg")
            .args(["-S", candidate])
            .output()
            .expect("dpkg (the project's machines are Debian)");
        let text = String::from_utf8(out.stdout).unwrap();
        if let (true, Some((package, _))) = (out.status.success(), text.split_once(':')) {
            return package.trim().to_string();
        }
    }
    panic!("no Debian package owns {path} (tried {candidates:?})")
}

fn which(program: &str) -> String {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .unwrap();
    let path = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(
        !path.is_empty(),
        "{program} is not installed here (scripts/deps.sh installs it)"
    );
    path
}

/// What `debian:bookworm-slim` already has of what the binary links.
const BASE_IMAGE_PACKAGES: [&str; 2] = ["libc6", "libgcc-s1"];

/// Programs the data plane runs (crates/dataplane/src/iptables_apply.rs); `nft` is in the
/// image for people inspecting a pod's table by hand.
const PROGRAMS_RUN: [&str; 7] = [
    "iptables",
    "iptables-restore",
    "ip6tables-restore",
    "iptables-save",
    "ip6tables-save",
    "ipset",
    "nft",
];

#[test]
fn dockerfile_runtime_packages_cover_what_the_binary_needs() {
    let stages = dockerfile_stages();
    assert_eq!(
        stages.len(),
        2,
        "deploy/Dockerfile: a build stage and a runtime stage"
    );
    let (build_base, runtime_base) = (&stages[0].0, &stages[1].0);
    let packages = apt_installed(&stages[1].1);
    assert_eq!(runtime_base, "debian:bookworm-slim");
    // The binary is built against the runtime's glibc.
    assert!(
        build_base.starts_with("rust:") && build_base.contains("-bookworm"),
        "build stage {build_base}: a Rust image on bookworm"
    );
    let mut needed = BTreeMap::<String, String>::new();
    // Shared libraries the binary links.
    let out = Command::new("ldd")
        .arg(env!("CARGO_BIN_EXE_netwarden"))
        .output()
        .expect("ldd");
    assert!(out.status.success(), "ldd: {out:?}");
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        if let Some((lib, rest)) = line.trim().split_once(" => ") {
            let path = rest.split_whitespace().next().unwrap();
            needed.insert(debian_package_of(path), format!("linked {lib}"));
        }
    }
    // libnftables, loaded at run time by the nft backend.
    let out = Command::new("ldconfig")
        .arg("-p")
        .output()
        .expect("ldconfig");
    let cache = String::from_utf8(out.stdout).unwrap();
    let lib = netwarden_dataplane::libnft::LIBRARY;
    let path = cache
        .lines()
        .filter(|l| l.trim_start().starts_with(lib))
        .find_map(|l| l.split(" => ").nth(1))
        .unwrap_or_else(|| {
            panic!("{lib} is not installed here (scripts/deps.sh installs nftables)")
        });
    needed.insert(debian_package_of(path.trim()), format!("dlopen {lib}"));
    for program in PROGRAMS_RUN {
        needed.insert(
            debian_package_of(&which(program)),
            format!("runs {program}"),
        );
    }
    let missing: Vec<String> = needed
        .iter()
        .filter(|(p, _)| !packages.contains(*p) && !BASE_IMAGE_PACKAGES.contains(&p.as_str()))
        .map(|(p, why)| format!("{p} ({why})"))
        .collect();
    assert!(
        missing.is_empty(),
        "deploy/Dockerfile's runtime stage does not install: {missing:?} (installs {packages:?})"
    );
}
