//! The six investigation tools of seed 004, as [`Tool`]s in a [`ToolRegistry`].
//!
//! Each tool takes the investigation state (as JSON, under `state`) and returns [`Findings`]:
//! the fields of the state it fills in. The tool executor merges them; a tool never writes
//! the state itself.

use super::data::FraudData;
use super::dataset::category;
use super::features::TxFeatures;
use super::state::Investigation;
use async_trait::async_trait;
use ferrograph::chat::{ChatModel, GenerateOptions};
use ferrograph::Json;
use ferrograph_tools::{Tool, ToolContext, ToolError, ToolRegistry};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::sync::Arc;

/// Tool names, in the deterministic fallback order.
pub const FALLBACK_SEQUENCE: [&str; 6] = [
    CONTEXT_TOOL,
    PATTERN_TOOL,
    SIMILARITY_TOOL,
    REASONING_TOOL,
    RECOMMENDATION_TOOL,
    RULE_DRAFT_TOOL,
];
/// Loads the transaction, account, merchant and history.
pub const CONTEXT_TOOL: &str = "context_tool";
/// Rules over velocity, amounts, geography and merchant category.
pub const PATTERN_TOOL: &str = "pattern_tool";
/// Nearest historical transactions (HNSW).
pub const SIMILARITY_TOOL: &str = "similarity_tool";
/// LLM assessment of the evidence.
pub const REASONING_TOOL: &str = "reasoning_tool";
/// Recommended actions.
pub const RECOMMENDATION_TOOL: &str = "recommendation_tool";
/// A detection rule drafted from the case, back-tested on the history.
pub const RULE_DRAFT_TOOL: &str = "rule_draft_tool";

/// What a tool adds to the investigation.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Findings {
    /// New context.
    pub context: Option<Value>,
    /// New pattern results.
    pub pattern_results: Option<Value>,
    /// New similarity results.
    pub similarity_results: Option<Value>,
    /// New reasoning.
    pub reasoning: Option<Value>,
    /// New recommendations.
    pub recommendations: Option<Vec<Value>>,
    /// New rule draft.
    pub rule_draft: Option<Value>,
    /// Hypotheses to append.
    pub hypotheses: Vec<String>,
    /// Evidence to append.
    pub evidence: Vec<Value>,
}

/// An investigation tool: reads the state, returns what it found. [`Investigating`] makes it a
/// [`Tool`] whose arguments are `{"state": …}` and whose result is the [`Findings`] as JSON.
#[async_trait]
pub trait InvestigationTool: Send + Sync + 'static {
    /// Registry name.
    const NAME: &'static str;
    /// What it does, for the planner.
    const DESCRIPTION: &'static str;
    /// Runs on the investigation so far.
    async fn run(&self, state: Investigation) -> Result<Findings, ToolError>;
}

/// An [`InvestigationTool`] as a [`Tool`].
pub struct Investigating<T>(pub T);

#[async_trait]
impl<T: InvestigationTool> Tool for Investigating<T> {
    fn name(&self) -> &str {
        T::NAME
    }
    fn description(&self) -> &str {
        T::DESCRIPTION
    }
    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": { "state": { "type": "object", "description": "the investigation state" } },
            "required": ["state"]
        })
    }
    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
        let state = args.get("state").cloned().unwrap_or(Value::Null);
        let state = serde_json::from_value(state)
            .map_err(|e| ToolError::invalid_arguments(T::NAME, e.to_string()))?;
        let findings = self.0.run(state).await?;
        serde_json::to_value(&findings).map_err(ToolError::from)
    }
}

