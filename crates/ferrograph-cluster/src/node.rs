//! A cluster node: ractor_cluster's node server, our node agent, and joining other nodes.
//!
//! Every node runs a node server (it accepts and opens the TCP or TLS sessions between
//! nodes and checks the shared cookie) and a node agent, an actor in the process group
//! [`NODES_GROUP`] that describes the node ([`NodeInfo`]). ractor_cluster synchronizes
//! process groups between connected nodes, so any node finds every other node's agent and
//! model hosts by group. After a session is ready, both sides ask the other's agent for its
//! description; a peer that speaks another protocol version is disconnected, and the side
//! that joined gets [`ClusterError::VersionMismatch`].

use crate::error::ClusterError;
use crate::guard::{self, Connections, FrontDoor, Limits, Sessions};
use crate::tls::{check_address, Tls, TlsFiles};
use crate::wire::{self, NodeInfo, Reply, Request, WireMsg};
use parking_lot::Mutex;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef};
use ractor_cluster::node::NodeServerSessionInformation;
use ractor_cluster::{
    IncomingEncryptionMode, NodeEventSubscription, NodeServer, NodeServerMessage,
};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;

/// The process group of every node's agent.
pub const NODES_GROUP: &str = "ferrograph.nodes";

/// How a node starts.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// The node's name, unique in the cluster.
    pub name: String,
    /// Where it listens (port 0: any free port).
    pub listen: SocketAddr,
    /// The shared secret every node of the cluster holds.
    pub cookie: String,
    /// The variable the cookie came from (for error messages).
    pub cookie_var: String,
    /// Labels placement can ask for (`gpu`, …).
    pub labels: Vec<String>,
    /// TLS identity; required off loopback.
    pub tls: Option<TlsFiles>,
    /// The cluster protocol version to speak (this build's [`wire::PROTOCOL_VERSION`]; tests
    /// set another one to check that nodes refuse each other).
    pub protocol: u32,
    /// How long an unanswered call to another node may take before that node counts as lost.
    pub failure_timeout: Duration,
    /// The caps on every connection: frame sizes, the authentication deadline, and how many
    /// connections may wait to authenticate.
    pub limits: Limits,
}

impl NodeConfig {
    /// A node named `name` on `listen` with this build's protocol and a 5-second failure
    /// timeout.
    pub fn new(name: impl Into<String>, listen: SocketAddr, cookie: impl Into<String>) -> Self {
        NodeConfig {
            name: name.into(),
            listen,
            cookie: cookie.into(),
            cookie_var: "FERROGRAPH_CLUSTER_COOKIE".into(),
            labels: Vec::new(),
            tls: None,
            protocol: wire::PROTOCOL_VERSION,
            failure_timeout: Duration::from_secs(5),
            limits: Limits::default(),
        }
    }
}

/// What a node knows about itself, shared by its actors.
#[derive(Debug)]
pub(crate) struct NodeShared {
    pub(crate) name: String,
    pub(crate) listen: Mutex<String>,
    pub(crate) labels: Vec<String>,
    pub(crate) protocol: u32,
    pub(crate) failure_timeout: Duration,
    pub(crate) models: Mutex<Vec<String>>,
    pub(crate) running: AtomicU32,
    pub(crate) served: AtomicU64,
    /// The node's session server, whose sessions [`Request::Peers`] lists.
    pub(crate) server: ActorRef<NodeServerMessage>,
}

impl NodeShared {
    pub(crate) fn info(&self) -> NodeInfo {
        NodeInfo {
            name: self.name.clone(),
            listen: self.listen.lock().clone(),
            labels: self.labels.clone(),
            models: self.models.lock().clone(),
            running: self.running.load(Ordering::Relaxed),
            served: self.served.load(Ordering::Relaxed),
            pid: std::process::id(),
            protocol: self.protocol,
        }
    }
}

