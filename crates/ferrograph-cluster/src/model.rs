//! Chat models across nodes: a model host on the node that has the model, and
//! [`ClusterChatModel`], the [`ChatModel`] contract for callers on any node.
//!
//! A host is an actor in the process group [`MODELS_GROUP`] serving one model. A call is a
//! job: the caller asks the host to start it ([`Request::Generate`]), then long-polls it
//! ([`Request::Poll`]): the host answers a poll as soon as new text pieces exist or the job
//! ended, or after the poll's wait with nothing new. So tokens stream back as they are
//! generated, a healthy host answers every poll within the wait, and a host that does not
//! answer within the wait plus the node's failure timeout (or whose session ends) is lost.
//!
//! [`ClusterChatModel`] places each call on the host of the model (and label, when asked)
//! with the fewest calls running, counting its own calls in flight. When a host is lost
//! mid-call the call starts again on another host that serves the model, up to the failover
//! count, and fails with [`LlmError::NodeLost`] naming the node when none is left. A model
//! call holds no committed state: the graph's checkpoints stay with the coordinator's
//! process, so a call that starts again changes nothing that was committed. Its tokens are
//! streamed again from the start on the new host.

use crate::error::ClusterError;
use crate::node::{call, refuse_version, ClusterNode, NodeShared};
use crate::wire::{self, ModelInfo, RemoteFailure, Reply, Request, WireMsg};
use async_trait::async_trait;
use ferrograph_chat::{ChatModel, GenerateOptions, LlmError, TokenSink};
use ferrograph_core::message::Message;
use parking_lot::Mutex;
use ractor::{Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The process group of every model host.
pub const MODELS_GROUP: &str = "ferrograph.models";

/// A job not polled for this long is abandoned (its caller is gone) and stopped.
const ABANDONED_AFTER: Duration = Duration::from_secs(60);

/// One model call, as it crosses the network (JSON inside the frame).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GenerateRequest {
    /// The conversation.
    pub messages: Vec<Message>,
    /// The call's options.
    pub options: GenerateOptions,
    /// Whether the caller wants the text pieces as they are generated.
    pub stream: bool,
}

/// One call running on a host.
struct Job {
    pieces: Mutex<Vec<String>>,
    done: Mutex<Option<Result<String, RemoteFailure>>>,
    tick: watch::Sender<u64>,
    last_poll: Mutex<Instant>,
    task: Mutex<Option<tokio::task::AbortHandle>>,
}

impl Job {
    fn bump(&self) {
        self.tick.send_modify(|n| *n += 1);
    }

    fn stop(&self) {
        if let Some(t) = self.task.lock().take() {
            t.abort();
        }
    }
}

type Jobs = Arc<Mutex<HashMap<u64, Arc<Job>>>>;

/// What a model host is given at start.
pub(crate) struct HostArgs {
    pub(crate) shared: Arc<NodeShared>,
    pub(crate) name: String,
    pub(crate) model: Arc<dyn ChatModel>,
}

/// A model host's state.
pub(crate) struct HostState {
    args: HostArgs,
    jobs: Jobs,
    next_job: u64,
    running: Arc<AtomicU32>,
    sweeper: tokio::task::JoinHandle<()>,
}

/// The model host actor.
pub(crate) struct ModelHost;

