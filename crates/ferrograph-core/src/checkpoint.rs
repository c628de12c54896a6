//! Checkpoints: the trait that stores them, the records it stores, and their encoding.
//!
//! A checkpoint is written after every superstep. Its payload is either the *full* state or a
//! *delta*: the updates merged in that step. Append-rule fields therefore cost what was
//! appended, not the whole list. A full snapshot is written when the deltas since the last one
//! add up to more than that snapshot's size, so the bytes written per step stay proportional to
//! the step's updates and loading never replays more than about one state's worth of deltas.
//!
//! Every payload sits in an envelope: magic bytes, format version, the state's schema version,
//! a CRC-32 of the body and its length. A damaged or truncated record is a typed error naming
//! the thread and checkpoint; nothing is ever silently reset.

use crate::engine::{Frame, PlannedTask};
use crate::id::now_millis;
use crate::interrupt::Interrupt;
use crate::json::Json;
use crate::node::{CommandTarget, Goto, NodeOutput, SendTo};
use crate::state::State;
use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

/// Magic bytes at the start of every encoded payload.
pub const MAGIC: [u8; 4] = *b"FGCK";
/// Version of the envelope and body layout.
pub const FORMAT_VERSION: u16 = 1;
/// Bytes of the envelope before the body: magic, format, schema, CRC-32, body length.
pub const HEADER_LEN: usize = 4 + 2 + 4 + 4 + 4;

/// Lifecycle status of a thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ThreadStatus {
    /// A run is in progress (or the process died during one).
    Running,
    /// Stopped on an interrupt, waiting for a resume value.
    Interrupted,
    /// Finished.
    Done,
    /// The last run failed.
    Failed,
}

impl ThreadStatus {
    /// Lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            ThreadStatus::Running => "running",
            ThreadStatus::Interrupted => "interrupted",
            ThreadStatus::Done => "done",
            ThreadStatus::Failed => "failed",
        }
    }
}

impl fmt::Display for ThreadStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ThreadStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "running" => Ok(ThreadStatus::Running),
            "interrupted" => Ok(ThreadStatus::Interrupted),
            "done" => Ok(ThreadStatus::Done),
            "failed" => Ok(ThreadStatus::Failed),
            other => Err(format!(
                "unknown thread status `{other}` (expected running, interrupted, done or failed)"
            )),
        }
    }
}

/// What is known about a thread besides its checkpoints.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ThreadInfo {
    /// Thread id.
    pub thread_id: String,
    /// Name of the graph that runs on it.
    pub graph: String,
    /// Current status.
    pub status: ThreadStatus,
    /// Creation time, ms since the epoch.
    pub created_at_ms: u64,
    /// Last change, ms since the epoch.
    pub updated_at_ms: u64,
    /// Newest checkpoint.
    pub last_checkpoint_id: Option<String>,
    /// Error of the last failed run.
    pub error: Option<String>,
    /// Pending interrupts, when interrupted.
    #[serde(default)]
    pub interrupts: Vec<Interrupt>,
    /// Free-form metadata.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

impl ThreadInfo {
    /// A new thread record in status `running`.
    pub fn new(thread_id: impl Into<String>, graph: impl Into<String>) -> Self {
        let now = now_millis();
        ThreadInfo {
            thread_id: thread_id.into(),
            graph: graph.into(),
            status: ThreadStatus::Running,
            created_at_ms: now,
            updated_at_ms: now,
            last_checkpoint_id: None,
            error: None,
            interrupts: Vec::new(),
            metadata: BTreeMap::new(),
        }
    }
}

/// Why a checkpoint was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointSource {
    /// The input of a run.
    Input,
    /// A superstep of the run loop.
    Loop,
    /// An update from outside (`update_state`).
    Update,
    /// A copy of another thread's checkpoint.
    Fork,
}

/// A stored checkpoint: metadata in the clear, state and plan in an encoded payload.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointRecord {
    /// Thread.
    pub thread_id: String,
    /// Id; later checkpoints of a thread have greater ids.
    pub checkpoint_id: String,
    /// The checkpoint this one follows.
    pub parent_id: Option<String>,
    /// Supersteps executed on the thread up to this checkpoint.
    pub step: u64,
    /// Why it was written.
    pub source: CheckpointSource,
    /// When, ms since the epoch.
    pub created_at_ms: u64,
    /// Nodes whose updates produced it.
    pub writers: Vec<String>,
    /// Nodes planned next.
    pub next: Vec<String>,
    /// Whether the payload holds the full state (otherwise the updates since the parent).
    pub full: bool,
    /// Encoded payload (see the module docs).
    pub payload: Vec<u8>,
}

