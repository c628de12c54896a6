//! Salvage of damaged stores: flipped bytes, truncation and a lost snapshot. Whatever is
//! saved reads back through the saver, and every thread that was in the store is either
//! saved or named as seen-but-not-saved.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers outside #[test]

mod common;

use common::copy_dir;
use ferrograph_checkpoint::maintenance::MaintenanceError;
use ferrograph_checkpoint::salvage::salvage;
use ferrograph_checkpoint::SledSaver;
use ferrograph_core::checkpoint::{
    CheckpointRecord, CheckpointSaver, CheckpointSource, ThreadInfo, ThreadStatus,
};
use std::collections::BTreeSet;
use std::path::Path;

const THREADS: usize = 40;
const CHECKPOINTS: usize = 3;

fn checkpoint_id(i: usize, step: usize) -> String {
    format!("{:016x}{:08x}", 1_000_000 + i * 10 + step, 0)
}

/// A store with 40 threads of 3 checkpoints each, written one thread at a time and flushed
/// after each, so the log holds them in order.
async fn make_store(dir: &Path) {
    let saver = SledSaver::open(dir).unwrap();
    for i in 0..THREADS {
        let thread = format!("thread-{i:02}");
        for step in 0..CHECKPOINTS {
            saver
                .put(CheckpointRecord {
                    thread_id: thread.clone(),
                    checkpoint_id: checkpoint_id(i, step),
                    parent_id: (step > 0).then(|| checkpoint_id(i, step - 1)),
                    step: step as u64,
                    source: CheckpointSource::Loop,
                    created_at_ms: 1_000 + (i * 10 + step) as u64,
                    writers: vec!["node".into()],
                    next: vec![],
                    full: true,
                    payload: vec![i as u8; 200],
                })
                .await
                .unwrap();
        }
        let mut info = ThreadInfo::new(thread, "review");
        info.status = ThreadStatus::Interrupted;
        info.last_checkpoint_id = Some(checkpoint_id(i, CHECKPOINTS - 1));
        saver.put_thread(info).await.unwrap();
        saver.flush().await.unwrap();
    }
    drop(saver);
}

fn all_threads() -> BTreeSet<String> {
    (0..THREADS).map(|i| format!("thread-{i:02}")).collect()
}

fn snapshot_of(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.file_type().unwrap().is_file() {
            out.push((
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            ));
        }
    }
    out.sort();
    out
}

/// Bytes of sled's log in use (it preallocates its segment with zeros).
fn log_used(dir: &Path) -> usize {
    let b = std::fs::read(dir.join("db")).unwrap();
    b.len() - b.iter().rev().take_while(|x| **x == 0).count()
}

fn flip(file: &Path, at: usize) {
    let mut b = std::fs::read(file).unwrap();
    b[at] ^= 0x5a;
    std::fs::write(file, b).unwrap();
}

/// Salvages `damaged` into a new folder and checks what a user relies on: the damaged store
/// is unchanged, what was saved reads back through the saver with every checkpoint, and every
/// thread is either saved or named. Returns the threads saved.
async fn salvage_and_check(
    damaged: &Path,
) -> (
    BTreeSet<String>,
    ferrograph_checkpoint::salvage::SalvageReport,
) {
    let before = snapshot_of(damaged);
    let into = damaged.parent().unwrap().join("salvaged");
    let report = salvage(damaged, &into).unwrap();
    assert_eq!(
        snapshot_of(damaged),
        before,
        "the damaged store was written"
    );

    let saver = SledSaver::open(&into).unwrap();
    let listed: BTreeSet<String> = saver
        .list_threads(None)
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.thread_id)
        .collect();
    let reported: BTreeSet<String> = report
        .threads
        .iter()
        .filter(|t| t.status != "none")
        .map(|t| t.thread_id.clone())
        .collect();
    assert_eq!(listed, reported);
    for t in &report.threads {
        let saved = saver.list(&t.thread_id, None, None).await.unwrap();
        assert_eq!(saved.len() as u64, t.checkpoints, "{}", t.thread_id);
    }
    let lost: BTreeSet<String> = report
        .lost_threads
        .iter()
        .map(|t| t.thread_id.clone())
        .collect();
    assert!(listed.is_disjoint(&lost));
    (listed, report)
}

/// Every thread is saved or named, except at most one per damaged record seen (a damaged
/// record may have been a thread's only copy).
fn assert_accounted(
    saved: &BTreeSet<String>,
    report: &ferrograph_checkpoint::salvage::SalvageReport,
) {
    let lost: BTreeSet<String> = report
        .lost_threads
        .iter()
        .map(|t| t.thread_id.clone())
        .collect();
    let accounted: BTreeSet<String> = saved.union(&lost).cloned().collect();
    let missing: Vec<_> = all_threads().difference(&accounted).cloned().collect();
    assert!(
        missing.len() as u64 <= report.damaged_seen,
        "neither saved nor named: {missing:?} ({} damaged records seen)",
        report.damaged_seen
    );
}

