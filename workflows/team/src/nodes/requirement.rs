//! Requirement context: the product owner, the business analyst, and the stories gate.

use super::*;
use crate::brief;
use crate::domain::{
    Blocker, Clarification, PriorityLevel, RequirementDoc, StoryDraft, StoryDrafts, UserStory,
};
use crate::events::agent::{BA, PM, PO, TA};
use crate::prompts;

fn short_hash(text: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(text.as_bytes())
        .iter()
        .take(3)
        .map(|b| format!("{b:02X}"))
        .collect()
}

/// The product owner: reads the brief (or revises after a rejection), blocks a vague one.
pub(crate) async fn po_agent(
    d: Arc<Deps>,
    s: Arc<TeamState>,
    ctx: NodeContext,
) -> Result<Update, NodeError> {
    crate::agent_step!(PO, po(&d, &s, &ctx).await)
}

async fn po(d: &Deps, s: &TeamState, ctx: &NodeContext) -> Result<Update, String> {
    let mut t = Turn::begin(d, s, ctx, PO)?;
    let mut u = Update::new();
    let mut req = s.requirement.clone();
    if s.run_dir.is_empty() {
        let base = if s.out.is_empty() {
            d.settings.data_dir.join("runs")
        } else {
            PathBuf::from(&s.out)
        };
        t.run_dir = base.join(&t.run);
        u = u.run_dir(rel(&t.run_dir));
    }
    if req.brief_text.is_empty() {
        if !s.brief_text.trim().is_empty() {
            req.brief_text = s.brief_text.clone();
        } else if s.brief.is_empty() {
            return Err(
                "the team needs a brief: --brief FILE_OR_DIR (or brief_text in the input)".into(),
            );
        } else {
            let b = brief::load(Path::new(&s.brief)).map_err(|e| e.to_string())?;
            req.brief_text = b.text;
            req.reference = b.reference;
        }
        if req.brief_text.len() as u64 > brief::MAX_BRIEF_BYTES {
            return Err(format!(
                "the brief is over the {}-byte limit",
                brief::MAX_BRIEF_BYTES
            ));
        }
        artifacts::write_text(&t.run_dir.join("brief.md"), &req.brief_text)
            .map_err(|e| e.to_string())?;
    }
    let text = req.brief_text.clone();
    let doc_id = format!("REQ-{}", short_hash(&text));

    if t.lifecycle == ReqState::Received {
        if let Some(why) = brief::vagueness(&text) {
            let blocker = Blocker {
                blocker_id: format!("BLK-{}", s.blockers.len() + 1),
                description: format!("The brief is too vague to clarify: {why}."),
                blocked_agent: PO.into(),
                raised_by: PO.into(),
                raised_at: now(),
                route: String::new(),
                resolved: false,
                resolution: None,
            };
            t.transition(ReqState::Blocked, "RequirementBlocked", why.clone());
            t.emit(DomainEvent::RequirementBlocked {
                blocker_id: blocker.blocker_id.clone(),
                description: blocker.description.clone(),
            });
            t.say(format!("the brief is too vague: {why}"));
            let mut blockers = s.blockers.clone();
            blockers.push(blocker);
            return t.finish(
                s,
                u.requirement(req)
                    .blockers(blockers)
                    .status(status::BLOCKED.to_string()),
            );
        }
    }

    let rejection = req.rejection_reason.clone();
    let previous = if rejection.is_some() {
        t.last_answer(d)
    } else {
        None
    };
    let answer: Option<Clarification> = t
        .ask(
            d,
            "clarify",
            prompts::PO.into(),
            prompts::clarify(&text, rejection.as_deref(), previous.as_deref()),
            320,
            |_| {},
        )
        .await?;
    let keep = |items: Vec<String>, must_ground: bool| -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for i in items.into_iter().map(|i| i.trim().to_string()) {
            if usable(&i)
                && (!must_ground || grounded(&i, &text))
                && !out.iter().any(|o| same(o, &i))
            {
                out.push(i);
            }
        }
        out
    };
    let (model_objectives, oos, assumptions, metrics) = match answer {
        Some(a) => (
            keep(a.objectives, true),
            keep(a.out_of_scope, true),
            keep(a.assumptions, false),
            keep(a.success_metrics, false),
        ),
        None => Default::default(),
    };
    // The brief's own requirement lines are kept verbatim: a small model's paraphrase loses
    // their details (the function names, "ignoring case"). The model's objectives are kept
    // when they add words the brief's lines do not have.
    let bullets = brief::objectives(&text);
    let bullet_words: std::collections::BTreeSet<String> =
        bullets.iter().flat_map(|b| words(b)).collect();
    let added: Vec<String> = model_objectives
        .iter()
        .filter(|o| !words(o).is_subset(&bullet_words))
        .cloned()
        .collect();
    let mut by = PO.to_string();
    let mut objectives = bullets.clone();
    objectives.extend(added.iter().cloned());
    if model_objectives.is_empty() {
        by = "fallback".into();
        t.audit("fallback", "the product owner's model gave no objective grounded in the brief: the brief's own requirement lines are the objectives", json!({"objectives": objectives}));
    } else if !bullets.is_empty() {
        t.audit(
            "decision",
            format!("objectives: the brief's {} requirement line(s) verbatim, plus {} of the model's {} that add to them", bullets.len(), added.len(), model_objectives.len()),
            json!({"model": model_objectives, "added": added}),
        );
    }
    objectives.truncate(6);
    if objectives.is_empty() {
        return Err("neither the model nor the brief's text gave an objective".into());
    }
    let objective_words: std::collections::BTreeSet<String> =
        objectives.iter().flat_map(|o| words(o)).collect();
    // Out of scope must not contradict an objective; an assumption must say something the
    // objectives do not.
    let oos: Vec<String> = oos
        .into_iter()
        .filter(|o| words(o).is_disjoint(&objective_words))
        .collect();
    let assumptions: Vec<String> = assumptions
        .into_iter()
        .filter(|a| !words(a).is_subset(&objective_words))
        .collect();
    let mut out_of_scope = brief::out_of_scope(&text);
    for o in oos {
        if !out_of_scope.iter().any(|x| same(x, &o)) {
            out_of_scope.push(o);
        }
    }
    let mut constraints = vec!["Python 3 standard library only".to_string()];
    if let Some(r) = &rejection {
        constraints.push(format!("Stakeholder feedback on the stories: {r}"));
    }
    let revision = req.doc.as_ref().map_or(0, |d| d.revision + 1);
    let doc = RequirementDoc {
        doc_id: doc_id.clone(),
        original_brief: text.clone(),
        clarified_objectives: objectives,
        out_of_scope,
        assumptions,
        constraints,
        success_metrics: metrics,
        deliverables: brief::deliverables(&text),
        clarified_by: by,
        clarified_at: now(),
        revision,
    };
    artifacts::write_text(
        &t.run_dir.join("requirements.md"),
        &artifacts::requirements_md(&doc),
    )
    .map_err(|e| e.to_string())?;
    if t.lifecycle == ReqState::Received {
        t.transition(
            ReqState::Clarified,
            "RequirementsClarified",
            format!("{} objectives", doc.clarified_objectives.len()),
        );
    } else {
        t.audit(
            "decision",
            format!("revision {revision} of the requirement after the stories were rejected"),
            json!({"reason": rejection}),
        );
    }
    t.emit(DomainEvent::RequirementsClarified {
        requirement_id: doc_id,
        objectives: doc.clarified_objectives.len(),
    });
    t.say(format!(
        "clarified {} objective(s) (by {})",
        doc.clarified_objectives.len(),
        doc.clarified_by
    ));
    req.doc = Some(doc);
    t.finish(s, u.requirement(req))
}