/// A write recorded for a task of the step after a checkpoint, before that step committed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PendingWrite {
    /// Task id.
    pub task_id: String,
    /// Node.
    pub node: String,
    /// What was recorded.
    pub kind: PendingKind,
}

/// Kinds of [`PendingWrite`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum PendingKind {
    /// The task finished; its encoded output is reused instead of running it again.
    Output(Vec<u8>),
    /// The task interrupted.
    Interrupts(Vec<Interrupt>),
    /// Resume values for the task's interrupts, by interrupt id.
    Resume(Vec<(String, Json)>),
    /// The task failed after its retries.
    Error(String),
    /// The step stopped at a static interrupt before it ran; resuming passes it.
    StaticInterrupt,
    /// An interrupted subgraph's own frame and pending writes, to resume it inside.
    Subgraph(Vec<u8>),
    /// Any of the above, encrypted by an encrypting saver (opaque to everything else).
    Sealed(Vec<u8>),
}

/// Errors of checkpoint storage and decoding.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// The storage backend failed.
    #[error("checkpoint storage failed: {message}")]
    Backend {
        /// What failed.
        message: String,
        /// Underlying error.
        #[source]
        source: Option<crate::node::BoxError>,
    },
    /// A record could not be decoded.
    #[error("checkpoint `{checkpoint}` of thread `{thread}` is corrupt: {source}")]
    Corrupt {
        /// Thread.
        thread: String,
        /// Checkpoint.
        checkpoint: String,
        /// What is wrong with it.
        #[source]
        source: CodecError,
    },
    /// A delta checkpoint's parent is missing.
    #[error("checkpoint `{checkpoint}` of thread `{thread}` needs its parent `{parent}`, which is missing")]
    MissingParent {
        /// Thread.
        thread: String,
        /// Checkpoint.
        checkpoint: String,
        /// Parent.
        parent: String,
    },
    /// No such checkpoint.
    #[error("thread `{thread}` has no checkpoint `{checkpoint}`")]
    NotFound {
        /// Thread.
        thread: String,
        /// Checkpoint.
        checkpoint: String,
    },
    /// An encrypted record could not be opened: the wrong key, a record that is not encrypted
    /// where encryption is on, or a record that fails authentication (damaged or tampered).
    #[error("record `{record}` of thread `{thread}` cannot be decrypted: {reason}")]
    Decrypt {
        /// Thread.
        thread: String,
        /// Which record (a checkpoint id, `writes of <id>`, `thread record`).
        record: String,
        /// Why.
        reason: DecryptError,
    },
}

/// Why an encrypted record did not open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecryptError {
    /// It was encrypted with another key.
    #[error("it was encrypted with another key (set the key it was written with in FERROGRAPH_CHECKPOINT_KEY)")]
    WrongKey,
    /// It is stored in the clear, and encryption is on.
    #[error("it is not encrypted, and this store is opened with encryption on")]
    NotEncrypted,
    /// Its authentication tag does not match: it was damaged or altered.
    #[error("authentication failed: the record was damaged or altered")]
    Tampered,
}

impl CheckpointError {
    /// A backend error from any error.
    pub fn backend(message: impl Into<String>, source: impl Into<crate::node::BoxError>) -> Self {
        CheckpointError::Backend {
            message: message.into(),
            source: Some(source.into()),
        }
    }
}

/// What is wrong with an encoded payload.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// Shorter than its header says.
    #[error("truncated: {len} bytes, expected {expected}")]
    Truncated {
        /// Bytes present.
        len: usize,
        /// Bytes expected.
        expected: usize,
    },
    /// Does not start with the magic bytes.
    #[error("not a ferrograph checkpoint (bad magic bytes)")]
    BadMagic,
    /// Written by an unknown format version.
    #[error("unsupported format version {0}")]
    UnsupportedFormat(u16),
    /// The checksum does not match the body.
    #[error("checksum mismatch (stored {stored:08x}, computed {computed:08x})")]
    Checksum {
        /// Stored CRC.
        stored: u32,
        /// Computed CRC.
        computed: u32,
    },
    /// Written for another schema version of the state, with no migration registered.
    #[error(
        "state schema version {found} cannot be read as version {expected} (register a migration)"
    )]
    SchemaMismatch {
        /// Version in the record.
        found: u32,
        /// Version of the running code.
        expected: u32,
    },
    /// bincode failed.
    #[error("decoding failed: {0}")]
    Decode(String),
    /// bincode failed while encoding.
    #[error("encoding failed: {0}")]
    Encode(String),
}

