//! The agents, one node each, by bounded context, and what every agent step shares: the
//! outbox dispatch before the step, the inbox, the model call with its conversation record,
//! guarded transitions, audit entries and the update that carries them.

mod coordination;
mod deployment;
mod design;
mod implementation;
mod quality;
mod requirement;

pub use coordination::EscalationAnswer;
pub(crate) use coordination::*;
pub(crate) use deployment::*;
pub(crate) use design::*;
pub(crate) use implementation::*;
pub(crate) use quality::*;
pub use requirement::GateAnswer;
pub(crate) use requirement::*;

use crate::bus::{ConversationEntry, Delivered, TeamStore};
use crate::domain::now;
use crate::events::{message_id, DomainEvent, Envelope};
use crate::lifecycle::{self, GuardContext, ReqState, TransitionRecord};
use crate::state::{status, AuditEntry, TeamState, TeamStateUpdate};
use crate::{artifacts, TeamSettings};
use ferrograph::chat::agent::{AgentLlm, LlmCall};
use ferrograph::chat::TokenSink;
use ferrograph::core::message::Message;
use ferrograph::prelude::*;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub(crate) type Update = TeamStateUpdate;

pub(crate) struct Deps {
    pub(crate) settings: TeamSettings,
}

impl Deps {
    pub(crate) fn store(&self) -> TeamStore {
        self.settings.store()
    }

    /// Stops the process with SIGKILL at `point` when the crash tests ask for it.
    pub(crate) fn crash_point(&self, point: &str) {
        if self.settings.crash_at.as_deref() != Some(point) {
            return;
        }
        tracing::warn!(point, "crash point reached: killing this process");
        #[cfg(unix)]
        {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL);
        }
        std::process::abort();
    }

    fn llm(&self) -> Result<&AgentLlm, String> {
        self.settings.llm.as_ref().ok_or_else(|| {
            "no model is configured for the team (set FERROGRAPH_MODEL to a GGUF file or `default`, or [workflows.team] model in the config file)".to_string()
        })
    }
}

/// The run's id: the thread.
pub(crate) fn run_id(ctx: &NodeContext) -> String {
    ctx.thread_id().unwrap_or("local").to_string()
}

/// A failed step: `error`, the status, an audit line; the run ends.
pub(crate) fn failed(agent: &str, msg: impl Into<String>) -> Update {
    let msg = msg.into();
    tracing::warn!(agent, error = %msg, "team step failed");
    Update::new()
        .error(Some(msg.clone()))
        .status(status::FAILED.to_string())
        .audit(vec![AuditEntry {
            at: now(),
            agent: agent.to_string(),
            kind: "error".into(),
            detail: msg.clone(),
            data: String::new(),
        }])
        .messages(vec![format!("{agent}: error: {msg}")])
}

/// One agent step in progress.
pub(crate) struct Turn {
    pub(crate) run: String,
    step: u64,
    pub(crate) agent: &'static str,
    next_message: usize,
    next_entry: usize,
    pub(crate) lifecycle: ReqState,
    pub(crate) guards: GuardContext,
    events: Vec<Envelope>,
    envelopes: Vec<Envelope>,
    audit: Vec<AuditEntry>,
    transitions: Vec<TransitionRecord>,
    messages: Vec<String>,
    llm_calls: Vec<LlmCall>,
    /// What the agent received, in order.
    pub(crate) inbox: Vec<Delivered>,
    pub(crate) run_dir: PathBuf,
    sink: Option<TokenSink>,
}

impl Turn {
    /// Dispatches the outbox (at least once, deduplicated by id), then reads the agent's
    /// inbox.
    pub(crate) fn begin(
        d: &Deps,
        s: &TeamState,
        ctx: &NodeContext,
        agent: &'static str,
    ) -> Result<Turn, String> {
        d.crash_point(&format!("before_dispatch:{}", ctx.node()));
        let run = run_id(ctx);
        let store = d.store();
        let run_dir = PathBuf::from(&s.run_dir);
        if !s.outbox.pending.is_empty() {
            let mid = format!("mid_dispatch:{}", ctx.node());
            store
                .dispatch(&run, &s.outbox.pending, &|i| {
                    if i == 0 {
                        d.crash_point(&mid)
                    }
                })
                .map_err(|e| format!("dispatching events: {e}"))?;
            if !s.run_dir.is_empty() {
                let log = store.events(&run).map_err(|e| e.to_string())?;
                artifacts::write_jsonl(&run_dir.join("events.jsonl"), &log)
                    .map_err(|e| e.to_string())?;
            }
        }
        d.crash_point(&format!("after_dispatch:{}", ctx.node()));
        let inbox = store.inbox(&run, agent).map_err(|e| e.to_string())?;
        Ok(Turn {
            run,
            step: ctx.step(),
            agent,
            next_message: 0,
            next_entry: 0,
            lifecycle: s.lifecycle,
            guards: GuardContext {
                stories_approved: s.requirement.stories_approved,
                self_tests_passing: s
                    .implementation
                    .self_tests
                    .as_ref()
                    .is_some_and(|t| t.passing()),
                deployment_approved: s.deployment.approved,
                attempts: s.implementation.attempts,
                manager_retry: false,
            },
            events: Vec::new(),
            envelopes: Vec::new(),
            audit: Vec::new(),
            transitions: Vec::new(),
            messages: Vec::new(),
            llm_calls: Vec::new(),
            inbox,
            run_dir,
            sink: TokenSink::from_context(ctx),
        })
    }

