//! Worker process of the crash tests (`tests/tests/crash.rs`).
//!
//! ```text
//! crash_worker run DIR EFFECTS_FILE INCARNATION THREADS
//!     Opens a SledSaver in DIR and runs threads job-0 .. job-{THREADS-1} of the job graph
//!     concurrently, in sync durability: a thread with checkpoints is continued
//!     (`RunInput::Continue`) unless it is recorded as done; a thread without any starts from
//!     its input. Every node execution appends
//!     `thread \t task_id \t node \t step \t incarnation` to EFFECTS_FILE and fsyncs it before
//!     returning its output. Prints `all done` and exits 0 when every thread has finished.
//! crash_worker inspect DIR THREADS
//!     Prints, as JSON, what DIR holds for each thread: its checkpoints (id, parent, step, the
//!     task ids planned next, whether full), the task ids with a recorded output among the
//!     pending writes, the thread status and the state at the newest checkpoint.
//! crash_worker expected THREADS
//!     Runs every thread uninterrupted with the in-memory saver and prints the final states.
//! ```
//!
//! The parent test kills `run` with SIGKILL at random moments and restarts it. With
//! `FERROGRAPH_CRASH_MUTANT=drop-writes`, `run` misbehaves on purpose (see
//! `drop_pending_writes`), so that the test can check that its checks fail.

use ferrograph::checkpoint_savers::SledSaver;
use ferrograph::core::checkpoint::{load_history, PendingKind};
use ferrograph::prelude::*;
use ferrograph::CheckpointSaver;
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// State of the job graph.
#[derive(State, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// What ran, in plan order.
    #[reducer(append)]
    pub log: Vec<String>,
    /// A running total.
    #[reducer(add)]
    pub total: i64,
    /// The thread's seed (input).
    pub seed: i64,
    /// The item a fanned-out worker was sent.
    pub item: i64,
}

/// Where effect records go, with this process's incarnation.
struct Effects {
    file: Mutex<File>,
    incarnation: u64,
}

static EFFECTS: OnceLock<Effects> = OnceLock::new();

/// Appends an effect record and makes it durable before the node returns.
fn record_effect(ctx: &NodeContext) -> Result<(), NodeError> {
    let Some(effects) = EFFECTS.get() else {
        return Ok(());
    };
    let line = format!(
        "{}\t{}\t{}\t{}\t{}\n",
        ctx.thread_id().unwrap_or_default(),
        ctx.task_id(),
        ctx.node(),
        ctx.step(),
        effects.incarnation
    );
    let mut file = effects
        .file
        .lock()
        .map_err(|_| NodeError::fatal("effects file lock poisoned"))?;
    file.write_all(line.as_bytes())
        .and_then(|()| file.sync_data())
        .map_err(|e| NodeError::fatal(format!("could not record an effect: {e}")))
}

/// A small, task-dependent pause, so that kills land at many different points.
async fn jitter(ctx: &NodeContext) {
    let h = ctx
        .task_id()
        .bytes()
        .fold(0u64, |a, b| a.wrapping_mul(31).wrapping_add(u64::from(b)));
    tokio::time::sleep(Duration::from_micros(h % 3000)).await;
}

/// Runs `f`'s update after the jitter and the durable effect record.
fn node<F>(f: F) -> impl Fn(Arc<Job>, NodeContext) -> futures_ret::Ret + Send + Sync + 'static
where
    F: Fn(&Job) -> JobUpdate + Send + Sync + 'static,
{
    let f = Arc::new(f);
    move |s: Arc<Job>, ctx: NodeContext| {
        let f = f.clone();
        Box::pin(async move {
            jitter(&ctx).await;
            let update = f(&s);
            record_effect(&ctx)?;
            Ok(update)
        })
    }
}

mod futures_ret {
    use super::JobUpdate;
    use ferrograph::NodeError;
    use std::future::Future;
    use std::pin::Pin;

    /// The future a job node returns.
    pub type Ret = Pin<Box<dyn Future<Output = Result<JobUpdate, NodeError>> + Send>>;
}