/// Wraps `body` in the envelope.
pub fn seal(schema_version: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&schema_version.to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// Checks the envelope and returns the schema version and the body.
pub fn open(bytes: &[u8]) -> Result<(u32, &[u8]), CodecError> {
    if bytes.len() < HEADER_LEN {
        return Err(CodecError::Truncated {
            len: bytes.len(),
            expected: HEADER_LEN,
        });
    }
    if bytes[0..4] != MAGIC {
        return Err(CodecError::BadMagic);
    }
    let u16_at = |i: usize| u16::from_le_bytes([bytes[i], bytes[i + 1]]);
    let u32_at =
        |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    let format = u16_at(4);
    if format != FORMAT_VERSION {
        return Err(CodecError::UnsupportedFormat(format));
    }
    let schema = u32_at(6);
    let stored = u32_at(10);
    let len = u32_at(14) as usize;
    let expected = HEADER_LEN + len;
    if bytes.len() < expected {
        return Err(CodecError::Truncated {
            len: bytes.len(),
            expected,
        });
    }
    let body = &bytes[HEADER_LEN..expected];
    let computed = crc32fast::hash(body);
    if computed != stored {
        return Err(CodecError::Checksum { stored, computed });
    }
    Ok((schema, body))
}

fn bincode_config() -> bincode::config::Configuration {
    bincode::config::standard()
}

/// Encodes a value with bincode and seals it.
pub fn encode<T: Serialize>(schema_version: u32, value: &T) -> Result<Vec<u8>, CodecError> {
    let body = bincode::serde::encode_to_vec(value, bincode_config())
        .map_err(|e| CodecError::Encode(e.to_string()))?;
    Ok(seal(schema_version, &body))
}

/// Opens a sealed value, checking its schema version.
pub fn decode<T: DeserializeOwned>(expected_schema: u32, bytes: &[u8]) -> Result<T, CodecError> {
    let (schema, body) = open(bytes)?;
    if schema != expected_schema {
        return Err(CodecError::SchemaMismatch {
            found: schema,
            expected: expected_schema,
        });
    }
    decode_body(body)
}

#[derive(Serialize, Deserialize)]
#[serde(bound(serialize = "S: State", deserialize = "S: State"))]
enum Base<S: State> {
    Full(S),
    Delta(Vec<(String, S::Update)>),
}

#[derive(Serialize, Deserialize)]
#[serde(bound(serialize = "S: State", deserialize = "S: State"))]
struct FrameBody<S: State> {
    base: Base<S>,
    next: Vec<PlannedTask<S>>,
    joins: Vec<BTreeSet<String>>,
}

/// Serializable form of a task output, for pending writes.
#[derive(Serialize, Deserialize)]
#[serde(bound(serialize = "S: State", deserialize = "S: State"))]
struct OutputBody<S: State> {
    updates: Vec<S::Update>,
    goto: Vec<GotoBody<S>>,
    target: CommandTarget,
}

#[derive(Serialize, Deserialize)]
#[serde(bound(serialize = "S: State", deserialize = "S: State"))]
enum GotoBody<S: State> {
    Node(String),
    Send(SendTo<S>),
    /// An overwrite of the output (kept here, after the goto variants, so that outputs
    /// recorded before overwrites existed still decode).
    Overwrite(S::Update),
}

/// The most bytes one decode may claim for strings and vectors. A body that passes its CRC can
/// still be read as the wrong type (salvage tries each type on every sealed value it finds):
/// a timestamp read as a string's length must fail, not ask the allocator for a terabyte.
const DECODE_LIMIT: usize = 1 << 30;

fn decode_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, CodecError> {
    let config = bincode_config().with_limit::<DECODE_LIMIT>();
    let (value, used) = bincode::serde::decode_from_slice(body, config)
        .map_err(|e| CodecError::Decode(e.to_string()))?;
    if used != body.len() {
        return Err(CodecError::Decode(format!(
            "{} trailing bytes after the value",
            body.len() - used
        )));
    }
    Ok(value)
}

fn migrate_task<Old: State, New: State>(
    t: PlannedTask<Old>,
    state: fn(Old) -> New,
) -> PlannedTask<New> {
    PlannedTask {
        id: t.id,
        node: t.node,
        input: t.input.map(state),
    }
}

/// Upgrades a frame body (unsealed, at `Old`'s version) to a sealed body at `New`'s version.
pub(crate) fn migrate_frame_body<Old: State, New: State>(
    body: &[u8],
    state: fn(Old) -> New,
    update: fn(Old::Update) -> New::Update,
) -> Result<Vec<u8>, CodecError> {
    let old: FrameBody<Old> = decode_body(body)?;
    let new = FrameBody::<New> {
        base: match old.base {
            Base::Full(s) => Base::Full(state(s)),
            Base::Delta(w) => Base::Delta(w.into_iter().map(|(n, u)| (n, update(u))).collect()),
        },
        next: old
            .next
            .into_iter()
            .map(|t| migrate_task(t, state))
            .collect(),
        joins: old.joins,
    };
    crate::migrate::reseal::<New, _>(&new)
}

/// Upgrades a pending task output.
pub(crate) fn migrate_output_body<Old: State, New: State>(
    body: &[u8],
    state: fn(Old) -> New,
    update: fn(Old::Update) -> New::Update,
) -> Result<Vec<u8>, CodecError> {
    let old: OutputBody<Old> = decode_body(body)?;
    let new = OutputBody::<New> {
        updates: old.updates.into_iter().map(update).collect(),
        goto: old
            .goto
            .into_iter()
            .map(|g| match g {
                GotoBody::Node(n) => GotoBody::Node(n),
                GotoBody::Send(s) => GotoBody::Send(SendTo {
                    node: s.node,
                    input: state(s.input),
                }),
                GotoBody::Overwrite(u) => GotoBody::Overwrite(update(u)),
            })
            .collect(),
        target: old.target,
    };
    crate::migrate::reseal::<New, _>(&new)
}

/// Upgrades an interrupted subgraph's snapshot.
pub(crate) fn migrate_subgraph_body<Old: State, New: State>(
    body: &[u8],
    state: fn(Old) -> New,
    update: fn(Old::Update) -> New::Update,
) -> Result<Vec<u8>, CodecError> {
    let old: SubgraphBody<Old> = decode_body(body)?;
    let new = SubgraphBody::<New> {
        checkpoint_id: old.checkpoint_id,
        parent_id: old.parent_id,
        step: old.step,
        state: state(old.state),
        next: old
            .next
            .into_iter()
            .map(|t| migrate_task(t, state))
            .collect(),
        joins: old.joins,
        pending: old.pending,
        merged: old.merged.into_iter().map(update).collect(),
    };
    crate::migrate::reseal::<New, _>(&new)
}

/// Decodes a payload of `S`, upgrading it first if it was written by an older schema version
/// with a registered migration.
fn decode_current<S: State, T: DeserializeOwned>(
    kind: crate::migrate::Payload,
    bytes: &[u8],
) -> Result<T, CodecError> {
    let current = crate::migrate::upgrade::<S>(kind, bytes)?;
    decode(S::SCHEMA_VERSION, &current)
}

/// Encodes a task output for a pending write.
pub fn encode_output<S: State>(output: &NodeOutput<S>) -> Result<Vec<u8>, CodecError> {
    let body = OutputBody::<S> {
        updates: output.updates.clone(),
        goto: output
            .goto
            .iter()
            .map(|g| match g {
                Goto::Node(n) => GotoBody::Node(n.clone()),
                Goto::Send(s) => GotoBody::Send(s.clone()),
            })
            .chain(output.overwrites.iter().cloned().map(GotoBody::Overwrite))
            .collect(),
        target: output.target,
    };
    encode(S::SCHEMA_VERSION, &body)
}

/// Decodes a task output from a pending write.
pub fn decode_output<S: State>(bytes: &[u8]) -> Result<NodeOutput<S>, CodecError> {
    let body: OutputBody<S> = decode_current::<S, _>(crate::migrate::Payload::Output, bytes)?;
    let mut goto = Vec::with_capacity(body.goto.len());
    let mut overwrites = Vec::new();
    for g in body.goto {
        match g {
            GotoBody::Node(n) => goto.push(Goto::Node(n)),
            GotoBody::Send(s) => goto.push(Goto::Send(s)),
            GotoBody::Overwrite(u) => overwrites.push(u),
        }
    }
    Ok(NodeOutput {
        updates: body.updates,
        goto,
        target: body.target,
        overwrites,
    })
}

/// A frame with its pending writes, as stored for an interrupted subgraph.
#[derive(Serialize, Deserialize)]
#[serde(bound(serialize = "S: State", deserialize = "S: State"))]
struct SubgraphBody<S: State> {
    checkpoint_id: String,
    parent_id: Option<String>,
    step: u64,
    state: S,
    next: Vec<PlannedTask<S>>,
    joins: Vec<BTreeSet<String>>,
    pending: Vec<PendingWrite>,
    merged: Vec<S::Update>,
}

/// An interrupted subgraph, as saved in its parent's pending writes.
pub struct SubgraphSnapshot<S: State> {
    /// Its frame.
    pub frame: Frame<S>,
    /// Its pending writes.
    pub pending: Vec<PendingWrite>,
    /// Updates it merged before the interrupt, owed to the parent when it finishes.
    pub merged: Vec<S::Update>,
}

/// Encodes an interrupted subgraph: frame, pending writes and the updates merged so far.
pub fn encode_subgraph<S: State>(
    frame: &Frame<S>,
    pending: &[PendingWrite],
    merged: &[S::Update],
) -> Result<Vec<u8>, CodecError> {
    let body = SubgraphBody::<S> {
        checkpoint_id: frame.checkpoint_id.clone(),
        parent_id: frame.parent_id.clone(),
        step: frame.step,
        state: (*frame.state).clone(),
        next: frame.next.clone(),
        joins: frame.joins.clone(),
        pending: pending.to_vec(),
        merged: merged.to_vec(),
    };
    encode(S::SCHEMA_VERSION, &body)
}

/// Decodes an interrupted subgraph.
pub fn decode_subgraph<S: State>(bytes: &[u8]) -> Result<SubgraphSnapshot<S>, CodecError> {
    let body: SubgraphBody<S> = decode_current::<S, _>(crate::migrate::Payload::Subgraph, bytes)?;
    Ok(SubgraphSnapshot {
        frame: Frame {
            checkpoint_id: body.checkpoint_id,
            parent_id: body.parent_id,
            step: body.step,
            state: Arc::new(body.state),
            next: body.next,
            joins: body.joins,
        },
        pending: body.pending,
        merged: body.merged,
    })
}

/// The interrupts still waiting for an answer among a step's pending writes: for each task the
/// interrupts of its latest record, less those a resume value already answers.
pub fn open_interrupts(pending: &[PendingWrite]) -> Vec<(Interrupt, String, String)> {
    let mut latest: Vec<(String, String, Vec<Interrupt>)> = Vec::new();
    // (task, interrupt id) pairs answered; a failure of the task (for example a resume value
    // of the wrong type) re-opens its interrupts.
    let mut answered: Vec<(String, String)> = Vec::new();
    for w in pending {
        match &w.kind {
            PendingKind::Interrupts(list) => {
                match latest.iter_mut().find(|(t, _, _)| *t == w.task_id) {
                    Some(entry) => entry.2 = list.clone(),
                    None => latest.push((w.task_id.clone(), w.node.clone(), list.clone())),
                }
            }
            PendingKind::Resume(values) => {
                answered.extend(values.iter().map(|(id, _)| (w.task_id.clone(), id.clone())))
            }
            PendingKind::Error(_) => answered.retain(|(t, _)| *t != w.task_id),
            PendingKind::Output(_) => latest.retain(|(t, _, _)| *t != w.task_id),
            _ => {}
        }
    }
    latest
        .into_iter()
        .flat_map(|(task, node, list)| {
            list.into_iter()
                .map(move |i| (i, task.clone(), node.clone()))
        })
        .filter(|(i, _, _)| !answered.iter().any(|(_, id)| *id == i.id))
        .collect()
}

/// The pending writes of a paused checkpoint that still hold at a checkpoint written over it
/// by an edit (`update_state`, or a command given as input), whose planned tasks are `next`:
/// the outputs, interrupts, answers and subgraph states of tasks that are still planned (by
/// id), and the marker of a stop at a static breakpoint (so that the edited thread continues
/// past the breakpoint it stopped at instead of stopping there again). Static interrupts are
/// kept while the nodes they stopped before are still planned. Errors are not kept: the edit
/// may be what fixes them.
pub fn carry_pending<S: State>(
    pending: &[PendingWrite],
    next: &[PlannedTask<S>],
) -> Vec<PendingWrite> {
    let planned = |task_id: &str| next.iter().any(|t| t.id == task_id);
    pending
        .iter()
        .filter(|w| match &w.kind {
            PendingKind::StaticInterrupt => true,
            PendingKind::Interrupts(list) if w.task_id.is_empty() => {
                list.iter().all(|i| i.static_ && planned(&i.task_id))
            }
            PendingKind::Output(_)
            | PendingKind::Interrupts(_)
            | PendingKind::Resume(_)
            | PendingKind::Subgraph(_) => planned(&w.task_id),
            PendingKind::Error(_) | PendingKind::Sealed(_) => false,
        })
        .cloned()
        .collect()
}

/// Tracks the size of a thread's last full snapshot and the deltas written since, to decide
/// when the next full snapshot is due.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChainStats {
    /// Bytes of the last full snapshot (0 if none yet).
    pub full_bytes: usize,
    /// Bytes of the deltas written since it.
    pub delta_bytes: usize,
    /// Whether a full snapshot exists on the chain.
    pub has_full: bool,
}

