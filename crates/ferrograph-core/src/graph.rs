//! Building a graph and checking it before it runs.

use crate::id::FnvBuildHasher;
use crate::node::{
    node_fn, Goto, NodeContext, NodeError, NodeFn, NodeOptions, NodeOutput, END, START,
};
use crate::state::State;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::sync::Arc;

/// What a router returns: node names (or labels of its path map), sends, or both.
#[derive(Clone, Debug)]
pub struct Route<S: State>(pub Vec<Goto<S>>);

impl<S: State> Route<S> {
    /// Go nowhere (the branch ends).
    pub fn end() -> Self {
        Route(vec![Goto::Node(END.to_string())])
    }
}

impl<S: State> From<&str> for Route<S> {
    fn from(s: &str) -> Self {
        Route(vec![Goto::Node(s.to_string())])
    }
}

impl<S: State> From<String> for Route<S> {
    fn from(s: String) -> Self {
        Route(vec![Goto::Node(s)])
    }
}

impl<S: State> From<Vec<&str>> for Route<S> {
    fn from(v: Vec<&str>) -> Self {
        Route(v.into_iter().map(|s| Goto::Node(s.to_string())).collect())
    }
}

impl<S: State> From<Vec<String>> for Route<S> {
    fn from(v: Vec<String>) -> Self {
        Route(v.into_iter().map(Goto::Node).collect())
    }
}

impl<S: State> From<crate::node::SendTo<S>> for Route<S> {
    fn from(s: crate::node::SendTo<S>) -> Self {
        Route(vec![Goto::Send(s)])
    }
}

impl<S: State> From<Vec<crate::node::SendTo<S>>> for Route<S> {
    fn from(v: Vec<crate::node::SendTo<S>>) -> Self {
        Route(v.into_iter().map(Goto::Send).collect())
    }
}

impl<S: State> From<Vec<Goto<S>>> for Route<S> {
    fn from(v: Vec<Goto<S>>) -> Self {
        Route(v)
    }
}

/// A conditional edge's decision function.
pub type RouterFn<S> = Arc<dyn Fn(&S) -> Route<S> + Send + Sync>;

/// A node's error handler: turns the node's failure (after its retries) into the node's
/// output, from the error and the input the node was given.
pub type ErrorHandlerFn<S> = Arc<dyn Fn(&NodeError, &S) -> NodeOutput<S> + Send + Sync>;

/// What runs for a node.
#[derive(Clone)]
pub enum NodeKind<S: State> {
    /// An async function.
    Func(Arc<dyn NodeFn<S>>),
    /// A compiled graph over the same state, run as one node.
    Subgraph(CompiledGraph<S>),
    /// A compiled graph over another state, with its input and output mapped (see
    /// [`crate::subgraph`]).
    Foreign(Arc<dyn crate::subgraph::ForeignGraph<S>>),
}

/// A node of a compiled graph.
#[derive(Clone)]
pub struct NodeSpec<S: State> {
    /// Name.
    pub name: Arc<str>,
    /// Behaviour.
    pub kind: NodeKind<S>,
    /// Options (retry, timeout, destinations, deferral, cache).
    pub options: NodeOptions,
    /// What the node's failure becomes instead of failing the step, if anything.
    pub on_error: Option<ErrorHandlerFn<S>>,
}

/// A conditional edge.
#[derive(Clone)]
pub struct Branch<S: State> {
    /// Decision function.
    pub router: RouterFn<S>,
    /// Label → target node (END allowed). For a plain list of targets, the identity.
    pub path_map: Vec<(String, String)>,
}

impl<S: State> Branch<S> {
    /// The node a label resolves to.
    pub fn resolve(&self, label: &str) -> Option<&str> {
        self.path_map
            .iter()
            .find(|(l, _)| l == label)
            .map(|(_, t)| t.as_str())
    }
}

/// A join edge: `target` runs once every source has finished since it last ran.
#[derive(Clone, Debug)]
pub struct Join {
    /// Source node indices.
    pub sources: Vec<usize>,
    /// Target node (index), or `None` for END.
    pub target: Option<usize>,
}

