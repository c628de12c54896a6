//! Design context: the architect's specification and decision record, and the tech lead's
//! review that approves it and plans the work.

use super::*;
use crate::brief::is_test_file;
use crate::domain::{ArchitectureDecision, Component, DesignDraft, DesignReview, TechnicalSpec};
use crate::events::agent::{SSE, TA, TL};
use crate::prompts;
use crate::translate::{spec_to_tasks, stories_to_requirements, TranslateError};
use std::collections::BTreeMap;

fn ident(name: &str) -> String {
    let s: String = name
        .trim()
        .to_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    s.trim_matches('_').chars().take(40).collect()
}

fn same_text(a: &str, b: &str) -> bool {
    a.trim().eq_ignore_ascii_case(b.trim())
}

fn stem(file: &str) -> String {
    file.rsplit('/')
        .next()
        .unwrap_or(file)
        .trim_end_matches(".py")
        .to_string()
}

/// The architect: components, the FRs each covers, and a decision record.
pub(crate) async fn ta_agent(
    d: Arc<Deps>,
    s: Arc<TeamState>,
    ctx: NodeContext,
) -> Result<Update, NodeError> {
    crate::agent_step!(TA, ta(&d, &s, &ctx).await)
}

async fn ta(d: &Deps, s: &TeamState, ctx: &NodeContext) -> Result<Update, String> {
    let mut t = Turn::begin(d, s, ctx, TA)?;
    let doc = s
        .requirement
        .doc
        .clone()
        .ok_or("the architect has no requirement")?;
    let approved: Vec<_> = s
        .requirement
        .stories
        .iter()
        .filter(|st| st.status == "approved")
        .cloned()
        .collect();
    let frs = stories_to_requirements(&approved);
    let sources: Vec<String> = doc
        .deliverables
        .iter()
        .filter(|f| !is_test_file(f))
        .cloned()
        .collect();
    let source_text = format!(
        "{} {}",
        doc.original_brief,
        frs.iter()
            .map(|f| f.statement.clone())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let allowed = sources.clone();
    let answer: Option<DesignDraft> = t
        .ask(
            d,
            "design",
            prompts::TA.into(),
            prompts::design(&frs, &sources),
            500,
            move |schema| {
                if let Some(fp) = schema.pointer_mut("/$defs/Component/properties/file_path") {
                    *fp = json!({"type": "string", "enum": allowed});
                }
            },
        )
        .await?;
    let mut components: Vec<Component> = Vec::new();
    let mut decision = None;
    if let Some(a) = answer {
        for c in a.components {
            let name = ident(&c.name);
            let ok = !name.is_empty()
                && sources.contains(&c.file_path)
                && usable(&c.responsibility)
                && c.responsibility.split_whitespace().count() >= 3
                && !c.responsibility.contains(&c.file_path)
                && grounded(&c.responsibility, &source_text)
                && !components.iter().any(|k| k.name == name);
            if ok {
                components.push(Component {
                    name,
                    responsibility: c.responsibility.trim().to_string(),
                    file_path: c.file_path,
                });
            }
        }
        let dd = a.decision;
        let n = |t: &str| t.split_whitespace().count();
        let ok = usable(&dd.title)
            && usable(&dd.decision)
            && n(&dd.title) >= 2
            && n(&dd.decision) >= 6
            && n(&dd.context) >= 5
            && !same_text(&dd.title, &dd.decision)
            && !same_text(&dd.context, &dd.decision)
            && grounded(&format!("{} {}", dd.context, dd.decision), &source_text);
        if ok {
            decision = Some(dd);
        }
    }
    for f in &sources {
        if !components.iter().any(|c| &c.file_path == f) {
            t.audit("fallback", format!("no usable component for `{f}` from the model: one component named after the file, responsible for every requirement"), Value::Null);
            components.push(Component {
                name: ident(&stem(f)),
                responsibility: frs
                    .iter()
                    .map(|r| {
                        r.statement
                            .trim_start_matches("The system shall ")
                            .to_string()
                    })
                    .collect::<Vec<_>>()
                    .join("; "),
                file_path: f.clone(),
            });
        }
    }
    // Each requirement goes to the component whose responsibility shares most words with it.
    let mut covers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for fr in &frs {
        let fw = words(&format!("{} {}", fr.statement, fr.conditions.join(" ")));
        let best = components
            .iter()
            .max_by_key(|c| words(&c.responsibility).intersection(&fw).count())
            .map(|c| c.name.clone())
            .unwrap_or_default();
        covers.entry(best).or_default().push(fr.fr_id.clone());
    }
    let adr = match decision {
        Some(dd) => ArchitectureDecision {
            adr_id: "ADR-1".into(),
            title: dd.title.trim().to_string(),
            status: "proposed".into(),
            context: dd.context.trim().to_string(),
            decision: dd.decision.trim().to_string(),
            consequences: dd.consequences.into_iter().filter(|c| usable(c)).collect(),
            alternatives_considered: dd.alternatives.into_iter().filter(|c| usable(c)).collect(),
            decided_by: TA.into(),
            decided_at: now(),
        },
        None => {
            t.audit("fallback", "the architect's decision record was not usable: the standard decision for a small program is recorded", Value::Null);
            ArchitectureDecision {
                adr_id: "ADR-1".into(),
                title: "Standard-library Python, one module per source file".into(),
                status: "proposed".into(),
                context: format!("The brief asks for {}; the program must run where only Python 3 is installed.", sources.join(", ")),
                decision: "Write the program in Python 3 with the standard library only, one module per source file, tested with unittest.".into(),
                consequences: vec!["No dependency to install or audit".into(), "Tests run with `python3 -m unittest`".into()],
                alternatives_considered: vec!["A third-party CLI framework (adds a dependency for little gain)".into()],
                decided_by: "fallback".into(),
                decided_at: now(),
            }
        }
    };
    let spec = TechnicalSpec {
        spec_id: format!("SPEC-{}", doc.doc_id.trim_start_matches("REQ-")),
        title: format!("Design of {}", sources.join(", ")),
        components,
        covers,
        tech_stack: [
            (
                "language".to_string(),
                "Python 3 (standard library)".to_string(),
            ),
            ("tests".to_string(), "unittest".to_string()),
            (
                "coverage".to_string(),
                "the standard library's trace module".to_string(),
            ),
        ]
        .into(),
        approved_by: None,
        approved_at: None,
    };
    artifacts::write_text(&t.run_dir.join("spec.md"), &artifacts::spec_md(&spec, &frs))
        .map_err(|e| e.to_string())?;
    artifacts::write_text(
        &t.run_dir.join("adr").join("ADR-1.md"),
        &artifacts::adr_md(&adr),
    )
    .map_err(|e| e.to_string())?;
    t.say(format!(
        "designed {} component(s); decision: {}",
        spec.components.len(),
        adr.title
    ));
    let mut design = s.design.clone();
    design.functional_requirements = frs;
    design.spec = Some(spec);
    design.decisions = vec![adr];
    t.finish(s, Update::new().design(design))
}

/// The tech lead's design review: checks that every requirement and file is covered,
/// approves, and plans the tasks.
pub(crate) async fn tl_agent(
    d: Arc<Deps>,
    s: Arc<TeamState>,
    ctx: NodeContext,
) -> Result<Update, NodeError> {
    crate::agent_step!(TL, tl(&d, &s, &ctx).await)
}

async fn tl(d: &Deps, s: &TeamState, ctx: &NodeContext) -> Result<Update, String> {
    let mut t = Turn::begin(d, s, ctx, TL)?;
    let mut design = s.design.clone();
    let mut spec = design
        .spec
        .clone()
        .ok_or("the tech lead has no specification")?;
    let doc = s
        .requirement
        .doc
        .clone()
        .ok_or("the tech lead has no requirement")?;
    let review: Option<DesignReview> = t
        .ask(
            d,
            "design review",
            prompts::TL.into(),
            prompts::review_design(&spec, &design.functional_requirements),
            200,
            |_| {},
        )
        .await?;
    let mut notes: Vec<String> = review
        .map(|r| r.notes)
        .unwrap_or_default()
        .into_iter()
        .filter(|n| usable(n))
        .collect();
    // The checks that decide: every requirement covered, every component's file planned.
    let covered: Vec<String> = spec.covers.values().flatten().cloned().collect();
    for fr in &design.functional_requirements {
        if !covered.contains(&fr.fr_id) {
            if let Some(first) = spec.components.first().map(|c| c.name.clone()) {
                spec.covers
                    .entry(first.clone())
                    .or_default()
                    .push(fr.fr_id.clone());
                notes.push(format!("{} was not covered: assigned to {first}", fr.fr_id));
            }
        }
    }
    let test_file = doc
        .deliverables
        .iter()
        .find(|f| is_test_file(f))
        .cloned()
        .unwrap_or_else(|| "test_app.py".into());
    let plan = match spec_to_tasks(&spec, &design.functional_requirements, &test_file) {
        Ok(p) => p,
        Err(e @ TranslateError::Cycle(_)) => {
            t.audit(
                "refused",
                format!("the plan was refused: {e}; the components' dependencies are dropped"),
                Value::Null,
            );
            notes.push(format!("{e}: tasks are planned without those dependencies"));
            let flat = TechnicalSpec {
                components: spec
                    .components
                    .iter()
                    .map(|c| Component {
                        responsibility: String::new(),
                        ..c.clone()
                    })
                    .collect(),
                ..spec.clone()
            };
            spec_to_tasks(&flat, &design.functional_requirements, &test_file)
                .map_err(|e| e.to_string())?
        }
        Err(e) => return Err(e.to_string()),
    };
    spec.approved_by = Some(TL.into());
    spec.approved_at = Some(now());
    for a in &mut design.decisions {
        a.status = "accepted".into();
    }
    t.transition(
        ReqState::InDevelopment,
        "DesignApproved",
        format!("{} task(s) planned", plan.len()),
    );
    t.emit(DomainEvent::DesignApproved {
        spec_id: spec.spec_id.clone(),
        task_count: plan.len(),
    });
    t.command(
        SSE,
        "ImplementPlan",
        json!({"tasks": plan.iter().map(|p| &p.task_id).collect::<Vec<_>>()}),
    );
    artifacts::write_text(
        &t.run_dir.join("spec.md"),
        &artifacts::spec_md(&spec, &design.functional_requirements),
    )
    .map_err(|e| e.to_string())?;
    for a in &design.decisions {
        artifacts::write_text(
            &t.run_dir.join("adr").join(format!("{}.md", a.adr_id)),
            &artifacts::adr_md(a),
        )
        .map_err(|e| e.to_string())?;
    }
    t.say(format!(
        "approved the design; {} task(s): {}",
        plan.len(),
        plan.iter()
            .map(|p| p.file_path.as_str())
            .collect::<Vec<_>>()
            .join(" → ")
    ));
    design.review_notes = notes;
    design.spec = Some(spec);
    let mut imp = s.implementation.clone();
    imp.plan = plan;
    t.finish(s, Update::new().design(design).implementation(imp))
}
