//! Crash tests: a worker process (`src/bin/crash_worker.rs`) runs 16 threads of a graph with a
//! parallel step, a `SendTo` fan-out and a chain on a [`SledSaver`] in sync durability, and is
//! killed with SIGKILL at random moments, then restarted with the next incarnation number until
//! every thread has finished. Each node execution appends an effect record
//! `(thread, task id, node, step, incarnation)` to a file and fsyncs it before returning.
//!
//! Between two incarnations the test inspects the database (with the worker's `inspect`
//! mode) and checks, for every incarnation `i` and the snapshot `S_i` taken after it died:
//!
//! 1. **No finished task runs again.** A task counts as *recorded* in a snapshot when a pending
//!    write holds its output, or when the checkpoint that planned it has a child checkpoint
//!    (its step committed). No effect record of incarnation `i` may belong to a task recorded
//!    in `S_{i-1}`. So a task may run in two incarnations only if the earlier one was killed
//!    before its output reached disk; a runtime that re-ran a task whose output was saved, or
//!    a step that was committed, fails this check.
//! 2. **Sync durability: the plan precedes the work.** Every task with an effect record in
//!    incarnation `i` is planned by a checkpoint present in `S_i`: its step's checkpoint was
//!    flushed before the task started.
//! 3. **No committed checkpoint is lost.** Each thread's history in `S_i` is one contiguous
//!    chain (first checkpoint without parent at step 0, each next one the child of the previous
//!    at the next step) and extends the chain of `S_{i-1}`.
//! 4. Within one incarnation a task runs at most once.
//!
//! When the worker finishes on its own, every thread must be `done` with exactly the state an
//! uninterrupted run produces (the worker's `expected` mode), every committed task must have
//! an effect record, and no effect record may belong to a task outside the final history.
//!
//! The default run makes at least 30 kills (a few seconds); `FERROGRAPH_CRASH_TRIALS=200`
//! (see `scripts/crash-long.sh`) makes more. `FERROGRAPH_CRASH_SEED` replays a sequence of
//! kill delays.

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use ferrograph::checkpoint_savers::SledSaver;
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const WORKER: &str = env!("CARGO_BIN_EXE_crash_worker");
const THREADS: usize = 16;
/// After this many kills in one round the worker is left to finish, so rounds always end.
const KILLS_PER_ROUND: u64 = 12;

#[derive(Deserialize, Debug, Clone)]
struct CheckpointView {
    id: String,
    parent: Option<String>,
    step: u64,
    next_tasks: Vec<String>,
}

#[derive(Deserialize, Debug, Clone)]
struct ThreadView {
    thread: String,
    status: Option<String>,
    checkpoints: Vec<CheckpointView>,
    output_tasks: Vec<String>,
    state: Option<serde_json::Value>,
}

type Snapshot = BTreeMap<String, ThreadView>;

#[derive(Debug, Clone)]
struct Effect {
    thread: String,
    task: String,
    node: String,
    step: u64,
}

/// Task ids are meaningful within a thread: a task is named `thread/task_id`.
fn key(thread: &str, task: &str) -> String {
    format!("{thread}/{task}")
}

impl Effect {
    fn key(&self) -> String {
        key(&self.thread, &self.task)
    }
}

/// splitmix64: enough randomness for kill delays, reproducible from a seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

fn output(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The files of a store folder with their sizes, for a failure message: which files a kill
/// left is what tells one store damage from another.
fn listing(dir: &Path) -> String {
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| {
                    let len = e.metadata().map(|m| m.len()).unwrap_or(0);
                    format!("{} ({len} B)", e.file_name().to_string_lossy())
                })
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files.join(", ")
}

fn inspect(db: &Path) -> Snapshot {
    let mut cmd = Command::new(WORKER);
    cmd.arg("inspect").arg(db).arg(THREADS.to_string());
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\nthe store holds: {}",
        String::from_utf8_lossy(&out.stderr),
        listing(db)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let views: Vec<ThreadView> = serde_json::from_str(&text).unwrap();
    views.into_iter().map(|v| (v.thread.clone(), v)).collect()
}

fn read_effects(path: &Path) -> Vec<Effect> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split('\t').collect();
            // A line cut by the kill would have fewer fields (each is written with one
            // write(2) call, so none has been seen); skip rather than misread it.
            (f.len() == 5).then(|| Effect {
                thread: f[0].to_string(),
                task: f[1].to_string(),
                node: f[2].to_string(),
                step: f[3].parse().unwrap(),
            })
        })
        .collect()
}

/// Tasks whose output is on disk in `snap`: pending outputs, and tasks planned by a
/// checkpoint that has a child.
fn recorded(snap: &Snapshot) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for t in snap.values() {
        out.extend(t.output_tasks.iter().map(|task| key(&t.thread, task)));
        let parents: BTreeSet<&str> = t
            .checkpoints
            .iter()
            .filter_map(|c| c.parent.as_deref())
            .collect();
        for c in &t.checkpoints {
            if parents.contains(c.id.as_str()) {
                out.extend(c.next_tasks.iter().map(|task| key(&t.thread, task)));
            }
        }
    }
    out
}

