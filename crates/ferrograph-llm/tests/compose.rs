//! Composition: retry (only retryable errors, N attempts, backoff with jitter, Retry-After),
//! fallbacks (each once, after retries), prompt templates with typed variables, and parallel
//! sub-calls merged into a typed result. Scripted models, no weights needed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use ferrograph_chat::testing::ScriptedModel;
use ferrograph_core::message::{Message, Role};
use ferrograph_llm::prompt::{ChatPrompt, PromptError, PromptTemplate};
use ferrograph_llm::{
    invoke_all, parallel, ChatModel, ChatModelExt, GenerateOptions, LlmError, RetryPolicy,
};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The shared scripted model, answering from `script(call number from 0, messages)`, and its
/// call counter.
fn scripted(
    name: &'static str,
    script: impl Fn(usize, &[Message]) -> Result<Message, LlmError> + Send + Sync + 'static,
) -> (ScriptedModel, Arc<AtomicUsize>) {
    let m = ScriptedModel::new(name, move |c| script(c.index, c.messages));
    let calls = m.call_counter();
    (m, calls)
}

fn fast(attempts: u32) -> RetryPolicy {
    RetryPolicy::attempts(attempts).backoff(Duration::from_millis(1), Duration::from_millis(5))
}

fn ask() -> Vec<Message> {
    vec![Message::human("hi")]
}

