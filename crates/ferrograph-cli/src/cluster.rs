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
    /// A model to serve to the cluster: a manifest name (`smollm2`), `NAME=PATH` for a GGUF
    /// file, or `echo[:MS]`, a test model that repeats the question word by word (MS
    /// milliseconds a word); repeatable.
    #[arg(long = "serve-model")]
    serve_models: Vec<String>,
    /// Device for the served models (`cpu`, `cuda`, `metal`; default FERROGRAPH_DEVICE).
    #[arg(long)]
    device: Option<String>,
    #[command(flatten)]
    conn: ConnArgs,
}

/// Runs a node until Ctrl-C or SIGTERM.
pub(crate) async fn node_command(args: NodeArgs) -> Result<ExitCode> {
    let config = args
        .conn
        .config(args.name.clone(), args.listen, args.labels.clone())?;
    let node = ClusterNode::start(config).await?;
    let device = ferrograph_llm::DeviceKind::from_flag_or_env(args.device.as_deref())?;
    let mut served = Vec::new();
    for spec in &args.serve_models {
        let (name, model) = served_model(spec, &args.name, device)?;
        warm_up(&name, model.as_ref()).await?;
        node.host_model(name.clone(), model).await?;
        served.push(name);
    }
    crate::print::line(format!(
        "node {} listening on {} (labels: {}; models: {})",
        node.name(),
        node.listen_addr(),
        if args.labels.is_empty() {
            "none".to_string()
        } else {
            args.labels.join(",")
        },
        if served.is_empty() {
            "none".to_string()
        } else {
            served.join(",")
        }
    ));
    args.conn.join_all(&node).await?;
    wait_for_stop().await;
    crate::print::line(format!("node {} stopping", node.name()));
    node.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

async fn wait_for_stop() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
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
        let model = EchoModel {
            node: node.to_string(),
            delay,
        };
        return Ok(("echo".into(), Arc::new(model)));
    }
    let (name, what) = match spec.split_once('=') {
        Some((name, path)) => (name.to_string(), path.to_string()),
        None => (spec.to_string(), spec.to_string()),
    };
    let path = if std::path::Path::new(&what).exists() {
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

/// A test model: answers `node NAME heard: WORDS` with the last human message's words, one
/// piece a word, `delay` apart. It lets tests and `bench cluster` see which node answered
/// and measure the cluster's own cost without a model's.
struct EchoModel {
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
    for addr in &conn.join {
        node.join(addr).await?;
    }
    // Transitive connections to the joined nodes' peers open right after the join.
    tokio::time::sleep(Duration::from_millis(300)).await;
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
    let models: Vec<_> = node.models().await;
    if args.json {
        crate::print::line(serde_json::to_string_pretty(&serde_json::json!({
            "nodes": nodes, "models": models,
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

/// The cluster as the run's chat model, when `FERROGRAPH_CLUSTER_JOIN` names nodes:
/// `FERROGRAPH_CLUSTER_MODEL` picks the model (default: any), `FERROGRAPH_CLUSTER_LABEL` a
/// label, `FERROGRAPH_CLUSTER_COOKIE_ENV` the cookie's variable (default
/// `FERROGRAPH_CLUSTER_COOKIE`), `FERROGRAPH_CLUSTER_TLS_CERT`, `_KEY`, `_CA` the TLS files.
pub(crate) async fn chat_model_from_env() -> Result<Option<Arc<dyn ChatModel>>> {
    let get = |n: &str| std::env::var(n).ok().filter(|v| !v.trim().is_empty());
    let Some(join) = get("FERROGRAPH_CLUSTER_JOIN") else {
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
        .context("FERROGRAPH_CLUSTER_JOIN: joining the cluster for its models")?;
    let model = node.chat_model(
        get("FERROGRAPH_CLUSTER_MODEL"),
        get("FERROGRAPH_CLUSTER_LABEL"),
    );
    let hosts = node.models().await;
    anyhow::ensure!(
        !hosts.is_empty(),
        "FERROGRAPH_CLUSTER_JOIN={join}: no node of the cluster serves a model (start one with `ferrograph node --serve-model …`)"
    );
    tracing::info!(
        "chat model: the cluster ({} host(s): {})",
        hosts.len(),
        hosts
            .iter()
            .map(|h| format!("{} on {}", h.model, h.node))
            .collect::<Vec<_>>()
            .join(", ")
    );
    // The node's actors keep running for the life of the process; the handle can go.
    drop(node);
    Ok(Some(Arc::new(model)))
}
