//! Every route of the team graph on the word-statistics fixture with the scripted model:
//! the happy path through all nine states, a vague brief, both gate rejections, three
//! failed attempts and escalation (retry and abandon), the reference fallback, a failed
//! release with its compensations, and a checkpoint of state version 1 resumed after the
//! migration. The code and tests run for real in the sandbox. The real model's run is in
//! `smollm2.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use ferrograph::prelude::*;
use ferrograph::runtime::JsonInput;
use ferrograph::Registry;
use ferrograph_chat::ChatModel;
use ferrograph_team::bus::TeamStore;
use ferrograph_team::fixture::{self, Fixture};
use ferrograph_team::testing::{scripted_model, settings, Behaviour};
use ferrograph_team::{register_with, NAME};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

struct Setup {
    _dir: tempfile::TempDir,
    root: PathBuf,
    data: PathBuf,
    fx: Fixture,
    registry: Registry,
    saver: Arc<MemorySaver>,
}

async fn setup(behaviour: Behaviour) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let fx = fixture::create(&root.join("fx")).unwrap();
    let data = root.join("data");
    let rt = Runtime::new().await.unwrap();
    let mut registry = Registry::new();
    let m: Arc<dyn ChatModel> = Arc::new(scripted_model(behaviour));
    let saver = Arc::new(MemorySaver::new());
    register_with(&mut registry, &rt, saver.clone(), settings(&data, m))
        .await
        .unwrap();
    Setup {
        _dir: dir,
        root,
        data,
        fx,
        registry,
        saver,
    }
}

impl Setup {
    async fn run(&self, thread: &str, input: JsonInput) -> ferrograph::runtime::JsonOutcome {
        self.registry
            .get(NAME)
            .unwrap()
            .workflow
            .invoke(input, RunConfig::thread(thread))
            .await
            .unwrap()
    }
    async fn start(&self, thread: &str, brief: &Path) -> ferrograph::runtime::JsonOutcome {
        self.run(
            thread,
            JsonInput::Update(json!({"brief": brief.display().to_string()})),
        )
        .await
    }
    async fn answer(&self, thread: &str, v: Value) -> ferrograph::runtime::JsonOutcome {
        self.run(thread, JsonInput::Resume(Resume::value(v))).await
    }
    fn store(&self) -> TeamStore {
        TeamStore::new(self.data.join(NAME).join("bus"))
    }
}

fn states(s: &Value) -> Vec<String> {
    let mut out = vec![];
    for t in s["transitions"].as_array().unwrap() {
        if out.is_empty() {
            out.push(t["from_state"].as_str().unwrap().to_string());
        }
        out.push(t["to_state"].as_str().unwrap().to_string());
    }
    out
}

