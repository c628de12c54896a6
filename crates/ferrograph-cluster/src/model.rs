//! Chat models across nodes: a model host on the node that has the model, and
//! [`ClusterChatModel`], the [`ChatModel`] contract for callers on any node.
//!
//! A model host is a host (see [`crate::jobs`]) in the process group [`MODELS_GROUP`]
//! serving one model; a call is a job whose pieces are the answer's text pieces, so tokens
//! stream back as they are generated.
//!
//! [`ClusterChatModel`] places each call on the host of the model (and label, when asked)
//! with the fewest calls running, counting its own calls in flight. When a host is lost
//! mid-call the call starts again on another host that serves the model, up to the failover
//! count, and fails with [`LlmError::NodeLost`] naming the node when none is left. A model
//! call holds no committed state: the graph's checkpoints stay with the coordinator's
//! process, so a call that starts again changes nothing that was committed. Its tokens are
//! streamed again from the start on the new host.

use crate::error::ClusterError;
use crate::jobs::{run_job, Host, HostArgs, JobError, Picker, Pieces, Service};
use crate::node::{ClusterNode, NodeShared};
use crate::wire::{HostInfo, RemoteFailure};
use async_trait::async_trait;
use ferrograph_chat::{ChatModel, GenerateOptions, LlmError, TokenSink};
use ferrograph_core::message::Message;
use ractor::Actor;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// The process group of every model host.
pub const MODELS_GROUP: &str = "ferrograph.models";

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

/// A model served to the cluster.
struct ModelService {
    name: String,
    model: Arc<dyn ChatModel>,
}

#[async_trait]
impl Service for ModelService {
    fn kind(&self) -> &'static str {
        "model"
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    async fn run(&self, request: String, pieces: Pieces) -> Result<String, RemoteFailure> {
        let req: GenerateRequest = serde_json::from_str(&request).map_err(|e| RemoteFailure {
            kind: "validation".into(),
            message: format!("the model request is not valid: {e}"),
            output: None,
        })?;
        let sink = req
            .stream
            .then(|| TokenSink::callback(move |_model, piece| pieces.push(piece.to_string())));
        let message = self
            .model
            .invoke(&req.messages, &req.options, sink)
            .await
            .map_err(|e| failure_of(&e))?;
        serde_json::to_string(&message).map_err(|e| RemoteFailure {
            kind: "backend".into(),
            message: format!("encoding the answer: {e}"),
            output: None,
        })
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
            Host,
            HostArgs {
                shared: self.shared.clone(),
                group: MODELS_GROUP,
                service: Arc::new(ModelService { name, model }),
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
            picker: Picker::default(),
        }
    }

    /// Every model and task host of the cluster, as the hosts describe themselves.
    pub async fn hosts(&self) -> Vec<HostInfo> {
        let mut out = Vec::new();
        for group in [MODELS_GROUP, crate::tasks::TASKS_GROUP] {
            out.extend(
                crate::jobs::hosts(&self.shared, group)
                    .await
                    .into_iter()
                    .map(|(_, info)| info),
            );
        }
        out.sort_by(|a, b| (&a.node, &a.kind, &a.name).cmp(&(&b.node, &b.kind, &b.name)));
        out
    }
}

/// A chat model served by the cluster's model hosts (see the module documentation).
#[derive(Clone)]
pub struct ClusterChatModel {
    shared: Arc<NodeShared>,
    model: Option<String>,
    label: Option<String>,
    failover: u32,
    poll_wait: Duration,
    picker: Picker,
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

    fn fits(&self, info: &HostInfo) -> bool {
        self.model.as_ref().is_none_or(|m| &info.name == m)
            && self.label.as_ref().is_none_or(|l| info.labels.contains(l))
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
            let Some((cell, info, _inflight)) = self
                .picker
                .pick(&self.shared, MODELS_GROUP, |h| self.fits(h), &excluded)
                .await
            else {
                break;
            };
            let (tx, mut rx) = mpsc::channel::<String>(256);
            let forward = async {
                while let Some(piece) = rx.recv().await {
                    if let Some(sink) = &sink {
                        sink.send(&info.name, &piece).await;
                    }
                }
            };
            let job = async {
                // The sender goes with the job, so the forwarding ends when the job does.
                let tx = tx;
                run_job(
                    &self.shared,
                    &cell,
                    &info.node,
                    request.clone(),
                    self.poll_wait,
                    &tx,
                )
                .await
            };
            let (result, ()) = tokio::join!(job, forward);
            match result {
                Ok(json) => {
                    return serde_json::from_str::<Message>(&json).map_err(|e| {
                        LlmError::MalformedResponse {
                            message: format!("the answer from node {}: {e}", info.node),
                            body: json.chars().take(300).collect(),
                        }
                    })
                }
                Err(JobError::Failed(f)) => return Err(error_of(&info.node, f)),
                Err(JobError::Broken(e)) => return Err(LlmError::Backend(e.to_string())),
                Err(JobError::Lost { node, message }) => {
                    let e = LlmError::NodeLost { node, message };
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