impl Actor for ModelHost {
    type Msg = WireMsg;
    type State = HostState;
    type Arguments = HostArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<WireMsg>,
        args: HostArgs,
    ) -> Result<HostState, ActorProcessingErr> {
        ractor::pg::join(MODELS_GROUP.to_string(), vec![myself.get_cell()]);
        let jobs: Jobs = Arc::default();
        let sweeper = {
            let jobs = jobs.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    jobs.lock().retain(|id, job| {
                        let keep = job.last_poll.lock().elapsed() < ABANDONED_AFTER;
                        if !keep {
                            tracing::warn!(job = id, "a model call nobody polls any more stopped");
                            job.stop();
                        }
                        keep
                    });
                }
            })
        };
        Ok(HostState {
            args,
            jobs,
            next_job: 1,
            running: Arc::default(),
            sweeper,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<WireMsg>,
        state: &mut HostState,
    ) -> Result<(), ActorProcessingErr> {
        state.sweeper.abort();
        for job in state.jobs.lock().values() {
            job.stop();
        }
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<WireMsg>,
        message: WireMsg,
        state: &mut HostState,
    ) -> Result<(), ActorProcessingErr> {
        let protocol = state.args.shared.protocol;
        let (bytes, reply) = match message {
            WireMsg::Call(bytes, reply) => (bytes, Some(reply)),
            WireMsg::Cast(bytes) => (bytes, None),
        };
        let version = wire::frame_version(&bytes).unwrap_or(0);
        if version != protocol {
            if let Some(reply) = reply {
                refuse_version(protocol, reply, version);
            }
            return Ok(());
        }
        let request = match wire::decode_from::<Request>(&bytes, protocol, "a caller") {
            Ok(r) => r,
            Err(e) => {
                answer(
                    protocol,
                    reply,
                    Reply::Refused {
                        reason: e.to_string(),
                    },
                );
                return Ok(());
            }
        };
        match request {
            Request::Info => {
                let info = ModelInfo {
                    model: state.args.name.clone(),
                    node: state.args.shared.name.clone(),
                    labels: state.args.shared.labels.clone(),
                    running: state.running.load(Ordering::Relaxed),
                };
                answer(protocol, reply, Reply::Model(info));
            }
            Request::Generate { request } => {
                let reply_body = match serde_json::from_str::<GenerateRequest>(&request) {
                    Ok(req) => {
                        let id = state.next_job;
                        state.next_job += 1;
                        start_job(state, id, req);
                        Reply::Started { job: id }
                    }
                    Err(e) => Reply::Refused {
                        reason: format!("the model request is not valid: {e}"),
                    },
                };
                answer(protocol, reply, reply_body);
            }
            Request::Poll { job, from, wait_ms } => {
                let found = state.jobs.lock().get(&job).cloned();
                match (found, reply) {
                    (Some(found), Some(reply)) => {
                        *found.last_poll.lock() = Instant::now();
                        let jobs = state.jobs.clone();
                        tokio::spawn(poll(
                            protocol,
                            jobs,
                            job,
                            found,
                            from as usize,
                            Duration::from_millis(u64::from(wait_ms.min(30_000))),
                            reply,
                        ));
                    }
                    (None, reply) => answer(
                        protocol,
                        reply,
                        Reply::Refused {
                            reason: format!("no model call {job} on this node"),
                        },
                    ),
                    (Some(_), None) => {}
                }
            }
            Request::Cancel { job } => {
                if let Some(found) = state.jobs.lock().remove(&job) {
                    found.stop();
                }
                answer(protocol, reply, Reply::Started { job });
            }
        }
        Ok(())
    }
}

fn answer(protocol: u32, reply: Option<ractor::RpcReplyPort<Vec<u8>>>, body: Reply) {
    if let Some(reply) = reply {
        match wire::encode_with(protocol, &body) {
            Ok(bytes) => {
                let _ = reply.send(bytes);
            }
            Err(e) => tracing::error!("encoding a reply: {e}"),
        }
    }
}

/// Counts a call on the host and its node until dropped.
struct Running {
    host: Arc<AtomicU32>,
    shared: Arc<NodeShared>,
}

impl Running {
    fn new(host: Arc<AtomicU32>, shared: Arc<NodeShared>) -> Self {
        host.fetch_add(1, Ordering::Relaxed);
        shared.running.fetch_add(1, Ordering::Relaxed);
        Running { host, shared }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.host.fetch_sub(1, Ordering::Relaxed);
        self.shared.running.fetch_sub(1, Ordering::Relaxed);
        self.shared.served.fetch_add(1, Ordering::Relaxed);
    }
}

