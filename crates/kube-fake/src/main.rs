//! `netwarden-kube-fake`: serves a directory of manifests through the fake API server and
//! writes a kubeconfig for it, so that `netwarden run --kube` can be tried without a cluster.
//!
//! ```sh
//! netwarden-kube-fake --manifests examples/multinet --kubeconfig /tmp/fake.kubeconfig --listen 127.0.0.1:6443
//! KUBECONFIG=/tmp/fake.kubeconfig netwarden run --kube --node-name node-1
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use netwarden_kube_fake::{manifests, FakeApiServer, ServerOptions};

#[derive(Parser, Debug)]
#[command(
    name = "netwarden-kube-fake",
    about = "A fake Kubernetes API server (list/watch over HTTP) serving a directory of manifests"
)]
struct Args {
    /// A directory of YAML/JSON manifests to serve (read recursively; `kind: List` too).
    #[arg(long)]
    manifests: Option<PathBuf>,
    /// Where to write a kubeconfig for the server.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Address to listen on (port 0: an ephemeral port, printed on start).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Seconds between watch BOOKMARKs.
    #[arg(long, default_value_t = 60)]
    bookmark_interval: u64,
    /// Changes retained for watches; older resourceVersions get 410 Expired.
    #[arg(long, default_value_t = 200_000)]
    history_limit: usize,
    /// Serve a CRD even without objects: `GROUP/VERSION/KIND`, e.g. `danm.k8s.io/v1/DanmEp`.
    #[arg(long = "crd", value_name = "GROUP/VERSION/KIND")]
    crds: Vec<String>,
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let options = ServerOptions {
        listen: args.listen,
        bookmark_interval: Duration::from_secs(args.bookmark_interval.max(1)),
        history_limit: args.history_limit,
        ..ServerOptions::default()
    };
    let server = FakeApiServer::start(options)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    for crd in &args.crds {
        let parts: Vec<&str> = crd.rsplitn(3, '/').collect();
        let [kind, version, group] = parts.as_slice() else {
            anyhow::bail!("--crd {crd:?}: expected GROUP/VERSION/KIND");
        };
        server.install_crd(group, version, kind);
    }
    if let Some(dir) = &args.manifests {
        let loaded = manifests::load_dir(&server, dir)
            .with_context(|| format!("loading {}", dir.display()))?;
        eprintln!(
            "loaded {} objects from {} ({} implied namespaces, CRDs installed: [{}], {} objects of kinds not served skipped)",
            loaded.created,
            dir.display(),
            loaded.implied_namespaces.len(),
            loaded.installed_crds.join(", "),
            loaded.skipped.len()
        );
    }
    if let Some(path) = &args.kubeconfig {
        server
            .write_kubeconfig(path)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    println!("serving {}", server.url());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    server.stop().await;
    Ok(())
}