/// Builds the record for `frame`, as a delta of `writes` when that is cheaper over time, or as
/// a full snapshot.
pub fn encode_checkpoint<S: State>(
    thread_id: &str,
    frame: &Frame<S>,
    writes: &[(String, S::Update)],
    source: CheckpointSource,
    stats: &mut ChainStats,
) -> Result<CheckpointRecord, CodecError> {
    let mut writers: Vec<String> = Vec::new();
    for (w, _) in writes {
        let w = crate::state::writer_node(w);
        if !writers.iter().any(|x| x == w) {
            writers.push(w.to_string());
        }
    }
    let mut payload = None;
    let mut full = false;
    if stats.has_full && frame.parent_id.is_some() {
        let body = FrameBody::<S> {
            base: Base::Delta(writes.to_vec()),
            next: frame.next.clone(),
            joins: frame.joins.clone(),
        };
        let bytes = encode(S::SCHEMA_VERSION, &body)?;
        if stats.delta_bytes + bytes.len() <= stats.full_bytes.max(4096) {
            stats.delta_bytes += bytes.len();
            payload = Some(bytes);
        }
    }
    let payload = match payload {
        Some(p) => p,
        None => {
            let body = FrameBody::<S> {
                base: Base::Full((*frame.state).clone()),
                next: frame.next.clone(),
                joins: frame.joins.clone(),
            };
            let bytes = encode(S::SCHEMA_VERSION, &body)?;
            *stats = ChainStats {
                full_bytes: bytes.len(),
                delta_bytes: 0,
                has_full: true,
            };
            full = true;
            bytes
        }
    };
    Ok(CheckpointRecord {
        thread_id: thread_id.to_string(),
        checkpoint_id: frame.checkpoint_id.clone(),
        parent_id: frame.parent_id.clone(),
        step: frame.step,
        source,
        created_at_ms: now_millis(),
        writers,
        next: frame.next_nodes(),
        full,
        payload,
    })
}