/// The job graph: `start`; `left` and `right` in parallel; `dispatch` once both finished,
/// fanning out four `worker` tasks with `SendTo`; then the chain `c1 -> c2 -> c3`.
pub fn job_graph() -> Result<CompiledGraph<Job>, ferrograph::CompileError> {
    let mut g = StateGraph::<Job>::new("crash-job")
        .add_node(
            "start",
            node(|s| JobUpdate::new().log(vec!["start".into()]).total(s.seed)),
        )
        .add_node(
            "left",
            node(|s| {
                JobUpdate::new()
                    .log(vec![format!("left:{}", s.seed)])
                    .total(2 * s.seed)
            }),
        )
        .add_node(
            "right",
            node(|_s| JobUpdate::new().log(vec!["right".into()]).total(3)),
        )
        .add_node(
            "dispatch",
            node(|_s| JobUpdate::new().log(vec!["dispatch".into()])),
        )
        .add_node(
            "worker",
            node(|s| {
                JobUpdate::new()
                    .log(vec![format!("w{}", s.item)])
                    .total(s.item * s.seed)
            }),
        )
        .add_edge(START, "start")
        .add_edge("start", "left")
        .add_edge("start", "right")
        .add_join(["left", "right"], "dispatch")
        .add_conditional_edges(
            "dispatch",
            |s: &Job| {
                (1..=4)
                    .map(|i| {
                        SendTo::new(
                            "worker",
                            Job {
                                seed: s.seed,
                                item: i,
                                ..Job::default()
                            },
                        )
                    })
                    .collect::<Vec<_>>()
            },
            ["worker"],
        )
        .add_edge("worker", "c1");
    for k in 1..=3i64 {
        g = g.add_node(
            format!("c{k}"),
            node(move |s| {
                JobUpdate::new()
                    .log(vec![format!("c{k}")])
                    .total(k * 100 + s.total % 7)
            }),
        );
    }
    g.add_edge("c1", "c2")
        .add_edge("c2", "c3")
        .add_edge("c3", END)
        .compile()
}

fn thread_name(k: usize) -> String {
    format!("job-{k}")
}

fn job_input(k: usize) -> RunInput<Job> {
    RunInput::Update(JobUpdate::new().seed(k as i64 + 1))
}

fn parse<T: std::str::FromStr>(args: &[String], i: usize, what: &str) -> Result<T, BoxError> {
    args.get(i)
        .ok_or_else(|| format!("missing {what}"))?
        .parse()
        .map_err(|_| format!("bad {what}: {:?}", args.get(i)).into())
}

async fn run(args: &[String]) -> Result<(), BoxError> {
    let dir: String = parse(args, 2, "DIR")?;
    let effects_path: String = parse(args, 3, "EFFECTS_FILE")?;
    let incarnation: u64 = parse(args, 4, "INCARNATION")?;
    let threads: usize = parse(args, 5, "THREADS")?;
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&effects_path)?;
    EFFECTS
        .set(Effects {
            file: Mutex::new(file),
            incarnation,
        })
        .map_err(|_| "effects already set")?;
    let saver = SledSaver::open(&dir)?;
    let runtime = Runtime::new().await?;
    let runner = runtime
        .load(job_graph()?)
        .await?
        .with_checkpointer(saver.clone());
    let mutant_drops_writes =
        std::env::var("FERROGRAPH_CRASH_MUTANT").is_ok_and(|m| m == "drop-writes");
    let mut tasks = Vec::new();
    for k in 0..threads {
        let thread = thread_name(k);
        let finished = saver
            .get_thread(&thread)
            .await?
            .is_some_and(|i| i.status == ferrograph::ThreadStatus::Done);
        let input = match saver.get(&thread, None).await? {
            None => job_input(k),
            // Finished, with its status recorded. (Killed between its last checkpoint and its
            // status update, it is continued: the run ends at once and records `done`.)
            Some(head) if head.next.is_empty() && finished => continue,
            Some(head) => {
                if mutant_drops_writes {
                    drop_pending_writes(&saver, &thread, &head.checkpoint_id)?;
                }
                RunInput::Continue
            }
        };
        let runner = runner.clone();
        tasks.push(tokio::spawn(async move {
            let config = RunConfig::thread(thread.clone()).durability(Durability::Sync);
            runner
                .invoke(input, config)
                .await
                .map_err(|e| format!("{thread}: {e}"))
        }));
    }
    for t in tasks {
        let out = t.await??;
        if !out.is_done() {
            return Err(format!("{:?} ended as {:?}", out.thread_id, out.status).into());
        }
    }
    drop(runner);
    runtime.shutdown(Duration::from_secs(5)).await;
    saver.flush().await?;
    println!("all done");
    Ok(())
}