fn checkpoint(o: &ferrograph::runtime::JsonOutcome) -> String {
    o.interrupts
        .first()
        .map(|i| {
            i.value.0["checkpoint_type"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .unwrap_or_default()
}

fn audit_kinds(s: &Value, kind: &str) -> Vec<String> {
    s["audit"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["kind"] == kind)
        .map(|a| a["detail"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn happy_path_through_all_nine_states_with_real_tests_and_exactly_once_events() {
    let t = setup(Behaviour::Good).await;
    let o = t.start("h", &t.fx.brief).await;
    assert_eq!(o.status, "interrupted", "{:?}", o.state);
    assert_eq!(checkpoint(&o), "stories_approval");
    let s = &o.state;
    assert_eq!(s["lifecycle"], "user_stories_created");
    assert_eq!(s["status"], "awaiting stories approval");
    let stories = s["requirement"]["stories"].as_array().unwrap();
    assert_eq!(stories.len(), 3, "one story per bullet of the brief");
    assert!(stories.iter().all(|st| st["created_by"] == "ba_agent"));
    let summary = o.interrupts[0].value.0["summary"].as_str().unwrap();
    assert!(
        summary.contains("US-1") && summary.contains("Acceptance criteria"),
        "{summary}"
    );

    let o = t.answer("h", json!("approve")).await;
    assert_eq!(
        checkpoint(&o),
        "deployment_approval",
        "{}",
        o.state["messages"]
    );
    let s = &o.state;
    assert_eq!(s["lifecycle"], "ready_to_deploy");
    let tests = audit_kinds(s, "tests");
    assert!(
        tests
            .iter()
            .any(|t| t.contains("attempt 1, the model's code: 3 of 3 tests passed")),
        "{tests:?}"
    );
    let qc = &s["quality"];
    assert_eq!(qc["passed"], true);
    assert!(
        qc["results"]["coverage_percent"].as_f64().unwrap() >= 80.0,
        "{qc}"
    );
    assert!(
        qc["test_cases"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["status"] == "passed"),
        "{qc}"
    );
    let yaml = o.interrupts[0].value.0["cicd_config"]["pipeline_yaml"]
        .as_str()
        .unwrap();
    assert!(yaml.contains("python3 -m unittest discover -v"));

    let o = t.answer("h", json!({"approved": true})).await;
    assert_eq!(o.status, "done");
    let s = &o.state;
    assert_eq!(s["status"], "deployed", "{}", s["messages"]);
    assert_eq!(
        states(s),
        [
            "received",
            "clarified",
            "user_stories_created",
            "design_ready",
            "in_development",
            "in_review",
            "test_pending",
            "ready_to_deploy",
            "deployed"
        ]
    );
    // The release: a tag, a copy, CURRENT.
    let run_dir = PathBuf::from(s["run_dir"].as_str().unwrap());
    let deploy = run_dir.join("deploy");
    assert_eq!(
        std::fs::read_to_string(deploy.join("CURRENT")).unwrap(),
        "release-1\n"
    );
    assert!(deploy.join("releases/release-1/wordstats.py").is_file());
    let repo = git2::Repository::open(run_dir.join("workspace")).unwrap();
    assert!(repo.find_reference("refs/tags/release-1").is_ok());
    for f in [
        "brief.md",
        "requirements.md",
        "stories.md",
        "spec.md",
        "adr/ADR-1.md",
        "ci.yml",
        "runbook.md",
        "events.jsonl",
        "audit.jsonl",
        "transitions.jsonl",
    ] {
        assert!(run_dir.join(f).is_file(), "{f} missing");
    }
    // Events: each delivered once to exactly its subscribers; nothing reaches the PO.
    let store = t.store();
    let log = store.events("h").unwrap();
    let names: Vec<&str> = log.iter().map(|r| r.envelope.name()).collect();
    for e in [
        "RequirementsClarified",
        "UserStoriesCreated",
        "StoriesApproved",
        "DesignApproved",
        "CodeArtifactReady",
        "QualityGatePassed",
        "DeploymentPrepared",
    ] {
        assert_eq!(
            names.iter().filter(|n| **n == e).count(),
            1,
            "{e}: {names:?}"
        );
    }
    let delivered: Vec<&str> = s["outbox"]["delivered"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        log.len(),
        delivered.len(),
        "every dispatched event is in the log once"
    );
    assert!(store.inbox("h", "po_agent").unwrap().is_empty());
    let qc_inbox: Vec<String> = store
        .inbox("h", "qc_agent")
        .unwrap()
        .iter()
        .map(|d| d.envelope.name().to_string())
        .collect();
    assert_eq!(qc_inbox, ["CodeArtifactReady"]);
    // The Deployed event is still in the outbox: the run ended after the last agent step.
    assert_eq!(s["outbox"]["pending"][0]["event_name"], "Deployed");
    // Memory: every agent that called the model has its conversation.
    let conv = store.full_history("h").unwrap();
    for a in [
        "po_agent",
        "ba_agent",
        "ta_agent",
        "tl_agent",
        "sse_agent",
        "devops_agent",
    ] {
        assert!(
            conv.get(a)
                .is_some_and(|c| c.iter().any(|e| e.role == "assistant")),
            "{a}"
        );
    }
    // Commands, a query and its response.
    let msgs = s["agent_messages"].as_array().unwrap();
    let q = msgs.iter().find(|m| m["message_type"] == "query").unwrap();
    let r = msgs
        .iter()
        .find(|m| m["message_type"] == "query_response")
        .unwrap();
    assert_eq!(q["correlation_id"], r["correlation_id"]);
    assert!(
        audit_kinds(s, "fallback").is_empty(),
        "{:?}",
        audit_kinds(s, "fallback")
    );
}

#[tokio::test]
async fn a_vague_brief_ends_blocked_with_a_routed_blocker_and_no_model_call() {
    let t = setup(Behaviour::Good).await;
    let o = t.start("v", &t.fx.vague).await;
    assert_eq!(o.status, "done");
    let s = &o.state;
    assert_eq!(s["status"], "blocked");
    assert_eq!(s["lifecycle"], "blocked");
    assert_eq!(states(s), ["received", "blocked"]);
    let b = &s["blockers"][0];
    assert_eq!(b["raised_by"], "po_agent");
    assert!(
        b["route"]
            .as_str()
            .unwrap()
            .contains("ferrograph run team --brief"),
        "{b}"
    );
    assert!(s["llm_calls"].as_array().unwrap().is_empty());
}

#[tokio::test]
async fn rejected_stories_roll_back_and_the_product_owner_revises() {
    let t = setup(Behaviour::Good).await;
    t.start("r", &t.fx.brief).await;
    let o = t
        .answer(
            "r",
            json!({"approved": false, "reason": "also show the total word count"}),
        )
        .await;
    assert_eq!(checkpoint(&o), "stories_approval");
    let s = &o.state;
    assert_eq!(s["requirement"]["rejections"], 1);
    let doc = &s["requirement"]["doc"];
    assert_eq!(doc["revision"], 1);
    assert!(
        doc["constraints"]
            .to_string()
            .contains("also show the total word count"),
        "{doc}"
    );
    assert_eq!(
        states(s),
        [
            "received",
            "clarified",
            "user_stories_created",
            "clarified",
            "user_stories_created"
        ]
    );
    let log: Vec<String> = t
        .store()
        .events("r")
        .unwrap()
        .iter()
        .map(|e| e.envelope.name().to_string())
        .collect();
    assert!(log.contains(&"StoriesRejected".to_string()), "{log:?}");
    // A bad answer is refused and the gate stays open.
    let bad = t
        .registry
        .get(NAME)
        .unwrap()
        .workflow
        .invoke(
            JsonInput::Resume(Resume::value(json!(""))),
            RunConfig::thread("r"),
        )
        .await;
    assert!(bad.is_err() || bad.as_ref().unwrap().status != "done");
}

#[tokio::test]
async fn a_rejected_deployment_goes_back_to_qc_then_deploys() {
    let t = setup(Behaviour::Good).await;
    t.start("d", &t.fx.brief).await;
    t.answer("d", json!("approve")).await;
    let o = t
        .answer("d", json!({"feedback": "wait for the change freeze"}))
        .await;
    assert_eq!(checkpoint(&o), "deployment_approval");
    let s = &o.state;
    assert_eq!(s["quality"]["runs"], 2, "QC ran again");
    assert!(s["deployment"]["notes"][0]
        .as_str()
        .unwrap()
        .contains("change freeze"));
    let o = t.answer("d", json!("approve")).await;
    assert_eq!(o.state["status"], "deployed");
    let st = states(&o.state);
    assert!(
        st.windows(2)
            .any(|w| w[0] == "ready_to_deploy" && w[1] == "test_pending"),
        "{st:?}"
    );
    assert_eq!(st.last().unwrap(), "deployed");
}

#[tokio::test]
async fn three_failures_escalate_to_the_manager_never_to_the_step_limit() {
    let t = setup(Behaviour::BadCode).await;
    t.start("e", &t.fx.brief_only).await;
    let o = t.answer("e", json!("approve")).await;
    assert_eq!(checkpoint(&o), "escalation", "{}", o.state["messages"]);
    let s = &o.state;
    assert_eq!(s["lifecycle"], "escalated");
    assert_eq!(s["implementation"]["attempts"], 3);
    let tests = audit_kinds(s, "tests");
    assert_eq!(tests.len(), 3, "three real runs: {tests:?}");
    assert!(
        s["audit"].to_string().contains("FAIL"),
        "the failing output is in the audit trail"
    );
    let st = states(s);
    assert_eq!(
        st.iter().filter(|x| *x == "in_development").count(),
        3,
        "{st:?}"
    );
    // Retry with a hint: three more attempts, then the manager again.
    let o = t
        .answer(
            "e",
            json!({"feedback": "count_words must not return an empty dict"}),
        )
        .await;
    assert_eq!(checkpoint(&o), "escalation");
    assert_eq!(o.state["implementation"]["total_attempts"], 6);
    assert!(o.state["implementation"]["manager_hints"][0]
        .as_str()
        .unwrap()
        .contains("empty dict"));
    let o = t.answer("e", json!("reject")).await;
    assert_eq!(o.state["status"], "abandoned");
}

#[tokio::test]
async fn the_reference_implementation_is_the_recorded_fallback_for_failing_code() {
    let t = setup(Behaviour::BadCode).await;
    t.start("f", &t.fx.brief).await;
    let o = t.answer("f", json!("approve")).await;
    assert_eq!(
        checkpoint(&o),
        "deployment_approval",
        "{}",
        o.state["messages"]
    );
    let s = &o.state;
    assert_eq!(
        s["implementation"]["attempts"], 1,
        "the model's attempt counted as failed"
    );
    assert!(audit_kinds(s, "fallback")
        .iter()
        .any(|f| f.contains("reference implementation")));
    assert!(s["implementation"]["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .all(|a| a["written_by"] == "fallback"));
}

#[tokio::test]
async fn model_failures_fall_back_and_are_recorded() {
    let t = setup(Behaviour::Fails).await;
    let o = t.start("x", &t.fx.brief).await;
    assert_eq!(checkpoint(&o), "stories_approval");
    let s = &o.state;
    assert_eq!(s["requirement"]["doc"]["clarified_by"], "fallback");
    assert!(s["requirement"]["stories"]
        .as_array()
        .unwrap()
        .iter()
        .all(|st| st["created_by"] == "fallback"));
    assert!(audit_kinds(s, "fallback").len() >= 2);
}

#[tokio::test]
async fn a_failed_release_runs_its_compensations_in_reverse() {
    let t = setup(Behaviour::Good).await;
    let deploy = t.root.join("target-site");
    std::fs::create_dir_all(deploy.join("CURRENT")).unwrap(); // activation will fail
    t.run("c", JsonInput::Update(json!({"brief": t.fx.brief.display().to_string(), "deploy_to": deploy.display().to_string()}))).await;
    t.answer("c", json!("approve")).await;
    let o = t.answer("c", json!("approve")).await;
    let s = &o.state;
    assert_eq!(s["status"], "deployment failed", "{}", s["messages"]);
    assert_eq!(s["lifecycle"], "ready_to_deploy");
    assert_eq!(s["deployment"]["status"]["status"], "rolled_back");
    let comp = audit_kinds(s, "compensation");
    assert_eq!(comp.len(), 2, "{comp:?}");
    assert!(
        comp[0].contains("copy the release") && comp[1].contains("tag release-1"),
        "reverse order: {comp:?}"
    );
    assert!(!deploy.join("releases/release-1").exists());
    let repo =
        git2::Repository::open(PathBuf::from(s["run_dir"].as_str().unwrap()).join("workspace"))
            .unwrap();
    assert!(repo.find_reference("refs/tags/release-1").is_err());
    let log: Vec<String> = t
        .store()
        .events("c")
        .unwrap()
        .iter()
        .map(|e| e.envelope.name().to_string())
        .collect();
    assert!(!log.contains(&"Deployed".to_string()));
    assert_eq!(s["outbox"]["pending"][0]["event_name"], "DeploymentFailed");
}

#[tokio::test]
async fn a_version_1_checkpoint_loads_after_the_migration_and_resumes() {
    use ferrograph_team::state::v1::TeamStateV1;
    let t = setup(Behaviour::Good).await;
    // A real run to the stories gate, rewritten in version 1's shape (the seed's outbox, with
    // its swapped lists: the delivered entry left in `pending`, the undelivered in
    // `delivered`).
    let o = t.start("src", &t.fx.brief).await;
    let mut v1 = o.state.clone();
    let outbox = v1.as_object_mut().unwrap().remove("outbox").unwrap();
    let pending = outbox["pending"].as_array().unwrap().clone();
    assert_eq!(pending.len(), 1, "UserStoriesCreated waits");
    v1["schema_version"] = json!("1.0");
    v1["event_outbox"] = json!({
        "pending": [{"event": null, "delivered": true, "delivery_attempts": 1, "created_at": ""}],
        "delivered": [{"event": pending[0], "delivered": false, "delivery_attempts": 0, "created_at": ""}],
    });
    let v1: TeamStateV1 = serde_json::from_value(v1).unwrap();
    let graph = StateGraph::<TeamStateV1>::new(NAME)
        .add_node("stories_gate", |_s, ctx: NodeContext| async move {
            let _: Value = ctx.interrupt(json!({"checkpoint_type": "stories_approval"}))?;
            Ok(ferrograph_team::state::v1::TeamStateV1Update::new())
        })
        .add_edge(START, "stories_gate")
        .add_edge("stories_gate", END)
        .compile()
        .unwrap();
    let rt = Runtime::new().await.unwrap();
    let old = rt
        .load(graph)
        .await
        .unwrap()
        .with_checkpointer(t.saver.clone());
    let full = serde_json::to_value(&v1).unwrap();
    let out = ferrograph::runtime::Workflow::invoke(
        &old,
        JsonInput::Update(full),
        RunConfig::thread("old"),
    )
    .await
    .unwrap();
    assert_eq!(out.status, "interrupted");

    // The current graph reads it (the migration was installed when the graph was built).
    let wf = &t.registry.get(NAME).unwrap().workflow;
    let state = wf.get_state("old", None).await.unwrap();
    assert_eq!(
        state.values["outbox"]["pending"].as_array().unwrap().len(),
        1,
        "{}",
        state.values["outbox"]
    );
    assert_eq!(
        state.values["outbox"]["pending"][0]["event_name"],
        "UserStoriesCreated"
    );
    let o = t.answer("old", json!("approve")).await;
    assert_eq!(
        checkpoint(&o),
        "deployment_approval",
        "{}",
        o.state["messages"]
    );
    // The migrated pending event was delivered once.
    let log = t.store().events("old").unwrap();
    assert_eq!(
        log.iter()
            .filter(|e| e.envelope.name() == "UserStoriesCreated")
            .count(),
        1
    );
}
