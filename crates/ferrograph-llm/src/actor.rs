//! Model actors: each loaded model is owned by one thread that serves typed requests, so
//! concurrent agents share one model safely. Models are loaded once per process and cached by
//! path and load options.
//!
//! **Continuous batching.** The actor keeps up to [`LoadOptions::max_batch`] requests in
//! flight, each a [`Sequence`] with its own KV cache, position, sampler, output grammar and
//! stop rule, and advances all of them by one forward pass per step: the rows of every
//! sequence go through each matrix product together, so the weights are read once for all
//! of them ([`ferrograph_kernels::decoder::forward_batch`]). A request that arrives while
//! others decode joins at the next step; while others are in flight its prompt is computed
//! in chunks of [`PREFILL_CHUNK`] tokens, one chunk per step, so that a long prompt delays
//! their next tokens by one chunk's time rather than by the whole prompt's. A sequence's
//! tokens are the same batched as alone (greedy decoding gives the same text). The
//! prompt-prefix cache is shared: a newcomer starts from the longest cached prefix of its
//! prompt. Text pieces stream per request as they are final. candle's models cannot share a
//! pass (their KV cache lives in the model, at one position), so with them the actor serves
//! one request at a time.
//!
//! **Fairness.** Requests wait in one queue per user ([`GenerateOptions::user`], by default
//! the calling tokio task or thread), and free places in the batch go to the users
//! round-robin: a caller that queues twenty requests delays another caller's request by at
//! most one batch place, not twenty. Within one user, requests start in arrival order.
//! Waiting requests are bounded (`queue_capacity` in the actor plus as many in its inbox);
//! past that, callers wait to enqueue (backpressure). A request whose caller has gone away is
//! dropped without running, or stopped at its next step.

use crate::engine::{common_prefix, Engine, Generation, ModelInfo, Shared, MIN_SHARED_PREFIX};
use crate::error::LlmError;
use crate::options::{GenerateOptions, LoadOptions};
use crate::sequence::Sequence;
use ferrograph_core::message::Message;
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use tokio::sync::{mpsc, oneshot};

/// What to generate from.
#[derive(Clone, Debug)]
pub enum PromptInput {
    /// A conversation, rendered with the model's chat template; `assistant_prefix` is appended
    /// after the opened assistant turn (the output continues it).
    Chat {
        /// The messages.
        messages: Vec<Message>,
        /// Tool definitions for the template, if any.
        tools: Option<Vec<serde_json::Value>>,
        /// Text that starts the answer.
        assistant_prefix: String,
    },
    /// Raw text, tokenized as is (special-token strings are recognized).
    Text(String),
    /// Token ids.
    Tokens(Vec<u32>),
}

struct Job {
    user: String,
    input: PromptInput,
    options: GenerateOptions,
    pieces: Option<mpsc::Sender<String>>,
    reply: oneshot::Sender<Result<Generation, LlmError>>,
}

/// A handle to a model actor. Cheap to clone; the actor stops when the last handle is gone.
#[derive(Clone)]
pub struct ModelHandle {
    tx: mpsc::Sender<Job>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ModelHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelHandle")
            .field("model", &self.shared.info.name)
            .finish()
    }
}

impl ModelHandle {
    /// Loads `path` and starts its actor (blocking; prefer [`load_model`], which caches).
    pub fn spawn(path: &Path, options: &LoadOptions) -> Result<Self, LlmError> {
        let engine = Engine::load(path, options)?;
        Ok(Self::from_engine(
            engine,
            options.queue_capacity.max(1),
            max_batch(options.max_batch),
        ))
    }

    /// Starts an actor that owns `engine`, batching up to `max_batch` requests (see the
    /// module documentation).
    pub fn from_engine(engine: Engine, queue_capacity: usize, max_batch: usize) -> Self {
        let shared = engine.shared();
        let capacity = queue_capacity.max(1);
        let (tx, rx) = mpsc::channel::<Job>(capacity);
        let name = format!("llm-{}", shared.info.name);
        let actor_shared = shared.clone();
        let max_batch = if engine.batches() {
            max_batch.max(1)
        } else {
            1
        };
        let spawned = std::thread::Builder::new()
            .name(name)
            .spawn(move || serve_jobs(engine, &actor_shared, rx, capacity, max_batch));
        if let Err(e) = spawned {
            tracing::error!("cannot start model actor thread: {e}");
        }
        ModelHandle { tx, shared }
    }

    /// Model facts.
    pub fn info(&self) -> &ModelInfo {
        &self.shared.info
    }