/// A problem found by [`StateGraph::compile`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GraphProblem {
    /// Two nodes share a name.
    DuplicateNode(String),
    /// A node name is empty, reserved or contains `/` or `:`.
    InvalidName(String),
    /// An edge, branch, join, destination or interrupt names a node that does not exist.
    UnknownTarget {
        /// Where the reference is.
        from: String,
        /// The missing name.
        target: String,
    },
    /// Nothing leaves START.
    NoEntryPoint,
    /// No path from START reaches the node.
    Unreachable(String),
    /// The node has no outgoing edge, branch, join or declared destination.
    NoWayOut(String),
    /// END used as a source, or START as a target.
    MisplacedEndpoint(String),
}

impl fmt::Display for GraphProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GraphProblem::DuplicateNode(n) => write!(f, "duplicate node name `{n}`"),
            GraphProblem::InvalidName(n) => write!(
                f,
                "invalid node name `{n}` (empty, reserved, or containing '/', ':' or a control character)"
            ),
            GraphProblem::UnknownTarget { from, target } => {
                write!(f, "`{from}` refers to unknown node `{target}`")
            }
            GraphProblem::NoEntryPoint => write!(f, "no edge leaves START"),
            GraphProblem::Unreachable(n) => write!(f, "node `{n}` is unreachable from START"),
            GraphProblem::NoWayOut(n) => write!(
                f,
                "node `{n}` has no way out (add an edge, a conditional edge, or destinations)"
            ),
            GraphProblem::MisplacedEndpoint(m) => write!(f, "{m}"),
        }
    }
}

/// The graph did not compile; every problem found is listed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("graph `{graph}` is invalid: {}", problems.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("; "))]
pub struct CompileError {
    /// Graph name.
    pub graph: String,
    /// Every problem found.
    pub problems: Vec<GraphProblem>,
}

enum EdgeSpec<S: State> {
    Plain(String, String),
    Join(Vec<String>, String),
    Branch(String, Branch<S>),
}

/// Builds a graph over state `S`.
pub struct StateGraph<S: State> {
    name: String,
    nodes: Vec<NodeSpec<S>>,
    edges: Vec<EdgeSpec<S>>,
    interrupt_before: Vec<String>,
    interrupt_after: Vec<String>,
    problems: Vec<GraphProblem>,
}

impl<S: State> StateGraph<S> {
    /// A new, empty graph.
    pub fn new(name: impl Into<String>) -> Self {
        StateGraph {
            name: name.into(),
            nodes: Vec::new(),
            edges: Vec::new(),
            interrupt_before: Vec::new(),
            interrupt_after: Vec::new(),
            problems: Vec::new(),
        }
    }

    fn push_node(&mut self, name: String, kind: NodeKind<S>, options: NodeOptions) {
        if name.is_empty()
            || name == START
            || name == END
            || name.contains('/')
            || name.contains(':')
            || name.chars().any(char::is_control)
        {
            self.problems.push(GraphProblem::InvalidName(name.clone()));
        }
        if self.nodes.iter().any(|n| *n.name == *name) {
            self.problems.push(GraphProblem::DuplicateNode(name));
            return;
        }
        self.nodes.push(NodeSpec {
            name: name.into(),
            kind,
            options,
            on_error: None,
        });
    }

