//! Agent communication (the seed's section 5): one envelope for commands, events, queries and
//! their responses; domain events as typed, immutable, past-tense facts; who subscribes to
//! what; and the outbox that events wait in, inside the checkpointed state, until they are
//! dispatched.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The envelope's schema version.
pub const ENVELOPE_VERSION: &str = "1.0";

/// The agents (each is a node of the graph).
pub mod agent {
    /// Product owner.
    pub const PO: &str = "po_agent";
    /// Business analyst.
    pub const BA: &str = "ba_agent";
    /// Technical architect.
    pub const TA: &str = "ta_agent";
    /// Tech lead.
    pub const TL: &str = "tl_agent";
    /// Senior software engineer.
    pub const SSE: &str = "sse_agent";
    /// QC engineer.
    pub const QC: &str = "qc_agent";
    /// DevOps engineer.
    pub const DEVOPS: &str = "devops_agent";
    /// Project manager.
    pub const PM: &str = "pm_agent";
    /// All of them.
    pub const ALL: [&str; 8] = [PO, BA, TA, TL, SSE, QC, DEVOPS, PM];
}

/// What kind of message an envelope carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageType {
    /// Do something (one target).
    Command,
    /// Something happened (broadcast to subscribers).
    Event,
    /// Tell me something (one target).
    Query,
    /// The answer to a query (carries its correlation id).
    QueryResponse,
}

/// Facts, named in the past tense. Once made, an event is never changed: the envelope has
/// no setters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event_name", content = "payload")]
#[non_exhaustive]
pub enum DomainEvent {
    /// The product owner clarified the brief.
    RequirementsClarified {
        /// `REQ-…`.
        requirement_id: String,
        /// How many objectives.
        objectives: usize,
    },
    /// The brief cannot be worked on.
    RequirementBlocked {
        /// The blocker.
        blocker_id: String,
        /// Why.
        description: String,
    },
    /// The analyst wrote stories.
    UserStoriesCreated {
        /// `REQ-…`.
        requirement_id: String,
        /// Their ids.
        story_ids: Vec<String>,
        /// How many.
        story_count: usize,
    },
    /// A human approved the stories.
    StoriesApproved {
        /// Their ids.
        story_ids: Vec<String>,
    },
    /// A human rejected the stories.
    StoriesRejected {
        /// Why.
        reason: String,
    },
    /// The tech lead approved the design.
    DesignApproved {
        /// `SPEC-…`.
        spec_id: String,
        /// Tasks planned.
        task_count: usize,
    },
    /// The engineer's code passes its own tests.
    CodeArtifactReady {
        /// The artifact.
        artifact_id: String,
        /// Stories it serves.
        story_ids: Vec<String>,
        /// Line coverage (percent).
        test_coverage: f64,
        /// Always true: the event is only raised then.
        self_tests_passing: bool,
    },
    /// The tech lead's code review failed.
    CodeReviewFailed {
        /// The artifact.
        artifact_id: String,
        /// Why.
        notes: Vec<String>,
    },
    /// QC's tests or gates failed.
    TestsFailed {
        /// The artifact.
        artifact_id: String,
        /// What failed.
        failure_summary: String,
        /// Failing tests.
        failed_test_ids: Vec<String>,
    },
    /// QC's gates passed.
    QualityGatePassed {
        /// The artifact.
        artifact_id: String,
        /// 0 to 100.
        quality_score: f64,
        /// Tests passed.
        passed: u32,
        /// Coverage (percent).
        coverage_percent: f64,
    },
    /// DevOps prepared the pipeline and the runbook.
    DeploymentPrepared {
        /// `CI-…`.
        config_id: String,
    },
    /// A human rejected the deployment.
    DeploymentRejected {
        /// Why.
        reason: String,
    },
    /// The release is live.
    Deployed {
        /// Its tag.
        version: String,
        /// Its folder.
        path: String,
    },
    /// The release failed and was compensated.
    DeploymentFailed {
        /// Why.
        reason: String,
        /// The compensations that ran, in order.
        compensated: Vec<String>,
    },
    /// Too many failed attempts: the manager has it.
    RequirementEscalated {
        /// Failed attempts.
        attempts: u32,
        /// The last failure.
        last_failure: String,
    },
}