fn points(p: u8) -> u8 {
    [1u8, 2, 3, 5, 8].into_iter().find(|x| *x >= p).unwrap_or(8)
}

/// A title from a requirement line: its first clause (the whole line when that clause is
/// under three words, as "However, …" is), cut at a word, under 60 characters.
fn title_of(o: &str) -> String {
    let clause = o.split([',', ';', '(']).next().unwrap_or(o);
    let source = if clause.split_whitespace().count() < 3 {
        o
    } else {
        clause
    };
    let mut t = String::new();
    for w in source.split_whitespace() {
        if t.len() + w.len() + 1 > 60 {
            break;
        }
        if !t.is_empty() {
            t.push(' ');
        }
        t.push_str(w);
    }
    let mut c = t.chars();
    c.next()
        .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
        .unwrap_or_default()
}

fn lower_first(o: &str) -> String {
    let mut c = o.trim().chars();
    c.next()
        .map(|f| f.to_lowercase().collect::<String>() + c.as_str())
        .unwrap_or_default()
}

/// Whether two texts say the same (case, spacing and punctuation aside).
pub(crate) fn same(a: &str, b: &str) -> bool {
    let norm = |t: &str| {
        t.to_lowercase()
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .collect::<Vec<_>>()
            .join(" ")
    };
    norm(a) == norm(b)
}

