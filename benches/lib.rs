//! Benchmark workloads, shared by the criterion benches (`cargo bench -p ferrograph-benches`)
//! and `ferrograph bench graph`, which prints JSON that `benches/peers/compare_graph.py` sets
//! side by side with the same graphs built in LangGraph.
//!
//! [`llm`]: `bench_llm` behind `ferrograph bench llm`; [`llm_peer`]: its comparison with
//! llama.cpp's own `llama-bench` and `llama-server` at every shape (`--peer llama-cpp`).
//!
//! - `chain10`: ten no-op nodes in a chain. Reported per node step.
//! - `fanout100`: a dispatch node sends 100 tasks to a worker that appends its item, and a
//!   join runs once after all of them. Reported per run (102 node executions).

use ferrograph::prelude::*;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub mod checkpoint;
pub mod llm;
pub mod llm_peer;

/// State of the chain graph.
#[derive(State, Clone, Debug, Default, Serialize, Deserialize)]
pub struct ChainState {
    /// Unused by the no-op nodes; present so the state is not empty.
    pub counter: i64,
}

/// State of the fan-out graph.
#[derive(State, Clone, Debug, Default, Serialize, Deserialize)]
pub struct FanState {
    /// Items appended by the workers.
    #[reducer(append)]
    pub items: Vec<i64>,
    /// The item a worker was sent.
    pub item: i64,
}

/// Ten no-op nodes in a chain.
pub fn chain10() -> CompiledGraph<ChainState> {
    let mut g = StateGraph::<ChainState>::new("chain10");
    for i in 0..10 {
        g = g.add_node(
            format!("n{i}"),
            |_s: Arc<ChainState>, _c: NodeContext| async { Ok::<_, NodeError>(()) },
        );
    }
    g = g.add_edge(START, "n0");
    for i in 0..9 {
        g = g.add_edge(format!("n{i}"), format!("n{}", i + 1));
    }
    match g.add_edge("n9", END).compile() {
        Ok(c) => c,
        Err(e) => unreachable_graph(e),
    }
}

/// A 100-way `SendTo` fan-out with a join.
pub fn fanout100() -> CompiledGraph<FanState> {
    let g = StateGraph::<FanState>::new("fanout100")
        .add_node("dispatch", |_s: Arc<FanState>, _c: NodeContext| async {
            Ok::<_, NodeError>(())
        })
        .add_node("worker", |s: Arc<FanState>, _c: NodeContext| async move {
            Ok::<_, NodeError>(FanStateUpdate::new().items(vec![s.item]))
        })
        .add_node("join", |_s: Arc<FanState>, _c: NodeContext| async {
            Ok::<_, NodeError>(())
        })
        .add_edge(START, "dispatch")
        .add_conditional_edges(
            "dispatch",
            |_s: &FanState| {
                (0..100)
                    .map(|i| {
                        SendTo::new(
                            "worker",
                            FanState {
                                items: Vec::new(),
                                item: i,
                            },
                        )
                    })
                    .collect::<Vec<_>>()
            },
            ["worker"],
        )
        .add_edge("worker", "join")
        .add_edge("join", END);
    match g.compile() {
        Ok(c) => c,
        Err(e) => unreachable_graph(e),
    }
}

fn unreachable_graph(e: ferrograph::CompileError) -> ! {
    // The graphs above are fixed; failing to compile them is a bug in this crate.
    #[allow(clippy::panic)]
    {
        panic!("benchmark graph does not compile: {e}")
    }
}

/// Which checkpointer a measurement used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Saver {
    /// None.
    None,
    /// [`MemorySaver`].
    Memory,
}

impl Saver {
    /// Name used in reports (matches the peer script).
    pub fn name(self) -> &'static str {
        match self {
            Saver::None => "none",
            Saver::Memory => "memory",
        }
    }
}

/// One measurement.
#[derive(Clone, Debug, Serialize)]
pub struct BenchResult {
    /// Graph name.
    pub graph: String,
    /// Checkpointer name.
    pub checkpointer: String,
    /// Mean microseconds per node execution.
    pub us_per_node_step: f64,
    /// Mean microseconds per run.
    pub us_per_run: f64,
    /// Median microseconds per run.
    pub p50_us_per_run: f64,
    /// 99th percentile microseconds per run.
    pub p99_us_per_run: f64,
    /// Runs measured.
    pub runs: usize,
}

/// How long to measure.
#[derive(Clone, Copy, Debug)]
pub enum Budget {
    /// About this long (plus a warm-up of a fifth of it).
    Time(Duration),
    /// Exactly this many runs after ten warm-up runs (for instruction-count profiling).
    Runs(usize),
}

/// Runs `graph` repeatedly within `budget` after a warm-up and reports timings.
pub async fn measure<S: State>(
    runtime: &Runtime,
    graph: CompiledGraph<S>,
    saver: Saver,
    node_steps: f64,
    input: impl Fn() -> S::Update,
    budget: Budget,
) -> Result<BenchResult, RunError> {
    let (time, runs) = match budget {
        Budget::Time(t) => (t, 20),
        Budget::Runs(n) => (Duration::ZERO, n.max(1)),
    };
    let mut runner = runtime.load(graph.clone()).await?;
    if saver == Saver::Memory {
        runner = runner.with_checkpointer(Arc::new(MemorySaver::new()));
    }
    let config = |i: usize| match saver {
        Saver::None => RunConfig::default(),
        Saver::Memory => RunConfig::thread(format!("bench-{i}")),
    };
    let warmup_until = Instant::now() + time / 5;
    let mut i = 0usize;
    while Instant::now() < warmup_until || i < 10 {
        runner.invoke(RunInput::Update(input()), config(i)).await?;
        i += 1;
    }
    let mut samples = Vec::new();
    let start = Instant::now();
    while start.elapsed() < time || samples.len() < runs {
        let t = Instant::now();
        runner.invoke(RunInput::Update(input()), config(i)).await?;
        samples.push(t.elapsed().as_secs_f64() * 1e6);
        i += 1;
    }
    let total: f64 = samples.iter().sum();
    let mean = total / samples.len() as f64;
    samples.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| samples[((samples.len() - 1) as f64 * p).round() as usize];
    Ok(BenchResult {
        graph: graph.name().to_string(),
        checkpointer: saver.name().to_string(),
        us_per_node_step: mean / node_steps,
        us_per_run: mean,
        p50_us_per_run: pct(0.5),
        p99_us_per_run: pct(0.99),
        runs: samples.len(),
    })
}

/// Measures both graphs with every checkpointer. The measuring loop runs inside a tokio task,
/// as a caller inside an async application would, not on the thread that blocks on the runtime.
pub async fn measure_all(budget: Budget) -> Result<Vec<BenchResult>, RunError> {
    let task = tokio::spawn(async move {
        let runtime = Runtime::new().await?;
        let mut out = Vec::new();
        for saver in [Saver::None, Saver::Memory] {
            out.push(
                measure(
                    &runtime,
                    chain10(),
                    saver,
                    10.0,
                    ChainStateUpdate::new,
                    budget,
                )
                .await?,
            );
            out.push(
                measure(
                    &runtime,
                    fanout100(),
                    saver,
                    102.0,
                    FanStateUpdate::new,
                    budget,
                )
                .await?,
            );
        }
        Ok(out)
    });
    task.await
        .map_err(|e| RunError::Internal(format!("benchmark task failed: {e}")))?
}
