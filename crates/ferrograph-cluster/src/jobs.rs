//! Jobs on hosts: the one mechanism behind model calls and graph tasks across nodes.
//!
//! A host is an actor in a process group (models, tasks) serving one [`Service`]. A caller
//! starts a job ([`Request::Start`]) and then long-polls it ([`Request::Poll`]): the host
//! answers as soon as the job has new pieces (model tokens, node events) or has ended, or
//! after the poll's wait with nothing new. So pieces stream back as they are made, a healthy
//! host answers every poll within the wait, and a host that does not answer within the wait
//! plus the node's failure timeout, or whose session ends, is lost. The start carries a wait
//! too, so a short job takes one round trip.
//!
//! Callers pick the host with the fewest jobs running (as the hosts report it, plus the
//! caller's own jobs in flight, which the hosts may not have counted yet).

use crate::error::ClusterError;
use crate::node::{ask_members, call, refuse_version, NodeShared};
use crate::wire::{self, HostInfo, RemoteFailure, Reply, Request, WireMsg};
use async_trait::async_trait;
use parking_lot::Mutex;
use ractor::{Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

/// A job not polled for this long is abandoned (its caller is gone) and stopped.
const ABANDONED_AFTER: Duration = Duration::from_secs(60);

/// What a host does with a job.
#[async_trait]
pub(crate) trait Service: Send + Sync + 'static {
    /// `model` or `tasks`.
    fn kind(&self) -> &'static str;
    /// The name callers look for (the model's name, `tasks`).
    fn name(&self) -> String;
    /// The graphs whose tasks it runs (task hosts).
    fn graphs(&self) -> Vec<String> {
        Vec::new()
    }
    /// Runs one job; its pieces go to `pieces`, in order.
    async fn run(&self, request: String, pieces: Pieces) -> Result<String, RemoteFailure>;
}

/// Where a running job puts its pieces.
#[derive(Clone)]
pub(crate) struct Pieces(Arc<Job>);

impl Pieces {
    /// Adds one piece (the caller's next poll gets it).
    pub(crate) fn push(&self, piece: String) {
        self.0.pieces.lock().push(piece);
        self.0.bump();
    }
}

/// One job on a host.
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

/// What a host is given at start.
pub(crate) struct HostArgs {
    pub(crate) shared: Arc<NodeShared>,
    pub(crate) group: &'static str,
    pub(crate) service: Arc<dyn Service>,
}

/// A host's state.
pub(crate) struct HostState {
    args: HostArgs,
    jobs: Jobs,
    next_job: u64,
    running: Arc<AtomicU32>,
    sweeper: tokio::task::JoinHandle<()>,
}

/// The host actor.
pub(crate) struct Host;

impl Actor for Host {
    type Msg = WireMsg;
    type State = HostState;
    type Arguments = HostArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<WireMsg>,
        args: HostArgs,
    ) -> Result<HostState, ActorProcessingErr> {
        ractor::pg::join(args.group.to_string(), vec![myself.get_cell()]);
        let jobs: Jobs = Arc::default();
        let sweeper = {
            let jobs = jobs.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    jobs.lock().retain(|id, job| {
                        let keep = job.last_poll.lock().elapsed() < ABANDONED_AFTER;
                        if !keep {
                            tracing::warn!(job = id, "a job nobody polls any more stopped");
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
                let info = HostInfo {
                    kind: state.args.service.kind().into(),
                    name: state.args.service.name(),
                    node: state.args.shared.name.clone(),
                    labels: state.args.shared.labels.clone(),
                    graphs: state.args.service.graphs(),
                    running: state.running.load(Ordering::Relaxed),
                };
                answer(protocol, reply, Reply::Host(info));
            }
            Request::Start { request, wait_ms } => {
                let id = state.next_job;
                state.next_job += 1;
                let job = start_job(state, id, request);
                if let Some(reply) = reply {
                    tokio::spawn(poll(
                        protocol,
                        state.jobs.clone(),
                        id,
                        job,
                        0,
                        wait(wait_ms),
                        reply,
                    ));
                }
            }
            Request::Poll { job, from, wait_ms } => {
                let found = state.jobs.lock().get(&job).cloned();
                match (found, reply) {
                    (Some(found), Some(reply)) => {
                        *found.last_poll.lock() = Instant::now();
                        tokio::spawn(poll(
                            protocol,
                            state.jobs.clone(),
                            job,
                            found,
                            from as usize,
                            wait(wait_ms),
                            reply,
                        ));
                    }
                    (None, reply) => answer(
                        protocol,
                        reply,
                        Reply::Refused {
                            reason: format!("no job {job} on this node"),
                        },
                    ),
                    (Some(_), None) => {}
                }
            }
            Request::Cancel { job } => {
                if let Some(found) = state.jobs.lock().remove(&job) {
                    found.stop();
                }
                answer(
                    protocol,
                    reply,
                    Reply::Refused {
                        reason: "cancelled".into(),
                    },
                );
            }
            Request::Peers => answer(
                protocol,
                reply,
                Reply::Refused {
                    reason: "a host does not list peers; its node agent does".into(),
                },
            ),
        }
        Ok(())
    }
}

fn wait(ms: u32) -> Duration {
    Duration::from_millis(u64::from(ms.min(30_000)))
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

/// Counts a job on the host and its node until dropped.
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

fn start_job(state: &mut HostState, id: u64, request: String) -> Arc<Job> {
    let (tick, _) = watch::channel(0);
    let job = Arc::new(Job {
        pieces: Mutex::new(Vec::new()),
        done: Mutex::new(None),
        tick,
        last_poll: Mutex::new(Instant::now()),
        task: Mutex::new(None),
    });
    state.jobs.lock().insert(id, job.clone());
    let service = state.args.service.clone();
    let counter = Running::new(state.running.clone(), state.args.shared.clone());
    let node = state.args.shared.name.clone();
    let running = job.clone();
    let task = tokio::spawn(async move {
        let _counter = counter;
        let result = service.run(request, Pieces(running.clone())).await;
        if let Err(f) = &result {
            tracing::warn!(%node, "a {} job failed: {}", service.kind(), f.message);
        }
        *running.done.lock() = Some(result);
        running.bump();
    });
    *job.task.lock() = Some(task.abort_handle());
    job
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
            answer(
                protocol,
                Some(reply),
                Reply::Progress {
                    job: id,
                    pieces,
                    done,
                },
            );
            return;
        }
        // A change between the check above and here is not missed: the receiver saw the
        // value current at `subscribe`, so any later bump marks it changed.
        let _ = tokio::time::timeout_at(deadline, rx.changed()).await;
    }
}