/// Removes what could steer a model from free text (acquirer-supplied names): control
/// characters, role markers and instruction phrases; caps the length.
pub fn sanitize(text: &str) -> String {
    let cleaned: String = text
        .chars()
        .filter(|c| !c.is_control())
        .collect::<String>()
        .replace(['{', '}', '<', '>', '`'], " ");
    let lower = cleaned.to_lowercase();
    let markers = [
        "ignore previous",
        "ignore all",
        "system:",
        "assistant:",
        "instruction",
        "answer complete",
        "you are",
    ];
    let cut = markers
        .iter()
        .filter_map(|m| lower.find(m))
        .min()
        .unwrap_or(cleaned.len());
    let mut out: String = cleaned[..cut]
        .trim()
        .trim_end_matches(['.', ',', ';', ':'])
        .to_string();
    if cut < cleaned.len() {
        out.push_str(" [text removed by prompt guard]");
    }
    out.chars().take(80).collect()
}

/// `context_tool`.
pub struct ContextTool {
    data: Arc<FraudData>,
}

#[async_trait]
impl InvestigationTool for ContextTool {
    const NAME: &'static str = CONTEXT_TOOL;
    const DESCRIPTION: &'static str =
        "Load the transaction, the account, the merchant and a summary of the account's recent history.";
    async fn run(&self, s: Investigation) -> Result<Findings, ToolError> {
        let ds = &self.data.dataset;
        let t = ds.transaction(&s.transaction_id).ok_or_else(|| {
            ToolError::failed(format!("transaction {} not found", s.transaction_id))
        })?;
        let a = ds
            .account(&t.account_id)
            .ok_or_else(|| ToolError::failed(format!("account {} not found", t.account_id)))?;
        let m = ds
            .merchant(&t.merchant_id)
            .ok_or_else(|| ToolError::failed(format!("merchant {} not found", t.merchant_id)))?;
        let f = self.data.features_of(&t.id).cloned().unwrap_or_default();
        let hist = ds.history_before(&a.id, t.ts_ms);
        let last = hist.last().map(|p| {
            json!({"timestamp": p.timestamp, "country": p.country, "city": p.city,
                   "amount": p.amount, "channel": p.channel})
        });
        let name = if s.feature_flags.prompt_guard_enabled {
            sanitize(&m.name)
        } else {
            m.name.clone()
        };
        let context = json!({
            "transaction": t,
            "account": {
                "id": a.id, "home_country": a.home_country, "home_city": a.home_city,
                "typical_amount": a.typical_amount, "opened_days_ago": a.opened_days_ago,
                "usual_categories": a.usual_mccs.iter()
                    .map(|c| category(*c).map_or("other", |x| x.1)).collect::<Vec<_>>(),
            },
            "merchant": {
                "id": m.id, "name": name, "mcc": m.mcc, "category": m.category,
                "country": m.country, "city": m.city, "online": m.online, "risk": m.risk,
            },
            "history": {
                "transactions_before": hist.len(),
                "previous": last,
            },
            "features": f,
        });
        Ok(Findings {
            context: Some(context),
            evidence: vec![json!({"source": CONTEXT_TOOL, "kind": "amount",
                "detail": format!("{:.2} EUR, {:.1}x the account's 30-day median of {:.2}",
                    t.amount, f.amount_ratio, f.median_amount)})],
            ..Findings::default()
        })
    }
}

fn features_from(s: &Investigation) -> Result<TxFeatures, ToolError> {
    let f = s
        .context
        .0
        .get("features")
        .cloned()
        .ok_or_else(|| ToolError::failed("no context yet: run context_tool first"))?;
    serde_json::from_value(f).map_err(ToolError::from)
}

/// One rule of the pattern tool.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RuleHit {
    /// Rule name.
    pub rule: String,
    /// Score it adds, 0..1.
    pub score: f64,
    /// Why it fired.
    pub detail: String,
    /// The fraud pattern it points at.
    pub pattern: String,
}

