#!/usr/bin/env python3
"""Writes large manifests to measure the loader's scaling (nothing here is committed output).

    scale-input.py status N  > FILE   one pod whose network-status annotation has N entries
    scale-input.py pods N    > FILE   N pods with podIPs, labels and a named container port,
                                      one DanmEp per pod, a Service + EndpointSlice per 100 pods

Measure with:
    cargo build --release -p netwarden
    /usr/bin/time -v target/release/netwarden validate -f FILE
"""
import json
import sys


def ip(i, base=10):
    return f"{base}.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"


def status(n):
    entries = [{"name": "cluster", "interface": "eth0", "ips": ["10.0.0.1"], "default": True}]
    for i in range(1, n):
        entries.append({"name": f"net-{i}", "interface": f"n{i}", "ips": [ip(i, 172)]})
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "wide",
            "namespace": "scale",
            "annotations": {"k8s.v1.cni.cncf.io/network-status": json.dumps(entries)},
        },
        "status": {"podIPs": [{"ip": "10.0.0.1"}]},
    }
    json.dump(pod, sys.stdout)
    sys.stdout.write("\n")


def pods(n):
    out = sys.stdout
    for i in range(n):
        out.write(json.dumps({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"p{i}", "namespace": f"ns{i % 50}",
                         "labels": {"app": f"a{i % 100}", "i": str(i)}},
            "spec": {"containers": [{"ports": [{"containerPort": 80, "name": "http"}]}]},
            "status": {"podIPs": [{"ip": ip(i)}]},
        }))
        out.write("\n---\n")
        out.write(json.dumps({
            "apiVersion": "danm.k8s.io/v1",
            "kind": "DanmEp",
            "metadata": {"name": f"ep{i}", "namespace": f"ns{i % 50}"},
            "spec": {"Pod": f"p{i}", "NetworkName": "internal",
                     "Interface": {"Name": "ext0", "Address": ip(i, 192) + "/8"}},
        }))
        out.write("\n---\n")
    for s in range(n // 100):
        ns = f"ns{s % 50}"
        out.write(json.dumps({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": f"s{s}", "namespace": ns},
            "spec": {"clusterIP": ip(s, 100), "selector": {"app": f"a{s % 100}"},
                     "ports": [{"port": 80, "targetPort": "http"}]},
        }))
        out.write("\n---\n")
        out.write(json.dumps({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"s{s}-1", "namespace": ns,
                         "labels": {"kubernetes.io/service-name": f"s{s}"}},
            "endpoints": [{"addresses": [ip(s * 100 + k) for k in range(100)]}],
        }))
        out.write("\n---\n")


if __name__ == "__main__":
    what, n = sys.argv[1], int(sys.argv[2])
    {"status": status, "pods": pods}[what](n)