/// Sends `request` to the actor `cell` (on node `peer`, for errors) and reads its reply.
/// A call that is not answered within `timeout`, or whose node session ends, is
/// [`ClusterError::NodeLost`].
pub(crate) async fn call(
    cell: &ActorCell,
    protocol: u32,
    peer: &str,
    request: &Request,
    timeout: Duration,
) -> Result<Reply, ClusterError> {
    let bytes = wire::encode_with(protocol, request)?;
    let lost = |message: String| ClusterError::NodeLost {
        node: peer.to_string(),
        message,
    };
    let answer = ractor::rpc::call::<WireMsg, Vec<u8>, _>(
        cell,
        |port| WireMsg::Call(bytes, port),
        Some(timeout),
    )
    .await
    .map_err(|e| lost(format!("sending to it failed: {e}")))?;
    let bytes = match answer {
        ractor::rpc::CallResult::Success(b) => b,
        ractor::rpc::CallResult::Timeout => {
            return Err(lost(format!("no answer within {timeout:?}")))
        }
        ractor::rpc::CallResult::SenderError => {
            return Err(lost("its session ended before it answered".into()))
        }
    };
    match wire::decode_from::<Reply>(&bytes, protocol, peer)? {
        Reply::Refused { reason } => Err(ClusterError::Refused {
            node: peer.to_string(),
            reason,
        }),
        reply => Ok(reply),
    }
}

/// Answers a request whose frame is of another protocol version, in our own version: the
/// caller reads our version first and reports the mismatch.
pub(crate) fn refuse_version(protocol: u32, reply: ractor::RpcReplyPort<Vec<u8>>, theirs: u32) {
    let reason = format!("this node speaks cluster protocol {protocol}, the request {theirs}");
    if let Ok(bytes) = wire::encode_with(protocol, &Reply::Refused { reason }) {
        let _ = reply.send(bytes);
    }
}

/// One of a node server's open sessions.
struct OpenSession {
    node_id: u64,
    /// Where the peer listens, as it announced it (`host:port`), once it has.
    listens: Option<String>,
    /// The session's remote address.
    peer_addr: String,
}

impl OpenSession {
    /// Whether the peer listens on, or connected from, `addr`.
    fn is_at(&self, addr: &str) -> bool {
        self.listens.as_deref() == Some(addr) || self.peer_addr == addr
    }
}

/// Where a peer's front door listens, from its session's connection string
/// (`<listen address>:<port>`: the announced host is the front door's address, and the port
/// ractor_cluster appends is its own loopback listener's, which nobody should dial).
fn announced_listen(connection_string: &str) -> String {
    match connection_string.rsplit_once(':') {
        Some((front, _)) if front.parse::<SocketAddr>().is_ok() => front.to_string(),
        _ => connection_string.to_string(),
    }
}

/// `server`'s open sessions; none (logged) when it does not answer within 2 s.
async fn open_sessions(server: &ActorRef<NodeServerMessage>) -> Vec<OpenSession> {
    match ractor::call_t!(server, NodeServerMessage::GetSessions, 2_000) {
        Ok(sessions) => sessions
            .into_values()
            .map(|s| OpenSession {
                node_id: s.node_id,
                listens: s.peer_name.map(|p| announced_listen(&p.connection_string)),
                peer_addr: s.peer_addr,
            })
            .collect(),
        Err(e) => {
            tracing::warn!("listing this node's sessions: {e}");
            Vec::new()
        }
    }
}

/// The node agent: answers [`Request::Info`] with the node's description and
/// [`Request::Peers`] with where its peers listen.
struct NodeAgent;

impl Actor for NodeAgent {
    type Msg = WireMsg;
    type State = Arc<NodeShared>;
    type Arguments = Arc<NodeShared>;

    async fn pre_start(
        &self,
        myself: ActorRef<WireMsg>,
        shared: Arc<NodeShared>,
    ) -> Result<Arc<NodeShared>, ActorProcessingErr> {
        ractor::pg::join(NODES_GROUP.to_string(), vec![myself.get_cell()]);
        Ok(shared)
    }

    async fn handle(
        &self,
        _myself: ActorRef<WireMsg>,
        message: WireMsg,
        shared: &mut Arc<NodeShared>,
    ) -> Result<(), ActorProcessingErr> {
        let WireMsg::Call(bytes, reply) = message else {
            return Ok(());
        };
        let version = wire::frame_version(&bytes).unwrap_or(0);
        if version != shared.protocol {
            refuse_version(shared.protocol, reply, version);
            return Ok(());
        }
        let answer = match wire::decode_from::<Request>(&bytes, shared.protocol, "a peer") {
            Ok(Request::Info) => Reply::Node(shared.info()),
            Ok(Request::Peers) => Reply::Peers(
                open_sessions(&shared.server)
                    .await
                    .into_iter()
                    .filter_map(|s| s.listens)
                    .collect(),
            ),
            Ok(other) => Reply::Refused {
                reason: format!("a node agent does not serve {other:?}"),
            },
            Err(e) => Reply::Refused {
                reason: e.to_string(),
            },
        };
        if let Ok(bytes) = wire::encode_with(shared.protocol, &answer) {
            let _ = reply.send(bytes);
        }
        Ok(())
    }
}

