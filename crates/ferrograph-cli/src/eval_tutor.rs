//! `ferrograph eval tutor`: the tutor on material we did not write. Each listed crate is
//! downloaded from crates.io at run time (sha256 from the crates.io index), and its README
//! becomes a note of one subject, `crates`; the course guide is written from the crates' own
//! metadata (description, licence, repository). Per crate the tutor is asked "What is NAME?"
//! and for a two-question quiz on it, and what a student would see is judged:
//! - the search found that crate's README (first hit, any hit);
//! - the answer is usable (not empty, not a loop) and on topic: it shares a word with the
//!   crate's own one-line description (written by its authors, not by us);
//! - whether the model's answer was shown or replaced by the notes;
//! - the quiz has two questions, four distinct options each, grading that agrees with the
//!   letter given, and each right answer is in that crate's README.

use anyhow::{bail, Context, Result};
use ferrograph::core::Role;
use ferrograph::prelude::*;
use ferrograph::runtime::{JsonInput, Workflow};
use ferrograph::Resume;
use ferrograph_tutor::text::{meaning_words, norm_words, unusable};
use ferrograph_tutor::{clean, TutorSettings, TutorState, TutorWorkflow};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// What `ferrograph eval tutor` was asked to do.
#[derive(Debug, Clone, clap::Args)]
pub struct TutorEvalOptions {
    /// The crate list (see tests/eval/tutor-crates.toml).
    #[arg(long, default_value = "tests/eval/tutor-crates.toml")]
    pub crates: PathBuf,
    /// The chat model: a manifest name or a GGUF path.
    #[arg(long, default_value = ferrograph_llm::manifest::DEFAULT_CHAT_MODEL)]
    pub model: String,
    /// Only this crate (repeatable).
    #[arg(long = "crate")]
    pub only: Vec<String>,
    /// Only the crates marked `smoke` (three; what CI runs).
    #[arg(long)]
    pub smoke: bool,
    /// Output folder: results.json and summary.md.
    #[arg(long, default_value = "eval-tutor")]
    pub out: PathBuf,
    /// No download progress bars.
    #[arg(long, short)]
    pub quiet: bool,
}

#[derive(Deserialize)]
struct CrateList {
    #[serde(rename = "crate")]
    crates: Vec<CrateSpec>,
}

#[derive(Deserialize, Clone)]
struct CrateSpec {
    name: String,
    version: String,
    /// In the smoke run (CI).
    #[serde(default)]
    smoke: bool,
}

/// A downloaded crate: its README and its own metadata.
struct Package {
    name: String,
    version: String,
    description: String,
    license: String,
    repository: String,
    readme: String,
}

/// One crate's measures.
#[derive(Debug, Clone, Serialize)]
struct CrateResult {
    name: String,
    version: String,
    description: String,
    first_hit: bool,
    any_hit: bool,
    answer: String,
    answer_by: String,
    usable: bool,
    on_topic: bool,
    answer_s: f64,
    quiz_questions: usize,
    quiz_error: Option<String>,
    quiz_well_formed: bool,
    quiz_grounded: usize,
    quiz_grading_agrees: bool,
    quiz_s: f64,
    questions: Vec<String>,
}

fn fetch(client: &ferrograph_fetch::Client, spec: &CrateSpec, quiet: bool) -> Result<Package> {
    let file = ferrograph_fetch::crate_file_checked(client, &spec.name, &spec.version)
        .with_context(|| format!("looking up {} {} on crates.io", spec.name, spec.version))?;
    let root = crate::eval::fetch_package(
        client,
        &ferrograph_fetch::cache_dir().join("eval-tutor"),
        &file.url,
        &file.filename,
        file.sha256.as_deref(),
        &format!("{}-{}", spec.name, spec.version),
        quiet,
    )?;
    let manifest: toml::Value = toml::from_str(
        &std::fs::read_to_string(root.join("Cargo.toml"))
            .with_context(|| format!("{}: no Cargo.toml", spec.name))?,
    )
    .with_context(|| format!("{}: reading Cargo.toml", spec.name))?;
    let pkg = manifest.get("package");
    let field = |k: &str| {
        pkg.and_then(|p| p.get(k))
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    let readme_name = match pkg.and_then(|p| p.get("readme")) {
        Some(toml::Value::String(s)) => s.clone(),
        _ => "README.md".to_string(),
    };
    let readme = std::fs::read_to_string(root.join(&readme_name))
        .with_context(|| format!("{}: no {readme_name} in the crate", spec.name))?;
    Ok(Package {
        name: spec.name.clone(),
        version: spec.version.clone(),
        description: field("description"),
        license: field("license"),
        repository: field("repository"),
        readme,
    })
}

/// The course folder: one note per crate and a guide from the crates' metadata.
fn write_course(dir: &Path, packages: &[Package]) -> Result<()> {
    let subject = dir.join("crates");
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&subject)?;
    let mut guide = String::from(
        "# Guide: Rust crates\n\nThe notes of this subject are the READMEs of these crates, as \
         published on crates.io.\n\n",
    );
    for p in packages {
        std::fs::write(subject.join(format!("{}.md", p.name)), &p.readme)?;
        guide.push_str(&format!(
            "- **{}** {}: {} Licence: {}. Repository: {}.\n",
            p.name,
            p.version,
            p.description.trim_end_matches('.').to_string() + ".",
            p.license,
            p.repository
        ));
    }
    std::fs::write(subject.join("guide.md"), guide)?;
    Ok(())
}