    /// Adds a node running an async function.
    pub fn add_node<F, Fut, O>(self, name: impl Into<String>, f: F) -> Self
    where
        F: Fn(Arc<S>, NodeContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, NodeError>> + Send + 'static,
        O: Into<NodeOutput<S>>,
    {
        self.add_node_with(name, f, NodeOptions::default())
    }

    /// Adds a node with options (retry policy, timeout, destinations).
    pub fn add_node_with<F, Fut, O>(
        mut self,
        name: impl Into<String>,
        f: F,
        options: NodeOptions,
    ) -> Self
    where
        F: Fn(Arc<S>, NodeContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, NodeError>> + Send + 'static,
        O: Into<NodeOutput<S>>,
    {
        self.push_node(name.into(), NodeKind::Func(node_fn(f)), options);
        self
    }

    /// Adds a node from a [`NodeFn`] implementation.
    pub fn add_node_fn(
        mut self,
        name: impl Into<String>,
        f: Arc<dyn NodeFn<S>>,
        options: NodeOptions,
    ) -> Self {
        self.push_node(name.into(), NodeKind::Func(f), options);
        self
    }

    /// Adds a compiled graph over the same state as one node. Its updates reach this graph as
    /// the node's update; its interrupts surface to the caller and resume inside it.
    pub fn add_subgraph(mut self, name: impl Into<String>, graph: CompiledGraph<S>) -> Self {
        self.push_node(
            name.into(),
            NodeKind::Subgraph(graph),
            NodeOptions::default(),
        );
        self
    }

    /// Adds a graph over *another* state type as one node (LangGraph's subgraph with its own
    /// schema): `child` maps the parent's state to the child's input and the child's final state
    /// to the parent's update (for example `ferrograph_runtime::MappedSubgraph`). Its interrupts
    /// surface to the caller and resume inside it, as a same-state subgraph's do.
    pub fn add_foreign_subgraph(
        mut self,
        name: impl Into<String>,
        child: impl crate::subgraph::ForeignGraph<S>,
        options: NodeOptions,
    ) -> Self {
        self.push_node(name.into(), NodeKind::Foreign(Arc::new(child)), options);
        self
    }

    /// Adds a subgraph node with options.
    pub fn add_subgraph_with(
        mut self,
        name: impl Into<String>,
        graph: CompiledGraph<S>,
        options: NodeOptions,
    ) -> Self {
        self.push_node(name.into(), NodeKind::Subgraph(graph), options);
        self
    }

    /// Adds an edge: when `from` finishes, `to` runs in the next superstep.
    pub fn add_edge(mut self, from: impl Into<String>, to: impl Into<String>) -> Self {
        self.edges.push(EdgeSpec::Plain(from.into(), to.into()));
        self
    }

    /// Adds a join edge: `to` runs once after every one of `sources` has finished.
    pub fn add_join<I, T>(mut self, sources: I, to: impl Into<String>) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        self.edges.push(EdgeSpec::Join(
            sources.into_iter().map(Into::into).collect(),
            to.into(),
        ));
        self
    }

    /// Adds a conditional edge. The router runs on the merged state after `from` finishes and
    /// returns node names from `targets` (END included), or `Send`s to them.
    pub fn add_conditional_edges<R, O, I, T>(
        self,
        from: impl Into<String>,
        router: R,
        targets: I,
    ) -> Self
    where
        R: Fn(&S) -> O + Send + Sync + 'static,
        O: Into<Route<S>>,
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        let map = targets
            .into_iter()
            .map(|t| {
                let t = t.into();
                (t.clone(), t)
            })
            .collect();
        self.add_branch(from.into(), router, map)
    }

    /// Adds a conditional edge whose router returns labels, mapped to nodes by `path_map`.
    pub fn add_conditional_edges_map<R, O, I, L, T>(
        self,
        from: impl Into<String>,
        router: R,
        path_map: I,
    ) -> Self
    where
        R: Fn(&S) -> O + Send + Sync + 'static,
        O: Into<Route<S>>,
        I: IntoIterator<Item = (L, T)>,
        L: Into<String>,
        T: Into<String>,
    {
        let map = path_map
            .into_iter()
            .map(|(l, t)| (l.into(), t.into()))
            .collect();
        self.add_branch(from.into(), router, map)
    }

    fn add_branch<R, O>(mut self, from: String, router: R, path_map: Vec<(String, String)>) -> Self
    where
        R: Fn(&S) -> O + Send + Sync + 'static,
        O: Into<Route<S>>,
    {
        let router: RouterFn<S> = Arc::new(move |s: &S| router(s).into());
        self.edges
            .push(EdgeSpec::Branch(from, Branch { router, path_map }));
        self
    }

