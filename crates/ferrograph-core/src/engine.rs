//! Superstep semantics, as pure functions: planning the tasks of a step and merging their
//! outputs at the barrier. The runtime executes tasks; this module decides what they are and
//! what their results mean, so the rules live in one place with no IO.
//!
//! The rules (Pregel / bulk-synchronous):
//! - the tasks of a step all see the same snapshot of the state;
//! - at the barrier their updates are merged in plan order, never in finishing order;
//! - two tasks writing the same overwrite field in one step is an error naming both;
//! - overwrites (values that bypass a field's rule) apply after the step's merges, and two
//!   tasks overwriting one field in a step conflict;
//! - a node triggered by several edges in one step runs once; every `Send` is its own task;
//! - routers run on the merged state;
//! - a join target runs once each of its sources has finished since it last ran.

use crate::graph::{Branch, CompiledGraph};
use crate::id::{ordered_id, stable_hash};
use crate::node::{CommandTarget, Goto, NodeOutput, END};
use crate::state::{ReducerError, State, StateUpdate, OVERWRITE_MARK};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// A task planned for the next superstep.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(bound(serialize = "S: State", deserialize = "S: State"))]
pub struct PlannedTask<S: State> {
    /// Deterministic id (same on every attempt and after a resume).
    pub id: String,
    /// Node name.
    pub node: String,
    /// The `Send` payload, if the task was sent; otherwise the node reads the state.
    pub input: Option<S>,
}

/// The in-memory form of a checkpoint: everything needed to run the next superstep.
#[derive(Clone, Debug)]
pub struct Frame<S: State> {
    /// Id of the checkpoint this frame is.
    pub checkpoint_id: String,
    /// Id of the checkpoint before it.
    pub parent_id: Option<String>,
    /// Supersteps executed so far on this thread (0 for the input checkpoint).
    pub step: u64,
    /// The state.
    pub state: Arc<S>,
    /// Tasks of the next superstep, in plan order.
    pub next: Vec<PlannedTask<S>>,
    /// For each join edge, the sources that finished since its target last ran.
    pub joins: Vec<BTreeSet<String>>,
}

impl<S: State> Frame<S> {
    /// An empty frame for a new thread.
    pub fn empty(graph: &CompiledGraph<S>) -> Self {
        Frame {
            checkpoint_id: ordered_id(),
            parent_id: None,
            step: 0,
            state: Arc::new(S::default()),
            next: Vec::new(),
            joins: vec![BTreeSet::new(); graph.spec().joins.len()],
        }
    }

    /// Names of the nodes planned next.
    pub fn next_nodes(&self) -> Vec<String> {
        self.next.iter().map(|t| t.node.clone()).collect()
    }
}

/// A task with its result, handed to [`CompiledGraph::commit_step`].
#[derive(Clone, Debug)]
pub struct FinishedTask<S: State> {
    /// The task.
    pub task: PlannedTask<S>,
    /// What it produced.
    pub output: NodeOutput<S>,
}

/// The outcome of merging a step.
#[derive(Clone, Debug)]
pub struct StepCommit<S: State> {
    /// The new frame (a new checkpoint).
    pub frame: Frame<S>,
    /// The updates merged, with the node that wrote each, in merge order.
    pub writes: Vec<(String, S::Update)>,
}