fn pct(k: usize, n: usize) -> String {
    if n == 0 {
        "-".into()
    } else {
        format!("{k}/{n} ({:.0} %)", 100.0 * k as f64 / n as f64)
    }
}

/// Runs the evaluation; writes `results.json` and `summary.md` under `out`.
pub async fn run(opts: &TutorEvalOptions) -> Result<()> {
    let list: CrateList = toml::from_str(
        &std::fs::read_to_string(&opts.crates)
            .with_context(|| format!("reading {}", opts.crates.display()))?,
    )
    .with_context(|| format!("parsing {}", opts.crates.display()))?;
    let specs: Vec<CrateSpec> = list
        .crates
        .into_iter()
        .filter(|c| opts.only.is_empty() || opts.only.contains(&c.name))
        .filter(|c| !opts.smoke || c.smoke)
        .collect();
    if specs.is_empty() {
        bail!("no crates to evaluate");
    }
    let client = ferrograph_fetch::Client::new()?;
    let mut packages = Vec::new();
    for spec in &specs {
        packages.push(fetch(&client, spec, opts.quiet)?);
    }
    let Some(llm) = crate::eval::resolve_model(&opts.model)?.model else {
        bail!("the tutor needs a chat model: `none` is not one");
    };
    std::fs::create_dir_all(&opts.out)?;
    let ws = ferrograph::WorkflowSettings {
        data_dir: opts.out.join("work"),
        llm: Some(llm),
        ..Default::default()
    };
    let settings = TutorSettings::from_workflow_settings(&ws);
    write_course(&settings.course_dir, &packages)?;
    let rt = Runtime::new().await?;
    let wf = TutorWorkflow::load(
        &rt,
        Arc::new(MemorySaver::new()),
        settings,
        ferrograph_tutor::course::minilm(),
    )
    .await?;
    let mut results = Vec::new();
    for p in &packages {
        let r = evaluate(&wf, p).await?;
        println!(
            "{:<18} hit {}/{}  by {:<5} on topic {:<5} quiz {}/2 grounded {}  {}",
            p.name,
            u8::from(r.first_hit),
            u8::from(r.any_hit),
            r.answer_by,
            r.on_topic,
            r.quiz_questions,
            r.quiz_grounded,
            ferrograph_tutor::text::clip(&r.answer.replace('\n', " "), 100)
        );
        results.push(r);
    }
    let n = results.len();
    let count = |f: &dyn Fn(&CrateResult) -> bool| results.iter().filter(|r| f(r)).count();
    let questions: usize = results.iter().map(|r| r.quiz_questions).sum();
    let grounded: usize = results.iter().map(|r| r.quiz_grounded).sum();
    let mut md = format!(
        "Tutor on {n} crates' READMEs (subject `crates`, model {}):\n\n\
         | measure | result |\n|---|---:|\n\
         | search: the crate's README is the first hit | {} |\n\
         | search: the crate's README among the hits | {} |\n\
         | answer usable (not empty, not a loop) | {} |\n\
         | answer on topic (shares a word with the crate's own description) | {} |\n\
         | answer written by the model (not replaced by the notes) | {} |\n\
         | quizzes with both questions written | {} |\n\
         | quiz questions well formed (four distinct options) | {} |\n\
         | right answers found in that crate's README | {} |\n\
         | grading agrees with the letter given | {} |\n\n\
         | crate | first hit | answer by | on topic | quiz | answer (start) |\n|---|---|---|---|---|---|\n",
        opts.model,
        pct(count(&|r| r.first_hit), n),
        pct(count(&|r| r.any_hit), n),
        pct(count(&|r| r.usable), n),
        pct(count(&|r| r.on_topic), n),
        pct(count(&|r| r.answer_by == "model"), n),
        pct(count(&|r| r.quiz_questions == 2), n),
        pct(count(&|r| r.quiz_well_formed && r.quiz_questions == 2), n),
        pct(grounded, questions),
        pct(count(&|r| r.quiz_grading_agrees), n),
    );
    for r in &results {
        md.push_str(&format!(
            "| {} {} | {} | {} | {} | {}/2 | {} |\n",
            r.name,
            r.version,
            if r.first_hit { "yes" } else { "no" },
            r.answer_by,
            if r.on_topic { "yes" } else { "no" },
            r.quiz_questions,
            ferrograph_tutor::text::clip(&r.answer.replace('\n', " ").replace('|', "/"), 90)
        ));
    }
    std::fs::write(opts.out.join("summary.md"), &md)?;
    std::fs::write(
        opts.out.join("results.json"),
        serde_json::to_string_pretty(&results)?,
    )?;
    println!("\n{md}");
    println!("written: {}", opts.out.join("summary.md").display());
    Ok(())
}

