//! Feeding the pure engine from loaded objects: a whole [`Inventory`] in the order that lets
//! each object find what it refers to, or an [`InventoryDelta`] (removals first). Shared by the
//! analysis commands and the node agent, which keeps its local pods apart
//! ([`apply_delta_with`]).

use std::sync::Arc;

use netwarden_engine::{
    AdminPolicy, Engine, EngineOptions, Namespace, Node, Pod, PodKey, Policy, Service,
};

use crate::{Inventory, InventoryDelta};

pub fn engine_from(inventory: &Inventory, options: EngineOptions) -> Engine {
    feed(
        Engine::new(options),
        inventory.namespaces.iter().cloned(),
        inventory.pods.iter().cloned(),
        inventory.policies.iter().cloned(),
        inventory.admin_policies.iter().cloned(),
        inventory.nodes.iter().cloned(),
        inventory.services.iter().cloned(),
    )
}

/// [`engine_from`], consuming the inventory: each object moves into the engine, so a large
/// cluster is not held twice while it is fed (what set the peak of `reach` at 100,000 pods).
pub fn engine_from_owned(inventory: Inventory, options: EngineOptions) -> Engine {
    feed(
        Engine::new(options),
        inventory.namespaces,
        inventory.pods,
        inventory.policies,
        inventory.admin_policies,
        inventory.nodes,
        inventory.services,
    )
}

/// Feeds `engine` every object, in the order that lets each find what it refers to.
fn feed(
    mut engine: Engine,
    namespaces: impl IntoIterator<Item = Namespace>,
    pods: impl IntoIterator<Item = Pod>,
    policies: impl IntoIterator<Item = Policy>,
    admin_policies: impl IntoIterator<Item = AdminPolicy>,
    nodes: impl IntoIterator<Item = Node>,
    services: impl IntoIterator<Item = Service>,
) -> Engine {
    namespaces.into_iter().for_each(|n| engine.set_namespace(n));
    pods.into_iter().for_each(|p| engine.set_pod(p));
    policies.into_iter().for_each(|p| engine.set_policy(p));
    nodes.into_iter().for_each(|n| engine.set_node(n));
    admin_policies
        .into_iter()
        .for_each(|p| engine.set_admin_policy(p));
    services.into_iter().for_each(|s| engine.set_service(s));
    engine
}

/// Feeds `engine` what `delta` says, removals first.
pub fn apply_delta(engine: &mut Engine, delta: InventoryDelta) {
    apply_delta_with(engine, delta, |engine, change| match change {
        PodChange::Removed(key) => engine.remove_pod(key),
        PodChange::Set(pod) => engine.set_pod(pod),
    });
}

/// A pod of a delta, handed to the caller of [`apply_delta_with`].
pub enum PodChange<'a> {
    Removed(&'a PodKey),
    Set(Arc<Pod>),
}

/// [`apply_delta`] with the pods handed to `pods` (in the delta's order: removals first) instead
/// of fed to the engine: the agent keeps its local pods apart (`agent::apply_delta`).
pub fn apply_delta_with(
    engine: &mut Engine,
    delta: InventoryDelta,
    mut pods: impl FnMut(&mut Engine, PodChange),
) {
    for key in &delta.pods_removed {
        pods(engine, PodChange::Removed(key));
    }
    for reference in &delta.policies_removed {
        engine.remove_policy(reference);
    }
    for reference in &delta.admin_policies_removed {
        engine.remove_admin_policy(reference);
    }
    for name in &delta.nodes_removed {
        engine.remove_node(name);
    }
    for key in &delta.services_removed {
        engine.remove_service(key);
    }
    for name in &delta.namespaces_removed {
        engine.remove_namespace(name);
    }
    for namespace in delta.namespaces {
        engine.set_namespace(namespace);
    }
    for pod in delta.pods {
        pods(engine, PodChange::Set(pod));
    }
    for policy in delta.policies {
        engine.set_policy(policy);
    }
    for node in delta.nodes {
        engine.set_node(node);
    }
    for policy in delta.admin_policies {
        engine.set_admin_policy(policy);
    }
    for service in delta.services {
        engine.set_service(service);
    }
}
