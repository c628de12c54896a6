//! Cost of durable checkpoints: [`SledSaver`] in sync durability (every checkpoint and every
//! pending write flushed to disk before the run goes on), printed by
//! `ferrograph bench checkpoint --json` and set beside LangGraph's `SqliteSaver` by
//! `benches/peers/compare_checkpoint.py`.
//!
//! Workloads (the same on both sides):
//!
//! - `chain10`: [`crate::chain10`], ten no-op nodes; each run is a fresh thread and writes 11
//!   checkpoints (the input and one per node).
//! - `chat500`: one thread, 250 turns; each turn adds a human message as input and an `ai`
//!   node answers with one AI message, so the conversation reaches 500 messages. Each turn
//!   writes 2 checkpoints (input and `ai`).
//! - `chain10_x64`: 64 `chain10` runs at once on one saver: the amortized cost per checkpointed
//!   step when concurrent runs share fsyncs (group commit).
//!
//! A *checkpointed step* is one checkpoint written (input or superstep). Per-step times are a
//! run's (or turn's) wall time divided by the checkpoints it wrote; p50 and p99 are taken over
//! runs (turns). Bytes per step count everything handed to sled (keys, sealed records, pending
//! writes and thread records) divided by the checkpoints written. The report also gives the
//! cost of a bare sled flush (`flush_async`, and a blocking flush on tokio's blocking pool) on
//! this machine, which bounds a single run's step from below in sync mode, and the `chain10`
//! sync row carries sled alone writing and flushing records of a step's size after every one of
//! its runs (`interleaved_flush_us`: the flush alone, the write and the flush together, and the
//! step's ratios to both).

use crate::{chain10, ChainStateUpdate};
use ferrograph::checkpoint_savers::SledSaver;
use ferrograph::prelude::*;
use ferrograph::CheckpointSaver;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Errors of the checkpoint benchmark.
pub type BenchError = Box<dyn std::error::Error + Send + Sync>;

/// State of the chat workload.
#[derive(State, Clone, Debug, Default, Serialize, Deserialize)]
pub struct ChatState {
    /// The conversation.
    #[reducer(messages)]
    pub messages: Vec<Message>,
}

/// The chat graph: START -> ai -> END; `ai` answers the last message.
pub fn chat() -> Result<CompiledGraph<ChatState>, ferrograph::CompileError> {
    StateGraph::<ChatState>::new("chat")
        .add_node("ai", |s: Arc<ChatState>, _c: NodeContext| async move {
            let n = s.messages.len();
            Ok::<_, NodeError>(ChatStateUpdate::new().messages(Message::ai(format!(
                "Answer number {n}: thank you for your question, here is a short reply."
            ))))
        })
        .add_edge(START, "ai")
        .add_edge("ai", END)
        .compile()
}

/// A scratch directory removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Result<Self, BenchError> {
        let dir = std::env::temp_dir().join(format!(
            "ferrograph-bench-{name}-{}-{}",
            std::process::id(),
            ferrograph::core::id::random_id()
        ));
        std::fs::create_dir_all(&dir)?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Mean, p50 and p99 of per-step samples.
fn summary(mut samples: Vec<f64>) -> (f64, f64, f64) {
    let mean = samples.iter().sum::<f64>() / samples.len().max(1) as f64;
    samples.sort_by(|a, b| a.total_cmp(b));
    (mean, pct(&samples, 0.5), pct(&samples, 0.99))
}