/// Why a drafted story is not usable, if it is not: empty or looping text, not about the
/// brief, a role that is not a role, fields that repeat each other, no testable criterion.
fn story_problem(st: &StoryDraft, source: &str) -> Option<&'static str> {
    if !usable(&st.title) || !usable(&st.i_want) {
        return Some("empty or looping text");
    }
    if !grounded(&format!("{} {}", st.title, st.i_want), source) {
        return Some("not about the brief");
    }
    if st.as_a.split_whitespace().count() > 6
        || same(&st.as_a, &st.i_want)
        || same(&st.as_a, &st.title)
    {
        return Some("the role is not a role");
    }
    if same(&st.so_that, &st.i_want) || same(&st.so_that, &st.title) || same(&st.so_that, &st.as_a)
    {
        return Some("the benefit repeats the want");
    }
    if !st
        .acceptance_criteria
        .iter()
        .any(|c| usable(c) && grounded(c, source))
    {
        return Some("no testable criterion about the brief");
    }
    None
}

/// The business analyst: stories with acceptance criteria.
pub(crate) async fn ba_agent(
    d: Arc<Deps>,
    s: Arc<TeamState>,
    ctx: NodeContext,
) -> Result<Update, NodeError> {
    crate::agent_step!(BA, ba(&d, &s, &ctx).await)
}

