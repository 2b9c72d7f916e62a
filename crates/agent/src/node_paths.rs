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

/// The CRI endpoint `run --kube` uses without `--cri-endpoint`: the first of
/// [`DEFAULT_CRI_ENDPOINTS`] whose socket `exists`; `None` when there is none (the agent then
/// runs on declared netns only).
pub fn default_cri_endpoint(exists: impl Fn(&std::path::Path) -> bool) -> Option<&'static str> {
    DEFAULT_CRI_ENDPOINTS
        .into_iter()
        .find(|e| unix_socket_path(e).is_some_and(|p| exists(std::path::Path::new(p))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_existing_socket_is_the_default_endpoint() {
        let crio = |p: &std::path::Path| p == std::path::Path::new("/run/crio/crio.sock");
        assert_eq!(default_cri_endpoint(crio), Some(DEFAULT_CRI_ENDPOINTS[1]));
        assert_eq!(
            default_cri_endpoint(|_| true),
            Some(DEFAULT_CRI_ENDPOINTS[0])
        );
        assert_eq!(default_cri_endpoint(|_| false), None);
    }

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