/// Storage for checkpoints, pending writes and thread records.
///
/// Implementations: `ferrograph_checkpoint::MemorySaver` and `ferrograph_checkpoint::SledSaver`.
/// Savers store records as opaque bytes; encoding belongs to this module.
#[async_trait]
pub trait CheckpointSaver: Send + Sync + 'static {
    /// Stores a checkpoint.
    async fn put(&self, record: CheckpointRecord) -> Result<(), CheckpointError>;

    /// Stores pending writes for the step after `checkpoint_id`.
    async fn put_writes(
        &self,
        thread_id: &str,
        checkpoint_id: &str,
        writes: Vec<PendingWrite>,
    ) -> Result<(), CheckpointError>;

    /// A checkpoint by id, or the newest when `checkpoint_id` is `None`.
    async fn get(
        &self,
        thread_id: &str,
        checkpoint_id: Option<&str>,
    ) -> Result<Option<CheckpointRecord>, CheckpointError>;

    /// Pending writes recorded after `checkpoint_id`, in the order written.
    async fn get_writes(
        &self,
        thread_id: &str,
        checkpoint_id: &str,
    ) -> Result<Vec<PendingWrite>, CheckpointError>;

    /// Checkpoints of a thread, newest first, optionally only those older than `before`, at
    /// most `limit`.
    async fn list(
        &self,
        thread_id: &str,
        before: Option<&str>,
        limit: Option<usize>,
    ) -> Result<Vec<CheckpointRecord>, CheckpointError>;

    /// Creates or replaces a thread record.
    async fn put_thread(&self, info: ThreadInfo) -> Result<(), CheckpointError>;

    /// Stores pending writes and the thread's record together: after a crash either both are
    /// there or neither. A resume uses it, so that a thread never shows an interrupt as
    /// waiting while its checkpoint already holds the answer. The default writes one after
    /// the other (enough for savers that lose everything in a crash anyway).
    async fn put_writes_and_thread(
        &self,
        thread_id: &str,
        checkpoint_id: &str,
        writes: Vec<PendingWrite>,
        info: ThreadInfo,
    ) -> Result<(), CheckpointError> {
        self.put_writes(thread_id, checkpoint_id, writes).await?;
        self.put_thread(info).await
    }

    /// A thread record.
    async fn get_thread(&self, thread_id: &str) -> Result<Option<ThreadInfo>, CheckpointError>;

    /// Thread records, optionally only those with `status`.
    async fn list_threads(
        &self,
        status: Option<ThreadStatus>,
    ) -> Result<Vec<ThreadInfo>, CheckpointError>;

    /// Deletes a thread with all its checkpoints and writes. Returns whether it existed.
    async fn delete_thread(&self, thread_id: &str) -> Result<bool, CheckpointError>;

    /// Deletes the thread's checkpoints older than `checkpoint_id` and their pending writes.
    /// Returns how many checkpoints were removed. The caller first rewrites `checkpoint_id` as
    /// a full snapshot so that it no longer needs its parents (see `GraphRunner::prune`).
    async fn delete_before(
        &self,
        thread_id: &str,
        checkpoint_id: &str,
    ) -> Result<usize, CheckpointError>;

    /// Makes everything written so far durable (a no-op for memory).
    async fn flush(&self) -> Result<(), CheckpointError> {
        Ok(())
    }
}