async fn ba(d: &Deps, s: &TeamState, ctx: &NodeContext) -> Result<Update, String> {
    let mut t = Turn::begin(d, s, ctx, BA)?;
    let mut req = s.requirement.clone();
    let doc = req
        .doc
        .clone()
        .ok_or("the analyst has no clarified requirement")?;
    let source = format!(
        "{} {}",
        doc.original_brief,
        doc.clarified_objectives.join(" ")
    );
    let answer: Option<StoryDrafts> = t
        .ask(
            d,
            "stories",
            prompts::BA.into(),
            prompts::stories(&doc, req.rejection_reason.as_deref()),
            700,
            |_| {},
        )
        .await?;
    let drafts: Vec<StoryDraft> = answer.map(|a| a.stories).unwrap_or_default();
    let n = drafts.len();
    let mut kept: Vec<StoryDraft> = Vec::new();
    let mut origin: Vec<&str> = Vec::new();
    let mut dropped: Vec<String> = Vec::new();
    for mut st in drafts {
        if let Some(why) = story_problem(&st, &source) {
            dropped.push(format!(
                "\"{}\": {why}",
                st.title.chars().take(60).collect::<String>()
            ));
            continue;
        }
        if kept
            .iter()
            .any(|k| same(&k.i_want, &st.i_want) || same(&k.title, &st.title))
        {
            dropped.push(format!(
                "\"{}\": a duplicate",
                st.title.chars().take(60).collect::<String>()
            ));
            continue;
        }
        let mut criteria: Vec<String> = Vec::new();
        for c in st.acceptance_criteria.iter().map(|c| c.trim().to_string()) {
            if usable(&c) && grounded(&c, &source) && !criteria.iter().any(|x| same(x, &c)) {
                criteria.push(c);
            }
        }
        st.acceptance_criteria = criteria;
        kept.push(st);
        origin.push(BA);
    }
    if !dropped.is_empty() {
        t.audit(
            "decision",
            format!("{} of the analyst's {n} stories dropped", dropped.len()),
            json!({"dropped": dropped}),
        );
    }
    // Every objective gets a story: those the model's stories leave out get one of their own.
    let mut added = 0;
    for o in &doc.clarified_objectives {
        let ow = words(o);
        let covered = kept.iter().any(|st| {
            let sw = words(&format!(
                "{} {} {}",
                st.title,
                st.i_want,
                st.acceptance_criteria.join(" ")
            ));
            ow.intersection(&sw).count() * 2 >= ow.len().max(1)
        });
        if !covered {
            added += 1;
            kept.push(StoryDraft {
                title: title_of(o),
                as_a: "user of the program".into(),
                i_want: format!("to {}", lower_first(o)),
                so_that: "the brief's goal is met".into(),
                acceptance_criteria: vec![o.clone()],
                priority: PriorityLevel::High,
                story_points: 2,
            });
            origin.push("fallback");
        }
    }
    if added > 0 {
        t.audit(
            "fallback",
            format!("{added} objective(s) had no usable story from the analyst: one story each, its criterion the objective"),
            Value::Null,
        );
    }
    let stories: Vec<UserStory> = kept
        .into_iter()
        .take(6)
        .enumerate()
        .map(|(i, st)| UserStory {
            story_id: format!("US-{}", i + 1),
            title: st.title.trim().to_string(),
            as_a: if st.as_a.trim().is_empty() {
                "user".into()
            } else {
                st.as_a.trim().to_string()
            },
            i_want: st.i_want.trim().to_string(),
            so_that: st.so_that.trim().to_string(),
            acceptance_criteria: st
                .acceptance_criteria
                .iter()
                .map(|c| c.trim().to_string())
                .collect(),
            priority: st.priority,
            story_points: points(st.story_points),
            status: "draft".into(),
            created_by: origin.get(i).copied().unwrap_or(BA).to_string(),
        })
        .collect();
    artifacts::write_text(
        &t.run_dir.join("stories.md"),
        &artifacts::stories_md(&stories),
    )
    .map_err(|e| e.to_string())?;
    t.transition(
        ReqState::UserStoriesCreated,
        "UserStoriesCreated",
        format!("{} stories", stories.len()),
    );
    t.emit(DomainEvent::UserStoriesCreated {
        requirement_id: doc.doc_id.clone(),
        story_ids: stories.iter().map(|s| s.story_id.clone()).collect(),
        story_count: stories.len(),
    });
    let from_model = stories.iter().filter(|s| s.created_by == BA).count();
    t.say(format!(
        "wrote {} user stor{} ({from_model} from the model, {} from the objectives)",
        stories.len(),
        if stories.len() == 1 { "y" } else { "ies" },
        stories.len() - from_model
    ));
    req.stories = stories;
    req.stories_approved = false;
    t.finish(
        s,
        Update::new()
            .requirement(req)
            .status(status::AWAITING_STORIES.to_string()),
    )
}

/// A human's answer at a gate.
#[derive(Clone, Debug, PartialEq)]
pub enum GateAnswer {
    /// Go on.
    Approve,
    /// Go back, with a reason.
    Reject(String),
}