    /// Tokenizer, template and special tokens (usable without going through the actor).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Queues a generation and waits for it. Text pieces go to `pieces` as they are final.
    /// Waits for queue space when the queue is full (backpressure).
    pub async fn generate(
        &self,
        input: PromptInput,
        options: GenerateOptions,
        pieces: Option<mpsc::Sender<String>>,
    ) -> Result<Generation, LlmError> {
        let (reply, rx) = oneshot::channel();
        let user = options.user.clone().unwrap_or_else(default_user);
        self.tx
            .send(Job {
                user,
                input,
                options,
                pieces,
                reply,
            })
            .await
            .map_err(|_| LlmError::ActorStopped("model actor is gone".into()))?;
        rx.await
            .map_err(|_| LlmError::ActorStopped("model actor dropped the request".into()))?
    }

    /// What batching has done so far: passes, sequences per pass, the largest batch.
    pub fn batch_stats(&self) -> crate::engine::BatchStats {
        self.shared.batching.read()
    }

    /// How many more requests the queue accepts right now.
    pub fn queue_room(&self) -> usize {
        self.tx.capacity()
    }
}

/// `FERROGRAPH_MAX_BATCH` when it is set to a positive number, else `configured`.
fn max_batch(configured: usize) -> usize {
    match std::env::var("FERROGRAPH_MAX_BATCH") {
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => {
                tracing::warn!(value = %v, "FERROGRAPH_MAX_BATCH is not a positive number; using {configured}");
                configured
            }
        },
        Err(_) => configured,
    }
}

/// The calling tokio task, or thread outside a runtime.
fn default_user() -> String {
    match tokio::task::try_id() {
        Some(id) => format!("task-{id}"),
        None => format!("{:?}", std::thread::current().id()),
    }
}

/// Waiting jobs, one FIFO per user, served round-robin.
#[derive(Default)]
struct FairQueue {
    queues: HashMap<String, VecDeque<Job>>,
    /// Users with waiting jobs, in serving order.
    order: VecDeque<String>,
    len: usize,
}

impl FairQueue {
    fn len(&self) -> usize {
        self.len
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn push(&mut self, job: Job) {
        let q = self.queues.entry(job.user.clone()).or_default();
        if q.is_empty() {
            self.order.push_back(job.user.clone());
        }
        q.push_back(job);
        self.len += 1;
    }

    /// The next job: the first of the user whose turn it is; that user goes to the back.
    fn pop(&mut self) -> Option<Job> {
        let user = self.order.pop_front()?;
        let q = self.queues.get_mut(&user)?;
        let job = q.pop_front();
        if q.is_empty() {
            self.queues.remove(&user);
        } else {
            self.order.push_back(user);
        }
        if job.is_some() {
            self.len -= 1;
        }
        job
    }
}

/// Prompt tokens computed per step for a request while others are in flight.
pub const PREFILL_CHUNK: usize = 256;

/// A request in the batch.
struct Active {
    seq: Sequence,
    job: Job,
    sink: PieceSink,
    /// Whether it waits for a forward pass this step.
    wants: bool,
    /// Set when it has ended: normally, or with the error.
    outcome: Option<Result<(), LlmError>>,
}

/// The actor's loop: take in requests, admit them to the batch, step the batch.
fn serve_jobs(
    mut engine: Engine,
    shared: &Shared,
    mut rx: mpsc::Receiver<Job>,
    capacity: usize,
    max_batch: usize,
) {
    let mut queue = FairQueue::default();
    let mut active: Vec<Active> = Vec::new();
    let mut waiting: Vec<Waiting> = Vec::new();
    let mut open = true;
    loop {
        // Take in what arrived (up to the capacity), waiting only when idle.
        while open && queue.len() < capacity {
            match rx.try_recv() {
                Ok(job) => queue.push(job),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => open = false,
            }
        }
        if active.is_empty() && queue.is_empty() && waiting.is_empty() {
            if !open {
                break;
            }
            match rx.blocking_recv() {
                Some(job) => queue.push(job),
                None => break,
            }
            continue;
        }
        // Requests that waited for a prompt prefix they share with one in the batch go
        // first, once nothing in the batch is still computing it.
        let mut i = 0;
        while i < waiting.len() && active.len() < max_batch {
            if waiting[i].job.reply.is_closed() {
                waiting.remove(i);
            } else if in_flight_prefix(&mut active, &waiting[i].tokens).is_some() {
                i += 1;
            } else {
                let w = waiting.remove(i);
                admit(&mut engine, &mut active, w);
            }
        }
        while active.len() < max_batch {
            let Some(job) = queue.pop() else {
                break;
            };
            if job.reply.is_closed() {
                continue;
            }
            // Rendering and tokenizing the prompt run here: a panic there fails this
            // request only, as one in a step fails that step's requests.
            let prepared =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| prepare(shared, &job)))
                    .unwrap_or_else(|_| Err(panicked()));
            let (tokens, hint) = match prepared {
                Ok(p) => p,
                Err(e) => {
                    let _ = job.reply.send(Err(e));
                    continue;
                }
            };
            let next = Waiting { job, tokens, hint };
            // A request whose prompt starts like one still being computed waits for it,
            // then starts from its snapshot rather than computing the same tokens again.
            if engine.keeps_prefixes() && in_flight_prefix(&mut active, &next.tokens).is_some() {
                shared.batching.record_prefix_wait();
                waiting.push(next);
                continue;
            }
            admit(&mut engine, &mut active, next);
        }
        let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            step(&mut engine, shared, &mut active)
        }));
        if stepped.is_err() {
            for a in active.drain(..) {
                let _ = a.job.reply.send(Err(panicked()));
            }
        }
    }
}