    fn next_id(&mut self) -> String {
        let id = message_id(&self.run, self.step, self.agent, self.next_message);
        self.next_message += 1;
        id
    }

    /// Writes `event` to the outbox (dispatched before the next agent step).
    pub(crate) fn emit(&mut self, event: DomainEvent) {
        let id = self.next_id();
        self.events.push(Envelope::event(id, self.agent, &event));
    }

    /// Records a command to `target`.
    pub(crate) fn command(&mut self, target: &str, name: &str, payload: Value) {
        let id = self.next_id();
        self.envelopes
            .push(Envelope::command(id, self.agent, target, name, payload));
    }

    /// Records a query to `target` and `target`'s response.
    pub(crate) fn query(&mut self, target: &str, name: &str, payload: Value, answer: Value) {
        let q = Envelope::query(self.next_id(), self.agent, target, name, payload);
        let r = Envelope::response(self.next_id(), &q, answer);
        self.envelopes.push(q);
        self.envelopes.push(r);
    }

    /// The events of kind `name` the agent received, newest last.
    pub(crate) fn received(&self, name: &str) -> Vec<DomainEvent> {
        self.inbox
            .iter()
            .filter(|d| d.envelope.name() == name)
            .filter_map(|d| d.envelope.domain_event())
            .collect()
    }

    /// Adds an audit line.
    pub(crate) fn audit(&mut self, kind: &str, detail: impl Into<String>, data: Value) {
        self.audit.push(AuditEntry {
            at: now(),
            agent: self.agent.to_string(),
            kind: kind.to_string(),
            detail: detail.into(),
            data: if data.is_null() {
                String::new()
            } else {
                data.to_string()
            },
        });
    }

    /// A progress line.
    pub(crate) fn say(&mut self, line: impl Into<String>) {
        self.messages
            .push(format!("{}: {}", self.agent, line.into()));
    }

    /// Moves the requirement to `to` if the table and guards allow it; a refusal changes
    /// nothing and is audited.
    pub(crate) fn transition(
        &mut self,
        to: ReqState,
        event: &str,
        note: impl Into<String>,
    ) -> bool {
        let note = note.into();
        match lifecycle::transition(self.lifecycle, to, &self.guards, self.agent, event, note) {
            Ok(r) => {
                self.audit(
                    "transition",
                    format!("{} → {} ({event})", r.from_state, r.to_state),
                    json!({"guard": r.guard, "note": r.note}),
                );
                self.lifecycle = to;
                self.transitions.push(r);
                true
            }
            Err(e) => {
                self.audit(
                    "refused",
                    e.to_string(),
                    json!({"from": e.from, "to": e.to}),
                );
                false
            }
        }
    }

    /// Asks the agent's model for a `T`, recording the conversation and the call. `None`
    /// when the call failed (audited).
    pub(crate) async fn ask<T: JsonSchema + DeserializeOwned + Serialize>(
        &mut self,
        d: &Deps,
        purpose: &str,
        system: String,
        task: String,
        max_tokens: usize,
        patch: impl Fn(&mut Value),
    ) -> Result<Option<T>, String> {
        let llm = d.llm()?;
        let msgs = vec![
            Message::system(system.clone()),
            Message::human(task.clone()),
        ];
        let (res, call) = llm
            .structured::<T>(purpose, &msgs, max_tokens, patch, self.sink.clone())
            .await;
        let model = call.model.clone();
        self.converse(d, "system", &system, None, &model)?;
        self.converse(d, "user", &task, Some(call.prompt_tokens), &model)?;
        let out = match res {
            Ok(v) => {
                let text = serde_json::to_string(&v).unwrap_or_default();
                self.converse(d, "assistant", &text, Some(call.completion_tokens), &model)?;
                Some(v)
            }
            Err(e) => {
                self.converse(
                    d,
                    "assistant",
                    &format!("(no usable answer: {e})"),
                    Some(call.completion_tokens),
                    &model,
                )?;
                self.audit(
                    "model",
                    format!("{purpose}: the model gave no usable answer: {e}"),
                    Value::Null,
                );
                None
            }
        };
        self.llm_calls.push(call);
        Ok(out)
    }

