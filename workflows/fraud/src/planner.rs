//! The planner: an LLM proposes the next tool; code decides.
//!
//! The LLM's answer is constrained to `{tool, reason, confidence}` with `tool` one of the
//! steps the safety rules allow now (registered, not yet run, in the rules' order, or
//! `COMPLETE` when completing is allowed), so the model's choice is always legal. When the
//! rules allow a single step, no model is asked and the decision says it was forced. The
//! rules are still checked in code after the model answers; a violation, an LLM error or a
//! timeout hands the choice to the deterministic sequence, and the decision records that.

use super::state::{Investigation, PlannerDecision, COMPLETE};
use super::time::now_iso;
use super::tools::{
    sanitize, CONTEXT_TOOL, FALLBACK_SEQUENCE, PATTERN_TOOL, REASONING_TOOL, RECOMMENDATION_TOOL,
    RULE_DRAFT_TOOL, SIMILARITY_TOOL,
};
use ferrograph::chat::{ChatModel, GenerateOptions, ResponseFormat};
use ferrograph::Message;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::time::Duration;

/// The planner's answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlannerChoice {
    /// A tool name or `COMPLETE`.
    pub tool: String,
    /// Why.
    pub reason: String,
    /// 0..1.
    pub confidence: f64,
}

/// A safety rule the LLM's choice broke.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Violation {
    /// Not a registered tool.
    #[error("`{0}` is not a registered tool")]
    UnknownTool(String),
    /// Already ran.
    #[error("`{0}` already ran")]
    Repeat(String),
    /// Context must come first.
    #[error("context_tool must run first (chose `{0}`)")]
    ContextFirst(String),
    /// Reasoning needs the analysis tools first.
    #[error("reasoning_tool needs pattern_tool and similarity_tool first")]
    AnalysisBeforeReasoning,
    /// Recommendations need analysis and reasoning first.
    #[error("recommendation_tool needs the analysis tools and reasoning_tool first")]
    RecommendationTooEarly,
    /// A rule draft needs recommendations first.
    #[error("rule_draft_tool needs recommendation_tool first")]
    RuleDraftBeforeRecommendation,
    /// Completing before any recommendation while tools remain.
    #[error("COMPLETE before recommendation_tool ran")]
    CompleteTooEarly,
}

/// Checks `tool` against the safety rules for `state`, given the registry's tool names.
pub fn check(tool: &str, state: &Investigation, registered: &[String]) -> Result<(), Violation> {
    if tool == COMPLETE {
        let remaining = FALLBACK_SEQUENCE
            .iter()
            .any(|t| !state.ran(t) && registered.iter().any(|r| r == t));
        if !state.ran(RECOMMENDATION_TOOL) && remaining {
            return Err(Violation::CompleteTooEarly);
        }
        return Ok(());
    }
    if !registered.iter().any(|r| r == tool) {
        return Err(Violation::UnknownTool(tool.to_string()));
    }
    if state.ran(tool) {
        return Err(Violation::Repeat(tool.to_string()));
    }
    if !state.ran(CONTEXT_TOOL) && tool != CONTEXT_TOOL {
        return Err(Violation::ContextFirst(tool.to_string()));
    }
    let analysed = state.ran(PATTERN_TOOL) && state.ran(SIMILARITY_TOOL);
    if tool == REASONING_TOOL && !analysed {
        return Err(Violation::AnalysisBeforeReasoning);
    }
    if tool == RECOMMENDATION_TOOL && !(analysed && state.ran(REASONING_TOOL)) {
        return Err(Violation::RecommendationTooEarly);
    }
    if tool == RULE_DRAFT_TOOL && !state.ran(RECOMMENDATION_TOOL) {
        return Err(Violation::RuleDraftBeforeRecommendation);
    }
    Ok(())
}

/// The deterministic choice: the first tool of the fallback sequence that has not run.
pub fn deterministic_next(state: &Investigation, registered: &[String]) -> String {
    FALLBACK_SEQUENCE
        .iter()
        .find(|t| !state.ran(t) && registered.iter().any(|r| r == *t))
        .map_or_else(|| COMPLETE.to_string(), |t| t.to_string())
}

/// The steps the safety rules allow for `state`: registered tools that [`check`] accepts, in
/// registration order, then `COMPLETE` when completing is allowed.
pub fn allowed_steps(state: &Investigation, registered: &[String]) -> Vec<String> {
    registered
        .iter()
        .map(String::as_str)
        .chain([COMPLETE])
        .filter(|t| check(t, state, registered).is_ok())
        .map(str::to_string)
        .collect()
}