fn start_job(state: &mut HostState, id: u64, req: GenerateRequest) {
    let (tick, _) = watch::channel(0);
    let job = Arc::new(Job {
        pieces: Mutex::new(Vec::new()),
        done: Mutex::new(None),
        tick,
        last_poll: Mutex::new(Instant::now()),
        task: Mutex::new(None),
    });
    state.jobs.lock().insert(id, job.clone());
    let model = state.args.model.clone();
    let counter = Running::new(state.running.clone(), state.args.shared.clone());
    let node = state.args.shared.name.clone();
    let task = tokio::spawn(async move {
        let _counter = counter;
        let sink = req.stream.then(|| {
            let job = job.clone();
            TokenSink::callback(move |_model, piece| {
                job.pieces.lock().push(piece.to_string());
                job.bump();
            })
        });
        let result = model.invoke(&req.messages, &req.options, sink).await;
        let done = match result {
            Ok(message) => serde_json::to_string(&message).map_err(|e| RemoteFailure {
                kind: "backend".into(),
                message: format!("encoding the answer: {e}"),
                output: None,
            }),
            Err(e) => {
                tracing::warn!(%node, "a model call failed: {e}");
                Err(failure_of(&e))
            }
        };
        *job.done.lock() = Some(done);
        job.bump();
    });
    if let Some(job) = state.jobs.lock().get(&id) {
        *job.task.lock() = Some(task.abort_handle());
    }
}

async fn poll(
    protocol: u32,
    jobs: Jobs,
    id: u64,
    job: Arc<Job>,
    from: usize,
    wait: Duration,
    reply: ractor::RpcReplyPort<Vec<u8>>,
) {
    let mut rx = job.tick.subscribe();
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let pieces: Vec<String> = job.pieces.lock().get(from..).unwrap_or(&[]).to_vec();
        let done = job.done.lock().clone();
        if !pieces.is_empty() || done.is_some() || tokio::time::Instant::now() >= deadline {
            if done.is_some() {
                jobs.lock().remove(&id);
            }
            answer(protocol, Some(reply), Reply::Progress { pieces, done });
            return;
        }
        // A change between the check above and here is not missed: the receiver saw the
        // value current at `subscribe`, so any later bump marks it changed.
        let _ = tokio::time::timeout_at(deadline, rx.changed()).await;
    }
}

fn failure_of(e: &LlmError) -> RemoteFailure {
    let (kind, output) = match e {
        LlmError::Validation(_) => ("validation", None),
        LlmError::Schema { output, .. } => ("schema", Some(output.clone())),
        LlmError::Overloaded(_) => ("overloaded", None),
        LlmError::Timeout(_) => ("timeout", None),
        _ => ("backend", None),
    };
    let message = match e {
        LlmError::Validation(m) | LlmError::Overloaded(m) => m.clone(),
        LlmError::Schema { message, .. } => message.clone(),
        other => other.to_string(),
    };
    RemoteFailure {
        kind: kind.into(),
        message,
        output,
    }
}

fn error_of(node: &str, f: RemoteFailure) -> LlmError {
    match f.kind.as_str() {
        "validation" => LlmError::Validation(f.message),
        "schema" => LlmError::Schema {
            message: f.message,
            output: f.output.unwrap_or_default(),
        },
        "overloaded" => LlmError::Overloaded(format!("on node {node}: {}", f.message)),
        _ => LlmError::Backend(format!("on node {node}: {}", f.message)),
    }
}

impl ClusterNode {
    /// Serves `model` to the cluster under `name`: starts a model host on this node.
    pub async fn host_model(
        &self,
        name: impl Into<String>,
        model: Arc<dyn ChatModel>,
    ) -> Result<(), ClusterError> {
        let name = name.into();
        self.shared.models.lock().push(name.clone());
        Actor::spawn(
            None,
            ModelHost,
            HostArgs {
                shared: self.shared.clone(),
                name,
                model,
            },
        )
        .await
        .map_err(|e| ClusterError::Actor(e.to_string()))?;
        Ok(())
    }

    /// The chat model `model` (any model when `None`) as served by the cluster's nodes
    /// (only nodes labelled `label`, when given). See [`ClusterChatModel`].
    pub fn chat_model(&self, model: Option<String>, label: Option<String>) -> ClusterChatModel {
        ClusterChatModel {
            shared: self.shared.clone(),
            model,
            label,
            failover: 2,
            poll_wait: Duration::from_millis(1_000),
            inflight: Arc::default(),
        }
    }