/// What happened to a session with another node.
#[derive(Clone, Debug)]
pub(crate) enum SessionEvent {
    Authenticated {
        peer_addr: String,
    },
    Ready {
        node_id: u64,
        peer_addr: String,
        /// The peer opened the session (our side accepted it).
        incoming: bool,
    },
    Closed {
        peer_addr: String,
    },
}

struct Events {
    events: broadcast::Sender<SessionEvent>,
    connections: Connections,
}

impl NodeEventSubscription for Events {
    fn node_session_opened(&self, _ses: NodeServerSessionInformation) {}

    fn node_session_disconnected(&self, ses: NodeServerSessionInformation) {
        self.connections.closed(&ses.peer_addr);
        let _ = self.events.send(SessionEvent::Closed {
            peer_addr: ses.peer_addr,
        });
    }

    fn node_session_authenicated(&self, ses: NodeServerSessionInformation) {
        self.connections.authenticated(&ses.peer_addr);
        let _ = self.events.send(SessionEvent::Authenticated {
            peer_addr: ses.peer_addr,
        });
    }

    fn node_session_ready(&self, ses: NodeServerSessionInformation) {
        let _ = self.events.send(SessionEvent::Ready {
            node_id: ses.node_id,
            peer_addr: ses.peer_addr,
            incoming: ses.is_server,
        });
    }
}

/// A running cluster node.
pub struct ClusterNode {
    pub(crate) shared: Arc<NodeShared>,
    server: ActorRef<NodeServerMessage>,
    agent: ActorRef<WireMsg>,
    tls: Option<Tls>,
    events: broadcast::Sender<SessionEvent>,
    sessions: Sessions,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for ClusterNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterNode")
            .field("name", &self.shared.name)
            .field("listen", &self.shared.listen.lock())
            .finish_non_exhaustive()
    }
}