    fn converse(
        &mut self,
        d: &Deps,
        role: &str,
        content: &str,
        tokens: Option<u32>,
        model: &str,
    ) -> Result<(), String> {
        let entry = ConversationEntry {
            entry_id: format!("{:08}-{:02}", self.step, self.next_entry),
            agent_id: self.agent.to_string(),
            task_id: self.run.clone(),
            role: role.to_string(),
            content: content.to_string(),
            timestamp: now(),
            token_count: tokens,
            model: Some(model.to_string()),
        };
        self.next_entry += 1;
        d.store()
            .save_entry(&entry)
            .map_err(|e| format!("saving the conversation: {e}"))
    }

    /// The agent's last answer in this run (its memory), if any.
    pub(crate) fn last_answer(&self, d: &Deps) -> Option<String> {
        d.store()
            .history(&self.run, self.agent, Some(8))
            .ok()?
            .into_iter()
            .rev()
            .find(|e| e.role == "assistant")
            .map(|e| e.content)
    }

    /// The update: `u` plus the outbox (pending dispatched, new events queued), the
    /// lifecycle, and the step's records; the audit trail and transitions are written to
    /// the run's folder.
    pub(crate) fn finish(self, s: &TeamState, u: Update) -> Result<Update, String> {
        if !self.run_dir.as_os_str().is_empty() {
            let mut audit = s.audit.clone();
            audit.extend(self.audit.iter().cloned());
            artifacts::write_jsonl(&self.run_dir.join("audit.jsonl"), &audit)
                .map_err(|e| e.to_string())?;
            let mut tr = s.transitions.clone();
            tr.extend(self.transitions.iter().cloned());
            artifacts::write_jsonl(&self.run_dir.join("transitions.jsonl"), &tr)
                .map_err(|e| e.to_string())?;
        }
        if !self.run_dir.as_os_str().is_empty() {
            let summary = json!({
                "run": self.run,
                "lifecycle": self.lifecycle,
                "status": u.status.clone().unwrap_or_else(|| s.status.clone()),
                "current_agent": self.agent,
                "updated_at": now(),
                "blockers": u.blockers.clone().unwrap_or_else(|| s.blockers.clone()),
                "deployment_path": u.deployment.as_ref().unwrap_or(&s.deployment).status.deployment_path,
            });
            artifacts::write_text(&self.run_dir.join("run.json"), &format!("{summary:#}\n"))
                .map_err(|e| e.to_string())?;
        }
        let mut u = u
            .outbox(s.outbox.dispatched().with(self.events))
            .current_agent(self.agent.to_string())
            .transitions(self.transitions)
            .audit(self.audit)
            .agent_messages(self.envelopes)
            .messages(self.messages)
            .llm_calls(self.llm_calls);
        if self.lifecycle != s.lifecycle {
            u = u.lifecycle(self.lifecycle);
        }
        Ok(u)
    }
}

/// The update of a gate's step, or the failure that ends the run.
pub(crate) fn settle(agent: &str, r: Result<Update, String>) -> Update {
    r.unwrap_or_else(|e| failed(agent, e))
}

/// Runs an agent body; an infrastructure error (store, workspace, sandbox) ends the run
/// with `error` set.
#[macro_export]
#[doc(hidden)]
macro_rules! agent_step {
    ($agent:expr, $body:expr) => {
        match $body {
            Ok(u) => Ok(u),
            Err(e) => Ok($crate::nodes::failed($agent, e)),
        }
    };
}

/// Whether a model's text is usable prose: not empty, not looping.
pub(crate) fn usable(text: &str) -> bool {
    !text.trim().is_empty() && !ferrograph::chat::agent::degenerate(text)
}

/// Content words of `text` (four letters or more, lowercased).
pub(crate) fn words(text: &str) -> std::collections::BTreeSet<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.len() >= 4)
        .map(str::to_lowercase)
        .collect()
}

/// Whether `text` shares a content word with `source` (it is about the brief, not invented).
pub(crate) fn grounded(text: &str, source: &str) -> bool {
    !words(text).is_disjoint(&words(source))
}

pub(crate) fn rel(p: &Path) -> String {
    p.display().to_string()
}