async fn evaluate(wf: &TutorWorkflow, p: &Package) -> Result<CrateResult> {
    let thread = format!("eval-{}", p.name);
    let cfg = || RunConfig::thread(thread.clone());
    let note = format!("crates/{}.md", p.name);
    let started = Instant::now();
    let o = wf
        .invoke(
            JsonInput::Update(
                json!({"subject": "crates", "message": format!("What is {}?", p.name)}),
            ),
            cfg(),
        )
        .await
        .with_context(|| format!("{}: the turn failed", p.name))?;
    let answer_s = started.elapsed().as_secs_f64();
    let s: TutorState = serde_json::from_value(o.state)?;
    let reply = s
        .messages
        .iter()
        .rev()
        .find(|m| m.role == Role::Ai)
        .cloned()
        .unwrap_or_else(|| Message::ai(""));
    let answer = reply.content.clone();
    let answer_by = if reply.metadata.contains_key("fallback") {
        "notes"
    } else {
        "model"
    };
    let name_words = meaning_words(&p.name.replace(['-', '_'], " "));
    let described: Vec<String> = meaning_words(&p.description)
        .into_iter()
        .filter(|w| !name_words.contains(w))
        .collect();
    let said = meaning_words(&answer);
    let on_topic = described.iter().any(|w| said.contains(w));

    // The quiz: the first answer is A, the second B (whatever is right).
    // Compared as words (case and punctuation aside): `Tokio’s` in the README is `Tokio's`
    // in an option.
    let readme = norm_words(&clean::readable(&p.readme));
    let started = Instant::now();
    let mut questions = Vec::new();
    let mut well_formed = true;
    let mut quiz_error = None;
    let mut o = wf
        .invoke(
            JsonInput::Update(
                json!({"message": format!("Quiz me on {} with 2 questions", p.name)}),
            ),
            cfg(),
        )
        .await;
    for letter in ["A", "B"] {
        let out = match &o {
            Ok(out) => out,
            Err(e) => {
                quiz_error = Some(e.to_string());
                break;
            }
        };
        if out.status != "interrupted" {
            break;
        }
        let q = out.interrupts[0].value.0.clone();
        let text = q["question_text"].as_str().unwrap_or("").to_string();
        let mut opts: Vec<String> = q["options"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str())
                    .map(|o| o.get(3..).unwrap_or("").to_lowercase())
                    .collect()
            })
            .unwrap_or_default();
        opts.sort();
        opts.dedup();
        well_formed &= opts.len() == 4 && unusable(&text).is_none();
        questions.push(text);
        o = wf
            .invoke(JsonInput::Resume(Resume::value(json!(letter))), cfg())
            .await;
    }
    let quiz_s = started.elapsed().as_secs_f64();
    let mut grounded = 0;
    let mut agrees = false;
    if let Ok(out) = &o {
        if out.status == "done" && questions.len() == 2 {
            let s: TutorState = serde_json::from_value(out.state.clone())?;
            let summary = s
                .messages
                .last()
                .map(|m| m.content.clone())
                .unwrap_or_default();
            let lines: Vec<&str> = summary
                .lines()
                .map(str::trim)
                .filter(|l| l.starts_with("Correct") || l.starts_with("Not quite"))
                .collect();
            agrees = lines.len() == 2;
            for (line, letter) in lines.iter().zip(["A", "B"]) {
                let right = if let Some(rest) = line.strip_prefix("Correct: ") {
                    agrees &= rest.starts_with(&format!("{letter})"));
                    rest
                } else {
                    agrees &= line.starts_with(&format!("Not quite: you chose {letter})"));
                    line.split("the answer is ").nth(1).unwrap_or("")
                };
                let term = right
                    .get(3..)
                    .unwrap_or("")
                    .split(". ")
                    .next()
                    .unwrap_or("")
                    .trim_end_matches('.')
                    .to_lowercase();
                let term = norm_words(&term);
                if !term.is_empty() && readme.contains(&term) {
                    grounded += 1;
                }
            }
        } else if quiz_error.is_none() && out.status != "done" {
            quiz_error = Some(format!("the quiz ended {}", out.status));
        }
    }
    if let Err(e) = &o {
        quiz_error.get_or_insert_with(|| e.to_string());
    }
    Ok(CrateResult {
        name: p.name.clone(),
        version: p.version.clone(),
        description: p.description.clone(),
        first_hit: s.context.first().is_some_and(|c| c.path == note),
        any_hit: s.context.iter().any(|c| c.path == note),
        usable: unusable(&answer).is_none(),
        answer,
        answer_by: answer_by.into(),
        on_topic,
        answer_s,
        quiz_questions: if quiz_error.is_some() {
            0
        } else {
            questions.len()
        },
        quiz_error,
        quiz_well_formed: well_formed,
        quiz_grounded: grounded,
        quiz_grading_agrees: agrees,
        quiz_s,
        questions,
    })
}