/// Re-encodes a loaded checkpoint as a full snapshot (same id, parent and metadata), so that
/// older checkpoints can be deleted.
pub fn encode_full<S: State>(
    thread_id: &str,
    loaded: &LoadedCheckpoint<S>,
) -> Result<CheckpointRecord, CodecError> {
    let mut stats = ChainStats::default();
    let mut record = encode_checkpoint(
        thread_id,
        &loaded.frame,
        &[],
        loaded.record.source,
        &mut stats,
    )?;
    record.created_at_ms = loaded.record.created_at_ms;
    record.writers = loaded.record.writers.clone();
    Ok(record)
}

/// A checkpoint loaded and materialized.
#[derive(Clone, Debug)]
pub struct LoadedCheckpoint<S: State> {
    /// The frame (state and plan).
    pub frame: Frame<S>,
    /// The record's metadata (payload emptied).
    pub record: CheckpointRecord,
    /// Snapshot bookkeeping of the chain up to this checkpoint.
    pub stats: ChainStats,
}

fn corrupt(record: &CheckpointRecord, source: CodecError) -> CheckpointError {
    CheckpointError::Corrupt {
        thread: record.thread_id.clone(),
        checkpoint: record.checkpoint_id.clone(),
        source,
    }
}

/// Loads a checkpoint (the newest when `checkpoint_id` is `None`) and materializes its state by
/// replaying deltas onto the last full snapshot before it.
pub async fn load_checkpoint<S: State>(
    saver: &dyn CheckpointSaver,
    thread_id: &str,
    checkpoint_id: Option<&str>,
) -> Result<Option<LoadedCheckpoint<S>>, CheckpointError> {
    let Some(head) = saver.get(thread_id, checkpoint_id).await? else {
        return match checkpoint_id {
            None => Ok(None),
            Some(c) => Err(CheckpointError::NotFound {
                thread: thread_id.to_string(),
                checkpoint: c.to_string(),
            }),
        };
    };
    load_from_record(saver, thread_id, head).await.map(Some)
}

