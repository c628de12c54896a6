//! State schema migrations: a thread written by version 1 of a state is resumed by version 2.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use ferrograph::core::migrate::{MigrationError, Migrations};
use ferrograph::prelude::*;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

#[derive(State, Clone, Debug, Default, Serialize, Deserialize)]
#[state(version = 1)]
struct TicketV1 {
    title: String,
    #[reducer(append)]
    log: Vec<String>,
}

#[derive(State, Clone, Debug, Default, Serialize, Deserialize)]
#[state(version = 2)]
struct TicketV2 {
    subject: String,
    priority: i64,
    #[reducer(append)]
    log: Vec<String>,
}

fn v1_graph() -> CompiledGraph<TicketV1> {
    StateGraph::<TicketV1>::new("ticket")
        .add_node("triage", |_s, _c| async {
            Ok(TicketV1Update::new().log(vec!["triaged".into()]))
        })
        .add_node("approve", |_s, ctx: NodeContext| async move {
            let _: String = ctx.interrupt("approve?")?;
            Ok(TicketV1Update::new().log(vec!["approved".into()]))
        })
        .add_edge(START, "triage")
        .add_edge("triage", "approve")
        .add_edge("approve", END)
        .compile()
        .unwrap()
}

fn v2_graph() -> CompiledGraph<TicketV2> {
    StateGraph::<TicketV2>::new("ticket")
        .add_node("triage", |_s, _c| async {
            Ok(TicketV2Update::new()
                .log(vec!["triaged".into()])
                .priority(1))
        })
        .add_node("approve", |s: Arc<TicketV2>, ctx: NodeContext| async move {
            let answer: String = ctx.interrupt("approve?")?;
            Ok(TicketV2Update::new().log(vec![format!("{answer}: {}", s.subject)]))
        })
        .add_edge(START, "triage")
        .add_edge("triage", "approve")
        .add_edge("approve", END)
        .compile()
        .unwrap()
}

#[tokio::test]
async fn a_thread_written_by_v1_resumes_under_v2_after_migration() {
    let dir = tempfile::tempdir().unwrap();
    let saver = ferrograph::checkpoint_savers::SledSaver::open(dir.path()).unwrap();
    let rt = Runtime::new().await.unwrap();
    let v1 = rt
        .load(v1_graph())
        .await
        .unwrap()
        .with_checkpointer(saver.clone());
    let out = v1
        .invoke(
            RunInput::Update(TicketV1Update::new().title("disk full".to_string())),
            RunConfig::thread("t"),
        )
        .await
        .unwrap();
    assert_eq!(out.status, RunStatus::Interrupted);

    let v2 = rt
        .load(v2_graph())
        .await
        .unwrap()
        .with_checkpointer(saver.clone());
    // Without a migration the old checkpoint is a typed error, not a reset.
    let err = v2.get_state("t", None).await.unwrap_err();
    assert!(err.to_string().contains("schema version 1"), "{err}");

    let bad = Migrations::<TicketV2>::new()
        .step::<TicketV1, TicketV1>(|o| o, |u| u)
        .install()
        .unwrap_err();
    assert!(matches!(bad, MigrationError::NotConsecutive { .. }));

    Migrations::<TicketV2>::new()
        .step::<TicketV1, TicketV2>(
            |old| TicketV2 {
                subject: old.title,
                priority: 0,
                log: old.log,
            },
            |u| TicketV2Update {
                subject: u.title,
                priority: None,
                log: u.log,
            },
        )
        .install()
        .unwrap();
    let state = v2.get_state("t", None).await.unwrap();
    assert_eq!(state.values.subject, "disk full");
    assert_eq!(state.values.log, vec!["triaged"]);
    assert_eq!(state.interrupts.len(), 1);
    let history = v2.get_state_history("t").await.unwrap();
    assert_eq!(history.len(), 2, "input and triage");

    let out = v2
        .invoke(RunInput::resume("yes".into()), RunConfig::thread("t"))
        .await
        .unwrap();
    assert_eq!(out.status, RunStatus::Done);
    assert_eq!(out.state.log, vec!["triaged", "yes: disk full"]);
}