/// The JSON schema the LLM answers under: `tool` is an enum of `choices` (the steps allowed
/// now; see [`allowed_steps`]).
pub fn choice_schema(choices: &[String]) -> Value {
    let names: Vec<Value> = choices.iter().map(|n| json!(n)).collect();
    json!({
        "type": "object",
        "properties": {
            "tool": { "type": "string", "enum": names },
            "reason": { "type": "string", "maxLength": 200 },
            "confidence": { "type": "number", "minimum": 0, "maximum": 1 }
        },
        "required": ["tool", "reason", "confidence"],
        "additionalProperties": false
    })
}

/// The planner prompt (seed 004's rules), with free text sanitised when the guard is on.
pub fn prompt(state: &Investigation, tools: &[(String, String)]) -> Vec<Message> {
    let guard = state.feature_flags.prompt_guard_enabled;
    let text = |s: &str| if guard { sanitize(s) } else { s.to_string() };
    let mut findings = String::new();
    for h in &state.hypotheses {
        findings.push_str(&format!("- {}\n", text(h)));
    }
    if findings.is_empty() {
        findings.push_str("- none yet\n");
    }
    let merchant = state
        .context
        .0
        .pointer("/merchant/name")
        .and_then(Value::as_str)
        .map(&text)
        .unwrap_or_default();
    let tool_list: String = tools.iter().map(|(n, d)| format!("- {n}: {d}\n")).collect();
    let system = "You are a fraud investigation planner for a card fraud operations team. \
                  Choose the NEXT investigation step. Answer with a JSON object \
                  {\"tool\": name, \"reason\": why, \"confidence\": 0..1}, or tool COMPLETE to finish.";
    let user = format!(
        "Transaction: {}\nMerchant: {}\nCompleted steps: {:?}\nStep: {} / {}\n\
         Context available: {}\nPattern analysis done: {}\nSimilarity analysis done: {}\n\
         Reasoning done: {}\nRecommendations done: {}\nRule draft done: {}\n\n\
         Findings so far:\n{}\nTools:\n{}\nRules:\n\
         1. Retrieve context first.\n2. Run pattern_tool and similarity_tool before reasoning_tool.\n\
         3. Run reasoning_tool before recommendation_tool.\n4. Run rule_draft_tool only after recommendation_tool.\n\
         5. Never repeat a completed step.\n6. Answer COMPLETE when there is enough evidence and recommendations exist.\n",
        state.transaction_id,
        merchant,
        state.completed_steps,
        state.step_count,
        state.max_steps,
        state.ran(CONTEXT_TOOL),
        state.ran(PATTERN_TOOL),
        state.ran(SIMILARITY_TOOL),
        state.ran(REASONING_TOOL),
        state.ran(RECOMMENDATION_TOOL),
        state.ran(RULE_DRAFT_TOOL),
        findings,
        tool_list,
    );
    vec![Message::system(system), Message::human(user)]
}