/// The deliberately broken mode `FERROGRAPH_CRASH_MUTANT=drop-writes`: forgets the pending
/// writes of a thread's newest checkpoint before continuing it, as a runtime that ignored
/// them would. The crash test uses it to show that its checks catch re-run tasks.
fn drop_pending_writes(saver: &SledSaver, thread: &str, checkpoint: &str) -> Result<(), BoxError> {
    let tree = saver
        .db()
        .open_tree(ferrograph::checkpoint_savers::WRITES_TREE)?;
    let mut prefix = ferrograph::checkpoint_savers::checkpoint_key(thread, checkpoint);
    prefix.push(0);
    for item in tree.scan_prefix(prefix) {
        let (key, _) = item?;
        tree.remove(key)?;
    }
    tree.flush()?;
    Ok(())
}

/// What `inspect` reports for a checkpoint.
#[derive(Serialize, Deserialize)]
struct CheckpointView {
    id: String,
    parent: Option<String>,
    step: u64,
    next_tasks: Vec<String>,
    full: bool,
}

/// What `inspect` reports for a thread.
#[derive(Serialize, Deserialize)]
struct ThreadView {
    thread: String,
    status: Option<String>,
    checkpoints: Vec<CheckpointView>,
    output_tasks: Vec<String>,
    state: Option<Job>,
}

async fn inspect(args: &[String]) -> Result<(), BoxError> {
    let dir: String = parse(args, 2, "DIR")?;
    let threads: usize = parse(args, 3, "THREADS")?;
    let saver = SledSaver::open(&dir)?;
    let mut out = Vec::new();
    for k in 0..threads {
        let thread = thread_name(k);
        let history = load_history::<Job>(saver.as_ref(), &thread).await?;
        let mut output_tasks = Vec::new();
        for c in &history {
            for w in saver.get_writes(&thread, &c.frame.checkpoint_id).await? {
                if matches!(w.kind, PendingKind::Output(_)) {
                    output_tasks.push(w.task_id);
                }
            }
        }
        out.push(ThreadView {
            status: saver
                .get_thread(&thread)
                .await?
                .map(|i| i.status.to_string()),
            state: history.last().map(|c| (*c.frame.state).clone()),
            checkpoints: history
                .iter()
                .map(|c| CheckpointView {
                    id: c.frame.checkpoint_id.clone(),
                    parent: c.frame.parent_id.clone(),
                    step: c.frame.step,
                    next_tasks: c.frame.next.iter().map(|t| t.id.clone()).collect(),
                    full: c.record.full,
                })
                .collect(),
            output_tasks,
            thread,
        });
    }
    println!("{}", serde_json::to_string(&out)?);
    Ok(())
}

async fn expected(args: &[String]) -> Result<(), BoxError> {
    let threads: usize = parse(args, 2, "THREADS")?;
    let runtime = Runtime::new().await?;
    let runner = runtime
        .load(job_graph()?)
        .await?
        .with_checkpointer(Arc::new(MemorySaver::new()));
    let mut states = Vec::new();
    for k in 0..threads {
        let out = runner
            .invoke(job_input(k), RunConfig::thread(thread_name(k)))
            .await?;
        states.push((*out.state).clone());
    }
    println!("{}", serde_json::to_string(&states)?);
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("crash_worker: no tokio runtime: {e}");
            return std::process::ExitCode::from(3);
        }
    };
    let result = rt.block_on(async {
        match args.get(1).map(String::as_str) {
            Some("run") => run(&args).await,
            Some("inspect") => inspect(&args).await,
            Some("expected") => expected(&args).await,
            _ => Err("usage: crash_worker run|inspect|expected ...".into()),
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let mut text = e.to_string();
            let mut source = e.source();
            while let Some(s) = source {
                text.push_str(&format!(": {s}"));
                source = s.source();
            }
            eprintln!("crash_worker: {text}");
            std::process::ExitCode::from(2)
        }
    }
}