#[tokio::test]
async fn retry_stops_after_n_attempts_of_retryable_errors() {
    let (m, calls) = scripted("m", |_, _| Err(LlmError::rate_limited("busy")));
    let err = m
        .with_retry(fast(3))
        .invoke(&ask(), &GenerateOptions::default(), None)
        .await
        .unwrap_err();
    assert!(matches!(err, LlmError::RateLimited { .. }), "{err}");
    assert_eq!(calls.load(Ordering::SeqCst), 3);

    let (m, calls) = scripted("m", |n, _| {
        if n < 2 {
            Err(LlmError::Timeout(Duration::from_secs(1)))
        } else {
            Ok(Message::ai("ok"))
        }
    });
    let answer = m
        .with_retry(fast(5))
        .invoke(&ask(), &GenerateOptions::default(), None)
        .await
        .unwrap();
    assert_eq!(answer.content, "ok");
    assert_eq!(answer.metadata["attempts"], "3");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn retry_never_retries_schema_or_validation_errors() {
    let makers: [fn() -> LlmError; 4] = [
        || LlmError::Validation("bad request".into()),
        || LlmError::Schema {
            message: "missing field".into(),
            output: "{}".into(),
        },
        || LlmError::Http {
            status: 400,
            message: "no".into(),
        },
        || LlmError::MalformedResponse {
            message: "x".into(),
            body: "y".into(),
        },
    ];
    for err in makers {
        let (m, calls) = scripted("m", move |_, _| Err(err()));
        let out = m
            .with_retry(fast(5))
            .invoke(&ask(), &GenerateOptions::default(), None)
            .await;
        assert!(out.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
    // A custom predicate narrows what is retried (only rate limits here), never widens it.
    let (m, calls) = scripted("m", |_, _| Err(LlmError::Overloaded("queue".into())));
    let policy = fast(5).retry_on(|e| matches!(e, LlmError::RateLimited { .. }));
    assert!(m
        .with_retry(policy)
        .invoke(&ask(), &GenerateOptions::default(), None)
        .await
        .is_err());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[allow(dead_code)]
struct Verdict {
    severity: u8,
}

#[tokio::test]
async fn structured_output_schema_errors_are_not_retried() {
    let (m, calls) = scripted("m", |_, _| Ok(Message::ai("not json at all")));
    let structured = m.with_retry(fast(4)).with_structured_output::<Verdict>();
    let err = structured
        .invoke(&ask(), &GenerateOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(err, LlmError::Schema { .. }), "{err}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // run_with_retry wraps any call, structured ones included: still one attempt.
    let (msgs, opts) = (ask(), GenerateOptions::default());
    let err = ferrograph_llm::run_with_retry(&fast(4), |_| structured.invoke(&msgs, &opts))
        .await
        .unwrap_err();
    assert!(matches!(err, LlmError::Schema { .. }));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn retry_honours_retry_after() {
    let (m, calls) = scripted("m", |n, _| {
        if n == 0 {
            Err(LlmError::RateLimited {
                message: "slow down".into(),
                retry_after: Some(Duration::from_millis(300)),
            })
        } else {
            Ok(Message::ai("ok"))
        }
    });
    // The computed backoff would be 1 ms; Retry-After says 300 ms.
    let started = Instant::now();
    let answer = m
        .with_retry(fast(2))
        .invoke(&ask(), &GenerateOptions::default(), None)
        .await
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(answer.metadata["attempts"], "2");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    // A Retry-After beyond the policy's patience fails at once (a fallback can take over).
    let (m, calls) = scripted("m", |_, _| {
        Err(LlmError::Unavailable {
            status: 503,
            message: "maintenance".into(),
            retry_after: Some(Duration::from_secs(3600)),
        })
    });
    let started = Instant::now();
    let err = m
        .with_retry(fast(3).max_retry_after(Duration::from_secs(5)))
        .invoke(&ask(), &GenerateOptions::default(), None)
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(err.retry_after(), Some(Duration::from_secs(3600)));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn backoff_is_exponential_capped_and_jittered() {
    let p = RetryPolicy::attempts(10)
        .backoff(Duration::from_millis(100), Duration::from_secs(1))
        .jitter(false);
    assert_eq!(p.backoff_for(1), Duration::from_millis(100));
    assert_eq!(p.backoff_for(2), Duration::from_millis(200));
    assert_eq!(p.backoff_for(3), Duration::from_millis(400));
    assert_eq!(p.backoff_for(5), Duration::from_secs(1));
    let err = LlmError::Overloaded("x".into());
    assert_eq!(p.delay_after(2, &err), Some(Duration::from_millis(200)));
    assert_eq!(p.delay_after(10, &err), None, "attempts used up");
    let jittered = p.clone().jitter(true);
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..50 {
        let d = jittered.delay_after(3, &err).unwrap();
        assert!(
            d >= Duration::from_millis(200) && d <= Duration::from_millis(400),
            "{d:?}"
        );
        seen.insert(d);
    }
    assert!(seen.len() > 5, "jitter varies the waits");
}

#[tokio::test]
async fn fallbacks_run_once_each_after_retries_are_exhausted() {
    let (primary, p_calls) = scripted("primary", |_, _| Err(LlmError::rate_limited("429")));
    let (first, f1_calls) = scripted("first", |_, _| Err(LlmError::Overloaded("full".into())));
    let (second, f2_calls) = scripted("second", |_, _| Ok(Message::ai("from second")));
    let model = primary
        .with_retry(fast(3))
        .boxed()
        .with_fallbacks([first.boxed(), second.boxed()]);
    let answer = model
        .invoke(&ask(), &GenerateOptions::default(), None)
        .await
        .unwrap();
    assert_eq!(answer.content, "from second");
    assert_eq!(answer.metadata["fallback_index"], "2");
    assert_eq!(p_calls.load(Ordering::SeqCst), 3);
    assert_eq!(f1_calls.load(Ordering::SeqCst), 1);
    assert_eq!(f2_calls.load(Ordering::SeqCst), 1);
    assert_eq!(model.model_name(), "primary");

    // All fail: the last error comes back, each model tried once (after the retries).
    let (primary, p_calls) = scripted("primary", |_, _| Err(LlmError::rate_limited("429")));
    let (backup, b_calls) = scripted("backup", |_, _| {
        Err(LlmError::Timeout(Duration::from_millis(5)))
    });
    let err = primary
        .with_retry(fast(2))
        .with_fallbacks([backup])
        .invoke(&ask(), &GenerateOptions::default(), None)
        .await
        .unwrap_err();
    assert!(matches!(err, LlmError::Timeout(_)), "{err}");
    assert_eq!(
        (
            p_calls.load(Ordering::SeqCst),
            b_calls.load(Ordering::SeqCst)
        ),
        (2, 1)
    );

    // An invalid request is not handed to the fallback.
    let (primary, _) = scripted("primary", |_, _| Err(LlmError::Validation("bad".into())));
    let (backup, b_calls) = scripted("backup", |_, _| Ok(Message::ai("x")));
    let err = primary
        .with_fallbacks([backup])
        .invoke(&ask(), &GenerateOptions::default(), None)
        .await
        .unwrap_err();
    assert!(matches!(err, LlmError::Validation(_)));
    assert_eq!(b_calls.load(Ordering::SeqCst), 0);
}

#[derive(Serialize)]
struct TriageVars<'a> {
    product: &'a str,
    symptoms: Vec<&'a str>,
    severity: Option<u8>,
}

#[test]
fn prompt_templates_render_typed_variables_and_report_missing_ones() {
    let t = PromptTemplate::<TriageVars<'_>>::new(
        "Product: {{ product }}\n{% for s in symptoms %}- {{ s }}\n{% endfor %}{% if severity %}Severity {{ severity }}{% endif %}",
    )
    .unwrap();
    let vars = TriageVars {
        product: "sled",
        symptoms: vec!["slow", "crash"],
        severity: Some(2),
    };
    assert_eq!(
        t.render(&vars).unwrap(),
        "Product: sled\n- slow\n- crash\nSeverity 2"
    );
    let mut names: Vec<&str> = t.variables().collect();
    names.sort();
    assert_eq!(names, ["product", "severity", "symptoms"]);

    let needs_more = PromptTemplate::<TriageVars<'_>>::new("{{ product }} {{ owner }}").unwrap();
    let err = needs_more.render(&vars).unwrap_err();
    assert!(
        matches!(err, PromptError::MissingVariable { ref name, .. } if name == "owner"),
        "{err}"
    );
    let llm: LlmError = err.into();
    assert!(!llm.is_retryable());
    // A missing nested field is an error too, never empty text.
    let nested = PromptTemplate::<serde_json::Value>::new("{{ user.name }}").unwrap();
    assert!(matches!(
        nested.render(&serde_json::json!({"user": {}})),
        Err(PromptError::Render(_))
    ));
    assert!(matches!(
        PromptTemplate::<serde_json::Value>::new("{{ unclosed"),
        Err(PromptError::Syntax(_))
    ));
    assert!(matches!(
        PromptTemplate::<u32>::new("{{ x }}").unwrap().render(&3),
        Err(PromptError::NotAMap(_))
    ));
}

#[test]
fn chat_prompts_build_messages_with_history() {
    let prompt = ChatPrompt::<TriageVars<'_>>::new()
        .system("You triage {{ product }} bugs.")
        .unwrap()
        .history()
        .human("New symptoms: {{ symptoms | join(', ') }}")
        .unwrap();
    let vars = TriageVars {
        product: "sled",
        symptoms: vec!["slow"],
        severity: None,
    };
    let history = [Message::human("earlier"), Message::ai("noted")];
    let msgs = prompt.format(&vars, &history).unwrap();
    let roles: Vec<Role> = msgs.iter().map(|m| m.role).collect();
    assert_eq!(roles, [Role::System, Role::Human, Role::Ai, Role::Human]);
    assert_eq!(msgs[0].content, "You triage sled bugs.");
    assert_eq!(msgs[3].content, "New symptoms: slow");
}

#[derive(Debug)]
struct Report {
    summary: String,
    risks: String,
    plan: String,
}

#[tokio::test]
async fn parallel_sub_calls_merge_into_a_typed_result() {
    let (m, calls) = scripted("writer", |_, msgs| {
        Ok(Message::ai(format!("wrote {}", msgs[0].content)))
    });
    let m = Arc::new(m.with_delay(Duration::from_millis(200)));
    let opts = GenerateOptions::default();
    let write = |topic: &'static str| {
        let m = m.clone();
        let opts = opts.clone();
        async move {
            let answer = m.invoke(&[Message::human(topic)], &opts, None).await?;
            Ok::<_, LlmError>(answer.content)
        }
    };
    let started = Instant::now();
    let report: Report = parallel!(Report {
        summary: write("summary"),
        risks: write("risks"),
        plan: write("plan"),
    })
    .await
    .unwrap();
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_millis(500),
        "ran concurrently: {elapsed:?}"
    );
    assert_eq!(report.summary, "wrote summary");
    assert_eq!(report.risks, "wrote risks");
    assert_eq!(report.plan, "wrote plan");
    assert_eq!(calls.load(Ordering::SeqCst), 3);

    // The first error is the result.
    let failing = async { Err::<String, _>(LlmError::Validation("bad".into())) };
    let out: Result<Report, LlmError> = parallel!(Report {
        summary: write("summary"),
        risks: failing,
        plan: write("plan"),
    })
    .await;
    assert!(matches!(out, Err(LlmError::Validation(_))));

    let answers = invoke_all(
        &*m,
        &[
            (vec![Message::human("a")], GenerateOptions::default()),
            (vec![Message::human("b")], GenerateOptions::default()),
        ],
    )
    .await
    .unwrap();
    assert_eq!(answers[0].content, "wrote a");
    assert_eq!(answers[1].content, "wrote b");
}
