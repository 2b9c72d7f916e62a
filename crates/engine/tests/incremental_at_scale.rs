//! Issue 10: the incremental engine equals a fresh computation after random event sequences
//! on a cluster of 10,000 pods and 2,000 policies (the generated one the benchmarks use: the
//! three policy kinds, a third of the pods on a secondary network, a Service per app).
//!
//! Each case starts from the same computed engine, applies a random sequence of pod,
//! policy, Service and namespace events, recomputing after each event only the pods the
//! engine names dirty (as the node agent does), and compares what it holds then with a
//! fresh engine fed the final objects. At this size the indexes hold thousands of entries
//! per bucket kind, so a candidate the index fails to name shows up as a stale pod.
//! A copy of the address owners kept from the engine's address changes
//! ([`Engine::take_address_changes`]) equals the fresh engine's too.
//! `NETWARDEN_SCALE_CASES` sets the number of cases (4 by default).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::LazyLock;

use netwarden_engine::generate::{cluster, Cluster};
use netwarden_engine::*;
use proptest::prelude::*;

const PODS: usize = 10_000;
const POLICIES: usize = 2_000;

/// The objects as they are now, keyed as the engine keys them.
#[derive(Clone)]
struct Objects {
    namespaces: BTreeMap<String, Namespace>,
    pods: BTreeMap<PodKey, Pod>,
    policies: BTreeMap<PolicyRef, Policy>,
    services: BTreeMap<ObjectKey, Service>,
}

impl Objects {
    fn of(c: &Cluster) -> Self {
        Self {
            namespaces: c
                .namespaces
                .iter()
                .map(|n| (n.name.clone(), n.clone()))
                .collect(),
            pods: c.pods.iter().map(|p| (p.key.clone(), p.clone())).collect(),
            policies: c
                .policies
                .iter()
                .map(|p| (p.reference(), p.clone()))
                .collect(),
            services: c
                .services
                .iter()
                .map(|s| (s.key.clone(), s.clone()))
                .collect(),
        }
    }

    fn engine(&self) -> Engine {
        let mut e = Engine::new(EngineOptions::default());
        self.namespaces
            .values()
            .for_each(|n| e.set_namespace(n.clone()));
        self.pods.values().for_each(|p| e.set_pod(p.clone()));
        self.policies.values().for_each(|p| e.set_policy(p.clone()));
        self.services
            .values()
            .for_each(|s| e.set_service(s.clone()));
        e
    }
}

/// The starting point every case shares: the objects, the engine, and every pod's rules.
static START: LazyLock<(Objects, Engine, BTreeMap<PodKey, PodRules>)> = LazyLock::new(|| {
    let objects = Objects::of(&cluster(PODS, POLICIES, 42));
    let mut engine = objects.engine();
    let rules = engine.all_pod_rules();
    (objects, engine, rules)
});

/// One event; the numbers pick objects and values (taken modulo what exists).
#[derive(Debug, Clone)]
enum Event {
    /// A pod takes another app's label (of its namespace or any other).
    Relabel { pod: usize, app: usize },
    /// A pod changes tier (what the cross-namespace peers select).
    Retier { pod: usize, tier: usize },
    /// A pod goes.
    RemovePod { pod: usize },
    /// A new pod joins a namespace with an app, on a fresh address, maybe on net1 too.
    AddPod {
        like: usize,
        app: usize,
        secondary: bool,
    },
    /// A pod gets a new primary address (rescheduled).
    Readdress { pod: usize },
    /// A policy goes.
    RemovePolicy { policy: usize },
    /// A policy selects another app, and flips between enforce and monitor.
    ChangePolicy { policy: usize, app: usize },
    /// A Service loses its first endpoint address, or its selector picks another app.
    ChangeService { service: usize, app: usize },
    /// A Service goes.
    RemoveService { service: usize },
    /// A namespace moves to another team (what the namespace selectors select).
    RelabelNamespace { namespace: usize, team: usize },
}

fn arb_event() -> impl Strategy<Value = Event> {
    let n = 1usize << 20;
    prop_oneof![
        4 => (0..n, 0..n).prop_map(|(pod, app)| Event::Relabel { pod, app }),
        2 => (0..n, 0..3usize).prop_map(|(pod, tier)| Event::Retier { pod, tier }),
        2 => (0..n).prop_map(|pod| Event::RemovePod { pod }),
        2 => (0..n, 0..n, any::<bool>()).prop_map(|(like, app, secondary)| Event::AddPod { like, app, secondary }),
        1 => (0..n).prop_map(|pod| Event::Readdress { pod }),
        2 => (0..n).prop_map(|policy| Event::RemovePolicy { policy }),
        2 => (0..n, 0..n).prop_map(|(policy, app)| Event::ChangePolicy { policy, app }),
        2 => (0..n, 0..n).prop_map(|(service, app)| Event::ChangeService { service, app }),
        1 => (0..n).prop_map(|service| Event::RemoveService { service }),
        1 => (0..n, 0..10usize).prop_map(|(namespace, team)| Event::RelabelNamespace { namespace, team }),
    ]
}

fn nth<K: Clone, V>(map: &BTreeMap<K, V>, i: usize) -> Option<K> {
    (!map.is_empty()).then(|| map.keys().nth(i % map.len()).cloned().expect("in range"))
}

/// An app name of the generated cluster (`app<N>`, 20 pods each).
fn app_name(i: usize) -> String {
    format!("app{}", i % PODS.div_ceil(20))
}

