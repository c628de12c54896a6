//! Ferrograph across processes and machines, on ractor's own cluster layer
//! (`ractor_cluster`).
//!
//! - [`ClusterNode`]: a node server (TCP, or TLS off loopback; the shared cookie checked on
//!   every session), its node agent, joining other nodes, and the cluster's description.
//! - [`ClusterNode::host_model`] serves a chat model to the cluster, and
//!   [`ClusterChatModel`] is the [`ferrograph_chat::ChatModel`] contract for callers on any
//!   node: each call is placed on the least busy host of the model (and label), its tokens
//!   stream back, and a host lost mid-call is replaced by another.
//! - [`ClusterNode::host_tasks`] runs graph tasks for other nodes, and
//!   [`ClusterTaskPlacer`] is the runtime's placer for nodes pinned to a label
//!   (`NodeOptions::on`): each task runs on the least busy worker with the label, its events
//!   stream back, and a worker lost mid-task is a retryable error naming it.
//! - [`wire`]: what crosses the network, one serialization (serde and bincode) in a frame
//!   that carries the protocol version, so two builds refuse each other clearly.

pub mod error;
pub mod guard;
mod jobs;
pub mod model;
pub mod node;
pub mod tasks;
pub mod tls;
pub mod wire;

pub use error::ClusterError;
pub use guard::Limits;
pub use model::{ClusterChatModel, GenerateRequest, MODELS_GROUP};
pub use node::{ClusterNode, NodeConfig, NODES_GROUP};
pub use tasks::{ClusterTaskPlacer, TASKS_GROUP};
pub use tls::TlsFiles;
pub use wire::{HostInfo, NodeInfo, PROTOCOL_VERSION};