/// A request with its prompt tokenized, not yet in the batch.
struct Waiting {
    job: Job,
    tokens: Vec<u32>,
    /// Where its cacheable prefix (the system prompt) ends.
    hint: Option<usize>,
}

/// Starts `w` and puts it in the batch (or answers it with the error).
fn admit(engine: &mut Engine, active: &mut Vec<Active>, w: Waiting) {
    let Waiting { job, tokens, hint } = w;
    let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        engine.start(&tokens, hint, &job.options)
    }))
    .unwrap_or_else(|_| Err(panicked()));
    match started {
        Ok(seq) => active.push(Active {
            seq,
            sink: PieceSink::new(job.pieces.clone()),
            job,
            wants: false,
            outcome: None,
        }),
        Err(e) => {
            let _ = job.reply.send(Err(e));
        }
    }
}

/// The longest prompt prefix (at least [`MIN_SHARED_PREFIX`] tokens, one short of the whole
/// prompt at most) that `tokens` shares with a request of the batch still computing it. That
/// request is asked to remember its state there ([`Sequence::share_prefix`]).
fn in_flight_prefix(active: &mut [Active], tokens: &[u32]) -> Option<usize> {
    let mut best: Option<(usize, usize)> = None;
    for (i, a) in active.iter().enumerate() {
        if a.outcome.is_some() || !a.seq.prefilling() || !a.seq.w.snapshots() {
            continue;
        }
        let n = common_prefix(a.seq.prompt(), tokens).min(tokens.len().saturating_sub(1));
        if n >= MIN_SHARED_PREFIX && a.seq.pos < n && best.is_none_or(|(m, _)| n > m) {
            best = Some((n, i));
        }
    }
    let (n, i) = best?;
    active.get_mut(i)?.seq.share_prefix(n);
    Some(n)
}

/// The error of a request whose generation panicked.
fn panicked() -> LlmError {
    LlmError::ActorStopped("generation panicked; the request was dropped".into())
}

/// Advances every request in the batch by one forward pass, and answers those that ended.
fn step(engine: &mut Engine, shared: &Shared, active: &mut Vec<Active>) {
    // Chunk prompts only when someone else would wait for them.
    let chunk = (active.len() > 1).then_some(PREFILL_CHUNK);
    for a in active.iter_mut() {
        let Active { seq, job, sink, .. } = a;
        let reply = &job.reply;
        match seq.next_feed(shared, chunk, &mut |s| sink.push(s), &|| reply.is_closed()) {
            Ok(wants) => {
                a.wants = wants;
                if !wants {
                    a.outcome = Some(Ok(()));
                }
            }
            Err(e) => {
                a.wants = false;
                a.outcome = Some(Err(e));
            }
        }
    }
    let mut seqs: Vec<&mut Sequence> = active
        .iter_mut()
        .filter(|a| a.wants)
        .map(|a| &mut a.seq)
        .collect();
    if !seqs.is_empty() {
        shared.batching.record(seqs.len());
    }
    let results = engine.forward_many(&mut seqs);
    drop(seqs);
    for (a, logits) in active.iter_mut().filter(|a| a.wants).zip(results) {
        if let Err(e) = logits.and_then(|l| engine.fed(&mut a.seq, l)) {
            a.outcome = Some(Err(e));
        }
    }
    let mut i = 0;
    while i < active.len() {
        if active[i].outcome.is_none() {
            i += 1;
            continue;
        }
        let Active {
            seq,
            job,
            mut sink,
            outcome,
            ..
        } = active.remove(i);
        let result = match outcome {
            Some(Err(e)) => {
                engine.release(seq);
                Err(e)
            }
            _ => engine.finish(seq, &mut |s| sink.push(s)),
        };
        sink.close(job.reply, result);
    }
}