impl DomainEvent {
    /// Its name (`CodeArtifactReady`, …).
    pub fn name(&self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| {
                v.get("event_name")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
            .unwrap_or_default()
    }
}

/// Who receives an event (the seed's subscriptions). The product owner subscribes to
/// nothing: it hears of the work at the human gates only.
pub fn subscribers(event_name: &str) -> &'static [&'static str] {
    use agent::*;
    match event_name {
        "RequirementsClarified" => &[BA],
        "UserStoriesCreated" => &[PM],
        "StoriesApproved" => &[TA, PM],
        "StoriesRejected" => &[PM],
        "DesignApproved" => &[SSE, PM],
        "CodeArtifactReady" => &[QC, TL],
        "CodeReviewFailed" => &[SSE],
        "TestsFailed" => &[SSE, PM],
        "QualityGatePassed" => &[DEVOPS, PM],
        "DeploymentPrepared" => &[PM],
        "DeploymentRejected" => &[QC, PM],
        "Deployed" | "DeploymentFailed" | "RequirementBlocked" | "RequirementEscalated" => &[PM],
        _ => &[],
    }
}

/// The universal message envelope. Its fields are read-only: a message, once made, is a
/// record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    message_id: String,
    message_type: MessageType,
    event_name: String,
    source_agent: String,
    target_agent: Option<String>,
    correlation_id: Option<String>,
    /// The payload as JSON text (checkpoints are encoded with a format that cannot hold an
    /// arbitrary JSON value).
    payload: String,
    timestamp: String,
    schema_version: String,
}

/// A message id that is the same when a step runs again after a crash: the run, the step,
/// the agent and the message's place in the step, hashed.
pub fn message_id(run: &str, step: u64, source: &str, index: usize) -> String {
    let h = Sha256::digest(format!("{run}\0{step}\0{source}\0{index}").as_bytes());
    let hex: String = h.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

impl Envelope {
    fn new(
        id: String,
        kind: MessageType,
        name: &str,
        source: &str,
        target: Option<&str>,
        correlation: Option<String>,
        payload: Value,
    ) -> Self {
        Envelope {
            message_id: id,
            message_type: kind,
            event_name: name.to_string(),
            source_agent: source.to_string(),
            target_agent: target.map(str::to_string),
            correlation_id: correlation,
            payload: payload.to_string(),
            timestamp: crate::domain::now(),
            schema_version: ENVELOPE_VERSION.to_string(),
        }
    }

    /// An event, broadcast to its subscribers.
    pub fn event(id: String, source: &str, event: &DomainEvent) -> Self {
        let v = serde_json::to_value(event).unwrap_or(Value::Null);
        let payload = v.get("payload").cloned().unwrap_or(Value::Null);
        Self::new(
            id,
            MessageType::Event,
            &event.name(),
            source,
            None,
            None,
            payload,
        )
    }

    /// A command to one agent.
    pub fn command(id: String, source: &str, target: &str, name: &str, payload: Value) -> Self {
        Self::new(
            id,
            MessageType::Command,
            name,
            source,
            Some(target),
            None,
            payload,
        )
    }

    /// A query to one agent; its id is the correlation id of the response.
    pub fn query(id: String, source: &str, target: &str, name: &str, payload: Value) -> Self {
        let c = Some(id.clone());
        Self::new(
            id,
            MessageType::Query,
            name,
            source,
            Some(target),
            c,
            payload,
        )
    }

    /// The response to `query`, from its target.
    pub fn response(id: String, query: &Envelope, payload: Value) -> Self {
        Self::new(
            id,
            MessageType::QueryResponse,
            &format!("{}Response", query.event_name),
            query.target_agent.as_deref().unwrap_or_default(),
            Some(&query.source_agent),
            query.correlation_id.clone(),
            payload,
        )
    }

    /// Its id.
    pub fn id(&self) -> &str {
        &self.message_id
    }
    /// Its kind.
    pub fn kind(&self) -> MessageType {
        self.message_type
    }
    /// The event's or command's name.
    pub fn name(&self) -> &str {
        &self.event_name
    }
    /// Who sent it.
    pub fn source(&self) -> &str {
        &self.source_agent
    }
    /// Its target (commands, queries, responses).
    pub fn target(&self) -> Option<&str> {
        self.target_agent.as_deref()
    }
    /// Links a query to its response.
    pub fn correlation_id(&self) -> Option<&str> {
        self.correlation_id.as_deref()
    }
    /// The payload.
    pub fn payload(&self) -> Value {
        serde_json::from_str(&self.payload).unwrap_or(Value::Null)
    }
    /// When it was made.
    pub fn timestamp(&self) -> &str {
        &self.timestamp
    }
    /// Its schema version.
    pub fn schema_version(&self) -> &str {
        &self.schema_version
    }
    /// The typed event it carries, if it is an event this build knows.
    pub fn domain_event(&self) -> Option<DomainEvent> {
        serde_json::from_value(
            serde_json::json!({"event_name": self.event_name, "payload": self.payload()}),
        )
        .ok()
    }
    /// Who receives it: an event's subscribers, or the target.
    pub fn recipients(&self) -> Vec<String> {
        match (self.message_type, &self.target_agent) {
            (MessageType::Event, _) => subscribers(&self.event_name)
                .iter()
                .map(|s| s.to_string())
                .collect(),
            (_, Some(t)) => vec![t.clone()],
            _ => Vec::new(),
        }
    }
}

/// Events written by agents and not yet dispatched, inside the checkpointed state; and the
/// ids of those dispatched, in order.
///
/// Mended from the seed: its `dispatch_events` kept delivered entries as pending and moved
/// the newly delivered ones nowhere (the two lists were swapped). Here an event leaves
/// `pending` only in the same checkpoint that records its id in `delivered`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Outbox {
    /// Waiting for dispatch, oldest first.
    pub pending: Vec<Envelope>,
    /// Ids dispatched, in order.
    pub delivered: Vec<String>,
}