impl ClusterNode {
    /// Starts the node: checks the address rules and the cookie, loads TLS, starts the node
    /// server and the node agent.
    pub async fn start(config: NodeConfig) -> Result<Self, ClusterError> {
        if config.cookie.is_empty() {
            return Err(ClusterError::MissingCookie {
                var: config.cookie_var.clone(),
            });
        }
        if let Some(why) = guard::cookie_weakness(&config.cookie) {
            return Err(ClusterError::WeakCookie {
                var: config.cookie_var.clone(),
                why,
            });
        }
        let tls = config.tls.as_ref().map(Tls::load).transpose()?;
        check_address("listening on", &config.listen, tls.is_some())?;
        // The node's address is ours (the front door, see `guard`); ractor_cluster's own
        // listener gets a loopback port the kernel picks and nobody is told.
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|e| ClusterError::Start {
                addr: config.listen,
                message: e.to_string(),
            })?;
        let listen = listener.local_addr().map_err(|e| ClusterError::Start {
            addr: config.listen,
            message: e.to_string(),
        })?;
        let encryption = match &tls {
            Some(t) => IncomingEncryptionMode::Tls(t.acceptor.clone()),
            None => IncomingEncryptionMode::Raw,
        };
        // Isolated: the session layer opens no connections of its own. `join` joins the
        // peers of the joined node itself (without TLS), so that the mesh is complete when
        // it returns (see `join_peers_of`).
        let mode = ractor_cluster::node::NodeConnectionMode::Isolated;
        // The announced "hostname" is the front door's address: peers read it back from the
        // session's connection string (`announced_listen`).
        let server = NodeServer::new(
            0,
            config.cookie.clone(),
            config.name.clone(),
            listen.to_string(),
            Some(encryption),
            Some(mode),
        )
        .with_listen_addr(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
        let (server, _) =
            Actor::spawn(None, server, ())
                .await
                .map_err(|e| ClusterError::Start {
                    addr: listen,
                    message: e.to_string(),
                })?;
        let connections = Connections::default();
        let (events, _) = broadcast::channel(256);
        server
            .cast(NodeServerMessage::SubscribeToEvents {
                id: "ferrograph".into(),
                subscription: Box::new(Events {
                    events: events.clone(),
                    connections: connections.clone(),
                }),
            })
            .map_err(|e| ClusterError::Actor(e.to_string()))?;
        let shared = Arc::new(NodeShared {
            name: config.name.clone(),
            listen: Mutex::new(listen.to_string()),
            labels: config.labels.clone(),
            protocol: config.protocol,
            failure_timeout: config.failure_timeout,
            models: Mutex::new(Vec::new()),
            running: AtomicU32::new(0),
            served: AtomicU64::new(0),
            server: server.clone(),
        });
        let (agent, _) = Actor::spawn(None, NodeAgent, shared.clone())
            .await
            .map_err(|e| ClusterError::Actor(e.to_string()))?;
        let sessions = Sessions {
            server: server.clone(),
            connections,
            limits: config.limits,
        };
        let door = FrontDoor {
            listener,
            acceptor: tls.as_ref().map(|t| t.acceptor.clone()),
            sessions: sessions.clone(),
        };
        let node = ClusterNode {
            shared,
            server,
            agent,
            tls,
            events,
            sessions,
            tasks: Mutex::new(vec![tokio::spawn(door.serve())]),
        };
        node.watch_sessions();
        tracing::info!(node = %config.name, %listen, "cluster node started");
        Ok(node)
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Where the node listens.
    pub fn listen_addr(&self) -> String {
        self.shared.listen.lock().clone()
    }

    /// This node's description.
    pub fn info(&self) -> NodeInfo {
        self.shared.info()
    }

    /// Checks the peer of every session it accepts: one that speaks another protocol is
    /// disconnected. (Sessions this node opens are the accepting side's to check; `join`
    /// checks its own to give the caller the error.)
    fn watch_sessions(&self) {
        let mut rx = self.events.subscribe();
        let server = self.server.clone();
        let shared = self.shared.clone();
        let task = tokio::spawn(async move {
            loop {
                match rx.recv().await {
                    Ok(SessionEvent::Ready {
                        node_id,
                        peer_addr,
                        incoming: true,
                    }) => {
                        let server = server.clone();
                        let shared = shared.clone();
                        tokio::spawn(async move {
                            if let Err(e) = check_peer(&server, &shared, node_id, &peer_addr).await
                            {
                                tracing::error!(peer = %peer_addr, "refusing a node: {e}");
                            }
                        });
                    }
                    Ok(SessionEvent::Closed { peer_addr, .. }) => {
                        tracing::info!(peer = %peer_addr, "a node session closed");
                    }
                    Ok(SessionEvent::Authenticated { .. } | SessionEvent::Ready { .. }) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => break,
                }
            }
        });
        self.tasks.lock().push(task);
    }

    /// Joins the node at `addr` (`host:port`): opens the session (TLS when configured),
    /// waits until it is authenticated and ready, and checks the peer's protocol version.
    /// Without TLS it then joins every node that node has a session with and this one has
    /// not, asking that node's agent where its peers listen; with TLS each node is joined by
    /// hand.
    pub async fn join(&self, addr: &str) -> Result<NodeInfo, ClusterError> {
        let (info, node_id) = self.join_one(addr).await?;
        if self.tls.is_none() {
            self.join_peers_of(node_id, &info.name).await;
        }
        Ok(info)
    }

    /// Joins the nodes that the peer behind session `node_id` (named `name`) has sessions
    /// with, where this node has none: the cluster's full mesh, complete when `join`
    /// returns. `ractor_cluster`'s transitive mode did this in the background, asking the
    /// peer for its sessions with a 500 ms limit and giving up silently past it; under the
    /// whole test suite's load a coordinator that joined one model node once never saw the
    /// other, and a call lost with the first had nowhere to go. A peer that cannot be joined
    /// is logged and skipped.
    async fn join_peers_of(&self, node_id: u64, name: &str) {
        let Some(agent) = agent_of(node_id) else {
            return;
        };
        let reply = call(
            &agent,
            self.shared.protocol,
            name,
            &Request::Peers,
            self.shared.failure_timeout,
        )
        .await;
        let peers = match reply {
            Ok(Reply::Peers(peers)) => peers,
            Ok(other) => {
                tracing::warn!(peer = %name, "asked for its peers, it answered {other:?}");
                return;
            }
            Err(e) => {
                tracing::warn!(peer = %name, "asking for its peers: {e}");
                return;
            }
        };
        let me = self.listen_addr();
        let open = open_sessions(&self.server).await;
        for addr in peers.into_iter().filter(|a| *a != me) {
            let Ok(target) = addr.parse::<SocketAddr>() else {
                tracing::debug!(%addr, "a peer's peer announced an address that is not ip:port");
                continue;
            };
            if open.iter().any(|s| s.is_at(&target.to_string())) {
                continue;
            }
            match self.join_one(&addr).await {
                Ok((info, _)) => tracing::info!(peer = %info.name, %addr, via = %name, "joined"),
                Err(e) => tracing::warn!(%addr, via = %name, "joining a peer's peer: {e}"),
            }
        }
    }

    /// [`ClusterNode::join`] of the node at `addr` alone; also returns the session's id.
    async fn join_one(&self, addr: &str) -> Result<(NodeInfo, u64), ClusterError> {
        let join_err = |message: String| ClusterError::Join {
            addr: addr.to_string(),
            message,
        };
        let resolved: Vec<SocketAddr> = tokio::net::lookup_host(addr)
            .await
            .map_err(|e| join_err(format!("resolving it: {e}")))?
            .collect();
        let target = *resolved
            .first()
            .ok_or_else(|| join_err("it resolves to no address".into()))?;
        check_address("joining", &target, self.tls.is_some())?;
        // Already connected (the peer joined this node, or this node joined it as another
        // node's peer): that session is the join.
        if let Some(node_id) = self.session_with(&target).await {
            let info = check_peer(&self.server, &self.shared, node_id, addr).await?;
            return Ok((info, node_id));
        }
        let mut rx = self.events.subscribe();
        let tcp = tokio::net::TcpStream::connect(target).await.map_err(|io| {
            join_err(format!(
                "nothing answers there ({io}): start a node there (`ferrograph node --listen {target}`) or check the address"
            ))
        })?;
        let _ = tcp.set_nodelay(true);
        let wanted = target.to_string();
        let opened = match &self.tls {
            Some(tls) => {
                let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
                let host = host.trim_start_matches('[').trim_end_matches(']');
                let stream = tls
                    .connector
                    .connect(tls.name_for(host)?, tcp)
                    .await
                    .map_err(|io| join_err(format!("the TLS handshake failed: {io}")))?;
                self.sessions.open(stream, wanted.clone(), None, false)
            }
            None => self.sessions.open(tcp, wanted.clone(), None, false),
        };
        opened.map_err(|e| join_err(format!("opening the session: {e}")))?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let mut authenticated = false;
        let node_id = loop {
            let event = tokio::time::timeout_at(deadline, rx.recv())
                .await
                .map_err(|_| {
                    join_err(if authenticated {
                        "the session was authenticated but did not become ready within 10 s".into()
                    } else {
                        "no authenticated session within 10 s".into()
                    })
                })?
                .map_err(|e| join_err(format!("watching the session: {e}")))?;
            match event {
                SessionEvent::Authenticated { peer_addr, .. } if peer_addr == wanted => {
                    authenticated = true;
                }
                SessionEvent::Ready {
                    node_id, peer_addr, ..
                } if peer_addr == wanted => break node_id,
                SessionEvent::Closed { peer_addr, .. } if peer_addr == wanted => {
                    // Two sessions with one peer (ours and one it opened to us) are settled by
                    // closing one: the other is the join.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    if let Some(node_id) = self.session_with(&target).await {
                        break node_id;
                    }
                    return Err(join_err(if authenticated {
                        "the session closed right after authentication".into()
                    } else {
                        "the peer closed the session during authentication: the cookies \
                         differ (every node needs the same secret), or it refused us"
                            .into()
                    }));
                }
                _ => {}
            }
        };
        let info = check_peer(&self.server, &self.shared, node_id, addr).await?;
        tracing::info!(peer = %info.name, %addr, "joined");
        Ok((info, node_id))
    }