    /// Gives `node` an error handler: when the node fails after its retries, the handler's
    /// output (an update, a `Command` with a goto, or nothing) becomes the node's output, and
    /// the step commits as if the node had returned it; its siblings are neither cancelled nor
    /// run again. Declare the handler's goto targets in the node's `destinations`.
    pub fn on_error<H, O>(mut self, node: impl Into<String>, handler: H) -> Self
    where
        H: Fn(&NodeError, &S) -> O + Send + Sync + 'static,
        O: Into<NodeOutput<S>>,
    {
        let node = node.into();
        let handler: ErrorHandlerFn<S> = Arc::new(move |e: &NodeError, s: &S| handler(e, s).into());
        match self.nodes.iter_mut().find(|n| *n.name == *node) {
            Some(spec) => spec.on_error = Some(handler),
            None => self.problems.push(GraphProblem::UnknownTarget {
                from: "on_error".into(),
                target: node,
            }),
        }
        self
    }

    /// Stops the run before these nodes execute (resume with no value to go on).
    pub fn interrupt_before<I, T>(mut self, nodes: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        self.interrupt_before
            .extend(nodes.into_iter().map(Into::into));
        self
    }

    /// Stops the run after these nodes execute.
    pub fn interrupt_after<I, T>(mut self, nodes: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        self.interrupt_after
            .extend(nodes.into_iter().map(Into::into));
        self
    }