impl GateAnswer {
    /// Reads `"approve"`, `"reject"`, `{"approved": bool, "reason": …}` (the seed's shape),
    /// `{"decision": "approve"|"reject", "reason"|"feedback": …}`, `{"feedback": …}` or any
    /// other text (a rejection with that reason).
    pub fn from_json(v: &Value) -> Result<GateAnswer, String> {
        let reason_of = |o: &serde_json::Map<String, Value>| {
            ["reason", "feedback"]
                .iter()
                .find_map(|k| o.get(*k).and_then(Value::as_str))
                .map(|r| r.trim().to_string())
                .filter(|r| !r.is_empty())
                .unwrap_or_else(|| "No reason provided".into())
        };
        match v {
            Value::String(s) => {
                let t = s.trim();
                match t.to_lowercase().as_str() {
                    "" => Err(
                        "an empty answer: use \"approve\", \"reject\" or {\"reason\": \"why\"}"
                            .into(),
                    ),
                    "approve" | "approved" | "yes" => Ok(GateAnswer::Approve),
                    "reject" | "rejected" | "no" => {
                        Ok(GateAnswer::Reject("No reason provided".into()))
                    }
                    _ => Ok(GateAnswer::Reject(t.to_string())),
                }
            }
            Value::Object(o) => {
                if let Some(a) = o.get("approved").and_then(Value::as_bool) {
                    return Ok(if a {
                        GateAnswer::Approve
                    } else {
                        GateAnswer::Reject(reason_of(o))
                    });
                }
                match o.get("decision").and_then(Value::as_str) {
                    Some("approve") => Ok(GateAnswer::Approve),
                    Some("reject") | Some("feedback") | None if o.contains_key("feedback") || o.contains_key("reason") || o.contains_key("decision") => {
                        Ok(GateAnswer::Reject(reason_of(o)))
                    }
                    Some(other) => Err(format!("unknown decision `{other}` (approve or reject)")),
                    None => Err(format!("unrecognized answer {v}: use \"approve\", \"reject\" or {{\"reason\": \"why\"}}")),
                }
            }
            _ => Err(format!(
                "unrecognized answer {v}: use \"approve\", \"reject\" or {{\"reason\": \"why\"}}"
            )),
        }
    }
}

/// Human gate 1: the stories, before any design or code.
pub(crate) async fn stories_gate(
    d: Arc<Deps>,
    s: Arc<TeamState>,
    ctx: NodeContext,
) -> Result<Update, NodeError> {
    let mut t = match Turn::begin(&d, &s, &ctx, PM) {
        Ok(t) => t,
        Err(e) => return Ok(failed(PM, e)),
    };
    let summary = format!(
        "{}\n\n{}",
        s.requirement
            .doc
            .as_ref()
            .map(artifacts::requirements_md)
            .unwrap_or_default(),
        artifacts::stories_md(&s.requirement.stories)
    );
    let answer: Value = ctx.interrupt(json!({
        "kind": "review",
        "checkpoint_type": "stories_approval",
        "title": "Approve the user stories before design starts",
        "message": "Please review the user stories and approve or reject.",
        "summary": summary,
        "user_stories": s.requirement.stories,
        "clarified_requirements": s.requirement.doc,
        "instructions": "Approve to start the design, or reject with a reason: the product owner revises the requirement.",
        "choices": ["approve", "reject", "feedback"],
        "feedback_placeholder": "why the stories are rejected (the product owner revises them)",
    }))?;
    let answer = GateAnswer::from_json(&answer).map_err(NodeError::fatal)?;
    let mut req = s.requirement.clone();
    let ids: Vec<String> = req.stories.iter().map(|s| s.story_id.clone()).collect();
    let u = match answer {
        GateAnswer::Approve => {
            t.guards.stories_approved = true;
            t.transition(
                ReqState::DesignReady,
                "StoriesApproved",
                "approved by a human",
            );
            t.audit("gate", "stories approved", json!({"stories": ids}));
            for st in &mut req.stories {
                st.status = "approved".into();
            }
            req.stories_approved = true;
            t.emit(DomainEvent::StoriesApproved {
                story_ids: ids.clone(),
            });
            t.command(TA, "DesignSolution", json!({"story_ids": ids}));
            t.say("a human approved the stories");
            Update::new()
                .requirement(req)
                .decision("approve".to_string())
                .status(String::new())
        }
        GateAnswer::Reject(reason) => {
            t.transition(ReqState::Clarified, "StoriesRejected", reason.clone());
            t.audit(
                "gate",
                format!("stories rejected: {reason}"),
                json!({"stories": ids}),
            );
            for st in &mut req.stories {
                st.status = "rejected".into();
            }
            req.stories_approved = false;
            req.rejection_reason = Some(reason.clone());
            req.rejections += 1;
            t.emit(DomainEvent::StoriesRejected {
                reason: reason.clone(),
            });
            t.command(PO, "ReviseRequirement", json!({"reason": reason}));
            t.say(format!("a human rejected the stories: {reason}"));
            Update::new()
                .requirement(req)
                .decision("reject".to_string())
        }
    };
    Ok(settle(PM, t.finish(&s, u)))
}