    /// The id of an open session with the node listening on (or connected from) `target`.
    async fn session_with(&self, target: &SocketAddr) -> Option<u64> {
        let wanted = target.to_string();
        open_sessions(&self.server)
            .await
            .into_iter()
            .find(|s| s.is_at(&wanted))
            .map(|s| s.node_id)
    }

    /// Every node this one is connected to, and itself, as their agents describe them.
    /// Nodes whose agent does not answer within the failure timeout are left out.
    pub async fn nodes(&self) -> Vec<NodeInfo> {
        let timeout = self.shared.failure_timeout;
        let mut out: Vec<NodeInfo> = ask_members(&self.shared, NODES_GROUP, timeout)
            .await
            .into_iter()
            .filter_map(|(_, reply)| match reply {
                Ok(Reply::Node(info)) => Some(info),
                Ok(_) => None,
                Err(e) => {
                    tracing::warn!("a node did not describe itself: {e}");
                    None
                }
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Stops the node's actors and its server (sessions close; peers see this node leave).
    pub async fn shutdown(self) {
        for t in self.tasks.lock().drain(..) {
            t.abort();
        }
        self.agent.stop(None);
        self.server.stop(None);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Asks every member of process group `group` to describe itself ([`Request::Info`]), all
/// at once, each within `timeout`.
pub(crate) async fn ask_members(
    shared: &NodeShared,
    group: &str,
    timeout: Duration,
) -> Vec<(ActorCell, Result<Reply, ClusterError>)> {
    let mut set = tokio::task::JoinSet::new();
    for cell in ractor::pg::get_members(&group.to_string()) {
        let protocol = shared.protocol;
        set.spawn(async move {
            let r = call(&cell, protocol, "a cluster member", &Request::Info, timeout).await;
            (cell, r)
        });
    }
    let mut out = Vec::new();
    while let Some(r) = set.join_next().await {
        match r {
            Ok(answer) => out.push(answer),
            Err(e) => tracing::warn!("asking a cluster member: {e}"),
        }
    }
    out
}

/// The node agent of the peer behind session `node_id`, once its process groups have
/// reached this node.
fn agent_of(node_id: u64) -> Option<ActorCell> {
    ractor::pg::get_members(&NODES_GROUP.to_string())
        .into_iter()
        .find(|c| !c.get_id().is_local() && c.get_id().node() == node_id)
}

/// Finds the agent of the peer behind session `node_id` and checks its protocol version; a
/// peer of another version is disconnected.
async fn check_peer(
    server: &ActorRef<NodeServerMessage>,
    shared: &NodeShared,
    node_id: u64,
    peer_addr: &str,
) -> Result<NodeInfo, ClusterError> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let agent = loop {
        if let Some(agent) = agent_of(node_id) {
            break agent;
        }
        if tokio::time::Instant::now() > deadline {
            return Err(ClusterError::Join {
                addr: peer_addr.to_string(),
                message: "the peer has no ferrograph node agent (is it a ferrograph node?)".into(),
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let peer = format!("at {peer_addr}");
    let reply = call(
        &agent,
        shared.protocol,
        &peer,
        &Request::Info,
        shared.failure_timeout,
    )
    .await;
    let refused = |e: ClusterError| {
        disconnect(server, node_id);
        Err(e)
    };
    match reply {
        Ok(Reply::Node(info)) if info.protocol == shared.protocol => Ok(info),
        Ok(Reply::Node(info)) => refused(ClusterError::VersionMismatch {
            peer: info.name,
            theirs: info.protocol,
            ours: shared.protocol,
        }),
        Ok(other) => refused(ClusterError::Protocol(format!(
            "the peer's agent answered {other:?}"
        ))),
        Err(e) => refused(e),
    }
}

/// Closes the session with the node behind `node_id`.
fn disconnect(server: &ActorRef<NodeServerMessage>, node_id: u64) {
    let server = server.clone();
    tokio::spawn(async move {
        // A moment first, so the peer's own check reads our answer (and its clear error)
        // before the session goes.
        tokio::time::sleep(Duration::from_millis(500)).await;
        if let Ok(sessions) = ractor::call_t!(server, NodeServerMessage::GetSessions, 2_000) {
            for s in sessions.values().filter(|s| s.node_id == node_id) {
                s.actor
                    .stop(Some("cluster protocol version mismatch".into()));
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::announced_listen;

    #[test]
    fn the_front_doors_address_is_read_back_from_the_connection_string() {
        assert_eq!(announced_listen("127.0.0.1:7501:37891"), "127.0.0.1:7501");
        assert_eq!(announced_listen("[::1]:7501:0"), "[::1]:7501");
        assert_eq!(announced_listen("127.0.0.1:7501"), "127.0.0.1:7501");
    }
}
