//! Two small workflows that show the programming model without a model or data, and a
//! starting point to copy for a workflow of your own:
//!
//! - [`demo`]: release notes from commit subjects (fan-out with `SendTo`, a join).
//! - [`review`]: a draft reviewed by a person: approve, reject or feedback, at most three
//!   revisions (interrupts and resume).
//!
//! [`register`] adds both to a [`Registry`], which the CLI and the HTTP server serve by name.

pub mod demo;
pub mod review;

use ferrograph::{CheckpointSaver, Entry, Registry, RegistryError, Runtime};
use std::sync::Arc;

/// Loads `demo` and `review` into `runtime` with `saver` as their checkpointer and adds them
/// to `registry`.
pub async fn register(
    registry: &mut Registry,
    runtime: &Runtime,
    saver: Arc<dyn CheckpointSaver>,
) -> Result<(), RegistryError> {
    let demo = runtime
        .load(demo::graph()?)
        .await?
        .with_checkpointer(saver.clone());
    registry.insert(
        "demo",
        Entry {
            workflow: Arc::new(demo),
            description: "release notes from commit subjects (fan-out, join)",
            parse_input: demo::parse_input,
            sample_input: demo::sample_input,
            parse_args: None,
            input_paths: &[],
        },
    );
    let review = runtime
        .load(review::graph()?)
        .await?
        .with_checkpointer(saver);
    registry.insert(
        "review",
        Entry {
            workflow: Arc::new(review),
            description: "a draft reviewed by a person: approve, reject or feedback (interrupts)",
            parse_input: review::parse_input,
            sample_input: review::sample_input,
            parse_args: None,
            input_paths: &[],
        },
    );
    Ok(())
}

/// A registry holding `demo` and `review` only.
pub async fn registry(
    runtime: &Runtime,
    saver: Arc<dyn CheckpointSaver>,
) -> Result<Registry, RegistryError> {
    let mut r = Registry::new();
    register(&mut r, runtime, saver).await?;
    Ok(r)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use ferrograph::prelude::*;
    use ferrograph::runtime::JsonInput;

    #[tokio::test]
    async fn review_loop_revises_on_feedback_and_publishes_on_approval() {
        let rt = Runtime::new().await.unwrap();
        let reg = registry(&rt, Arc::new(MemorySaver::new())).await.unwrap();
        let wf = &reg.get("review").unwrap().workflow;
        let cfg = || RunConfig::thread("r1");
        let out = wf
            .invoke(JsonInput::Update(review::sample_input()), cfg())
            .await
            .unwrap();
        assert_eq!(out.status, "interrupted");
        assert_eq!(out.interrupts[0].value.0["kind"], "review");
        let out = wf
            .invoke(
                JsonInput::Resume(Resume::value(serde_json::json!({"feedback": "add tests"}))),
                cfg(),
            )
            .await
            .unwrap();
        assert_eq!(out.status, "interrupted");
        assert_eq!(out.state["revisions"], 2);
        assert!(out.state["draft"].as_str().unwrap().contains("add tests"));
        let out = wf
            .invoke(JsonInput::Resume(Resume::value("approve".into())), cfg())
            .await
            .unwrap();
        assert_eq!(out.status, "done");
        assert_eq!(out.state["published"], true);
        assert_eq!(out.state["decision"], "approved");
    }

    #[tokio::test]
    async fn review_stops_after_three_revisions_and_rejects_nonsense() {
        let rt = Runtime::new().await.unwrap();
        let reg = registry(&rt, Arc::new(MemorySaver::new())).await.unwrap();
        let wf = &reg.get("review").unwrap().workflow;
        let cfg = || RunConfig::thread("r2");
        wf.invoke(JsonInput::Update(serde_json::json!({"title": "x"})), cfg())
            .await
            .unwrap();
        let bad = wf
            .invoke(JsonInput::Resume(Resume::value("maybe".into())), cfg())
            .await
            .unwrap_err();
        assert!(
            bad.to_string().contains("unrecognized review answer"),
            "{bad}"
        );
        let mut last = None;
        for i in 0..3 {
            last = Some(
                wf.invoke(
                    JsonInput::Resume(Resume::value(
                        serde_json::json!({ "feedback": format!("f{i}") }),
                    )),
                    cfg(),
                )
                .await
                .unwrap(),
            );
        }
        let out = last.unwrap();
        assert_eq!(out.status, "done");
        assert_eq!(out.state["decision"], "revision limit reached");
        assert_eq!(out.state["published"], false);
        assert_eq!(out.state["revisions"], 3);
    }

    #[tokio::test]
    async fn demo_classifies_every_commit() {
        let rt = Runtime::new().await.unwrap();
        let reg = registry(&rt, Arc::new(MemorySaver::new())).await.unwrap();
        let wf = &reg.get("demo").unwrap().workflow;
        let out = wf
            .invoke(
                JsonInput::Update(demo::parse_input("feat: a\nfix: b\nmisc")),
                RunConfig::thread("d"),
            )
            .await
            .unwrap();
        assert_eq!(out.state["classified"], 3);
        let md = out.state["markdown"].as_str().unwrap();
        assert!(
            md.contains("## Features\n- a") && md.contains("## Fixes\n- b"),
            "{md}"
        );
    }
}
