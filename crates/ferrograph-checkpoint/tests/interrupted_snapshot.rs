//! A process killed while sled writes its snapshot (`snap.<lsn>.generating`, written at every
//! open that finds new log entries, then renamed) leaves a cut file that sled 0.34's own next
//! open reads and refuses as corrupt. Our crash test met it on CI (a worker killed while it
//! opened its store); here the same file is made on purpose, cut at every point a kill can cut
//! it, from the bytes sled itself writes for that store, and the store must open with all it
//! held.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{copy_dir, record};
use ferrograph_checkpoint::SledSaver;
use ferrograph_core::checkpoint::CheckpointSaver;
use std::path::{Path, PathBuf};

async fn put_and_flush(dir: &Path, steps: std::ops::Range<u64>) {
    let saver = SledSaver::open(dir).unwrap();
    for step in steps {
        saver.put(record("t", step)).await.unwrap();
    }
    saver.flush().await.unwrap();
}

fn snapshots(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("snap.")
        })
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_whose_snapshot_was_cut_by_a_kill_opens_with_everything_it_held() {
    let root = tempfile::tempdir().unwrap();
    // A store with a complete snapshot, then more log after it: the state in which a process
    // that opens it writes a newer snapshot.
    let store = root.path().join("store");
    put_and_flush(&store, 0..3).await;
    put_and_flush(&store, 3..6).await;
    put_and_flush(&store, 6..9).await;
    let old = snapshots(&store);
    assert_eq!(old.len(), 1, "{old:?}");

    // What sled writes when it opens this store: open a copy (sled itself, nothing of ours).
    let probe = root.path().join("probe");
    copy_dir(&store, &probe);
    drop(sled::Config::new().path(&probe).open().unwrap());
    let new = snapshots(&probe);
    assert_eq!(new.len(), 1, "{new:?}");
    assert!(
        new[0].file_name() > old[0].file_name(),
        "{new:?} after {old:?}"
    );
    let bytes = std::fs::read(&new[0]).unwrap();
    let name = format!(
        "{}.generating",
        new[0].file_name().unwrap().to_string_lossy()
    );

    // A kill can stop the write anywhere: before any byte, within the body, after the body
    // (without length and checksum), before the checksum, one byte short.
    let n = bytes.len();
    for cut in [0, 1, n / 2, n - 12, n - 4, n - 1] {
        let case = root.path().join(format!("cut-{cut}"));
        copy_dir(&store, &case);
        std::fs::write(case.join(&name), &bytes[..cut]).unwrap();

        // sled alone refuses it (if a sled upgrade fixes this, this check says so).
        let raw = root.path().join(format!("raw-{cut}"));
        copy_dir(&case, &raw);
        match sled::Config::new().path(&raw).open() {
            Err(sled::Error::Corruption { .. }) => {}
            other => panic!("cut at {cut} of {n}: sled itself opened with {other:?}"),
        }

        let saver = SledSaver::open(&case).unwrap_or_else(|e| panic!("cut at {cut} of {n}: {e}"));
        let history = saver.list("t", None, None).await.unwrap();
        let steps: Vec<u64> = history.iter().rev().map(|c| c.step).collect();
        assert_eq!(steps, (0..9).collect::<Vec<_>>(), "cut at {cut} of {n}");
        assert_eq!(history[0], record("t", 8));
        // The leftover is gone and sled wrote the snapshot again, whole.
        let after = snapshots(&case);
        assert!(
            after
                .iter()
                .all(|p| !p.to_string_lossy().ends_with(".generating")),
            "{after:?}"
        );
        assert_eq!(std::fs::read(after.last().unwrap()).unwrap(), bytes);
        // And it keeps working.
        saver.put(record("t", 9)).await.unwrap();
        saver.flush().await.unwrap();
        assert_eq!(saver.get("t", None).await.unwrap(), Some(record("t", 9)));
    }
}