async fn chain10_sled(
    runtime: &Runtime,
    quick: bool,
    checkpointer: bool,
) -> Result<serde_json::Value, BenchError> {
    let scratch = Scratch::new("chain10")?;
    let saver = SledSaver::open(&scratch.0)?;
    let mut runner = runtime.load(chain10()).await?;
    if checkpointer {
        runner = runner.with_checkpointer(saver.clone());
    }
    let budget = if quick {
        Duration::from_millis(700)
    } else {
        Duration::from_secs(4)
    };
    let config = |i: usize| {
        if checkpointer {
            RunConfig::thread(format!("chain-{i}")).durability(Durability::Sync)
        } else {
            RunConfig::default()
        }
    };
    for i in 0..5 {
        runner
            .invoke(RunInput::Update(ChainStateUpdate::new()), config(i))
            .await?;
    }
    let before = saver.stats();
    let mut samples = Vec::new();
    // After every run, sled alone does what the run's steps had to: 11 times, write a record
    // of a step's size under a key shaped like a checkpoint's and flush, on the same database
    // and disk at the same moment (a flush measured apart, even seconds apart, moves with the
    // disk by ±30 % here). The floors a step of one run in sync mode is compared with: the
    // flush alone, and the write and the flush together.
    let floor_tree = saver.db().open_tree("bench/flush-floor")?;
    let mut floor = Vec::new();
    let mut floor_write = Vec::new();
    let started = Instant::now();
    let mut i = 5;
    while started.elapsed() < budget || samples.len() < 20 {
        let t = Instant::now();
        runner
            .invoke(RunInput::Update(ChainStateUpdate::new()), config(i))
            .await?;
        samples.push(t.elapsed().as_secs_f64() * 1e6 / 11.0);
        if checkpointer {
            for step in 0..11u64 {
                let key = format!("floor-{i}\0{:016x}{:08x}", i as u64 * 100 + step, step);
                // The plainest write and flush there are: sled's, on this thread, nothing else
                // around them.
                let w = Instant::now();
                floor_tree.insert(key.as_bytes(), vec![7u8; 150])?;
                let t = Instant::now();
                saver.db().flush()?;
                floor.push(t.elapsed().as_secs_f64() * 1e6);
                floor_write.push(w.elapsed().as_secs_f64() * 1e6);
            }
        }
        i += 1;
    }
    let after = saver.stats();
    let steps = after.checkpoints - before.checkpoints;
    let runs = samples.len();
    let (mean, p50, p99) = summary(samples);
    let floor = (!floor.is_empty()).then(|| {
        let (fm, f50, f99) = summary(floor);
        let (wm, w50, w99) = summary(floor_write);
        json!({
            "mean": fm, "p50": f50, "p99": f99,
            "step_p50_over_flush_p50": p50 / f50,
            "write_and_flush_us": { "mean": wm, "p50": w50, "p99": w99 },
            "step_p50_over_write_and_flush_p50": p50 / w50,
            "step_mean_over_write_and_flush_mean": mean / wm,
        })
    });
    Ok(json!({
        "interleaved_flush_us": floor,
        "workload": "chain10",
        "checkpointer": if checkpointer { "sled" } else { "none" },
        "durability": if checkpointer { "sync" } else { "none" },
        "us_per_step": mean,
        "p50_us_per_step": p50,
        "p99_us_per_step": p99,
        "bytes_per_step": (after.bytes_written - before.bytes_written) as f64 / steps.max(1) as f64,
        "payload_bytes_per_step": (after.payload_bytes - before.payload_bytes) as f64 / steps.max(1) as f64,
        "disk_flushes_per_step": (after.disk_flushes - before.disk_flushes) as f64 / steps.max(1) as f64,
        // Time spent inside the saver's disk flushes (sled writing and syncing), per step.
        "flush_us_per_step": (after.flush_nanos - before.flush_nanos) as f64 / 1e3 / steps.max(1) as f64,
        "steps": if checkpointer { steps } else { runs as u64 * 11 },
        "runs": runs,
    }))
}