/// Why a step could not be merged.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum StepError {
    /// Two tasks wrote the same overwrite field in one superstep.
    #[error("conflicting writes to field `{field}` in one superstep by `{first}` and `{second}`; give the field a merge rule or write it from one node")]
    ConflictingWrites {
        /// Field.
        field: &'static str,
        /// First writer (plan order).
        first: String,
        /// Second writer.
        second: String,
    },
    /// A merge rule rejected a node's update.
    #[error("merging the update of `{node}` failed: {source}")]
    Reducer {
        /// Node.
        node: String,
        /// Why.
        #[source]
        source: ReducerError,
    },
    /// A router or command named a node that does not exist (or is not among the router's
    /// declared targets).
    #[error("`{from}` routed to unknown target `{target}`")]
    UnknownTarget {
        /// Node (or START) whose router or command it was.
        from: String,
        /// The target.
        target: String,
    },
    /// A router panicked.
    #[error("router of `{from}` panicked: {message}")]
    RouterPanicked {
        /// Node (or START) the router belongs to.
        from: String,
        /// Panic message.
        message: String,
    },
    /// An edit of a thread's state that cannot be applied.
    #[error("invalid state edit: {0}")]
    InvalidEdit(String),
    /// A node addressed the parent graph but runs in the root graph.
    #[error("node `{node}` sent a command to the parent graph, but it is not in a subgraph")]
    NoParentGraph {
        /// Node.
        node: String,
    },
}

/// What one task of a step wrote: its node, its updates and its overwrites.
pub type TaskWrites<S> = (String, Vec<<S as State>::Update>, Vec<<S as State>::Update>);

/// Merges the outputs of a step's tasks (node, updates, overwrites), given in plan order, into
/// `state`: every update with its field's rule, then every overwrite (which so wins over the
/// step's merges). Returns the writes as recorded in a checkpoint, overwrites marked with
/// [`OVERWRITE_MARK`]. The barrier, a command given as input and the views of a step that
/// stopped part-way all merge through here.
pub fn merge_outputs<S: State>(
    state: &mut S,
    outputs: Vec<TaskWrites<S>>,
) -> Result<Vec<(String, S::Update)>, StepError> {
    let mut writes = Vec::new();
    let mut overwrites = Vec::new();
    for (node, updates, later) in outputs {
        for u in updates {
            state
                .apply(u.clone())
                .map_err(|source| StepError::Reducer {
                    node: node.clone(),
                    source,
                })?;
            writes.push((node.clone(), u));
        }
        overwrites.extend(later.into_iter().map(|u| (node.clone(), u)));
    }
    for (node, u) in overwrites {
        state
            .overwrite(u.clone())
            .map_err(|source| StepError::Reducer {
                node: node.clone(),
                source,
            })?;
        writes.push((format!("{OVERWRITE_MARK}{node}"), u));
    }
    Ok(writes)
}

/// Text of a panic payload.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

struct Planner<'g, S: State> {
    graph: &'g CompiledGraph<S>,
    pull: BTreeSet<usize>,
    push: Vec<(usize, S)>,
}

impl<'g, S: State> Planner<'g, S> {
    fn new(graph: &'g CompiledGraph<S>) -> Self {
        Planner {
            graph,
            pull: BTreeSet::new(),
            push: Vec::new(),
        }
    }

    fn target(&mut self, t: Option<usize>) {
        if let Some(i) = t {
            self.pull.insert(i);
        }
    }

    fn goto(
        &mut self,
        from: &str,
        goto: Goto<S>,
        branch: Option<&Branch<S>>,
    ) -> Result<(), StepError> {
        let (label, payload) = match goto {
            Goto::Node(n) => (n, None),
            Goto::Send(s) => (s.node, Some(s.input)),
        };
        let name = match branch {
            Some(b) => b.resolve(&label).ok_or_else(|| StepError::UnknownTarget {
                from: from.to_string(),
                target: label.clone(),
            })?,
            None => label.as_str(),
        };
        if name == END {
            return Ok(());
        }
        let idx = self
            .graph
            .node_index(name)
            .ok_or_else(|| StepError::UnknownTarget {
                from: from.to_string(),
                target: name.to_string(),
            })?;
        match payload {
            None => {
                self.pull.insert(idx);
            }
            Some(input) => self.push.push((idx, input)),
        }
        Ok(())
    }

    fn branch(&mut self, from: &str, branch: &Branch<S>, state: &S) -> Result<(), StepError> {
        let route = catch_unwind(AssertUnwindSafe(|| (branch.router)(state))).map_err(|p| {
            StepError::RouterPanicked {
                from: from.to_string(),
                message: panic_message(p.as_ref()),
            }
        })?;
        for goto in route.0 {
            self.goto(from, goto, Some(branch))?;
        }
        Ok(())
    }