/// Applies `event` to the objects and the engine alike.
fn apply(objects: &mut Objects, engine: &mut Engine, event: &Event, serial: usize) {
    match *event {
        Event::Relabel { pod, app } => {
            if let Some(key) = nth(&objects.pods, pod) {
                let p = objects.pods.get_mut(&key).expect("listed");
                p.labels.insert("app".into(), app_name(app));
                engine.set_pod(p.clone());
            }
        }
        Event::Retier { pod, tier } => {
            if let Some(key) = nth(&objects.pods, pod) {
                let p = objects.pods.get_mut(&key).expect("listed");
                p.labels
                    .insert("tier".into(), ["web", "api", "db"][tier].into());
                engine.set_pod(p.clone());
            }
        }
        Event::RemovePod { pod } => {
            if let Some(key) = nth(&objects.pods, pod) {
                objects.pods.remove(&key);
                engine.remove_pod(&key);
            }
        }
        Event::AddPod {
            like,
            app,
            secondary,
        } => {
            if let Some(key) = nth(&objects.pods, like) {
                let mut p = objects.pods[&key].clone();
                p.key = PodKey::new(key.namespace.clone(), format!("added{serial}"));
                p.labels.insert("app".into(), app_name(app));
                p.interfaces[0].ips = vec![fresh_addr(serial, 0)];
                if secondary && p.interfaces.len() > 1 {
                    p.interfaces[1].ips = vec![fresh_addr(serial, 1)];
                } else {
                    p.interfaces.truncate(1);
                }
                objects.pods.insert(p.key.clone(), p.clone());
                engine.set_pod(p);
            }
        }
        Event::Readdress { pod } => {
            if let Some(key) = nth(&objects.pods, pod) {
                let p = objects.pods.get_mut(&key).expect("listed");
                p.interfaces[0].ips = vec![fresh_addr(serial, 0)];
                engine.set_pod(p.clone());
            }
        }
        Event::RemovePolicy { policy } => {
            if let Some(reference) = nth(&objects.policies, policy) {
                objects.policies.remove(&reference);
                engine.remove_policy(&reference);
            }
        }
        Event::ChangePolicy { policy, app } => {
            if let Some(reference) = nth(&objects.policies, policy) {
                let p = objects.policies.get_mut(&reference).expect("listed");
                p.pod_selector
                    .match_labels
                    .insert("app".into(), app_name(app));
                p.mode = match p.mode {
                    Mode::Enforce => Mode::Monitor,
                    Mode::Monitor => Mode::Enforce,
                };
                engine.set_policy(p.clone());
            }
        }
        Event::ChangeService { service, app } => {
            if let Some(key) = nth(&objects.services, service) {
                let s = objects.services.get_mut(&key).expect("listed");
                match &mut s.selector {
                    Some(selector) => {
                        selector.insert("app".into(), app_name(app));
                    }
                    None if !s.endpoint_addrs.is_empty() => {
                        s.endpoint_addrs.remove(0);
                    }
                    None => {}
                }
                engine.set_service(s.clone());
            }
        }
        Event::RemoveService { service } => {
            if let Some(key) = nth(&objects.services, service) {
                objects.services.remove(&key);
                engine.remove_service(&key);
            }
        }
        Event::RelabelNamespace { namespace, team } => {
            if let Some(name) = nth(&objects.namespaces, namespace) {
                let n = objects.namespaces.get_mut(&name).expect("listed");
                n.labels.insert("team".into(), format!("team{team}"));
                engine.set_namespace(n.clone());
            }
        }
    }
}

/// An address no generated pod has (172.30.0.0/16 primary, 172.31.0.0/16 secondary).
fn fresh_addr(serial: usize, interface: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(
        172,
        30 + interface,
        (serial >> 8) as u8,
        serial as u8,
    ))
}

fn cases() -> u32 {
    std::env::var("NETWARDEN_SCALE_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn incremental_equals_fresh_at_ten_thousand_pods(events in proptest::collection::vec(arb_event(), 1..40)) {
        let (objects, engine, rules) = &*START;
        let mut objects = objects.clone();
        let mut engine = engine.clone();
        let mut held = rules.clone();
        // A copy of the address owners that follows the engine's changes (as the agent's
        // events thread holds one).
        engine.take_address_changes();
        let mut addresses = engine.pods_by_address();
        for (serial, event) in events.iter().enumerate() {
            apply(&mut objects, &mut engine, event, serial);
            match engine.take_address_changes() {
                AddressChanges::All => addresses = engine.pods_by_address(),
                AddressChanges::Listed(ips) => {
                    for ip in ips {
                        match engine.pod_at(ip) {
                            Some(key) => addresses.insert(ip, key.clone()),
                            None => addresses.remove(&ip),
                        };
                    }
                }
            }
            for key in engine.take_dirty() {
                match engine.pod_rules(&key) {
                    Some(r) => {
                        held.insert(key, r);
                    }
                    None => {
                        held.remove(&key);
                    }
                }
            }
        }
        let mut fresh_engine = objects.engine();
        prop_assert_eq!(&addresses, &fresh_engine.pods_by_address());
        let fresh = fresh_engine.all_pod_rules();
        prop_assert_eq!(held.len(), fresh.len());
        for (key, rules) in &fresh {
            prop_assert_eq!(held.get(key), Some(rules), "pod {} after {:?}", key, events);
        }
    }
}
