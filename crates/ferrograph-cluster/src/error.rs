//! Errors of cluster nodes.

use std::net::SocketAddr;

/// Why a cluster operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// A node may listen off loopback, or join a node off loopback, only with TLS.
    #[error(
        "{what} {addr} is not a loopback address, and nodes talk to other machines only over \
         TLS: give --tls-cert, --tls-key and --tls-ca (or use 127.0.0.1)"
    )]
    InsecureAddress {
        /// `listening on` or `joining`.
        what: &'static str,
        /// The address.
        addr: String,
    },
    /// No shared secret was configured.
    #[error("the cluster cookie is empty: set the variable named by --cookie-env ({var})")]
    MissingCookie {
        /// The variable that should hold it.
        var: String,
    },
    /// The cookie is too short or too simple to be a secret.
    #[error(
        "the cluster cookie in {var} is too weak ({why}): make one with \
         `head -c 32 /dev/urandom | base64` and give every node the same value"
    )]
    WeakCookie {
        /// The variable it came from.
        var: String,
        /// What is wrong with it.
        why: String,
    },
    /// The TLS files could not be used.
    #[error("TLS configuration: {0}")]
    Tls(String),
    /// The node server could not start or listen.
    #[error("the node server could not start on {addr}: {message}")]
    Start {
        /// The address it was to listen on.
        addr: SocketAddr,
        /// What failed.
        message: String,
    },
    /// Joining another node failed.
    #[error("could not join {addr}: {message}")]
    Join {
        /// The address joined.
        addr: String,
        /// What failed.
        message: String,
    },
    /// A peer speaks another version of the cluster protocol.
    #[error(
        "node {peer} speaks ferrograph cluster protocol {theirs}, this build speaks {ours}; \
         run the same ferrograph version on every node"
    )]
    VersionMismatch {
        /// The peer's name.
        peer: String,
        /// Its protocol version.
        theirs: u32,
        /// Ours.
        ours: u32,
    },
    /// A message could not be encoded or read.
    #[error("cluster protocol error: {0}")]
    Protocol(String),
    /// A node stopped answering (it exited, was killed, or the network between us is cut).
    #[error("node {node} was lost: {message}")]
    NodeLost {
        /// The node's name.
        node: String,
        /// What was seen.
        message: String,
    },
    /// A node refused a request.
    #[error("node {node} refused the request: {reason}")]
    Refused {
        /// The node's name.
        node: String,
        /// Why.
        reason: String,
    },
    /// An actor of this node could not be started.
    #[error("actor: {0}")]
    Actor(String),
}