    fn finish(self, checkpoint_id: &str) -> Vec<PlannedTask<S>> {
        let spec = self.graph.spec();
        let mut tasks = Vec::with_capacity(self.pull.len() + self.push.len());
        for i in self.pull {
            let node = spec.nodes[i].name.to_string();
            let id = stable_hash(&[checkpoint_id.as_bytes(), b"pull", node.as_bytes()]);
            tasks.push(PlannedTask {
                id,
                node,
                input: None,
            });
        }
        for (n, (i, input)) in self.push.into_iter().enumerate() {
            let node = spec.nodes[i].name.to_string();
            let id = stable_hash(&[
                checkpoint_id.as_bytes(),
                b"push",
                node.as_bytes(),
                n.to_string().as_bytes(),
            ]);
            tasks.push(PlannedTask {
                id,
                node,
                input: Some(input),
            });
        }
        tasks
    }
}

impl<S: State> CompiledGraph<S> {
    /// The input step: merges `input` (if any) into `base`'s state and plans the tasks that
    /// follow START. Pending tasks of `base` are dropped: new input starts a new run.
    pub fn plan_input(
        &self,
        base: &Frame<S>,
        input: Option<S::Update>,
    ) -> Result<StepCommit<S>, StepError> {
        let mut state = base.state.clone();
        let mut writes = Vec::new();
        if let Some(update) = input {
            Arc::make_mut(&mut state)
                .apply(update.clone())
                .map_err(|source| StepError::Reducer {
                    node: "__input__".into(),
                    source,
                })?;
            writes.push(("__input__".to_string(), update));
        }
        let checkpoint_id = ordered_id();
        let spec = self.spec();
        let mut planner = Planner::new(self);
        for &t in &spec.start_edges {
            planner.target(t);
        }
        for b in &spec.start_branches {
            planner.branch("__start__", b, &state)?;
        }
        let next = planner.finish(&checkpoint_id);
        Ok(StepCommit {
            frame: Frame {
                checkpoint_id,
                parent_id: Some(base.checkpoint_id.clone()),
                step: base.step,
                state,
                next,
                joins: vec![BTreeSet::new(); spec.joins.len()],
            },
            writes,
        })
    }

    fn is_deferred(&self, node: &str) -> bool {
        let deferred = &self.spec().deferred;
        !deferred.is_empty() && self.node_index(node).is_some_and(|i| deferred.contains(&i))
    }

