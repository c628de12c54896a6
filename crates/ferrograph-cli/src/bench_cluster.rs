//! `ferrograph bench cluster`: what crossing processes costs, and what a second worker buys.
//!
//! Worker nodes are real processes of this binary (`ferrograph node`) on loopback; the bench
//! process is the coordinator's node.
//! - **Per-call overhead**: the same echo model (no model work, no delay) called in-process
//!   and on a worker through [`ferrograph_cluster::ClusterChatModel`] (placement, the start
//!   call, long polls), sequentially, with and without streamed pieces.
//! - **Per-step overhead**: a three-step run with its middle step's task here, then placed
//!   on a worker process (`ferrograph node --serve-tasks`).
//! - **Spread**: a fan-out of echo calls over two workers; how many each served.
//! - **Model-bound fan-out**: the same batch of real model calls on one worker, then on two,
//!   with the CPU seconds each worker process spent, from which the throughput on separate
//!   machines is reasoned (each worker then has the cores this machine's workers share).

use anyhow::{Context, Result};
use ferrograph_chat::{ChatModel, GenerateOptions, TokenSink};
use ferrograph_cluster::{ClusterNode, NodeConfig};
use ferrograph_core::message::Message;
use serde::Serialize;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};

const COOKIE_VAR: &str = "FERROGRAPH_BENCH_CLUSTER_COOKIE";

/// A worker node process.
struct Worker {
    name: String,
    addr: String,
    child: tokio::process::Child,
}

impl Worker {
    async fn start(name: &str, models: &[&str], join: Option<&str>) -> Result<Worker> {
        Self::start_with(name, models, join, &[]).await
    }

    async fn start_with(
        name: &str,
        models: &[&str],
        join: Option<&str>,
        extra: &[&str],
    ) -> Result<Worker> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let addr = format!("127.0.0.1:{port}");
        let exe = std::env::current_exe().context("finding this binary")?;
        let mut cmd = tokio::process::Command::new(exe);
        cmd.args([
            "node",
            "--name",
            name,
            "--listen",
            &addr,
            "--cookie-env",
            COOKIE_VAR,
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true);
        for m in models {
            cmd.args(["--serve-model", m]);
        }
        if let Some(j) = join {
            cmd.args(["--join", j]);
        }
        cmd.args(extra);
        let mut child = cmd.spawn().context("starting a worker node")?;
        let stdout = child.stdout.take().context("the worker's output")?;
        let mut lines = BufReader::new(stdout).lines();
        let ready = tokio::time::timeout(Duration::from_secs(300), async {
            while let Some(line) = lines.next_line().await? {
                if line.contains("listening on") {
                    return Ok::<bool, std::io::Error>(true);
                }
            }
            Ok(false)
        })
        .await;
        anyhow::ensure!(
            matches!(ready, Ok(Ok(true))),
            "worker {name} did not start (try `ferrograph node --name {name} --serve-model {}` to see why)",
            models.join(" --serve-model ")
        );
        // Keep reading its output so that it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Worker {
            name: name.to_string(),
            addr,
            child,
        })
    }

    /// User plus system CPU seconds the process has spent.
    fn cpu_seconds(&self) -> Option<f64> {
        let pid = self.child.id()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let after = stat.rsplit_once(')')?.1;
        let fields: Vec<&str> = after.split_whitespace().collect();
        let utime: f64 = fields.get(11)?.parse().ok()?;
        let stime: f64 = fields.get(12)?.parse().ok()?;
        Some((utime + stime) / 100.0)
    }
}

/// Per-call figures of one way of calling.
#[derive(Debug, Serialize)]
pub(crate) struct CallCost {
    /// How the model was called.
    pub(crate) how: String,
    /// Calls made.
    pub(crate) calls: usize,
    /// Median microseconds per call.
    pub(crate) median_us: f64,
    /// Mean microseconds per call.
    pub(crate) mean_us: f64,
}

/// A model-bound fan-out on some workers.
#[derive(Debug, Serialize)]
pub(crate) struct FanOut {
    /// Worker processes.
    pub(crate) workers: usize,
    /// Calls in the batch.
    pub(crate) calls: usize,
    /// Wall-clock seconds for the batch.
    pub(crate) seconds: f64,
    /// Calls per second.
    pub(crate) calls_per_s: f64,
    /// Calls each worker served.
    pub(crate) served: Vec<(String, u64)>,
    /// CPU seconds the workers spent per call.
    pub(crate) cpu_s_per_call: Option<f64>,
}

/// The whole report.
#[derive(Debug, Serialize)]
pub(crate) struct ClusterBench {
    /// Per-call overhead, local against remote.
    pub(crate) overhead: Vec<CallCost>,
    /// A three-step run (`demo` with one commit) with its middle step here and placed on a
    /// worker process.
    pub(crate) task: Vec<CallCost>,
    /// An echo fan-out over two workers: calls each served.
    pub(crate) spread: Vec<(String, u64)>,
    /// Real model calls on one and two workers.
    pub(crate) fan_out: Vec<FanOut>,
    /// The model of the fan-out.
    pub(crate) model: String,
    /// Logical CPUs of this machine.
    pub(crate) cpus: usize,
}