/// Materializes an already fetched checkpoint record (reading its parents back to the last
/// full snapshot), for callers that fetched the record for another reason first.
pub async fn load_from_record<S: State>(
    saver: &dyn CheckpointSaver,
    thread_id: &str,
    head: CheckpointRecord,
) -> Result<LoadedCheckpoint<S>, CheckpointError> {
    let mut chain = vec![head];
    while let Some(last) = chain.last() {
        if last.full {
            break;
        }
        let Some(parent) = last.parent_id.clone() else {
            return Err(corrupt(
                last,
                CodecError::Decode("delta checkpoint without a parent".into()),
            ));
        };
        match saver.get(thread_id, Some(&parent)).await? {
            Some(p) => chain.push(p),
            None => {
                return Err(CheckpointError::MissingParent {
                    thread: thread_id.to_string(),
                    checkpoint: last.checkpoint_id.clone(),
                    parent,
                })
            }
        }
    }
    materialize(chain)
}

/// Materializes a chain given newest first, ending with a full snapshot.
fn materialize<S: State>(
    mut chain: Vec<CheckpointRecord>,
) -> Result<LoadedCheckpoint<S>, CheckpointError> {
    let mut stats = ChainStats::default();
    let mut state: Option<S> = None;
    let mut last: Option<(CheckpointRecord, FrameBody<S>)> = None;
    while let Some(record) = chain.pop() {
        let mut body: FrameBody<S> =
            decode_current::<S, _>(crate::migrate::Payload::Frame, &record.payload)
                .map_err(|e| corrupt(&record, e))?;
        match std::mem::replace(&mut body.base, Base::Delta(Vec::new())) {
            Base::Full(s) => {
                stats = ChainStats {
                    full_bytes: record.payload.len(),
                    delta_bytes: 0,
                    has_full: true,
                };
                state = Some(s);
            }
            Base::Delta(writes) => {
                let Some(s) = state.as_mut() else {
                    return Err(corrupt(
                        &record,
                        CodecError::Decode("delta before any full snapshot".into()),
                    ));
                };
                stats.delta_bytes += record.payload.len();
                for (node, update) in writes {
                    crate::state::replay_write(s, &node, update).map_err(|e| {
                        corrupt(
                            &record,
                            CodecError::Decode(format!("replaying the update of `{node}`: {e}")),
                        )
                    })?;
                }
            }
        }
        last = Some((record, body));
    }
    let Some((mut meta, body)) = last else {
        return Err(CheckpointError::Backend {
            message: "empty checkpoint chain".into(),
            source: None,
        });
    };
    meta.payload = Vec::new();
    Ok(LoadedCheckpoint {
        frame: Frame {
            checkpoint_id: meta.checkpoint_id.clone(),
            parent_id: meta.parent_id.clone(),
            step: meta.step,
            state: Arc::new(state.unwrap_or_default()),
            next: body.next,
            joins: body.joins,
        },
        record: meta,
        stats,
    })
}