/// The rules of the pattern tool, over a transaction's features.
pub fn pattern_rules(f: &TxFeatures) -> Vec<RuleHit> {
    let mut hits = Vec::new();
    let mut hit = |rule: &str, score: f64, pattern: &str, detail: String| {
        hits.push(RuleHit {
            rule: rule.into(),
            score,
            detail,
            pattern: pattern.into(),
        })
    };
    if f.small_online_last_1h >= 3 {
        hit(
            "card_testing_probes",
            0.9,
            "card_testing",
            format!(
                "{} online purchases under 5 EUR in the hour before",
                f.small_online_last_1h
            ),
        );
    }
    if f.amount_ratio >= 5.0 {
        hit(
            "amount_anomaly",
            (f.amount_ratio / 25.0).clamp(0.35, 0.85),
            "account_takeover",
            format!("amount is {:.1}x the 30-day median", f.amount_ratio),
        );
    }
    if f.tx_last_1h >= 4 {
        hit(
            "velocity",
            (f64::from(f.tx_last_1h) / 8.0).clamp(0.4, 0.9),
            "velocity_burst",
            format!("{} purchases in the hour before", f.tx_last_1h),
        );
    }
    if f.travel_speed_kmh > 900.0 && f.travel_km > 500.0 {
        hit(
            "impossible_travel",
            0.95,
            "impossible_travel",
            format!(
                "{:.0} km from the previous card-present purchase at {:.0} km/h",
                f.travel_km, f.travel_speed_kmh
            ),
        );
    }
    if f.new_country {
        hit(
            "new_country",
            0.45,
            "account_takeover",
            "used in a country not seen on the account in 30 days".into(),
        );
    }
    if f.high_risk_category {
        hit(
            "high_risk_category",
            0.4 + 0.4 * f.merchant_risk.clamp(0.0, 1.0),
            "account_takeover",
            format!(
                "high-risk category outside the holder's habits (merchant risk {:.2})",
                f.merchant_risk
            ),
        );
    }
    if f.round_amount && f.high_risk_category {
        hit(
            "round_amount_cash_out",
            0.7,
            "cash_out",
            "round amount at a cash-like merchant".into(),
        );
    }
    if f.night && f.online && f.amount_ratio > 3.0 {
        hit(
            "night_online_spend",
            0.35,
            "account_takeover",
            "large online purchase between midnight and 5 am".into(),
        );
    }
    hits
}

/// Noisy-or of the rule scores.
pub fn combined_score(hits: &[RuleHit]) -> f64 {
    1.0 - hits
        .iter()
        .fold(1.0, |acc, h| acc * (1.0 - h.score.clamp(0.0, 1.0)))
}

/// `pattern_tool`.
pub struct PatternTool;

#[async_trait]
impl InvestigationTool for PatternTool {
    const NAME: &'static str = PATTERN_TOOL;
    const DESCRIPTION: &'static str =
        "Check velocity, amount, geography and merchant-category rules against the transaction.";
    async fn run(&self, s: Investigation) -> Result<Findings, ToolError> {
        let f = features_from(&s)?;
        let hits = pattern_rules(&f);
        let score = combined_score(&hits);
        let mut patterns: Vec<String> = hits.iter().map(|h| h.pattern.clone()).collect();
        patterns.sort();
        patterns.dedup();
        let hypotheses = patterns
            .iter()
            .map(|p| format!("pattern rules point at {}", p.replace('_', " ")))
            .collect();
        let evidence = hits
            .iter()
            .map(|h| json!({"source": PATTERN_TOOL, "kind": h.rule, "score": h.score, "detail": h.detail}))
            .collect();
        Ok(Findings {
            pattern_results: Some(json!({ "rules": hits, "score": score, "patterns": patterns })),
            hypotheses,
            evidence,
            ..Findings::default()
        })
    }
}

/// `similarity_tool`.
pub struct SimilarityTool {
    data: Arc<FraudData>,
}

