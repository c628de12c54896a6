//! What crosses the network: one message type for every ferrograph actor that other nodes
//! call, and the versioned frame its bytes are in.
//!
//! ractor_cluster moves a message between nodes as bytes: a cast (one way) or a call (with a
//! reply port whose answer is bytes too). [`WireMsg`] is that shape. The bytes are a frame:
//! the protocol version (4 bytes, little endian) and then the body, a [`Request`] or
//! [`Reply`] serialized once with serde and bincode. A node reads the version first, so two
//! builds that speak different versions refuse each other with an error naming both versions
//! instead of misreading each other's bytes.
//!
//! Bodies that hold arbitrary JSON (a chat request's messages and options: tool arguments,
//! JSON schemas) carry it as JSON text inside the bincode body: bincode cannot represent
//! self-describing values such as `serde_json::Value`.

use crate::error::ClusterError;
use ractor::message::{BoxedDowncastErr, SerializedMessage};
use ractor::RpcReplyPort;
use serde::{Deserialize, Serialize};

/// The version of ferrograph's cluster protocol this build speaks. Raise it whenever
/// [`Request`] or [`Reply`] change shape.
pub const PROTOCOL_VERSION: u32 = 1;

/// The message of every ferrograph actor that other nodes reach: bytes in a versioned frame.
pub enum WireMsg {
    /// A one-way message.
    Cast(Vec<u8>),
    /// A request whose answer goes to the reply port.
    Call(Vec<u8>, RpcReplyPort<Vec<u8>>),
}

impl std::fmt::Debug for WireMsg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireMsg::Cast(b) => write!(f, "Cast({} bytes)", b.len()),
            WireMsg::Call(b, _) => write!(f, "Call({} bytes)", b.len()),
        }
    }
}

impl ractor::Message for WireMsg {
    fn serializable() -> bool {
        true
    }

    fn serialize(self) -> Result<SerializedMessage, BoxedDowncastErr> {
        Ok(match self {
            WireMsg::Cast(args) => SerializedMessage::Cast {
                variant: "cast".into(),
                args,
                metadata: None,
            },
            WireMsg::Call(args, reply) => SerializedMessage::Call {
                variant: "call".into(),
                args,
                reply,
                metadata: None,
            },
        })
    }

    fn deserialize(bytes: SerializedMessage) -> Result<Self, BoxedDowncastErr> {
        match bytes {
            SerializedMessage::Cast { args, .. } => Ok(WireMsg::Cast(args)),
            SerializedMessage::Call { args, reply, .. } => Ok(WireMsg::Call(args, reply)),
            SerializedMessage::CallReply(..) => Err(BoxedDowncastErr),
        }
    }
}

/// What one node asks of another's actor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Request {
    /// Describe yourself: a node agent answers [`Reply::Node`], a host [`Reply::Host`].
    Info,
    /// Start a job on a host (a model call, a graph task: the request's JSON text) and wait
    /// up to `wait_ms` for its first news; the host answers [`Reply::Progress`].
    Start {
        /// The request as JSON text.
        request: String,
        /// The longest the host holds the answer when there is no news.
        wait_ms: u32,
    },
    /// The pieces of job `job` from piece `from` on, and its end when it has ended. The host
    /// answers when there is something new or after `wait_ms`, whichever comes first.
    Poll {
        /// The job.
        job: u64,
        /// How many pieces the caller already has.
        from: u32,
        /// The longest the host holds the poll before answering with nothing new.
        wait_ms: u32,
    },
    /// Stop job `job` (the caller gave up on it).
    Cancel {
        /// The job.
        job: u64,
    },
    /// Where the nodes this node has sessions with listen: a node agent answers
    /// [`Reply::Peers`], so that a node joining it can join them too.
    Peers,
}

/// One node's description, as its node agent gives it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// The node's name, unique in the cluster.
    pub name: String,
    /// Where it listens.
    pub listen: String,
    /// Its labels (`gpu`, `big-model`, …).
    pub labels: Vec<String>,
    /// The models it serves.
    pub models: Vec<String>,
    /// Model calls running or queued on it now.
    pub running: u32,
    /// Model calls it has finished since it started.
    pub served: u64,
    /// Its operating-system process id.
    pub pid: u32,
    /// The cluster protocol it speaks.
    pub protocol: u32,
}

/// One host's description: a model host or a task host.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostInfo {
    /// `model` or `tasks`.
    pub kind: String,
    /// The model's name in the cluster (`tasks` for a task host).
    pub name: String,
    /// The node it runs on.
    pub node: String,
    /// That node's labels.
    pub labels: Vec<String>,
    /// For a task host, the graphs whose tasks it runs.
    pub graphs: Vec<String>,
    /// Jobs running or queued on it now.
    pub running: u32,
}