/// Every host of `group` that answers, with its description.
pub(crate) async fn hosts(shared: &Arc<NodeShared>, group: &str) -> Vec<(ActorCell, HostInfo)> {
    let timeout = shared.failure_timeout.min(Duration::from_secs(2));
    ask_members(shared, group, timeout)
        .await
        .into_iter()
        .filter_map(|(cell, reply)| match reply {
            Ok(Reply::Host(info)) => Some((cell, info)),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!("a host did not describe itself: {e}");
                None
            }
        })
        .collect()
}

/// Takes a job off a host's local in-flight count when dropped.
pub(crate) struct InFlight {
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

/// Picks hosts for a caller: the one with the fewest jobs.
#[derive(Clone, Default)]
pub(crate) struct Picker {
    inflight: Arc<Mutex<HashMap<ActorId, u32>>>,
}

impl Picker {
    /// The host of `group` with the fewest jobs among those `fits` accepts and not in
    /// `excluded`.
    pub(crate) async fn pick(
        &self,
        shared: &Arc<NodeShared>,
        group: &str,
        fits: impl Fn(&HostInfo) -> bool,
        excluded: &[ActorId],
    ) -> Option<(ActorCell, HostInfo, InFlight)> {
        let candidates: Vec<(ActorCell, HostInfo)> = hosts(shared, group)
            .await
            .into_iter()
            .filter(|(cell, info)| !excluded.contains(&cell.get_id()) && fits(info))
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
}

/// How a job ended, when it did not succeed.
#[derive(Debug)]
pub(crate) enum JobError {
    /// The host was lost: another host may take the job.
    Lost {
        /// The host's node.
        node: String,
        /// What was seen.
        message: String,
    },
    /// The job failed on the host: it would fail anywhere.
    Failed(RemoteFailure),
    /// The host answered something this build does not expect (another version, a refusal).
    Broken(ClusterError),
}

/// Cancels a job on its host when the caller gives up on it (the future is dropped).
struct CancelOnDrop {
    cell: ActorCell,
    protocol: u32,
    job: Option<u64>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(job) = self.job {
            if let Ok(bytes) = wire::encode_with(self.protocol, &Request::Cancel { job }) {
                let _ = self.cell.send_message(WireMsg::Cast(bytes));
            }
        }
    }
}

/// Runs one job on the host `cell` (of node `node`): starts it, sends its pieces to `pieces`
/// as they come, and returns its result.
pub(crate) async fn run_job(
    shared: &NodeShared,
    cell: &ActorCell,
    node: &str,
    request: String,
    poll_wait: Duration,
    pieces: &mpsc::Sender<String>,
) -> Result<String, JobError> {
    let protocol = shared.protocol;
    let wait_ms = u32::try_from(poll_wait.as_millis()).unwrap_or(u32::MAX);
    let limit = poll_wait + shared.failure_timeout;
    let sort = |e: ClusterError| match e {
        ClusterError::NodeLost { node, message } => JobError::Lost { node, message },
        other => JobError::Broken(other),
    };
    let mut cancel = CancelOnDrop {
        cell: cell.clone(),
        protocol,
        job: None,
    };
    let mut next = Request::Start { request, wait_ms };
    let mut from: u32 = 0;
    loop {
        let reply = call(cell, protocol, node, &next, limit)
            .await
            .map_err(sort)?;
        let Reply::Progress {
            job,
            pieces: new,
            done,
        } = reply
        else {
            return Err(JobError::Broken(ClusterError::Protocol(format!(
                "node {node} answered a job with {reply:?}"
            ))));
        };
        cancel.job = Some(job);
        from += u32::try_from(new.len()).unwrap_or(u32::MAX);
        for piece in new {
            let _ = pieces.send(piece).await;
        }
        match done {
            None => next = Request::Poll { job, from, wait_ms },
            Some(result) => {
                cancel.job = None;
                return result.map_err(JobError::Failed);
            }
        }
    }
}