#[async_trait]
impl InvestigationTool for SimilarityTool {
    const NAME: &'static str = SIMILARITY_TOOL;
    const DESCRIPTION: &'static str =
        "Find the most similar historical transactions (HNSW over behaviour features) and how many were confirmed fraud.";
    async fn run(&self, s: Investigation) -> Result<Findings, ToolError> {
        let f = features_from(&s)?;
        let k = 10;
        let data = self.data.clone();
        let exact = !s.feature_flags.vector_search_enabled;
        let t = s
            .context
            .0
            .pointer("/transaction/ts_ms")
            .and_then(Value::as_i64)
            .unwrap_or(i64::MAX);
        let neighbours =
            tokio::task::spawn_blocking(move || data.similar(&f.vector(), k, t, exact))
                .await
                .map_err(|e| ToolError::failed(format!("similarity search panicked: {e}")))??;
        let fraud: Vec<&super::data::Neighbour> = neighbours
            .iter()
            .filter(|n| n.fraud_label.is_some())
            .collect();
        let ratio = if neighbours.is_empty() {
            0.0
        } else {
            fraud.len() as f64 / neighbours.len() as f64
        };
        let mut labels: Vec<String> = fraud.iter().filter_map(|n| n.fraud_label.clone()).collect();
        labels.sort();
        let dominant = labels
            .chunk_by(|a, b| a == b)
            .max_by_key(|g| g.len())
            .and_then(|g| g.first().cloned());
        let mut hypotheses = Vec::new();
        if let Some(d) = &dominant {
            if ratio >= 0.3 {
                hypotheses.push(format!(
                    "{} of the {} nearest historical transactions were confirmed {}",
                    fraud.len(),
                    neighbours.len(),
                    d.replace('_', " ")
                ));
            }
        }
        Ok(Findings {
            similarity_results: Some(json!({
                "k": k, "search": if exact { "exact" } else { "hnsw" },
                "neighbours": neighbours, "fraud_ratio": ratio, "dominant_pattern": dominant,
            })),
            evidence: vec![json!({"source": SIMILARITY_TOOL, "kind": "neighbours",
                "detail": format!("{}/{} similar past transactions were fraud", fraud.len(), neighbours.len())})],
            hypotheses,
            ..Findings::default()
        })
    }
}

/// The reasoning tool's structured answer.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema, PartialEq)]
pub struct Assessment {
    /// Overall verdict.
    pub verdict: Verdict,
    /// Confidence in the verdict, 0 to 1.
    pub confidence: f64,
    /// The most likely explanation, one sentence.
    pub hypothesis: String,
    /// Up to three facts that support it.
    pub key_factors: Vec<String>,
}

/// Verdict of the reasoning tool.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Verdict {
    /// Fraud is the best explanation.
    LikelyFraud,
    /// Unclear; needs a person.
    Suspicious,
    /// A legitimate explanation fits.
    LikelyLegitimate,
}

/// `reasoning_tool`.
pub struct ReasoningTool {
    llm: Option<Arc<dyn ChatModel>>,
    options: GenerateOptions,
}

/// The pattern tool's combined score and the share of fraud among the similar transactions
/// (0 for what has not run).
fn analysis_scores(s: &Investigation) -> (f64, f64) {
    let read = |v: &Json, key: &str| v.0.get(key).and_then(Value::as_f64).unwrap_or(0.0);
    (
        read(&s.pattern_results, "score"),
        read(&s.similarity_results, "fraud_ratio"),
    )
}