/// Loads every checkpoint of a thread, oldest first, materializing each state once.
pub async fn load_history<S: State>(
    saver: &dyn CheckpointSaver,
    thread_id: &str,
) -> Result<Vec<LoadedCheckpoint<S>>, CheckpointError> {
    let mut records = saver.list(thread_id, None, None).await?;
    records.reverse();
    let mut by_id: BTreeMap<String, Arc<S>> = BTreeMap::new();
    let mut out = Vec::with_capacity(records.len());
    for record in records {
        let body: FrameBody<S> =
            decode_current::<S, _>(crate::migrate::Payload::Frame, &record.payload)
                .map_err(|e| corrupt(&record, e))?;
        let state = match body.base {
            Base::Full(s) => Arc::new(s),
            Base::Delta(writes) => {
                let parent = record.parent_id.clone().unwrap_or_default();
                let base = match by_id.get(&parent) {
                    Some(p) => p.clone(),
                    None => match load_checkpoint::<S>(saver, thread_id, Some(&parent)).await {
                        Ok(Some(l)) => l.frame.state,
                        Ok(None) | Err(CheckpointError::NotFound { .. }) => {
                            return Err(CheckpointError::MissingParent {
                                thread: thread_id.to_string(),
                                checkpoint: record.checkpoint_id.clone(),
                                parent,
                            })
                        }
                        Err(e) => return Err(e),
                    },
                };
                let mut s = (*base).clone();
                for (node, update) in writes {
                    crate::state::replay_write(&mut s, &node, update).map_err(|e| {
                        corrupt(
                            &record,
                            CodecError::Decode(format!("replaying the update of `{node}`: {e}")),
                        )
                    })?;
                }
                Arc::new(s)
            }
        };
        by_id.insert(record.checkpoint_id.clone(), state.clone());
        let mut meta = record;
        meta.payload = Vec::new();
        out.push(LoadedCheckpoint {
            frame: Frame {
                checkpoint_id: meta.checkpoint_id.clone(),
                parent_id: meta.parent_id.clone(),
                step: meta.step,
                state,
                next: body.next,
                joins: body.joins,
            },
            record: meta,
            stats: ChainStats::default(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_detects_damage() {
        let sealed = seal(3, b"hello world");
        assert_eq!(open(&sealed).unwrap(), (3, &b"hello world"[..]));
        let mut flipped = sealed.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(matches!(open(&flipped), Err(CodecError::Checksum { .. })));
        assert!(matches!(
            open(&sealed[..sealed.len() - 2]),
            Err(CodecError::Truncated { .. })
        ));
        assert!(matches!(
            open(&sealed[..5]),
            Err(CodecError::Truncated { .. })
        ));
        let mut magic = sealed.clone();
        magic[0] = b'X';
        assert_eq!(open(&magic), Err(CodecError::BadMagic));
        let mut fmt = sealed;
        fmt[4] = 9;
        assert_eq!(open(&fmt), Err(CodecError::UnsupportedFormat(9)));
    }

    #[test]
    fn decode_checks_schema_version() {
        let bytes = encode(2, &vec![1u32, 2, 3]).unwrap();
        assert_eq!(decode::<Vec<u32>>(2, &bytes).unwrap(), vec![1, 2, 3]);
        assert_eq!(
            decode::<Vec<u32>>(3, &bytes).unwrap_err(),
            CodecError::SchemaMismatch {
                found: 2,
                expected: 3
            }
        );
    }
}