/// How a job ended on its host, when it failed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RemoteFailure {
    /// What kind of failure: for model calls the kind of [`ferrograph_chat::LlmError`]
    /// (`validation`, `schema`, `timeout`, …); for tasks `retryable` or `fatal`.
    pub kind: String,
    /// Its message.
    pub message: String,
    /// The model's raw output, for schema failures.
    pub output: Option<String>,
}

/// An answer to a [`Request`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Reply {
    /// A node agent's description.
    Node(NodeInfo),
    /// A host's description.
    Host(HostInfo),
    /// News of a job.
    Progress {
        /// The job's id on the host.
        job: u64,
        /// New text pieces, in order.
        pieces: Vec<String>,
        /// The result as JSON text when the job succeeded, its failure when it failed; `None`
        /// while it runs.
        done: Option<Result<String, RemoteFailure>>,
    },
    /// The request was understood but refused (unknown job, a request this actor does not
    /// serve, a body it could not read).
    Refused {
        /// Why.
        reason: String,
    },
    /// A node agent's peers: the `host:port` each of the nodes it has sessions with listens
    /// on.
    Peers(Vec<String>),
}

fn bincode_config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<{ 64 * 1024 * 1024 }>()
}

/// Frames `body` with `protocol` in front.
pub(crate) fn encode_with<T: Serialize>(protocol: u32, body: &T) -> Result<Vec<u8>, ClusterError> {
    let mut out = protocol.to_le_bytes().to_vec();
    let bytes = bincode::serde::encode_to_vec(body, bincode_config())
        .map_err(|e| ClusterError::Protocol(format!("encoding a message: {e}")))?;
    out.extend_from_slice(&bytes);
    Ok(out)
}

/// Frames `body` with this build's protocol version.
#[cfg(test)]
pub(crate) fn encode<T: Serialize>(body: &T) -> Result<Vec<u8>, ClusterError> {
    encode_with(PROTOCOL_VERSION, body)
}

/// The protocol version in front of a frame.
pub(crate) fn frame_version(bytes: &[u8]) -> Result<u32, ClusterError> {
    let head: [u8; 4] = bytes
        .get(..4)
        .and_then(|h| h.try_into().ok())
        .ok_or_else(|| ClusterError::Protocol(format!("a frame of {} bytes", bytes.len())))?;
    Ok(u32::from_le_bytes(head))
}

/// Reads a frame of protocol `expected` (from `peer`, for the error).
pub(crate) fn decode_from<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    expected: u32,
    peer: &str,
) -> Result<T, ClusterError> {
    let version = frame_version(bytes)?;
    if version != expected {
        return Err(ClusterError::VersionMismatch {
            peer: peer.to_string(),
            theirs: version,
            ours: expected,
        });
    }
    let (value, _) = bincode::serde::decode_from_slice(&bytes[4..], bincode_config())
        .map_err(|e| ClusterError::Protocol(format!("a message from {peer}: {e}")))?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_carry_their_version() {
        let req = Request::Poll {
            job: 7,
            from: 3,
            wait_ms: 1000,
        };
        let bytes = encode(&req).unwrap();
        assert_eq!(frame_version(&bytes).unwrap(), PROTOCOL_VERSION);
        let back: Request = decode_from(&bytes, PROTOCOL_VERSION, "n").unwrap();
        assert_eq!(back, req);

        let reply = Reply::Progress {
            job: 3,
            pieces: vec!["a".into(), "b".into()],
            done: Some(Err(RemoteFailure {
                kind: "schema".into(),
                message: "m".into(),
                output: Some("{".into()),
            })),
        };
        let bytes = encode(&reply).unwrap();
        let back: Reply = decode_from(&bytes, PROTOCOL_VERSION, "n").unwrap();
        assert_eq!(back, reply);
    }

    #[test]
    fn another_version_is_refused_by_name() {
        let bytes = encode_with(PROTOCOL_VERSION + 1, &Request::Info).unwrap();
        let err = decode_from::<Request>(&bytes, PROTOCOL_VERSION, "gpu-box").unwrap_err();
        match err {
            ClusterError::VersionMismatch { peer, theirs, ours } => {
                assert_eq!(peer, "gpu-box");
                assert_eq!(theirs, PROTOCOL_VERSION + 1);
                assert_eq!(ours, PROTOCOL_VERSION);
            }
            other => panic!("{other:?}"),
        }
        assert!(err_text(&bytes).contains("protocol"));
    }

    fn err_text(bytes: &[u8]) -> String {
        decode_from::<Request>(bytes, PROTOCOL_VERSION, "gpu-box")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn short_and_garbled_frames_are_errors() {
        assert!(matches!(
            decode_from::<Request>(&[1, 0], PROTOCOL_VERSION, "n"),
            Err(ClusterError::Protocol(_))
        ));
        let mut bytes = PROTOCOL_VERSION.to_le_bytes().to_vec();
        bytes.extend_from_slice(&[250, 250, 250, 250]);
        assert!(matches!(
            decode_from::<Request>(&bytes, PROTOCOL_VERSION, "n"),
            Err(ClusterError::Protocol(_))
        ));
    }
}