    /// Every model host of the cluster, as the hosts describe themselves.
    pub async fn models(&self) -> Vec<ModelInfo> {
        let mut out: Vec<ModelInfo> = hosts(&self.shared)
            .await
            .into_iter()
            .map(|(_, info)| info)
            .collect();
        out.sort_by(|a, b| (&a.node, &a.model).cmp(&(&b.node, &b.model)));
        out
    }
}

/// Every model host that answers, with its description.
async fn hosts(shared: &Arc<NodeShared>) -> Vec<(ActorCell, ModelInfo)> {
    let mut set = tokio::task::JoinSet::new();
    let timeout = shared.failure_timeout.min(Duration::from_secs(2));
    for cell in ractor::pg::get_members(&MODELS_GROUP.to_string()) {
        let protocol = shared.protocol;
        set.spawn(async move {
            let r = call(&cell, protocol, "a model host", &Request::Info, timeout).await;
            (cell, r)
        });
    }
    let mut out = Vec::new();
    while let Some(r) = set.join_next().await {
        match r {
            Ok((cell, Ok(Reply::Model(info)))) => out.push((cell, info)),
            Ok((_, Ok(_))) => {}
            Ok((_, Err(e))) => tracing::warn!("a model host did not describe itself: {e}"),
            Err(e) => tracing::warn!("asking a model host: {e}"),
        }
    }
    out
}

/// A chat model served by the cluster's model hosts (see the module documentation).
#[derive(Clone)]
pub struct ClusterChatModel {
    shared: Arc<NodeShared>,
    model: Option<String>,
    label: Option<String>,
    failover: u32,
    poll_wait: Duration,
    inflight: Arc<Mutex<HashMap<ActorId, u32>>>,
}

impl std::fmt::Debug for ClusterChatModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterChatModel")
            .field("model", &self.model)
            .field("label", &self.label)
            .field("failover", &self.failover)
            .finish_non_exhaustive()
    }
}

/// How one attempt on one host ended, when it did not answer.
enum AttemptError {
    /// The host was lost: another host may take the call.
    Lost(LlmError),
    /// The call failed on the host: the same call fails anywhere.
    Failed(LlmError),
}

/// Takes a call off a host's local in-flight count when dropped.
struct InFlight {
    map: Arc<Mutex<HashMap<ActorId, u32>>>,
    id: ActorId,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut map = self.map.lock();
        if let Some(n) = map.get_mut(&self.id) {
            *n = n.saturating_sub(1);
        }
    }
}

/// Cancels a job on its host when the caller gives up on it (the call's future is dropped).
struct CancelOnDrop {
    cell: ActorCell,
    protocol: u32,
    job: u64,
    armed: bool,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.armed {
            if let Ok(bytes) = wire::encode_with(self.protocol, &Request::Cancel { job: self.job })
            {
                let _ = self.cell.send_message(WireMsg::Cast(bytes));
            }
        }
    }
}

impl ClusterChatModel {
    /// How many times a call lost with its host starts again on another host (default 2).
    #[must_use]
    pub fn failover(mut self, times: u32) -> Self {
        self.failover = times;
        self
    }

    /// The longest a host holds a poll with nothing new (default 1 s).
    #[must_use]
    pub fn poll_wait(mut self, wait: Duration) -> Self {
        self.poll_wait = wait;
        self
    }

    fn wanted(&self) -> String {
        let model = self.model.as_deref().unwrap_or("any model");
        match &self.label {
            Some(l) => format!("{model} on a node labelled {l}"),
            None => model.to_string(),
        }
    }

    /// The host with the fewest calls, among those that serve the model and have the label.
    async fn pick(&self, excluded: &[ActorId]) -> Option<(ActorCell, ModelInfo, InFlight)> {
        let candidates: Vec<(ActorCell, ModelInfo)> = hosts(&self.shared)
            .await
            .into_iter()
            .filter(|(cell, info)| {
                !excluded.contains(&cell.get_id())
                    && self.model.as_ref().is_none_or(|m| &info.model == m)
                    && self.label.as_ref().is_none_or(|l| info.labels.contains(l))
            })
            .collect();
        let mut map = self.inflight.lock();
        let (cell, info) = candidates.into_iter().min_by_key(|(cell, info)| {
            let mine = map.get(&cell.get_id()).copied().unwrap_or(0);
            (info.running + mine, info.node.clone())
        })?;
        *map.entry(cell.get_id()).or_insert(0) += 1;
        let guard = InFlight {
            map: self.inflight.clone(),
            id: cell.get_id(),
        };
        Some((cell, info, guard))
    }