    /// Checks the graph and freezes it. Every problem is reported at once.
    pub fn compile(self) -> Result<CompiledGraph<S>, CompileError> {
        let mut problems = self.problems;
        let index: HashMap<Arc<str>, usize, FnvBuildHasher> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.clone(), i))
            .collect();
        let n = self.nodes.len();
        let mut edges: Vec<Vec<Option<usize>>> = vec![Vec::new(); n];
        let mut start_edges: Vec<Option<usize>> = Vec::new();
        let mut branches: Vec<Vec<Branch<S>>> = vec![Vec::new(); n];
        let mut start_branches: Vec<Branch<S>> = Vec::new();
        let mut joins: Vec<Join> = Vec::new();
        let mut has_way_out = vec![false; n];

        // Resolves a target name: Ok(None) is END.
        let resolve = |from: &str, target: &str, problems: &mut Vec<GraphProblem>| {
            if target == END {
                return Some(None);
            }
            if target == START {
                problems.push(GraphProblem::MisplacedEndpoint(format!(
                    "`{from}` has START as a target"
                )));
                return None;
            }
            match index.get(target) {
                Some(&i) => Some(Some(i)),
                None => {
                    problems.push(GraphProblem::UnknownTarget {
                        from: from.to_string(),
                        target: target.to_string(),
                    });
                    None
                }
            }
        };
        let source = |from: &str, problems: &mut Vec<GraphProblem>| -> Option<Option<usize>> {
            if from == START {
                return Some(None);
            }
            if from == END {
                problems.push(GraphProblem::MisplacedEndpoint(
                    "END cannot be the source of an edge".into(),
                ));
                return None;
            }
            match index.get(from) {
                Some(&i) => Some(Some(i)),
                None => {
                    problems.push(GraphProblem::UnknownTarget {
                        from: "edge".into(),
                        target: from.to_string(),
                    });
                    None
                }
            }
        };

        for edge in self.edges {
            match edge {
                EdgeSpec::Plain(from, to) => {
                    let src = source(&from, &mut problems);
                    let dst = resolve(&from, &to, &mut problems);
                    if let (Some(src), Some(dst)) = (src, dst) {
                        match src {
                            None => start_edges.push(dst),
                            Some(s) => {
                                edges[s].push(dst);
                                has_way_out[s] = true;
                            }
                        }
                    }
                }
                EdgeSpec::Join(sources, to) => {
                    let dst = resolve(&format!("join into {to}"), &to, &mut problems);
                    let mut idx = Vec::new();
                    for s in &sources {
                        match source(s, &mut problems) {
                            Some(Some(i)) => {
                                idx.push(i);
                                has_way_out[i] = true;
                            }
                            Some(None) => problems.push(GraphProblem::MisplacedEndpoint(
                                "START cannot be a join source".into(),
                            )),
                            None => {}
                        }
                    }
                    if let Some(dst) = dst {
                        if idx.len() == sources.len() && !idx.is_empty() {
                            idx.sort_unstable();
                            idx.dedup();
                            joins.push(Join {
                                sources: idx,
                                target: dst,
                            });
                        }
                    }
                }
                EdgeSpec::Branch(from, branch) => {
                    let src = source(&from, &mut problems);
                    let mut ok = true;
                    for (_, target) in &branch.path_map {
                        if resolve(&from, target, &mut problems).is_none() {
                            ok = false;
                        }
                    }
                    if let (Some(src), true) = (src, ok) {
                        match src {
                            None => start_branches.push(branch),
                            Some(s) => {
                                has_way_out[s] = true;
                                branches[s].push(branch);
                            }
                        }
                    }
                }
            }
        }

        let mut destinations: Vec<Vec<Option<usize>>> = vec![Vec::new(); n];
        for (i, node) in self.nodes.iter().enumerate() {
            for d in &node.options.destinations {
                if let Some(t) = resolve(&node.name, d, &mut problems) {
                    destinations[i].push(t);
                    has_way_out[i] = true;
                }
            }
        }

        let mut check_names = |names: &[String], what: &str| -> BTreeSet<usize> {
            let mut set = BTreeSet::new();
            for name in names {
                match index.get(name.as_str()) {
                    Some(&i) => {
                        set.insert(i);
                    }
                    None => problems.push(GraphProblem::UnknownTarget {
                        from: what.to_string(),
                        target: name.clone(),
                    }),
                }
            }
            set
        };
        let interrupt_before = check_names(&self.interrupt_before, "interrupt_before");
        let interrupt_after = check_names(&self.interrupt_after, "interrupt_after");

        if start_edges.is_empty() && start_branches.is_empty() {
            problems.push(GraphProblem::NoEntryPoint);
        }

        // Reachability from START over every kind of edge.
        let mut reached = vec![false; n];
        let mut queue: VecDeque<usize> = VecDeque::new();
        let visit = |t: Option<usize>, reached: &mut Vec<bool>, queue: &mut VecDeque<usize>| {
            if let Some(i) = t {
                if !reached[i] {
                    reached[i] = true;
                    queue.push_back(i);
                }
            }
        };
        let branch_targets = |b: &Branch<S>| -> Vec<Option<usize>> {
            b.path_map
                .iter()
                .filter_map(|(_, t)| {
                    if t == END {
                        Some(None)
                    } else {
                        index.get(t.as_str()).map(|&i| Some(i))
                    }
                })
                .collect()
        };
        for &t in &start_edges {
            visit(t, &mut reached, &mut queue);
        }
        for b in &start_branches {
            for t in branch_targets(b) {
                visit(t, &mut reached, &mut queue);
            }
        }
        while let Some(i) = queue.pop_front() {
            for &t in &edges[i] {
                visit(t, &mut reached, &mut queue);
            }
            for b in &branches[i] {
                for t in branch_targets(b) {
                    visit(t, &mut reached, &mut queue);
                }
            }
            for &t in &destinations[i] {
                visit(t, &mut reached, &mut queue);
            }
            for j in &joins {
                if j.sources.contains(&i) {
                    visit(j.target, &mut reached, &mut queue);
                }
            }
        }
        for (i, node) in self.nodes.iter().enumerate() {
            if !reached[i] {
                problems.push(GraphProblem::Unreachable(node.name.to_string()));
            }
            if !has_way_out[i] {
                problems.push(GraphProblem::NoWayOut(node.name.to_string()));
            }
        }

        if !problems.is_empty() {
            return Err(CompileError {
                graph: self.name,
                problems,
            });
        }
        let mut joins_of = vec![Vec::new(); n];
        for (ji, j) in joins.iter().enumerate() {
            for &s in &j.sources {
                joins_of[s].push(ji);
            }
        }
        let deferred = (0..self.nodes.len())
            .filter(|&i| self.nodes[i].options.defer)
            .collect();
        Ok(CompiledGraph {
            inner: Arc::new(GraphSpec {
                name: self.name,
                nodes: self.nodes,
                index,
                edges,
                start_edges,
                branches,
                start_branches,
                joins,
                joins_of,
                interrupt_before,
                interrupt_after,
                deferred,
            }),
        })
    }
}

