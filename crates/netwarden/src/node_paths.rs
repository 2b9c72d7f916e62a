//! Where the node agent finds things on the node: the CRI runtime's socket and the directory of
//! pod network namespaces. The agent's defaults and the DaemonSet's host mounts
//! (`deploy/daemonset.yaml`, checked by `tests/deploy.rs`) both come from here, so the image
//! cannot look for a socket the DaemonSet does not mount.

/// The CRI endpoints tried when `--cri-endpoint` is not given, in order: containerd's, then
/// CRI-O's; the first whose socket exists is used.
pub const DEFAULT_CRI_ENDPOINTS: [&str; 2] = [
    "unix:///run/containerd/containerd.sock",
    "unix:///run/crio/crio.sock",
];

/// Where CRI runtimes bind-mount pod network namespaces (containerd's and CRI-O's default is
/// `/var/run/netns`, the same directory: `/var/run` is a symlink to `/run` on systemd hosts).
pub const NETNS_DIR: &str = "/run/netns";

/// The socket path of a `unix://` endpoint; `None` for any other scheme.
pub fn unix_socket_path(endpoint: &str) -> Option<&str> {
    endpoint
        .strip_prefix("unix://")
        .filter(|path| path.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_endpoints_give_absolute_socket_paths() {
        assert_eq!(
            unix_socket_path(DEFAULT_CRI_ENDPOINTS[0]),
            Some("/run/containerd/containerd.sock")
        );
        assert_eq!(unix_socket_path("unix://relative.sock"), None);
        assert_eq!(unix_socket_path("tcp://127.0.0.1:1234"), None);
    }
}