#[tokio::test]
async fn a_healthy_store_is_copied_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    make_store(&store).await;
    let (saved, report) = salvage_and_check(&store).await;
    assert_eq!(saved, all_threads());
    assert_accounted(&saved, &report);
    assert!(report.open_error.is_none() && !report.snapshot_dropped);
    assert!(!report.lost_anything(), "{report:?}");
    assert_eq!(report.copied.records as usize, THREADS * (CHECKPOINTS + 1));
}

#[tokio::test]
async fn a_flipped_byte_loses_only_what_follows_it_and_names_it() {
    for fraction in [0.3, 0.6, 0.9] {
        let tmp = tempfile::tempdir().unwrap();
        let store = tmp.path().join("store");
        make_store(&store).await;
        let at = (log_used(&store) as f64 * fraction) as usize;
        flip(&store.join("db"), at);
        // Whether sled opens it, asked of a copy: sled takes damage near the end of its log for
        // a torn write and cuts the log there when it opens it, dropping what follows.
        let probe = tmp.path().join("probe");
        copy_dir(&store, &probe);
        let opens = SledSaver::open(&probe).is_ok();
        let (saved, report) = salvage_and_check(&store).await;
        assert_accounted(&saved, &report);
        eprintln!(
            "flip at {fraction}: sled opens it: {opens}; saved {}, named lost {}, damaged seen {}",
            saved.len(),
            report.lost_threads.len(),
            report.damaged_seen
        );
        // Where sled no longer opens, the log is read up to the damage: the threads written
        // before it are saved, the rest named.
        assert_eq!(report.snapshot_dropped, !opens, "{report:?}");
        if report.snapshot_dropped {
            assert!(!saved.is_empty(), "{fraction}: nothing saved");
            assert!(saved.len() < THREADS, "{fraction}: nothing lost?");
            assert!(report.lost_anything());
        }
        // The log is in write order: what was saved is the threads written first.
        let expected: BTreeSet<String> =
            (0..saved.len()).map(|i| format!("thread-{i:02}")).collect();
        let whole: BTreeSet<String> = report
            .threads
            .iter()
            .filter(|t| t.checkpoints == CHECKPOINTS as u64)
            .map(|t| t.thread_id.clone())
            .collect();
        assert!(whole.is_subset(&expected), "{fraction}: {whole:?}");
    }
}

#[tokio::test]
async fn a_truncated_log_and_a_damaged_snapshot_are_salvaged() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    make_store(&store).await;
    let used = log_used(&store);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(store.join("db"))
        .unwrap();
    f.set_len((used / 2) as u64).unwrap();
    drop(f);
    // What was cut off is gone from the disk and cannot be named; what is left is saved.
    let (saved, report) = salvage_and_check(&store).await;
    assert!(!saved.is_empty() && saved.len() < THREADS, "{saved:?}");
    assert!(report.lost_anything(), "{report:?}");

    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    make_store(&store).await;
    for e in std::fs::read_dir(&store).unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with("snap.") {
            let len = std::fs::metadata(e.path()).unwrap().len() as usize;
            flip(&e.path(), len / 2);
        }
    }
    let (saved, report) = salvage_and_check(&store).await;
    assert_eq!(saved, all_threads(), "{report:?}");
    assert_accounted(&saved, &report);
}

#[tokio::test]
async fn salvage_refuses_a_target_in_use_and_survives_heavy_damage() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    make_store(&store).await;
    let into = tmp.path().join("busy");
    std::fs::create_dir_all(&into).unwrap();
    std::fs::write(into.join("x"), b"x").unwrap();
    assert!(matches!(
        salvage(&store, &into),
        Err(MaintenanceError::TargetExists(_))
    ));
    // A store that is open (a server running on it) is refused.
    let saver = SledSaver::open(&store).unwrap();
    assert!(matches!(
        salvage(&store, &tmp.path().join("while-open")),
        Err(MaintenanceError::InUse(_))
    ));
    drop(saver);

    // A byte in every 64 flipped: nothing or little can be saved, but the answer is a
    // report or a typed error, never a panic, and the store is left as it was.
    let b = std::fs::read(store.join("db")).unwrap();
    let damaged: Vec<u8> = b
        .iter()
        .enumerate()
        .map(|(i, x)| if i % 64 == 32 { x ^ 0x5a } else { *x })
        .collect();
    std::fs::write(store.join("db"), &damaged).unwrap();
    let before = snapshot_of(&store);
    match salvage(&store, &tmp.path().join("out")) {
        Ok(report) => assert!(report.lost_anything()),
        Err(MaintenanceError::Unsalvageable { reason, .. }) => {
            assert!(reason.contains("restore"), "{reason}")
        }
        Err(other) => panic!("{other:?}"),
    }
    assert_eq!(snapshot_of(&store), before);
}
