//! Model actors: each loaded model is owned by one thread that serves typed requests, so
//! concurrent agents share one model safely. Models are loaded once per process and cached by
//! path and load options.
//!
//! **Fairness.** Requests wait in one queue per user ([`GenerateOptions::user`], by default
//! the calling tokio task or thread) and the actor serves the users round-robin, one whole
//! request at a time: a caller that queues twenty requests delays another caller's request
//! by at most one of them, not twenty. Within one user, requests run in arrival order.
//! Waiting requests are bounded (`queue_capacity` in the actor plus as many in its inbox);
//! past that, callers wait to enqueue (backpressure). A request whose caller has gone away
//! is dropped without running.
//!
//! **No batching.** candle's quantized models (`quantized_llama`, `quantized_qwen2/3`,
//! `quantized_phi3`, `quantized_gemma3`) keep one KV cache per model instance and advance it
//! from a single scalar position: a forward pass over a batch of rows would need every row
//! at the same position with the same history. Concurrent requests have different prompts
//! and lengths, so they cannot share a forward pass without per-row caches, positions and
//! attention masks, which these models do not have. Requests therefore run one after the
//! other; what they share is the prompt-prefix KV cache (a common system prompt is computed
//! once). On a CPU with few cores a single request already uses every core for its matrix
//! products, so batching would mostly help GPUs.

use crate::engine::{Engine, Generation, ModelInfo, Shared};
use crate::error::LlmError;
use crate::options::{GenerateOptions, LoadOptions};
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
        Ok(Self::from_engine(engine, options.queue_capacity.max(1)))
    }

    /// Starts an actor that owns `engine`.
    pub fn from_engine(mut engine: Engine, queue_capacity: usize) -> Self {
        let shared = engine.shared();
        let (tx, mut rx) = mpsc::channel::<Job>(queue_capacity.max(1));
        let name = format!("llm-{}", shared.info.name);
        let actor_shared = shared.clone();
        let capacity = queue_capacity.max(1);
        let spawned = std::thread::Builder::new().name(name).spawn(move || {
            let mut queue = FairQueue::default();
            loop {
                // Take in what arrived (up to the capacity), waiting only when idle.
                while queue.len() < capacity {
                    match rx.try_recv() {
                        Ok(job) => queue.push(job),
                        Err(_) => break,
                    }
                }
                if queue.is_empty() {
                    match rx.blocking_recv() {
                        Some(job) => queue.push(job),
                        None => break,
                    }
                    continue;
                }
                let Some(job) = queue.pop() else {
                    continue;
                };
                if job.reply.is_closed() {
                    continue;
                }
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    serve(&mut engine, &actor_shared, &job)
                }))
                .unwrap_or_else(|_| {
                    Err(LlmError::ActorStopped(
                        "generation panicked; the request was dropped".into(),
                    ))
                });
                let _ = job.reply.send(result);
            }
        });
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

    /// How many more requests the queue accepts right now.
    pub fn queue_room(&self) -> usize {
        self.tx.capacity()
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

fn serve(engine: &mut Engine, shared: &Shared, job: &Job) -> Result<Generation, LlmError> {
    let (tokens, hint) = match &job.input {
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
    };
    let pieces = job.pieces.clone();
    let mut on_piece = |s: &str| {
        if let Some(tx) = &pieces {
            // Blocks when the consumer is slow: generation slows down instead of buffering.
            let _ = tx.blocking_send(s.to_string());
        }
    };
    let reply = &job.reply;
    engine.generate(&tokens, hint, &job.options, &mut on_piece, &|| {
        reply.is_closed()
    })
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