    /// The tasks of `next` that run in the coming step: all of them, except that deferred
    /// nodes' tasks wait while a task of a node that is not deferred is planned.
    pub fn runnable<'a>(
        &'a self,
        next: &'a [PlannedTask<S>],
    ) -> impl Iterator<Item = &'a PlannedTask<S>> + 'a {
        let hold =
            !self.spec().deferred.is_empty() && next.iter().any(|t| !self.is_deferred(&t.node));
        next.iter()
            .filter(move |t| !hold || !self.is_deferred(&t.node))
    }

    /// The barrier: merges the outputs of a completed step (given in plan order) and plans the
    /// next one. Deferred tasks of `frame` that did not run stay planned.
    pub fn commit_step(
        &self,
        frame: &Frame<S>,
        mut finished: Vec<FinishedTask<S>>,
    ) -> Result<StepCommit<S>, StepError> {
        // Conflicts are found before anything is applied.
        let mut first_writer: Vec<(&'static str, usize)> = Vec::new();
        for (t, f) in finished.iter().enumerate() {
            if f.output.target == CommandTarget::Parent {
                return Err(StepError::NoParentGraph {
                    node: f.task.node.clone(),
                });
            }
            let mut fields: Vec<&'static str> = Vec::new();
            for u in &f.output.updates {
                S::overwritten_fields(u, &mut |name| {
                    if !fields.contains(&name) {
                        fields.push(name)
                    }
                });
            }
            // An overwrite is an exclusive write of every field it sets, whatever its rule.
            for u in &f.output.overwrites {
                for name in u.fields_set() {
                    if !fields.contains(&name) {
                        fields.push(name)
                    }
                }
            }
            for field in fields {
                match first_writer.iter().find(|(n, _)| *n == field) {
                    Some(&(_, other)) => {
                        return Err(StepError::ConflictingWrites {
                            field,
                            first: finished[other].task.node.clone(),
                            second: f.task.node.clone(),
                        })
                    }
                    None => first_writer.push((field, t)),
                }
            }
        }

        let mut state = frame.state.clone();
        let outputs = finished
            .iter_mut()
            .map(|f| {
                (
                    f.task.node.clone(),
                    std::mem::take(&mut f.output.updates),
                    std::mem::take(&mut f.output.overwrites),
                )
            })
            .collect();
        let writes = merge_outputs(Arc::make_mut(&mut state), outputs)?;

        let checkpoint_id = ordered_id();
        let spec = self.spec();
        // Only a graph with deferred nodes needs to know which planned tasks ran.
        let ran: Vec<String> = if spec.deferred.is_empty() {
            Vec::new()
        } else {
            finished.iter().map(|f| f.task.id.clone()).collect()
        };
        let mut planner = Planner::new(self);
        let mut joins = frame.joins.clone();
        joins.resize(spec.joins.len(), BTreeSet::new());
        for f in finished {
            let from = f.task.node.as_str();
            let Some(i) = self.node_index(from) else {
                return Err(StepError::UnknownTarget {
                    from: "plan".into(),
                    target: from.to_string(),
                });
            };
            for goto in f.output.goto {
                planner.goto(from, goto, None)?;
            }
            for &t in &spec.edges[i] {
                planner.target(t);
            }
            for b in &spec.branches[i] {
                planner.branch(from, b, &state)?;
            }
            for &j in &spec.joins_of[i] {
                joins[j].insert(from.to_string());
            }
        }
        for (j, join) in spec.joins.iter().enumerate() {
            let complete = join
                .sources
                .iter()
                .all(|&s| joins[j].contains(&*spec.nodes[s].name));
            if complete {
                joins[j].clear();
                planner.target(join.target);
            }
        }
        let mut next = planner.finish(&checkpoint_id);
        // Deferred tasks that waited through this step wait on (with their ids, so nothing
        // recorded for them is lost); one planned again is not planned twice.
        let mut waited: Vec<PlannedTask<S>> = if spec.deferred.is_empty() {
            Vec::new()
        } else {
            frame
                .next
                .iter()
                .filter(|t| !ran.contains(&t.id) && self.is_deferred(&t.node))
                .cloned()
                .collect()
        };
        if !waited.is_empty() {
            next.retain(|t| {
                t.input.is_some() || !waited.iter().any(|w| w.input.is_none() && w.node == t.node)
            });
            waited.append(&mut next);
            next = waited;
        }
        Ok(StepCommit {
            frame: Frame {
                checkpoint_id,
                parent_id: Some(frame.checkpoint_id.clone()),
                step: frame.step + 1,
                state,
                next,
                joins,
            },
            writes,
        })
    }

    /// A command given as a run's input (LangGraph's `Command(update=..., goto=...)`): merges
    /// `update` into `frame`'s state as input and adds a task for every `goto` target to the
    /// tasks already planned, which keep their ids (so their pending writes, interrupts and
    /// resume values still apply). `overwrite` is applied after `update` (see
    /// [`crate::node::Command::overwrite`]). Nothing starts at START: with nothing planned and
    /// no `goto`, nothing runs.
    pub fn commit_command(
        &self,
        frame: &Frame<S>,
        update: Option<S::Update>,
        overwrite: Option<S::Update>,
        goto: Vec<Goto<S>>,
    ) -> Result<StepCommit<S>, StepError> {
        let mut state = frame.state.clone();
        let writes = if update.is_none() && overwrite.is_none() {
            Vec::new()
        } else {
            merge_outputs(
                Arc::make_mut(&mut state),
                vec![(
                    "__input__".to_string(),
                    update.into_iter().collect(),
                    overwrite.into_iter().collect(),
                )],
            )?
        };
        let checkpoint_id = ordered_id();
        let mut planner = Planner::new(self);
        for g in goto {
            planner.goto("__command__", g, None)?;
        }
        let mut next = frame.next.clone();
        for task in planner.finish(&checkpoint_id) {
            let planned_already = task.input.is_none()
                && next
                    .iter()
                    .any(|t| t.input.is_none() && t.node == task.node);
            if !planned_already {
                next.push(task);
            }
        }
        let mut joins = frame.joins.clone();
        joins.resize(self.spec().joins.len(), BTreeSet::new());
        Ok(StepCommit {
            frame: Frame {
                checkpoint_id,
                parent_id: Some(frame.checkpoint_id.clone()),
                step: frame.step,
                state,
                next,
                joins,
            },
            writes,
        })
    }

    /// Applies `update` as if node `as_node` had written it (or as input if `None`), and plans
    /// what would follow that node. Used to edit a thread's state from outside. Without a node
    /// the planned tasks are kept as they are (ids included), so a paused thread can be edited
    /// and then continued or resumed.
    pub fn commit_external_update(
        &self,
        frame: &Frame<S>,
        as_node: Option<&str>,
        update: S::Update,
    ) -> Result<StepCommit<S>, StepError> {
        match as_node {
            None => {
                // An update without a node keeps the pending tasks.
                self.commit_command(frame, Some(update), None, Vec::new())
            }
            Some(node) => {
                if self.node_index(node).is_none() {
                    return Err(StepError::UnknownTarget {
                        from: "update_state".into(),
                        target: node.to_string(),
                    });
                }
                let task = PlannedTask {
                    id: stable_hash(&[frame.checkpoint_id.as_bytes(), b"update", node.as_bytes()]),
                    node: node.to_string(),
                    input: None,
                };
                let mut commit = self.commit_step(
                    frame,
                    vec![FinishedTask {
                        task,
                        output: NodeOutput::update(update),
                    }],
                )?;
                commit.frame.step = frame.step;
                Ok(commit)
            }
        }
    }

    /// One superstep of edits from outside (a step of a bulk update): one edit is
    /// [`CompiledGraph::commit_external_update`]; several are merged like the outputs of a
    /// step, one task per edit, so two edits of an overwrite field conflict. Each of several
    /// edits must name its node.
    pub fn commit_edits(
        &self,
        frame: &Frame<S>,
        mut edits: Vec<(Option<String>, S::Update)>,
    ) -> Result<StepCommit<S>, StepError> {
        if edits.len() == 1 {
            if let Some((as_node, update)) = edits.pop() {
                return self.commit_external_update(frame, as_node.as_deref(), update);
            }
        }
        let mut finished = Vec::with_capacity(edits.len());
        for (n, (as_node, update)) in edits.into_iter().enumerate() {
            let Some(node) = as_node else {
                return Err(StepError::InvalidEdit(
                    "a step of several edits must name the node of each".into(),
                ));
            };
            if self.node_index(&node).is_none() {
                return Err(StepError::UnknownTarget {
                    from: "update_state".into(),
                    target: node,
                });
            }
            let id = stable_hash(&[
                frame.checkpoint_id.as_bytes(),
                b"update",
                node.as_bytes(),
                n.to_string().as_bytes(),
            ]);
            finished.push(FinishedTask {
                task: PlannedTask {
                    id,
                    node,
                    input: None,
                },
                output: NodeOutput::update(update),
            });
        }
        let mut commit = self.commit_step(frame, finished)?;
        commit.frame.step = frame.step;
        Ok(commit)
    }
}
