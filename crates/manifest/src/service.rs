//! Services and EndpointSlices: the virtual IPs a pod may dial on the primary network, and the
//! endpoints behind them (SPEC 3.2).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use netwarden_engine::{ObjectKey, PortRef, Service, ServicePort};
use serde_json::Value;

use crate::ctx::{get, index, join, show, Ctx, LabelCheck};
use crate::meta::read_meta;
use crate::pod::section;
use crate::{validate, Problem, Severity};

/// The label linking an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

pub(crate) fn read_service(cx: &mut Ctx<'_>, doc: &Value) -> Option<Service> {
    let meta = read_meta(cx, doc, true)?;
    let spec = section(cx, doc, "", "spec");

    let mut cluster_ips: Vec<IpAddr> = Vec::new();
    let mut seen: HashSet<IpAddr> = HashSet::new();
    let mut add_ip = |cx: &mut Ctx<'_>, field: &str, s: &str| {
        // "None" marks a headless Service: no virtual IP.
        if s.is_empty() || s == "None" {
            return;
        }
        match s.parse::<IpAddr>() {
            Ok(ip) => {
                if seen.insert(ip) {
                    cluster_ips.push(ip);
                }
            }
            Err(_) => cx.error(
                field,
                format!("\"{}\" is not an IP address", validate::shorten(s)),
            ),
        }
    };
    if let Some(list) = cx.array(spec, "spec", "clusterIPs") {
        for (i, v) in list.iter().enumerate() {
            let f = index("spec.clusterIPs", i);
            match v {
                Value::String(s) => add_ip(cx, &f, s),
                other => cx.wrong_type(&f, "a string", other),
            }
        }
    }
    if let Some(s) = cx.str(spec, "spec", "clusterIP") {
        add_ip(cx, "spec.clusterIP", s);
    }

    // A selector with an invalid entry would select more pods than written: the Service is
    // ignored instead. An empty selector means the same as none: endpoints are managed by
    // someone else.
    let check = LabelCheck {
        consequence: "; object ignored",
    };
    let (selector, selector_ok) = cx.string_map(spec, "spec", "selector", Some(check));
    if !selector_ok {
        return None;
    }
    let selector = (!selector.is_empty()).then_some(selector);

    let mut ports = Vec::new();
    if let Some(list) = cx.array(spec, "spec", "ports") {
        for (i, p) in list.iter().enumerate() {
            if let Some(sp) = read_service_port(cx, p, &index("spec.ports", i)) {
                ports.push(sp);
            }
        }
    }
    Some(Service {
        key: ObjectKey::new(meta.namespace, meta.name),
        cluster_ips,
        selector,
        endpoint_addrs: Vec::new(),
        ports,
    })
}

fn read_service_port(cx: &mut Ctx<'_>, p: &Value, base: &str) -> Option<ServicePort> {
    if !p.is_object() {
        cx.wrong_type(base, "an object", p);
        return None;
    }
    let protocol = cx.protocol(p, base, "protocol");
    let port_field = join(base, "port");
    let port = match get(p, "port") {
        Some(v) => cx.port_number(&port_field, v),
        None => {
            cx.error(&port_field, "missing port; port ignored");
            None
        }
    };
    let target_field = join(base, "targetPort");
    let target = match get(p, "targetPort") {
        None => port.map(PortRef::Number),
        Some(Value::String(s)) => match s.parse::<u16>() {
            // Service targetPorts are often written quoted; a number is a number here.
            Ok(n) if n > 0 => Some(PortRef::Number(n)),
            _ => match validate::port_name(s) {
                Ok(()) => Some(PortRef::Named(s.clone())),
                Err(e) => {
                    cx.error(&target_field, e);
                    None
                }
            },
        },
        Some(v) => cx.port_number(&target_field, v).map(PortRef::Number),
    };
    Some(ServicePort {
        protocol: protocol?,
        port: port?,
        target: target?,
    })
}

/// An EndpointSlice reduced to its Service and addresses.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SliceRecord {
    file: String,
    object: String,
    namespace: String,
    service: String,
    addrs: Vec<IpAddr>,
}

impl SliceRecord {
    /// The Service it holds endpoints of: namespace and name.
    pub(crate) fn service_key(&self) -> (&str, &str) {
        (&self.namespace, &self.service)
    }
}

pub(crate) fn read_slice(cx: &mut Ctx<'_>, doc: &Value) -> Option<SliceRecord> {
    let meta = read_meta(cx, doc, true)?;
    let label_field = format!("metadata.labels[\"{SERVICE_NAME_LABEL}\"]");
    let Some(service) = meta.labels.get(SERVICE_NAME_LABEL).cloned() else {
        cx.warn(
            &label_field,
            "missing: the slice belongs to no Service; ignored",
        );
        return None;
    };
    // FQDN slices carry names, not addresses.
    if cx.str(doc, "", "addressType") == Some("FQDN") {
        return None;
    }
    let mut addrs = Vec::new();
    let mut seen: HashSet<IpAddr> = HashSet::new();
    if let Some(endpoints) = cx.array(doc, "", "endpoints") {
        for (i, ep) in endpoints.iter().enumerate() {
            let base = index("endpoints", i);
            if !ep.is_object() {
                cx.wrong_type(&base, "an object", ep);
                continue;
            }
            // `ready` unset means ready (Kubernetes API convention for this field).
            let cond = section(cx, ep, &base, "conditions");
            if cx.bool(cond, &join(&base, "conditions"), "ready") == Some(false) {
                continue;
            }
            let Some(list) = cx.array(ep, &base, "addresses") else {
                continue;
            };
            for (j, a) in list.iter().enumerate() {
                let f = index(&join(&base, "addresses"), j);
                let Value::String(text) = a else {
                    cx.wrong_type(&f, "a string", a);
                    continue;
                };
                match text.parse::<IpAddr>() {
                    Ok(ip) => {
                        if seen.insert(ip) {
                            addrs.push(ip);
                        }
                    }
                    Err(_) => cx.error(&f, format!("{} is not an IP address", show(a))),
                }
            }
        }
    }
    Some(SliceRecord {
        file: cx.file.to_string(),
        object: cx.object.clone(),
        namespace: meta.namespace,
        service,
        addrs,
    })
}

/// Second pass: endpoint addresses to their Services (sorted, deduplicated).
pub(crate) fn attach_slices(
    services: &mut [Service],
    slices: &[&SliceRecord],
    problems: &mut Vec<Problem>,
) {
    let by_key: HashMap<(&str, &str), usize> = services
        .iter()
        .enumerate()
        .map(|(i, s)| ((s.key.namespace.as_str(), s.key.name.as_str()), i))
        .collect();
    let mut found: Vec<(usize, &SliceRecord)> = Vec::new();
    for slice in slices {
        match by_key.get(&(slice.namespace.as_str(), slice.service.as_str())) {
            Some(&i) => found.push((i, slice)),
            None => problems.push(Problem {
                file: slice.file.clone(),
                kind: "EndpointSlice".into(),
                object: slice.object.clone(),
                field: format!("metadata.labels[\"{SERVICE_NAME_LABEL}\"]"),
                reason: format!(
                    "Service {}/{} not found; slice ignored",
                    slice.namespace,
                    validate::shorten(&slice.service)
                ),
                severity: Severity::Warning,
            }),
        }
    }
    for (i, slice) in found {
        services[i]
            .endpoint_addrs
            .extend(slice.addrs.iter().copied());
    }
    for svc in services {
        svc.endpoint_addrs.sort();
        svc.endpoint_addrs.dedup();
    }
}