    async fn attempt(
        &self,
        cell: &ActorCell,
        info: &ModelInfo,
        request: &str,
        stream: bool,
        sink: Option<&TokenSink>,
    ) -> Result<Message, AttemptError> {
        let protocol = self.shared.protocol;
        let node = info.node.as_str();
        let lost = |e: ClusterError| match e {
            ClusterError::NodeLost { node, message } => {
                AttemptError::Lost(LlmError::NodeLost { node, message })
            }
            other => AttemptError::Failed(LlmError::Backend(other.to_string())),
        };
        let start = Request::Generate {
            request: request.to_string(),
        };
        let job = match call(cell, protocol, node, &start, self.shared.failure_timeout)
            .await
            .map_err(lost)?
        {
            Reply::Started { job } => job,
            other => {
                return Err(AttemptError::Failed(LlmError::Backend(format!(
                    "node {node} answered a model call with {other:?}"
                ))))
            }
        };
        let mut cancel = CancelOnDrop {
            cell: cell.clone(),
            protocol,
            job,
            armed: true,
        };
        let mut from: u32 = 0;
        let wait_ms = u32::try_from(self.poll_wait.as_millis()).unwrap_or(u32::MAX);
        loop {
            let poll = Request::Poll { job, from, wait_ms };
            let reply = call(
                cell,
                protocol,
                node,
                &poll,
                self.poll_wait + self.shared.failure_timeout,
            )
            .await
            .map_err(lost)?;
            let Reply::Progress { pieces, done } = reply else {
                return Err(AttemptError::Failed(LlmError::Backend(format!(
                    "node {node} answered a poll with {reply:?}"
                ))));
            };
            from += u32::try_from(pieces.len()).unwrap_or(u32::MAX);
            if stream {
                if let Some(sink) = sink {
                    for piece in &pieces {
                        sink.send(&info.model, piece).await;
                    }
                }
            }
            match done {
                None => {}
                Some(Ok(json)) => {
                    cancel.armed = false;
                    return serde_json::from_str::<Message>(&json).map_err(|e| {
                        AttemptError::Failed(LlmError::MalformedResponse {
                            message: format!("the answer from node {node}: {e}"),
                            body: json.chars().take(300).collect(),
                        })
                    });
                }
                Some(Err(f)) => {
                    cancel.armed = false;
                    return Err(AttemptError::Failed(error_of(node, f)));
                }
            }
        }
    }
}

#[async_trait]
impl ChatModel for ClusterChatModel {
    fn model_name(&self) -> String {
        self.model.clone().unwrap_or_else(|| "cluster".into())
    }

    async fn invoke(
        &self,
        messages: &[Message],
        options: &GenerateOptions,
        sink: Option<TokenSink>,
    ) -> Result<Message, LlmError> {
        let stream = sink
            .as_ref()
            .is_some_and(|s| s.wants_tokens(&self.model_name()));
        let request = serde_json::to_string(&GenerateRequest {
            messages: messages.to_vec(),
            options: options.clone(),
            stream,
        })
        .map_err(|e| LlmError::Validation(format!("the request cannot be encoded: {e}")))?;
        let mut excluded = Vec::new();
        let mut last_lost = None;
        for _ in 0..=self.failover {
            let Some((cell, info, _inflight)) = self.pick(&excluded).await else {
                break;
            };
            match self
                .attempt(&cell, &info, &request, stream, sink.as_ref())
                .await
            {
                Ok(message) => return Ok(message),
                Err(AttemptError::Failed(e)) => return Err(e),
                Err(AttemptError::Lost(e)) => {
                    tracing::warn!("model call lost with its node, trying another: {e}");
                    excluded.push(cell.get_id());
                    last_lost = Some(e);
                }
            }
        }
        Err(last_lost.unwrap_or_else(|| LlmError::NodeLost {
            node: "none".into(),
            message: format!("no node of the cluster serves {}", self.wanted()),
        }))
    }
}