fn planned(snap: &Snapshot) -> BTreeSet<String> {
    snap.values()
        .flat_map(|t| t.checkpoints.iter().map(move |c| (t, c)))
        .flat_map(|(t, c)| c.next_tasks.iter().map(|task| key(&t.thread, task)))
        .collect()
}

/// Check 3: one contiguous chain per thread, extending the previous snapshot's chain.
fn check_chains(snap: &Snapshot, prev: Option<&Snapshot>, problems: &mut Vec<String>) {
    for t in snap.values() {
        for (i, c) in t.checkpoints.iter().enumerate() {
            let (want_parent, want_step) = match i {
                0 => (None, 0),
                _ => (
                    Some(t.checkpoints[i - 1].id.as_str()),
                    t.checkpoints[i - 1].step + 1,
                ),
            };
            if c.parent.as_deref() != want_parent || c.step != want_step {
                problems.push(format!(
                    "{}: checkpoint {} (step {}, parent {:?}) does not continue the chain",
                    t.thread, c.id, c.step, c.parent
                ));
            }
        }
        if let Some(before) = prev.and_then(|p| p.get(&t.thread)) {
            let now: Vec<&str> = t.checkpoints.iter().map(|c| c.id.as_str()).collect();
            let then: Vec<&str> = before.checkpoints.iter().map(|c| c.id.as_str()).collect();
            if !now.starts_with(&then) {
                problems.push(format!(
                    "{}: committed checkpoints were lost: had {then:?}, now {now:?}",
                    t.thread
                ));
            }
        }
    }
}

#[derive(Default)]
struct Totals {
    kills: u64,
    kills_before_any_effect: u64,
    rounds: u64,
    reexecuted: u64,
    effects: u64,
    incarnations: u64,
    last_lifetime: Duration,
}

fn kill_after(child: &mut Child, delay: Duration) -> Option<std::process::ExitStatus> {
    let until = Instant::now() + delay;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() >= until {
            child.kill().unwrap(); // SIGKILL
            child.wait().unwrap();
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// One round: a fresh database, killed and restarted until every thread finished.
/// Returns the problems found by checks 1-4 as an error; the final checks assert.
fn round(
    rng: &mut Rng,
    expected: &[serde_json::Value],
    kills_wanted: u64,
    totals: &mut Totals,
    mutant: Option<&str>,
    max_delay: Duration,
) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let mut prev: Option<Snapshot> = None;
    let mut all_effects: Vec<(u64, Effect)> = Vec::new();
    let mut round_kills = 0u64;
    for incarnation in 0u64.. {
        let effects_path = dir.path().join(format!("effects-{incarnation}"));
        let mut child = Command::new(WORKER)
            .arg("run")
            .arg(&db)
            .arg(&effects_path)
            .arg(incarnation.to_string())
            .arg(THREADS.to_string())
            .env("FERROGRAPH_CRASH_MUTANT", mutant.unwrap_or(""))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let kill = round_kills < KILLS_PER_ROUND && totals.kills < kills_wanted;
        let delay = if kill {
            Duration::from_micros(rng.next() % (max_delay.as_micros() as u64 + 1))
        } else {
            Duration::from_secs(60)
        };
        let spawned = Instant::now();
        let finished = kill_after(&mut child, delay);
        totals.incarnations += 1;
        totals.last_lifetime = spawned.elapsed();
        if let Some(status) = finished {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                use std::io::Read;
                e.read_to_string(&mut err).unwrap();
            }
            assert!(status.success(), "worker failed ({status}): {err}");
        } else {
            totals.kills += 1;
            round_kills += 1;
        }
        let snap = inspect(&db);
        let effects = read_effects(&effects_path);
        if finished.is_none() && effects.is_empty() {
            totals.kills_before_any_effect += 1;
        }
        totals.effects += effects.len() as u64;
        let mut problems = Vec::new();
        // Check 1: nothing recorded before this incarnation ran again in it.
        if let Some(before) = &prev {
            let done_before = recorded(before);
            for e in &effects {
                if done_before.contains(&e.key()) {
                    problems.push(format!(
                        "incarnation {incarnation} re-ran task {} ({} of {}, step {}) whose \
                         output was already on disk",
                        e.task, e.node, e.thread, e.step
                    ));
                }
            }
        }
        // Check 2: every task that ran was planned by a durable checkpoint.
        let plan = planned(&snap);
        for e in &effects {
            if !plan.contains(&e.key()) {
                problems.push(format!(
                    "incarnation {incarnation} ran task {} ({} of {}, step {}) whose \
                     checkpoint is not on disk",
                    e.task, e.node, e.thread, e.step
                ));
            }
        }
        // Check 3.
        check_chains(&snap, prev.as_ref(), &mut problems);
        // Check 4.
        let mut seen = BTreeSet::new();
        for e in &effects {
            if !seen.insert(e.key()) {
                problems.push(format!(
                    "incarnation {incarnation} ran task {} ({}) twice",
                    e.task, e.node
                ));
            }
        }
        if !problems.is_empty() {
            return Err(problems.join("\n"));
        }
        all_effects.extend(effects.into_iter().map(|e| (incarnation, e)));
        prev = Some(snap);
        if finished.is_some() {
            break;
        }
        assert!(incarnation < 1000, "no progress after 1000 incarnations");
    }
    totals.rounds += 1;

    // The final state of every thread is that of an uninterrupted run.
    let snap = prev.unwrap();
    for (k, want) in expected.iter().enumerate() {
        let t = &snap[&format!("job-{k}")];
        assert_eq!(t.status.as_deref(), Some("done"), "{}", t.thread);
        assert_eq!(t.state.as_ref(), Some(want), "final state of {}", t.thread);
        assert!(t.checkpoints.last().unwrap().next_tasks.is_empty());
    }
    // Every committed task ran, and nothing ran outside the final history.
    let committed = recorded(&snap);
    let mut runs: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    for (inc, e) in &all_effects {
        runs.entry(e.key()).or_default().insert(*inc);
    }
    for task in &committed {
        assert!(
            runs.contains_key(task),
            "task {task} committed but never ran"
        );
    }
    for (task, incs) in &runs {
        assert!(
            committed.contains(task),
            "task {task} ran but is not in any history"
        );
        if incs.len() > 1 {
            totals.reexecuted += 1;
        }
    }
    Ok(())
}