/// A request's prompt, rendered and tokenized, and where its cacheable prefix ends.
fn prepare(shared: &Shared, job: &Job) -> Result<(Vec<u32>, Option<usize>), LlmError> {
    Ok(match &job.input {
        PromptInput::Chat {
            messages,
            tools,
            assistant_prefix,
        } => shared.chat_prompt(messages, tools.as_deref(), assistant_prefix)?,
        PromptInput::Text(t) => {
            let mut ids = Vec::new();
            if shared.specials.add_bos {
                ids.extend(shared.specials.bos);
            }
            ids.extend(shared.encode(t)?);
            (ids, None)
        }
        PromptInput::Tokens(ids) => (ids.clone(), None),
    })
}

/// Where a request's text pieces go. A slow reader must not stall the other requests of the
/// batch, so pieces it has no room for wait here, in order, and are sent as room appears;
/// what is left when the request ends is delivered by a helper thread before the reply.
struct PieceSink {
    tx: Option<mpsc::Sender<String>>,
    backlog: VecDeque<String>,
}

impl PieceSink {
    fn new(tx: Option<mpsc::Sender<String>>) -> Self {
        PieceSink {
            tx,
            backlog: VecDeque::new(),
        }
    }

    fn push(&mut self, piece: &str) {
        if self.tx.is_none() {
            return;
        }
        self.backlog.push_back(piece.to_string());
        self.drain();
    }

    /// Sends what the channel has room for.
    fn drain(&mut self) {
        let Some(tx) = &self.tx else {
            return;
        };
        while let Some(piece) = self.backlog.pop_front() {
            match tx.try_send(piece) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(piece)) => {
                    self.backlog.push_front(piece);
                    return;
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    self.tx = None;
                    self.backlog.clear();
                    return;
                }
            }
        }
    }

    /// Sends the reply after every piece.
    fn close(
        self,
        reply: oneshot::Sender<Result<Generation, LlmError>>,
        result: Result<Generation, LlmError>,
    ) {
        self.close_with(reply, result, |deliver| {
            std::thread::Builder::new()
                .name("llm-pieces".into())
                .spawn(deliver)
                .map(|_| ())
        });
    }

    /// [`PieceSink::close`] with the helper thread started by `spawn` (tests make it fail).
    fn close_with(
        mut self,
        reply: oneshot::Sender<Result<Generation, LlmError>>,
        result: Result<Generation, LlmError>,
        spawn: impl FnOnce(Box<dyn FnOnce() + Send>) -> std::io::Result<()>,
    ) {
        self.drain();
        let Some(tx) = self.tx.take().filter(|_| !self.backlog.is_empty()) else {
            let _ = reply.send(result);
            return;
        };
        let backlog = std::mem::take(&mut self.backlog);
        // The reply waits in a slot the helper takes it from, so that if the helper cannot
        // start, the reply is still sent from here (its stream then misses the last pieces,
        // but the generation's text is whole).
        let slot = std::sync::Arc::new(std::sync::Mutex::new(Some((reply, result))));
        let helper_slot = slot.clone();
        let spawned = spawn(Box::new(move || {
            for piece in backlog {
                if tx.blocking_send(piece).is_err() {
                    break;
                }
            }
            if let Some((reply, result)) = take_slot(&helper_slot) {
                let _ = reply.send(result);
            }
        }));
        if let Err(e) = spawned {
            tracing::error!(
                "cannot start a thread for the last text pieces ({e}); replying without them"
            );
            if let Some((reply, result)) = take_slot(&slot) {
                let _ = reply.send(result);
            }
        }
    }
}

/// A reply and the result it carries.
type PendingReply = (
    oneshot::Sender<Result<Generation, LlmError>>,
    Result<Generation, LlmError>,
);

/// Takes the reply out of the slot [`PieceSink::close`] leaves it in (a poisoned lock still
/// holds it).
fn take_slot(slot: &std::sync::Mutex<Option<PendingReply>>) -> Option<PendingReply> {
    slot.lock().unwrap_or_else(|p| p.into_inner()).take()
}