/// The frozen structure of a graph.
pub struct GraphSpec<S: State> {
    /// Graph name.
    pub name: String,
    /// Nodes in declaration order.
    pub nodes: Vec<NodeSpec<S>>,
    /// Name → index.
    pub index: HashMap<Arc<str>, usize, FnvBuildHasher>,
    /// Static successors per node (`None` = END).
    pub edges: Vec<Vec<Option<usize>>>,
    /// Static successors of START.
    pub start_edges: Vec<Option<usize>>,
    /// Conditional edges per node.
    pub branches: Vec<Vec<Branch<S>>>,
    /// Conditional edges from START.
    pub start_branches: Vec<Branch<S>>,
    /// Join edges.
    pub joins: Vec<Join>,
    /// For each node, the joins it is a source of.
    pub joins_of: Vec<Vec<usize>>,
    /// Nodes with a static interrupt before them.
    pub interrupt_before: BTreeSet<usize>,
    /// Nodes with a static interrupt after them.
    pub interrupt_after: BTreeSet<usize>,
    /// Deferred nodes (see [`NodeOptions::defer`]).
    pub deferred: BTreeSet<usize>,
}

/// A checked, immutable graph, cheap to clone and share between runs.
pub struct CompiledGraph<S: State> {
    inner: Arc<GraphSpec<S>>,
}

impl<S: State> Clone for CompiledGraph<S> {
    fn clone(&self) -> Self {
        CompiledGraph {
            inner: self.inner.clone(),
        }
    }
}

impl<S: State> fmt::Debug for CompiledGraph<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompiledGraph")
            .field("name", &self.inner.name)
            .field(
                "nodes",
                &self.inner.nodes.iter().map(|n| &n.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl<S: State> CompiledGraph<S> {
    /// The frozen structure.
    pub fn spec(&self) -> &GraphSpec<S> {
        &self.inner
    }

    /// Graph name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Index of a node by name.
    pub fn node_index(&self, name: &str) -> Option<usize> {
        self.inner.index.get(name).copied()
    }

    /// A node by index.
    pub fn node(&self, index: usize) -> &NodeSpec<S> {
        &self.inner.nodes[index]
    }

    /// Identity of this compiled graph (two clones share it).
    pub fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as *const () as usize
    }

    /// The graph's nodes and edges, ready to draw (Mermaid, LangGraph's graph JSON, SVG).
    pub fn drawing(&self) -> crate::drawing::GraphDrawing {
        use crate::drawing::{DrawEdge, EdgeKind, GraphDrawing, END_NODE, START_NODE};
        let spec = &self.inner;
        let name = |t: Option<usize>| match t {
            Some(i) => spec.nodes[i].name.to_string(),
            None => END_NODE.to_string(),
        };
        let mut edges = Vec::new();
        let mut push = |source: String, target: String, label: Option<String>, kind: EdgeKind| {
            let e = DrawEdge {
                source,
                target,
                label,
                kind,
            };
            if !edges.contains(&e) {
                edges.push(e);
            }
        };
        for &t in &spec.start_edges {
            push(START_NODE.to_string(), name(t), None, EdgeKind::Direct);
        }
        for b in &spec.start_branches {
            for (l, t) in &b.path_map {
                push(
                    START_NODE.to_string(),
                    t.clone(),
                    Some(l.clone()),
                    EdgeKind::Conditional,
                );
            }
        }
        for (i, node) in spec.nodes.iter().enumerate() {
            for &t in &spec.edges[i] {
                push(node.name.to_string(), name(t), None, EdgeKind::Direct);
            }
            for b in &spec.branches[i] {
                for (l, t) in &b.path_map {
                    push(
                        node.name.to_string(),
                        t.clone(),
                        Some(l.clone()),
                        EdgeKind::Conditional,
                    );
                }
            }
        }
        for j in &spec.joins {
            for &s in &j.sources {
                push(
                    spec.nodes[s].name.to_string(),
                    name(j.target),
                    None,
                    EdgeKind::Join,
                );
            }
        }
        GraphDrawing {
            name: spec.name.clone(),
            nodes: spec.nodes.iter().map(|n| n.name.to_string()).collect(),
            edges,
        }
    }

    /// A Mermaid flowchart of the graph.
    pub fn to_mermaid(&self) -> String {
        self.drawing().to_mermaid(None)
    }
}
