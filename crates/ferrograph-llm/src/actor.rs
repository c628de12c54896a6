//! Model actors: each loaded model is owned by one thread that serves typed requests from a
//! bounded queue in arrival (FIFO) order, so concurrent agents share one model safely and
//! fairly. Models are loaded once per process and cached by path and load options.

use crate::engine::{Engine, Generation, ModelInfo, Shared};
use crate::error::LlmError;
use crate::options::{GenerateOptions, LoadOptions};
use ferrograph_core::message::Message;
use std::collections::HashMap;
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
        let spawned = std::thread::Builder::new().name(name).spawn(move || {
            while let Some(job) = rx.blocking_recv() {
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
        self.tx
            .send(Job {
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