async fn chat_sled(runtime: &Runtime, quick: bool) -> Result<serde_json::Value, BenchError> {
    let turns = if quick { 100 } else { 250 };
    let scratch = Scratch::new("chat")?;
    let saver = SledSaver::open(&scratch.0)?;
    let runner = runtime
        .load(chat()?)
        .await?
        .with_checkpointer(saver.clone());
    let before = saver.stats();
    let mut samples = Vec::with_capacity(turns);
    let mut late = (0u64, 0u64);
    let mut busy_retries = 0u64;
    for turn in 0..turns {
        let s0 = saver.stats();
        let mut t = Instant::now();
        let input = ChatStateUpdate::new().messages(Message::human(format!(
            "Question number {turn}: could you tell me something interesting?"
        )));
        let out = loop {
            match runner
                .invoke(
                    RunInput::Update(input.clone()),
                    RunConfig::thread("chat").durability(Durability::Sync),
                )
                .await
            {
                // The previous turn's run answers before it releases the thread; wait for it.
                Err(RunError::ThreadBusy(_)) => {
                    busy_retries += 1;
                    tokio::task::yield_now().await;
                    t = Instant::now();
                }
                other => break other?,
            }
        };
        samples.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
        if turn >= turns - turns / 5 {
            let s1 = saver.stats();
            late.0 += s1.bytes_written - s0.bytes_written;
            late.1 += s1.checkpoints - s0.checkpoints;
        }
        if out.state.messages.len() != 2 * (turn + 1) {
            return Err(format!("chat lost messages at turn {turn}").into());
        }
    }
    let after = saver.stats();
    let steps = after.checkpoints - before.checkpoints;
    let state = runner.get_state("chat", None).await?;
    let full_state = ferrograph::core::checkpoint::encode(1, &*state.values)?.len();
    let (mean, p50, p99) = summary(samples);
    Ok(json!({
        "workload": "chat500",
        "checkpointer": "sled",
        "durability": "sync",
        "messages": 2 * turns,
        "us_per_step": mean,
        "p50_us_per_step": p50,
        "p99_us_per_step": p99,
        "bytes_per_step": (after.bytes_written - before.bytes_written) as f64 / steps.max(1) as f64,
        "bytes_per_step_last_fifth": late.0 as f64 / late.1.max(1) as f64,
        "payload_bytes_per_step": (after.payload_bytes - before.payload_bytes) as f64 / steps.max(1) as f64,
        "full_state_bytes": full_state,
        "thread_busy_retries": busy_retries,
        "steps": steps,
        "runs": turns,
    }))
}

async fn chain10_concurrent(
    runtime: &Runtime,
    quick: bool,
    width: usize,
) -> Result<serde_json::Value, BenchError> {
    let scratch = Scratch::new("chain10x")?;
    let saver = SledSaver::open(&scratch.0)?;
    let runner = runtime
        .load(chain10())
        .await?
        .with_checkpointer(saver.clone());
    let rounds = if quick { 3 } else { 10 };
    let before = saver.stats();
    let started = Instant::now();
    for r in 0..rounds {
        let mut tasks = Vec::with_capacity(width);
        for i in 0..width {
            let runner = runner.clone();
            tasks.push(tokio::spawn(async move {
                runner
                    .invoke(
                        RunInput::Update(ChainStateUpdate::new()),
                        RunConfig::thread(format!("c{r}-{i}")).durability(Durability::Sync),
                    )
                    .await
            }));
        }
        for t in tasks {
            t.await??;
        }
    }
    let elapsed = started.elapsed();
    let after = saver.stats();
    let steps = after.checkpoints - before.checkpoints;
    Ok(json!({
        "workload": format!("chain10_x{width}"),
        "checkpointer": "sled",
        "durability": "sync",
        "concurrent_runs": width,
        "us_per_step": elapsed.as_secs_f64() * 1e6 / steps.max(1) as f64,
        "disk_flushes_per_step": (after.disk_flushes - before.disk_flushes) as f64 / steps.max(1) as f64,
        "ms_per_disk_flush": (after.flush_nanos - before.flush_nanos) as f64 / 1e6
            / (after.disk_flushes - before.disk_flushes).max(1) as f64,
        "steps": steps,
        "runs": rounds * width,
    }))
}

