//! Which steps can share one lab (`lab check -f S0 --then S1 ...`): those with the same pods
//! (keys, interfaces, addresses: `EnforcedLab::enforce` refuses a state that changes them;
//! labels may differ) and the same ports. Building and removing the netns is most of a lab's
//! cost.

use serde_json::Value;
use std::collections::BTreeSet;

/// What decides a lab: the ports probed and the pods with everything but their labels. Each
/// step keeps exactly its own ports, as in a lab of its own: a union of ports (fewer labs, no
/// faster) multiplied the ICMP answers (SCTP's, UDP refusals') a pod's netns sends state after
/// state, and once in three runs an allowed SCTP probe of a port its step did not need timed
/// out on iptables.
pub fn lab_key(state: &[Value], ports: &BTreeSet<(u16, String)>) -> String {
    let mut pods: Vec<Value> = state
        .iter()
        .filter(|o| o["kind"] == "Pod")
        .cloned()
        .collect();
    for pod in &mut pods {
        if let Some(metadata) = pod["metadata"].as_object_mut() {
            metadata.remove("labels");
        }
    }
    format!("{ports:?} {}", Value::Array(pods))
}

/// Groups `items` by `key`, keeping the order of first appearance and the order within a group.
pub fn grouped<T>(items: Vec<T>, key: impl Fn(&T) -> String) -> Vec<Vec<T>> {
    let mut groups: Vec<(String, Vec<T>)> = Vec::new();
    for item in items {
        let k = key(&item);
        match groups.iter_mut().find(|(g, _)| *g == k) {
            Some((_, group)) => group.push(item),
            None => groups.push((k, vec![item])),
        }
    }
    groups.into_iter().map(|(_, group)| group).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn labels_do_not_split_a_lab_addresses_and_ports_do() {
        let pod = |labels: Value, ip: &str| {
            json!({"kind": "Pod", "metadata": {"name": "a", "namespace": "x", "labels": labels},
                "status": {"podIP": ip}})
        };
        let ns =
            |v: &str| json!({"kind": "Namespace", "metadata": {"name": "x", "labels": {"v": v}}});
        let tcp = BTreeSet::from([(80, "TCP".to_string())]);
        let udp = BTreeSet::from([(80, "UDP".to_string())]);
        let a = lab_key(&[ns("1"), pod(json!({"app": "a"}), "10.244.1.1")], &tcp);
        let relabelled = lab_key(&[ns("2"), pod(json!({"app": "b"}), "10.244.1.1")], &tcp);
        let moved = lab_key(&[ns("1"), pod(json!({"app": "a"}), "10.244.1.2")], &tcp);
        let other_port = lab_key(&[ns("1"), pod(json!({"app": "a"}), "10.244.1.1")], &udp);
        assert_eq!(a, relabelled);
        assert_ne!(a, moved);
        assert_ne!(a, other_port);
        let groups = grouped(vec![(1, "a"), (2, "b"), (3, "a")], |(_, k)| k.to_string());
        assert_eq!(groups, vec![vec![(1, "a"), (3, "a")], vec![(2, "b")]]);
    }
}
