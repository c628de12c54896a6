//! Writes checkpoints according to the run's durability mode.

use crate::config::Durability;
use ferrograph_core::checkpoint::{
    CheckpointError, CheckpointRecord, CheckpointSaver, PendingWrite,
};
use ferrograph_core::ThreadInfo;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

pub(crate) enum Op {
    Put(CheckpointRecord),
    Writes(String, String, Vec<PendingWrite>),
    WritesAndThread(String, String, Vec<PendingWrite>, Box<ThreadInfo>),
}

/// Checkpoint writer of one run.
pub(crate) enum Writer {
    /// No checkpointer.
    Off,
    /// Write and flush before going on. The flag is set while a write awaits the next flush.
    Sync(Arc<dyn CheckpointSaver>, bool),
    /// A background task writes, at most `lag` operations behind.
    Async {
        tx: Option<mpsc::Sender<Op>>,
        task: Option<JoinHandle<Result<(), CheckpointError>>>,
    },
    /// Buffered until the run ends.
    Exit(Arc<dyn CheckpointSaver>, Vec<Op>),
}

async fn apply(saver: &dyn CheckpointSaver, op: Op) -> Result<(), CheckpointError> {
    match op {
        Op::Put(r) => saver.put(r).await,
        Op::Writes(t, c, w) => saver.put_writes(&t, &c, w).await,
        Op::WritesAndThread(t, c, w, info) => saver.put_writes_and_thread(&t, &c, w, *info).await,
    }
}

impl Writer {
    pub(crate) fn new(
        saver: Option<Arc<dyn CheckpointSaver>>,
        mode: Durability,
        lag: usize,
    ) -> Self {
        match (saver, mode) {
            (None, _) => Writer::Off,
            (Some(s), Durability::Sync) => Writer::Sync(s, false),
            (Some(s), Durability::Exit) => Writer::Exit(s, Vec::new()),
            (Some(s), Durability::Async) => {
                let (tx, mut rx) = mpsc::channel::<Op>(lag.max(1));
                let task = tokio::spawn(async move {
                    let mut first_error = None;
                    while let Some(op) = rx.recv().await {
                        if let Err(e) = apply(s.as_ref(), op).await {
                            tracing::error!(error = %e, "background checkpoint write failed");
                            first_error.get_or_insert(e);
                        }
                    }
                    if first_error.is_none() {
                        if let Err(e) = s.flush().await {
                            first_error = Some(e);
                        }
                    }
                    first_error.map_or(Ok(()), Err)
                });
                Writer::Async {
                    tx: Some(tx),
                    task: Some(task),
                }
            }
        }
    }

    pub(crate) fn is_on(&self) -> bool {
        !matches!(self, Writer::Off)
    }

    /// Whether writes are flushed before each step (sync durability).
    pub(crate) fn is_sync(&self) -> bool {
        matches!(self, Writer::Sync(..))
    }

    /// Notes that something was written to the saver directly and needs the end-of-run flush.
    pub(crate) fn mark_dirty(&mut self) {
        if let Writer::Sync(_, dirty) = self {
            *dirty = true;
        }
    }

    async fn submit(&mut self, op: Op, flush: bool) -> Result<(), CheckpointError> {
        match self {
            Writer::Off => Ok(()),
            Writer::Sync(s, dirty) => {
                apply(s.as_ref(), op).await?;
                if flush {
                    s.flush().await?;
                    *dirty = false;
                } else {
                    *dirty = true;
                }
                Ok(())
            }
            Writer::Async { tx, .. } => match tx {
                Some(tx) => tx.send(op).await.map_err(|_| CheckpointError::Backend {
                    message: "the background checkpoint writer stopped".into(),
                    source: None,
                }),
                None => Ok(()),
            },
            Writer::Exit(_, ops) => {
                ops.push(op);
                Ok(())
            }
        }
    }

    pub(crate) async fn put(&mut self, record: CheckpointRecord) -> Result<(), CheckpointError> {
        self.submit(Op::Put(record), true).await
    }

    /// Writes a checkpoint whose durability the end of the run provides: the last step's
    /// checkpoint, after which no task runs. Sync mode saves a disk flush per run this way
    /// without weakening what a crash can lose. (The input checkpoint is never deferred: tasks
    /// are planned from it, and must not run before it is durable.)
    pub(crate) async fn put_before_flush(
        &mut self,
        record: CheckpointRecord,
    ) -> Result<(), CheckpointError> {
        self.submit(Op::Put(record), false).await
    }

    pub(crate) async fn put_writes(
        &mut self,
        thread: &str,
        checkpoint: &str,
        writes: Vec<PendingWrite>,
    ) -> Result<(), CheckpointError> {
        self.submit(Op::Writes(thread.into(), checkpoint.into(), writes), true)
            .await
    }

    /// Writes a resume's answers together with the thread's new record (see
    /// `CheckpointSaver::put_writes_and_thread`).
    pub(crate) async fn put_writes_and_thread(
        &mut self,
        thread: &str,
        checkpoint: &str,
        writes: Vec<PendingWrite>,
        info: ThreadInfo,
    ) -> Result<(), CheckpointError> {
        self.submit(
            Op::WritesAndThread(thread.into(), checkpoint.into(), writes, Box::new(info)),
            true,
        )
        .await
    }

    /// Makes everything durable (end of run).
    pub(crate) async fn finish(&mut self) -> Result<(), CheckpointError> {
        match self {
            Writer::Off => Ok(()),
            Writer::Sync(s, dirty) => {
                if *dirty {
                    s.flush().await?;
                    *dirty = false;
                }
                Ok(())
            }
            Writer::Async { tx, task } => {
                tx.take();
                match task.take() {
                    Some(t) => t.await.map_err(|e| CheckpointError::Backend {
                        message: format!("background checkpoint writer crashed: {e}"),
                        source: None,
                    })?,
                    None => Ok(()),
                }
            }
            Writer::Exit(s, ops) => {
                for op in ops.drain(..) {
                    apply(s.as_ref(), op).await?;
                }
                s.flush().await
            }
        }
    }
}
