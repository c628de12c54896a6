//! The saver's flush makes writes durable however it is driven: on a worker of a multi-threaded
//! tokio runtime (where it flushes on the calling thread, with the worker handed over), on a
//! current-thread runtime and with no tokio runtime at all (where it uses sled's pool). Each
//! case writes, flushes, closes the store and reads everything back from a fresh handle.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers outside #[test]

mod common;

use common::record;
use ferrograph_checkpoint::SledSaver;
use ferrograph_core::checkpoint::{CheckpointSaver, ThreadInfo};
use std::path::Path;

/// Writes 20 checkpoints and a thread record, flushing after each write.
async fn write_and_flush(dir: &Path) {
    let saver = SledSaver::open(dir).unwrap();
    for step in 0..20 {
        saver.put(record("t", step)).await.unwrap();
        saver.flush().await.unwrap();
    }
    saver.put_thread(ThreadInfo::new("t", "g")).await.unwrap();
    saver.flush().await.unwrap();
    let stats = saver.stats();
    assert!(stats.disk_flushes >= 1, "{stats:?}");
    assert_eq!(
        stats.disk_flushes + stats.grouped_flushes + stats.empty_flushes,
        21
    );
}

async fn read_back(dir: &Path) {
    let saver = SledSaver::open(dir).unwrap();
    let list = saver.list("t", None, None).await.unwrap();
    assert_eq!(list.len(), 20);
    let newest = saver.get("t", None).await.unwrap().unwrap();
    assert_eq!(newest.step, 19);
    assert_eq!(newest.payload, vec![19u8; 150]);
    assert!(saver.get_thread("t").await.unwrap().is_some());
}

fn multi_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap()
}

#[test]
fn flush_on_a_multi_threaded_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let rt = multi_thread_runtime();
    // On a worker (a spawned task) and from block_on's own thread.
    let path = dir.path().to_path_buf();
    rt.block_on(async move { tokio::spawn(write_and_flush_owned(path)).await.unwrap() });
    rt.block_on(read_back(dir.path()));
}

async fn write_and_flush_owned(dir: std::path::PathBuf) {
    write_and_flush(&dir).await;
}

#[test]
fn flush_from_block_on_of_a_multi_threaded_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let rt = multi_thread_runtime();
    rt.block_on(write_and_flush(dir.path()));
    rt.block_on(read_back(dir.path()));
}

#[tokio::test(flavor = "current_thread")]
async fn flush_on_a_current_thread_runtime() {
    let dir = tempfile::tempdir().unwrap();
    write_and_flush(dir.path()).await;
    read_back(dir.path()).await;
}

#[test]
fn flush_without_a_tokio_runtime() {
    let dir = tempfile::tempdir().unwrap();
    futures::executor::block_on(write_and_flush(dir.path()));
    futures::executor::block_on(read_back(dir.path()));
}