/// Asks the LLM (when enabled and present), applies the safety rules, and returns the
/// decision for the next step as it is recorded.
pub async fn decide(
    state: &Investigation,
    llm: Option<&dyn ChatModel>,
    options: &GenerateOptions,
    tools: &[(String, String)],
    timeout: Duration,
) -> PlannerDecision {
    let registered: Vec<String> = tools.iter().map(|(n, _)| n.clone()).collect();
    let decision = |selected_tool: String,
                    reason: String,
                    confidence: f64,
                    used_fallback: bool,
                    rejected: Option<String>| PlannerDecision {
        step: state.step_count + 1,
        selected_tool,
        reason,
        confidence,
        used_fallback,
        rejected,
        forced: false,
        timestamp: now_iso(),
    };
    let fallback = |why: Option<String>| {
        let tool = deterministic_next(state, &registered);
        let reason = format!("deterministic sequence: next step is {tool}");
        decision(tool, reason, 1.0, true, why)
    };
    let Some(llm) = llm.filter(|_| state.feature_flags.planner_llm_enabled) else {
        return fallback(None);
    };
    let allowed = allowed_steps(state, &registered);
    if let [only] = allowed.as_slice() {
        return PlannerDecision {
            forced: true,
            ..decision(
                only.clone(),
                format!("the safety rules allow only {only} at this step"),
                1.0,
                false,
                None,
            )
        };
    }
    if allowed.is_empty() {
        return fallback(Some("the safety rules allow no step".into()));
    }
    let mut opts = options.clone();
    opts.response_format = Some(ResponseFormat::JsonSchema {
        name: "planner_choice".into(),
        schema: choice_schema(&allowed),
    });
    let messages = prompt(state, tools);
    let answer = tokio::time::timeout(timeout, llm.invoke(&messages, &opts, None)).await;
    let choice = match answer {
        Err(_) => return fallback(Some(format!("planner LLM timed out after {timeout:?}"))),
        Ok(Err(e)) => return fallback(Some(format!("planner LLM failed: {e}"))),
        Ok(Ok(msg)) => match ferrograph::chat::parse_structured::<PlannerChoice>(&msg.content) {
            Ok(c) => c,
            Err(e) => return fallback(Some(format!("planner answer invalid: {e}"))),
        },
    };
    match check(&choice.tool, state, &registered) {
        Ok(()) => decision(
            choice.tool,
            choice.reason.chars().take(300).collect(),
            if choice.confidence.is_finite() {
                choice.confidence.clamp(0.0, 1.0)
            } else {
                0.0
            },
            false,
            None,
        ),
        Err(v) => fallback(Some(format!("LLM chose `{}`: {v}", choice.tool))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        FALLBACK_SEQUENCE.iter().map(|s| s.to_string()).collect()
    }

    fn with(steps: &[&str]) -> Investigation {
        Investigation {
            completed_steps: steps.iter().map(|s| s.to_string()).collect(),
            ..Investigation::default()
        }
    }

    #[test]
    fn allowed_steps_follow_the_rules() {
        let r = names();
        assert_eq!(allowed_steps(&with(&[]), &r), ["context_tool"]);
        assert_eq!(
            allowed_steps(&with(&["context_tool"]), &r),
            ["pattern_tool", "similarity_tool"]
        );
        assert_eq!(
            allowed_steps(
                &with(&["context_tool", "pattern_tool", "similarity_tool"]),
                &r
            ),
            ["reasoning_tool"]
        );
        let done = [
            "context_tool",
            "pattern_tool",
            "similarity_tool",
            "reasoning_tool",
            "recommendation_tool",
        ];
        assert_eq!(
            allowed_steps(&with(&done), &r),
            ["rule_draft_tool", COMPLETE]
        );
        // Every allowed step passes the check, and the schema offers exactly those.
        for steps in [&done[..0], &done[..1], &done[..3], &done[..]] {
            let st = with(steps);
            let allowed = allowed_steps(&st, &r);
            assert!(allowed.iter().all(|t| check(t, &st, &r).is_ok()));
            let schema = choice_schema(&allowed);
            assert_eq!(
                schema["properties"]["tool"]["enum"]
                    .as_array()
                    .unwrap()
                    .len(),
                allowed.len()
            );
        }
    }

    #[test]
    fn every_rule_is_enforced() {
        let r = names();
        assert_eq!(
            check("pattern_tool", &with(&[]), &r),
            Err(Violation::ContextFirst("pattern_tool".into()))
        );
        assert_eq!(
            check("context_tool", &with(&["context_tool"]), &r),
            Err(Violation::Repeat("context_tool".into()))
        );
        assert_eq!(
            check(
                "reasoning_tool",
                &with(&["context_tool", "pattern_tool"]),
                &r
            ),
            Err(Violation::AnalysisBeforeReasoning)
        );
        assert_eq!(
            check(
                "recommendation_tool",
                &with(&["context_tool", "pattern_tool", "similarity_tool"]),
                &r
            ),
            Err(Violation::RecommendationTooEarly)
        );
        assert_eq!(
            check(
                "rule_draft_tool",
                &with(&[
                    "context_tool",
                    "pattern_tool",
                    "similarity_tool",
                    "reasoning_tool"
                ]),
                &r
            ),
            Err(Violation::RuleDraftBeforeRecommendation)
        );
        assert_eq!(
            check("wire_money", &with(&["context_tool"]), &r),
            Err(Violation::UnknownTool("wire_money".into()))
        );
        assert_eq!(
            check(COMPLETE, &with(&["context_tool"]), &r),
            Err(Violation::CompleteTooEarly)
        );
        assert_eq!(check("context_tool", &with(&[]), &r), Ok(()));
        assert_eq!(
            check("similarity_tool", &with(&["context_tool"]), &r),
            Ok(())
        );
        let all = with(&FALLBACK_SEQUENCE);
        assert_eq!(check(COMPLETE, &all, &r), Ok(()));
        assert_eq!(deterministic_next(&all, &r), COMPLETE);
        assert_eq!(
            deterministic_next(&with(&["context_tool"]), &r),
            "pattern_tool"
        );
    }
}