impl Outbox {
    /// `self` with `events` added to the pending ones (an id already known is not added
    /// twice).
    pub fn with(&self, events: Vec<Envelope>) -> Outbox {
        let mut o = self.clone();
        for e in events {
            let known = o.delivered.iter().any(|d| d == e.id())
                || o.pending.iter().any(|p| p.id() == e.id());
            if !known {
                o.pending.push(e);
            }
        }
        o
    }

    /// `self` after every pending event was dispatched.
    pub fn dispatched(&self) -> Outbox {
        let mut delivered = self.delivered.clone();
        delivered.extend(self.pending.iter().map(|e| e.id().to_string()));
        Outbox {
            pending: Vec::new(),
            delivered,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn subscriptions_follow_the_seed() {
        assert_eq!(subscribers("CodeArtifactReady"), &[agent::QC, agent::TL]);
        assert_eq!(subscribers("QualityGatePassed")[0], agent::DEVOPS);
        assert_eq!(subscribers("TestsFailed")[0], agent::SSE);
        let all = [
            "RequirementsClarified",
            "RequirementBlocked",
            "UserStoriesCreated",
            "StoriesApproved",
            "StoriesRejected",
            "DesignApproved",
            "CodeArtifactReady",
            "CodeReviewFailed",
            "TestsFailed",
            "QualityGatePassed",
            "DeploymentPrepared",
            "DeploymentRejected",
            "Deployed",
            "DeploymentFailed",
            "RequirementEscalated",
        ];
        for e in all {
            assert!(
                !subscribers(e).contains(&agent::PO),
                "{e} reaches the product owner"
            );
            assert!(!subscribers(e).is_empty(), "{e} reaches nobody");
        }
    }

    #[test]
    fn envelopes_carry_typed_events_and_correlate_queries() {
        let ev = DomainEvent::TestsFailed {
            artifact_id: "A".into(),
            failure_summary: "2 failed".into(),
            failed_test_ids: vec!["t".into()],
        };
        let e = Envelope::event(message_id("r", 3, agent::QC, 0), agent::QC, &ev);
        assert_eq!(e.name(), "TestsFailed");
        assert_eq!(e.kind(), MessageType::Event);
        assert_eq!(e.domain_event(), Some(ev));
        assert_eq!(e.recipients(), vec![agent::SSE, agent::PM]);
        assert_eq!(e.schema_version(), ENVELOPE_VERSION);
        let q = Envelope::query(
            "q1".into(),
            agent::DEVOPS,
            agent::QC,
            "QualityReport",
            Value::Null,
        );
        let r = Envelope::response("r1".into(), &q, serde_json::json!({"score": 90}));
        assert_eq!(r.correlation_id(), Some("q1"));
        assert_eq!(r.target(), Some(agent::DEVOPS));
        assert_eq!(r.source(), agent::QC);
        assert_eq!(message_id("r", 3, "x", 0), message_id("r", 3, "x", 0));
        assert_ne!(message_id("r", 3, "x", 0), message_id("r", 3, "x", 1));
    }

    #[test]
    fn outbox_moves_events_once() {
        let ev = DomainEvent::StoriesRejected { reason: "x".into() };
        let a = Envelope::event("a".into(), agent::PM, &ev);
        let o = Outbox::default().with(vec![a.clone(), a.clone()]);
        assert_eq!(o.pending.len(), 1);
        let d = o.dispatched();
        assert!(d.pending.is_empty());
        assert_eq!(d.delivered, vec!["a"]);
        assert_eq!(
            d.with(vec![a]).pending.len(),
            0,
            "a delivered id is not queued again"
        );
    }
}