#[test]
fn killed_workers_resume_without_losing_or_repeating_work() {
    let trials: u64 = std::env::var("FERROGRAPH_CRASH_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let seed: u64 = std::env::var("FERROGRAPH_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("crash test: {trials} kills wanted, FERROGRAPH_CRASH_SEED={seed}");
    let expected: Vec<serde_json::Value> = serde_json::from_str(&output(
        Command::new(WORKER)
            .arg("expected")
            .arg(THREADS.to_string()),
    ))
    .unwrap();
    assert_eq!(expected.len(), THREADS);
    let mut rng = Rng(seed);
    let mut totals = Totals::default();
    let started = Instant::now();
    // Calibration: one round without kills (checked like the others) measures how long a
    // whole run takes here; kill delays are then uniform in [0, that], so most incarnations
    // die in the middle of the work.
    round(&mut rng, &expected, 0, &mut totals, None, Duration::ZERO)
        .unwrap_or_else(|p| panic!("uninterrupted round: {p}"));
    let max_delay = totals.last_lifetime;
    eprintln!("crash test: an uninterrupted run takes {max_delay:.1?}");
    while totals.kills < trials {
        if let Err(problems) = round(&mut rng, &expected, trials, &mut totals, None, max_delay) {
            panic!("seed {seed}: {problems}");
        }
    }
    eprintln!(
        "crash test: {} kills in {} rounds ({} incarnations, {} killed before any node ran) in \
         {:.1?}; {} node executions recorded, {} tasks ran in two incarnations (each killed \
         before its output was saved); every check passed",
        totals.kills,
        totals.rounds,
        totals.incarnations,
        totals.kills_before_any_effect,
        started.elapsed(),
        totals.effects,
        totals.reexecuted
    );
    assert!(totals.kills >= trials);
}

/// The parent can read what the worker wrote with the same saver type (a smoke test of the
/// test's own plumbing: `inspect` of an empty directory reports no checkpoints).
#[test]
fn inspect_of_an_empty_database_reports_nothing() {
    let dir = tempfile::tempdir().unwrap();
    drop(SledSaver::open(dir.path()).unwrap());
    let snap = inspect(dir.path());
    assert_eq!(snap.len(), THREADS);
    assert!(snap
        .values()
        .all(|t| t.checkpoints.is_empty() && t.status.is_none()));
}

/// The checks are real: a worker that forgets pending writes before continuing (as a runtime
/// that ignored them would) re-runs tasks whose output was saved, and check 1 reports it.
#[test]
fn the_checks_catch_a_worker_that_reruns_saved_tasks() {
    let expected: Vec<serde_json::Value> = serde_json::from_str(&output(
        Command::new(WORKER)
            .arg("expected")
            .arg(THREADS.to_string()),
    ))
    .unwrap();
    let mut rng = Rng(7);
    let mut totals = Totals::default();
    round(&mut rng, &expected, 0, &mut totals, None, Duration::ZERO).unwrap();
    let max_delay = totals.last_lifetime;
    for attempt in 0..20 {
        match round(
            &mut rng,
            &expected,
            totals.kills + 10,
            &mut totals,
            Some("drop-writes"),
            max_delay,
        ) {
            Err(problems) => {
                assert!(
                    problems.contains("whose output was already on disk"),
                    "{problems}"
                );
                eprintln!(
                    "mutant caught after {attempt} rounds: {}",
                    problems.lines().next().unwrap_or("")
                );
                return;
            }
            Ok(()) => continue,
        }
    }
    panic!("20 rounds with a worker that drops pending writes passed every check");
}