fn rule_assessment(s: &Investigation) -> Assessment {
    let (p, r) = analysis_scores(s);
    let score = 0.6 * p + 0.4 * r;
    let verdict = if score >= 0.6 {
        Verdict::LikelyFraud
    } else if score >= 0.3 {
        Verdict::Suspicious
    } else {
        Verdict::LikelyLegitimate
    };
    Assessment {
        verdict,
        confidence: (0.5 + (score - 0.45).abs()).min(0.95),
        hypothesis: s
            .hypotheses
            .first()
            .cloned()
            .unwrap_or_else(|| "no fraud pattern found".into()),
        key_factors: s
            .evidence
            .iter()
            .filter_map(|e| {
                e.0.get("detail")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
            .take(3)
            .collect(),
    }
}

fn evidence_summary(s: &Investigation) -> String {
    let mut out = String::new();
    if let Some(t) = s.context.0.get("transaction") {
        out.push_str(&format!(
            "Transaction: {} EUR, {} in {} ({}), category {}.\n",
            t.get("amount").and_then(Value::as_f64).unwrap_or(0.0),
            t.get("channel").and_then(Value::as_str).unwrap_or("?"),
            t.get("city").and_then(Value::as_str).unwrap_or("?"),
            t.get("country").and_then(Value::as_str).unwrap_or("?"),
            s.context
                .0
                .pointer("/merchant/category")
                .and_then(Value::as_str)
                .unwrap_or("?"),
        ));
    }
    for e in &s.evidence {
        if let Some(d) = e.0.get("detail").and_then(Value::as_str) {
            out.push_str(&format!("- {d}\n"));
        }
    }
    for h in &s.hypotheses {
        out.push_str(&format!("Hypothesis: {h}\n"));
    }
    out
}

#[async_trait]
impl InvestigationTool for ReasoningTool {
    const NAME: &'static str = REASONING_TOOL;
    const DESCRIPTION: &'static str =
        "Weigh the evidence and give a verdict (LIKELY_FRAUD, SUSPICIOUS, LIKELY_LEGITIMATE) with confidence.";
    async fn run(&self, s: Investigation) -> Result<Findings, ToolError> {
        let fallback = rule_assessment(&s);
        let (assessment, method, note) = match (&self.llm, s.feature_flags.reasoning_llm_enabled) {
            (Some(llm), true) => {
                let messages = vec![
                    ferrograph::Message::system(
                        "You are a card fraud analyst. Weigh the evidence and answer with a JSON \
                         object: verdict (LIKELY_FRAUD, SUSPICIOUS or LIKELY_LEGITIMATE), \
                         confidence (0 to 1), hypothesis (one sentence), key_factors (up to 3).",
                    ),
                    ferrograph::Message::human(evidence_summary(&s)),
                ];
                let answer = llm
                    .clone()
                    .with_structured_output::<Assessment>()
                    .invoke(&messages, &self.options)
                    .await;
                match answer {
                    Ok(mut a) => {
                        a.confidence = if a.confidence.is_finite() {
                            a.confidence.clamp(0.0, 1.0)
                        } else {
                            0.5
                        };
                        a.key_factors.truncate(3);
                        (a, "llm", None)
                    }
                    Err(e) => (fallback, "rules_fallback", Some(e.to_string())),
                }
            }
            _ => (fallback, "rules", None),
        };
        Ok(Findings {
            reasoning: Some(json!({
                "verdict": assessment.verdict, "confidence": assessment.confidence,
                "hypothesis": assessment.hypothesis, "key_factors": assessment.key_factors,
                "method": method, "llm_error": note,
            })),
            hypotheses: vec![assessment.hypothesis.clone()],
            ..Findings::default()
        })
    }
}

/// Combined fraud score of the evidence so far, 0..1.
pub fn evidence_score(s: &Investigation) -> f64 {
    let (p, r) = analysis_scores(s);
    let verdict = s.reasoning.0.get("verdict").and_then(Value::as_str);
    let c = s
        .reasoning
        .0
        .get("confidence")
        .and_then(Value::as_f64)
        .unwrap_or(0.5);
    let llm = match verdict {
        Some("LIKELY_FRAUD") => 0.5 + 0.5 * c,
        Some("SUSPICIOUS") => 0.5,
        Some("LIKELY_LEGITIMATE") => 0.5 - 0.5 * c,
        _ => 0.5,
    };
    // The model is advisory: it moves the score by at most 0.15.
    (0.55 * p + 0.45 * r + 0.3 * (llm - 0.5)).clamp(0.0, 1.0)
}

/// `recommendation_tool`.
pub struct RecommendationTool;

#[async_trait]
impl InvestigationTool for RecommendationTool {
    const NAME: &'static str = RECOMMENDATION_TOOL;
    const DESCRIPTION: &'static str =
        "Recommend actions (block the card, step-up authentication, contact the customer, monitor, close).";
    async fn run(&self, s: Investigation) -> Result<Findings, ToolError> {
        let score = evidence_score(&s);
        let rec = |action: &str, priority: &str, why: &str| json!({"action": action, "priority": priority, "rationale": why, "score": score});
        let recs = if score >= 0.75 {
            vec![
                rec(
                    "BLOCK_CARD",
                    "P1",
                    "strong fraud evidence: stop further losses",
                ),
                rec(
                    "HOLD_TRANSACTION",
                    "P1",
                    "do not settle until the holder confirms",
                ),
                rec("CONTACT_CUSTOMER", "P2", "confirm and reissue the card"),
            ]
        } else if score >= 0.5 {
            vec![
                rec("STEP_UP_AUTH", "P2", "challenge the next purchases"),
                rec(
                    "CONTACT_CUSTOMER",
                    "P2",
                    "ask the holder to confirm the purchase",
                ),
                rec("MONITOR", "P3", "watch the account for 14 days"),
            ]
        } else if score >= 0.3 {
            vec![rec(
                "MONITOR",
                "P3",
                "some risk signals; watch the account for 30 days",
            )]
        } else {
            vec![rec(
                "CLOSE_NO_ACTION",
                "P4",
                "behaviour consistent with the holder's",
            )]
        };
        Ok(Findings {
            recommendations: Some(recs),
            ..Findings::default()
        })
    }
}

/// `rule_draft_tool`.
pub struct RuleDraftTool {
    data: Arc<FraudData>,
}

#[async_trait]
impl InvestigationTool for RuleDraftTool {
    const NAME: &'static str = RULE_DRAFT_TOOL;
    const DESCRIPTION: &'static str =
        "Draft a detection rule from the rules that fired, back-tested on the labelled history.";
    async fn run(&self, s: Investigation) -> Result<Findings, ToolError> {
        let hits: Vec<RuleHit> = s
            .pattern_results
            .0
            .get("rules")
            .cloned()
            .map(serde_json::from_value)
            .transpose()?
            .unwrap_or_default();
        if hits.is_empty() {
            return Ok(Findings {
                rule_draft: Some(json!({"status": "NOT_NEEDED",
                    "reason": "no pattern rule fired on this transaction"})),
                ..Findings::default()
            });
        }
        let mut top = hits.clone();
        top.sort_by(|a, b| b.score.total_cmp(&a.score));
        top.truncate(2);
        let names: Vec<String> = top.iter().map(|h| h.rule.clone()).collect();
        let data = self.data.clone();
        let names2 = names.clone();
        let bt = tokio::task::spawn_blocking(move || data.backtest(&names2))
            .await
            .map_err(|e| ToolError::failed(format!("back-test panicked: {e}")))?;
        let expression = names.join(" AND ");
        Ok(Findings {
            rule_draft: Some(json!({
                "name": format!("draft_{}", names.join("_and_")),
                "conditions": names, "expression": expression,
                "action": if bt.precision >= 0.5 { "DECLINE_AND_REVIEW" } else { "REVIEW" },
                "status": "DRAFT", "backtest": bt,
            })),
            ..Findings::default()
        })
    }
}

/// The registry with the six tools.
pub fn registry(
    data: Arc<FraudData>,
    llm: Option<Arc<dyn ChatModel>>,
    llm_options: GenerateOptions,
) -> Result<ToolRegistry, ToolError> {
    let mut r = ToolRegistry::new();
    r.register(Investigating(ContextTool { data: data.clone() }))?;
    r.register(Investigating(PatternTool))?;
    r.register(Investigating(SimilarityTool { data: data.clone() }))?;
    r.register(Investigating(ReasoningTool {
        llm,
        options: llm_options,
    }))?;
    r.register(Investigating(RecommendationTool))?;
    r.register(Investigating(RuleDraftTool { data }))?;
    Ok(r)
}

/// The findings a tool returned, from its JSON result.
pub fn findings(value: Value) -> Result<Findings, ToolError> {
    serde_json::from_value(value).map_err(ToolError::from)
}