type Registry = tokio::sync::Mutex<HashMap<(PathBuf, LoadOptions), ModelHandle>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| tokio::sync::Mutex::new(HashMap::new()))
}

/// The actor for `path` with `options`, loading the model on first use (once per process;
/// concurrent callers wait for the same load).
pub async fn load_model(path: &Path, options: &LoadOptions) -> Result<ModelHandle, LlmError> {
    let key_path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mut models = registry().lock().await;
    if let Some(h) = models.get(&(key_path.clone(), options.clone())) {
        return Ok(h.clone());
    }
    let p = path.to_path_buf();
    let o = options.clone();
    let handle = tokio::task::spawn_blocking(move || ModelHandle::spawn(&p, &o))
        .await
        .map_err(|e| LlmError::Backend(format!("model loading task failed: {e}")))??;
    models.insert((key_path, options.clone()), handle.clone());
    Ok(handle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::FinishReason;
    use std::time::Duration;

    fn job(user: &str, n: usize) -> (Job, oneshot::Receiver<Result<Generation, LlmError>>) {
        let (reply, rx) = oneshot::channel();
        (
            Job {
                user: user.to_string(),
                input: PromptInput::Tokens(vec![n as u32]),
                options: GenerateOptions::default(),
                pieces: None,
                reply,
            },
            rx,
        )
    }

    fn tag(j: &Job) -> (String, u32) {
        match &j.input {
            PromptInput::Tokens(t) => (j.user.clone(), t[0]),
            _ => (String::new(), 0),
        }
    }

    fn generation(text: &str) -> Generation {
        Generation {
            text: text.to_string(),
            tokens: vec![1, 2, 3],
            prompt_tokens: 1,
            cached_prompt_tokens: 0,
            finish_reason: FinishReason::Stop,
            prefill_time: Duration::ZERO,
            time_to_first_token: Duration::ZERO,
            decode_time: Duration::ZERO,
            constraint: None,
        }
    }

    /// A sink whose channel has room for one piece, given three: two wait in its backlog.
    fn sink_with_backlog() -> (PieceSink, mpsc::Receiver<String>) {
        let (tx, pieces) = mpsc::channel(1);
        let mut sink = PieceSink::new(Some(tx));
        for p in ["a", "b", "c"] {
            sink.push(p);
        }
        (sink, pieces)
    }

    #[test]
    fn last_pieces_arrive_before_the_reply() {
        let (sink, mut pieces) = sink_with_backlog();
        let (reply, mut rx) = oneshot::channel();
        sink.close(reply, Ok(generation("abc")));
        let mut got = String::new();
        while let Some(p) = pieces.blocking_recv() {
            got.push_str(&p);
        }
        assert_eq!(got, "abc");
        let done = rx.try_recv().expect("the reply was sent after the pieces");
        assert_eq!(done.expect("ok").text, "abc");
    }

    #[test]
    fn a_helper_that_cannot_start_still_replies() {
        let (sink, mut pieces) = sink_with_backlog();
        let (reply, mut rx) = oneshot::channel();
        sink.close_with(reply, Ok(generation("abc")), |_| {
            Err(std::io::Error::other("no threads left"))
        });
        let done = rx
            .try_recv()
            .expect("the reply was sent without the helper");
        assert_eq!(done.expect("ok").text, "abc");
        // The piece the channel had room for arrived; the backlog went with the helper.
        assert_eq!(pieces.try_recv().ok().as_deref(), Some("a"));
    }

    #[test]
    fn users_are_served_round_robin() {
        let mut q = FairQueue::default();
        let mut keep = Vec::new();
        for n in 0..4 {
            let (j, rx) = job("greedy", n);
            q.push(j);
            keep.push(rx);
        }
        let (j, rx) = job("other", 0);
        q.push(j);
        keep.push(rx);
        let (j, rx) = job("third", 0);
        q.push(j);
        keep.push(rx);
        assert_eq!(q.len(), 6);
        let order: Vec<(String, u32)> = std::iter::from_fn(|| q.pop()).map(|j| tag(&j)).collect();
        let expect: Vec<(String, u32)> = [
            ("greedy", 0),
            ("other", 0),
            ("third", 0),
            ("greedy", 1),
            ("greedy", 2),
            ("greedy", 3),
        ]
        .iter()
        .map(|(u, n)| (u.to_string(), *n))
        .collect();
        assert_eq!(order, expect);
        assert!(q.is_empty());
    }
}