/// What one sled flush of a small write costs here: `flush` called directly on this thread,
/// through `flush_async` (sled's thread pool), a blocking flush on tokio's blocking pool, and
/// the saver's `flush`.
async fn flush_cost(quick: bool) -> Result<serde_json::Value, BenchError> {
    let scratch = Scratch::new("flush")?;
    let saver = SledSaver::open(&scratch.0)?;
    let n = if quick { 50 } else { 300 };
    let db = saver.db().clone();
    let mut asynch = Vec::with_capacity(n);
    let mut blocking = Vec::with_capacity(n);
    let mut direct = Vec::with_capacity(n);
    let mut via_saver = Vec::with_capacity(n);
    for i in 0..n as u64 {
        db.insert(i.to_be_bytes(), vec![6u8; 200])?;
        let t = Instant::now();
        db.flush()?;
        direct.push(t.elapsed().as_secs_f64() * 1e6);
        db.insert(i.to_be_bytes(), vec![7u8; 200])?;
        let t = Instant::now();
        db.flush_async().await?;
        asynch.push(t.elapsed().as_secs_f64() * 1e6);
        db.insert(i.to_be_bytes(), vec![8u8; 200])?;
        let t = Instant::now();
        let d = db.clone();
        tokio::task::spawn_blocking(move || d.flush()).await??;
        blocking.push(t.elapsed().as_secs_f64() * 1e6);
        saver
            .put_thread(ferrograph::ThreadInfo::new(format!("f{i}"), "flush"))
            .await?;
        let t = Instant::now();
        saver.flush().await?;
        via_saver.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let (dm, d50, d99) = summary(direct);
    let (am, a50, a99) = summary(asynch);
    let (bm, b50, b99) = summary(blocking);
    let (sm, s50, s99) = summary(via_saver);
    Ok(json!({
        "direct_flush_us": { "mean": dm, "p50": d50, "p99": d99 },
        "flush_async_us": { "mean": am, "p50": a50, "p99": a99 },
        "spawn_blocking_flush_us": { "mean": bm, "p50": b50, "p99": b99 },
        "saver_flush_us": { "mean": sm, "p50": s50, "p99": s99 },
        "samples": n,
    }))
}

/// Measures durable checkpoints with [`SledSaver`] in sync mode: per-step cost (mean, p50,
/// p99) and bytes per step on `chain10` and a 500-message chat, the amortized cost with 64
/// concurrent runs, `chain10` without a checkpointer as the baseline, and the cost of a bare
/// flush. `quick` shortens everything (and the chat to 200 messages).
pub async fn measure_checkpoint(quick: bool) -> Result<serde_json::Value, BenchError> {
    let runtime = Runtime::new().await?;
    let flush = flush_cost(quick).await?;
    let results = vec![
        chain10_sled(&runtime, quick, false).await?,
        chain10_sled(&runtime, quick, true).await?,
        chat_sled(&runtime, quick).await?,
        chain10_concurrent(&runtime, quick, 64).await?,
    ];
    runtime.shutdown(Duration::from_secs(10)).await;
    Ok(json!({
        "engine": "ferrograph",
        "version": env!("CARGO_PKG_VERSION"),
        "checkpointer": "sled",
        "sled_version": "0.34",
        "flush": flush,
        "results": results,
    }))
}

#[cfg(test)]
mod tests {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn quick_measurement_reports_every_workload() {
        let v = super::measure_checkpoint(true).await.unwrap();
        let rows = v["results"].as_array().unwrap();
        assert_eq!(rows.len(), 4);
        for r in rows {
            assert!(r["us_per_step"].as_f64().unwrap() > 0.0, "{r}");
        }
        // The sync chain carries its own floor: a bare flush after each of its runs.
        let floor = &rows[1]["interleaved_flush_us"];
        assert!(floor["p50"].as_f64().unwrap() > 0.0, "{floor}");
        assert!(
            floor["step_p50_over_flush_p50"].as_f64().unwrap() > 0.0,
            "{floor}"
        );
        assert!(rows[0]["interleaved_flush_us"].is_null());
    }
}