async fn time_calls(model: &dyn ChatModel, calls: usize, stream: bool) -> Result<Vec<f64>> {
    let opts = GenerateOptions::default();
    let msgs = [Message::human("one two three four five six seven eight")];
    let mut out = Vec::with_capacity(calls);
    for _ in 0..calls {
        let sink = stream.then(|| TokenSink::callback(|_, _| {}));
        let t = Instant::now();
        model.invoke(&msgs, &opts, sink).await?;
        out.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(out)
}

fn cost(how: &str, mut us: Vec<f64>) -> CallCost {
    us.sort_by(f64::total_cmp);
    let calls = us.len();
    let mean = us.iter().sum::<f64>() / calls.max(1) as f64;
    CallCost {
        how: how.into(),
        calls,
        median_us: us.get(calls / 2).copied().unwrap_or(0.0),
        mean_us: mean,
    }
}

async fn coordinator(join: &[&str]) -> Result<ClusterNode> {
    let listen: SocketAddr = ([127, 0, 0, 1], 0).into();
    let cookie = std::env::var(COOKIE_VAR).unwrap_or_default();
    let mut c = NodeConfig::new(format!("bench-{}", std::process::id()), listen, cookie);
    c.cookie_var = COOKIE_VAR.into();
    let node = ClusterNode::start(c).await?;
    for j in join {
        node.join(j).await?;
    }
    Ok(node)
}

async fn served(node: &ClusterNode, workers: &[Worker]) -> Vec<(String, u64)> {
    let infos = node.nodes().await;
    workers
        .iter()
        .map(|w| {
            let n = infos
                .iter()
                .find(|i| i.name == w.name)
                .map_or(0, |i| i.served);
            (w.name.clone(), n)
        })
        .collect()
}

/// The served name and `--serve-model` spec of the bench's model.
fn model_spec(model: &str) -> (String, String) {
    ("bench-model".into(), format!("bench-model={model}"))
}

fn requests(n: usize, max_tokens: usize) -> Vec<(Vec<Message>, GenerateOptions)> {
    (0..n)
        .map(|i| {
            let opts = GenerateOptions {
                max_tokens,
                ..GenerateOptions::default()
            };
            let q = format!("Write one sentence about the number {}.", i + 1);
            (vec![Message::human(q)], opts)
        })
        .collect()
}

fn difference(after: &[(String, u64)], before: &[(String, u64)]) -> Vec<(String, u64)> {
    after
        .iter()
        .map(|(name, n)| {
            let b = before
                .iter()
                .find(|(m, _)| m == name)
                .map_or(0, |(_, b)| *b);
            (name.clone(), n.saturating_sub(b))
        })
        .collect()
}

/// Runs the benchmark: `model` is a manifest name or a GGUF path; `fan_calls` model calls of
/// up to `max_tokens` tokens each.
pub(crate) async fn bench_cluster(
    model: &str,
    quick: bool,
    fan_calls: usize,
    max_tokens: usize,
) -> Result<ClusterBench> {
    if std::env::var(COOKIE_VAR).map_or(true, |v| v.is_empty()) {
        // A fresh secret for this run's processes (the workers inherit the environment).
        let secret = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        std::env::set_var(COOKIE_VAR, secret);
    }
    let calls = if quick { 50 } else { 500 };

    // Overhead and spread, on two echo workers.
    let (overhead, spread) = {
        let w1 = Worker::start("echo-1", &["echo"], None).await?;
        let w2 = Worker::start("echo-2", &["echo"], Some(&w1.addr)).await?;
        let node = coordinator(&[&w1.addr, &w2.addr]).await?;
        let local = crate::cluster::echo("local", Duration::ZERO);
        let remote = node.chat_model(Some("echo".into()), None);
        time_calls(&remote, 5, false).await?;
        let overhead = vec![
            cost("in-process", time_calls(&local, calls, false).await?),
            cost("other process", time_calls(&remote, calls, false).await?),
            cost(
                "other process, streamed",
                time_calls(&remote, calls, true).await?,
            ),
        ];
        let workers = [w1, w2];
        let before = served(&node, &workers).await;
        ferrograph_chat::invoke_all(&remote, &requests(100, 16)).await?;
        let spread = difference(&served(&node, &workers).await, &before);
        node.shutdown().await;
        (overhead, spread)
    };

    // A step's task here against one on a worker process: `demo` with one commit runs
    // split, classify, write; classify is placed.
    let task = {
        let tmp = tempfile::tempdir()?;
        let data = tmp.path().display().to_string();
        let w = Worker::start_with(
            "tasks-1",
            &[],
            None,
            &["--labels", "worker", "--serve-tasks", "--data-dir", &data],
        )
        .await?;
        let node = coordinator(&[&w.addr]).await?;
        let runs = calls / 2;
        let mut out = Vec::new();
        for placed in [false, true] {
            let rt = ferrograph::Runtime::new().await?;
            if placed {
                rt.set_placer(std::sync::Arc::new(node.task_placer()));
                rt.place("demo", "classify", "worker");
            }
            let runner = rt.load(ferrograph_basics::demo::graph()?).await?;
            let input = || {
                ferrograph::runtime::JsonInput::Update(
                    serde_json::json!({"commits": ["fix: crash in the parser"]}),
                )
            };
            let mut us = Vec::with_capacity(runs);
            for i in 0..runs + 5 {
                let t = Instant::now();
                ferrograph::runtime::Workflow::invoke(
                    &runner,
                    input(),
                    ferrograph::RunConfig::default(),
                )
                .await?;
                if i >= 5 {
                    us.push(t.elapsed().as_secs_f64() * 1e6);
                }
            }
            let how = if placed {
                "classify on a worker process"
            } else {
                "every step here"
            };
            out.push(cost(how, us));
        }
        node.shutdown().await;
        out
    };

    // The model-bound fan-out on one worker, then two.
    let (name, spec) = model_spec(model);
    let mut fan_out = Vec::new();
    for n in [1usize, 2] {
        let mut workers: Vec<Worker> = Vec::new();
        for k in 0..n {
            let join = workers.first().map(|w| w.addr.clone());
            workers
                .push(Worker::start(&format!("model-{}", k + 1), &[&spec], join.as_deref()).await?);
        }
        let addrs: Vec<&str> = workers.iter().map(|w| w.addr.as_str()).collect();
        let node = coordinator(&addrs).await?;
        let remote = node.chat_model(Some(name.clone()), None);
        let batch = requests(fan_calls, max_tokens);
        let cpu = |ws: &[Worker]| ws.iter().map(Worker::cpu_seconds).sum::<Option<f64>>();
        let before = served(&node, &workers).await;
        let cpu0 = cpu(&workers);
        let t = Instant::now();
        ferrograph_chat::invoke_all(&remote, &batch).await?;
        let seconds = t.elapsed().as_secs_f64();
        let cpu1 = cpu(&workers);
        let served_now = difference(&served(&node, &workers).await, &before);
        fan_out.push(FanOut {
            workers: n,
            calls: fan_calls,
            seconds,
            calls_per_s: fan_calls as f64 / seconds,
            served: served_now,
            cpu_s_per_call: cpu0.zip(cpu1).map(|(a, b)| (b - a) / fan_calls as f64),
        });
        node.shutdown().await;
        drop(workers);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    Ok(ClusterBench {
        overhead,
        task,
        spread,
        fan_out,
        model: model.to_string(),
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
    })
}

/// The report in words.
pub(crate) fn summary(b: &ClusterBench) -> String {
    let mut out = String::from("per model call (echo model, sequential):\n");
    for c in &b.overhead {
        out.push_str(&format!(
            "  {:<26} median {:>8.1} us   mean {:>8.1} us   ({} calls)\n",
            c.how, c.median_us, c.mean_us, c.calls
        ));
    }
    out.push_str("a three-step run (demo, one commit), sequential:\n");
    for c in &b.task {
        out.push_str(&format!(
            "  {:<30} median {:>8.1} us   mean {:>8.1} us   ({} runs)\n",
            c.how, c.median_us, c.mean_us, c.calls
        ));
    }
    if let [here, placed] = b.task.as_slice() {
        out.push_str(&format!(
            "  a step's task on another process costs {:.1} us more (median)\n",
            placed.median_us - here.median_us
        ));
    }
    let spread: Vec<String> = b.spread.iter().map(|(n, k)| format!("{n} {k}")).collect();
    out.push_str(&format!(
        "fan-out of 100 echo calls over two workers: {}\n",
        spread.join(", ")
    ));
    out.push_str(&format!(
        "model-bound fan-out ({}), {} CPUs:\n",
        b.model, b.cpus
    ));
    for f in &b.fan_out {
        let served: Vec<String> = f.served.iter().map(|(n, k)| format!("{n} {k}")).collect();
        out.push_str(&format!(
            "  {} worker(s): {} calls in {:.2} s = {:.2} calls/s; served {}; CPU {} s/call\n",
            f.workers,
            f.calls,
            f.seconds,
            f.calls_per_s,
            served.join(", "),
            f.cpu_s_per_call
                .map_or("?".to_string(), |c| format!("{c:.2}"))
        ));
    }
    if let (Some(one), Some(two)) = (b.fan_out.first(), b.fan_out.get(1)) {
        out.push_str(&format!(
            "  two workers on this machine: {:.2}x one (they share its {} CPUs); on two such machines: about {:.2} calls/s (2x one worker's, less the per-call overhead above)\n",
            two.calls_per_s / one.calls_per_s,
            b.cpus,
            2.0 * one.calls_per_s
        ));
    }
    out
}
