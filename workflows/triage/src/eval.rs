//! The triage evaluation's cases, measures and plots: real bugs from public packages (the
//! case file), hit@k of the fixed file among the codebase findings beside plain lexical and
//! plain vector search, and the quality of the text a maintainer would read (degenerate or
//! empty fields, invented names, fields the model could not write).
//!
//! Downloading and running the cases is the CLI's part (`ferrograph eval triage`); what is
//! here has no network and no model, so it is tested on its own.

use super::agents::error_lines;
use super::check::{self, CheckContext, Problem};
use super::state::TriageState;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Errors of the evaluation's own inputs.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EvalError {
    /// The case file could not be read.
    #[error("reading the case file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A relative case-file path that does not exist from the current folder (the default,
    /// `tests/eval/triage-cases.toml`, is relative to the repository's root).
    #[error(
        "there is no case file {path} in {cwd}: run `ferrograph eval triage` from the \
         repository's root, or give the file with --cases"
    )]
    NotHere {
        /// The file, as given.
        path: PathBuf,
        /// The folder it was looked for in.
        cwd: PathBuf,
    },
    /// The case file is not valid TOML of the expected shape.
    #[error("the case file {path} is malformed: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        source: toml::de::Error,
    },
    /// A case is unusable (no fixed file, a duplicate id, a bad checksum field).
    #[error("case `{id}` in {path}: {reason}")]
    Case {
        /// The file.
        path: PathBuf,
        /// The case.
        id: String,
        /// What is wrong.
        reason: String,
    },
}

/// The registry a case's package comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Ecosystem {
    /// A Python package on PyPI (its sdist).
    Pypi,
    /// A Rust crate on crates.io (its `.crate`).
    Crates,
}

/// One real bug: a package's buggy version, the public report, our issue text, and the
/// files the fix changed.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalCase {
    /// Unique slug.
    pub id: String,
    /// Where the package comes from.
    pub ecosystem: Ecosystem,
    /// The package or crate name.
    pub package: String,
    /// The version with the bug (downloaded and triaged).
    pub buggy_version: String,
    /// The first version with the fix.
    pub fixed_version: String,
    /// The buggy version's archive file name.
    pub artifact_file: String,
    /// Where the archive is downloaded from.
    pub artifact_url: String,
    /// The archive's sha256.
    pub sha256: String,
    /// The public bug report this case was written from.
    pub report_url: String,
    /// The public fix, when known.
    #[serde(default)]
    pub fix_url: Option<String>,
    /// The source files the fix changed, relative to the unpacked package root.
    pub fixed_files: Vec<String>,
    /// Files in the unpacked tree (informational).
    #[serde(default)]
    pub files: Option<usize>,
    /// Part of the 3-case smoke set that CI runs.
    #[serde(default)]
    pub smoke: bool,
    /// The issue title (our words).
    pub title: String,
    /// The issue text (our words, written from the public report).
    pub issue: String,
}

impl EvalCase {
    /// The issue as the triage workflow reads it: a Markdown title line, then the text.
    pub fn issue_markdown(&self) -> String {
        format!("# {}\n\n{}\n", self.title.trim(), self.issue.trim())
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CaseFile {
    case: Vec<EvalCase>,
}

/// Reads and checks a case file.
pub fn load_cases(path: &Path) -> Result<Vec<EvalCase>, EvalError> {
    let text = std::fs::read_to_string(path).map_err(|source| match std::env::current_dir() {
        Ok(cwd) if path.is_relative() && source.kind() == std::io::ErrorKind::NotFound => {
            EvalError::NotHere {
                path: path.to_path_buf(),
                cwd,
            }
        }
        _ => EvalError::Read {
            path: path.to_path_buf(),
            source,
        },
    })?;
    parse_cases(&text, path)
}

/// Parses case-file text (`path` names it in errors).
pub fn parse_cases(text: &str, path: &Path) -> Result<Vec<EvalCase>, EvalError> {
    let file: CaseFile = toml::from_str(text).map_err(|source| EvalError::Parse {
        path: path.to_path_buf(),
        source,
    })?;
    let mut seen = std::collections::HashSet::new();
    for c in &file.case {
        let bad = |reason: &str| EvalError::Case {
            path: path.to_path_buf(),
            id: c.id.clone(),
            reason: reason.to_string(),
        };
        if !seen.insert(c.id.clone()) {
            return Err(bad("duplicate id"));
        }
        if c.fixed_files.is_empty() {
            return Err(bad("no fixed file"));
        }
        if c.sha256.len() != 64 || !c.sha256.chars().all(|ch| ch.is_ascii_hexdigit()) {
            return Err(bad("sha256 is not 64 hex digits"));
        }
        if c.fixed_files
            .iter()
            .any(|f| f.starts_with('/') || f.split('/').any(|p| p == ".."))
        {
            return Err(bad(
                "a fixed file is not a relative path inside the package",
            ));
        }
        if c.issue.trim().is_empty() || c.title.trim().is_empty() {
            return Err(bad("empty title or issue"));
        }
    }
    Ok(file.case)
}

/// The 1-based rank of the first fixed file in `ranked`, if any.
pub fn rank_of(ranked: &[String], fixed: &[String]) -> Option<usize> {
    ranked
        .iter()
        .position(|p| fixed.iter().any(|f| same_file(p, f)))
        .map(|i| i + 1)
}

/// Whether a ranked path names a fixed file (equal, ignoring a leading `./`).
fn same_file(ranked: &str, fixed: &str) -> bool {
    ranked.trim_start_matches("./") == fixed.trim_start_matches("./")
}

/// Whether the rank is within `k`.
pub fn hit(rank: Option<usize>, k: usize) -> bool {
    rank.is_some_and(|r| r <= k)
}

/// One free-text field of a finished triage, as judged.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JudgedField {
    /// Which field (`agent.field`).
    pub field: String,
    /// Degenerate (a loop, a placeholder) or empty / too short.
    pub degenerate: bool,
    /// Names in the text found nowhere in the evidence, the repository or the vocabulary.
    pub invented: Vec<String>,
}

/// The judgement of a finished triage's text.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TextJudgement {
    /// Every judged field.
    pub fields: Vec<JudgedField>,
    /// Checked fields whose text the model wrote on its first answer.
    pub from_model: usize,
    /// ... on its second answer.
    pub from_retry: usize,
    /// ... that code composed because both answers failed (or there was no model).
    pub composed: usize,
    /// Model calls made.
    pub calls: usize,
    /// Model calls whose answer parsed into its schema.
    pub schema_valid_calls: usize,
}

impl TextJudgement {
    /// Fields that are degenerate or empty.
    pub fn degenerate(&self) -> usize {
        self.fields.iter().filter(|f| f.degenerate).count()
    }

    /// Invented names over all fields.
    pub fn invented(&self) -> usize {
        self.fields.iter().map(|f| f.invented.len()).sum()
    }
}

/// Judges the text of a finished triage the way a maintainer would read it: each free-text
/// field must not loop, hold a placeholder, be empty or a fragment, or name anything that is
/// not in the report, the repository (`repo_files`, `code` read from it) or `vocabulary`
/// (labels, team). Also counts where the checked fields came from and how many model calls
/// gave a schema-valid answer.
pub fn judge(
    s: &TriageState,
    repo_files: &[String],
    code: &str,
    vocabulary: &[String],
) -> TextJudgement {
    let mut known = CheckContext::new(
        &format!("{}\n{}", s.issue_title, s.issue_body),
        &s.issue_title,
    );
    known.extend(&repo_files.join("\n"));
    known.extend(code);
    known.extend(&vocabulary.join("\n"));
    if let Some(w) = &s.web_search {
        for r in &w.relevant_results {
            known.extend(&r.snippet);
            known.extend(&r.url);
        }
    }
    // The regions retrieval returned (`path:start-end (score)`, written by the search, not
    // by the model) in files of the repository: their line numbers are the repository's.
    if let Some(c) = &s.codebase {
        for region in &c.evidence {
            if repo_files.iter().any(|f| {
                region
                    .strip_prefix(f.as_str())
                    .is_some_and(|r| r.starts_with(':'))
            }) {
                known.extend(region);
            }
        }
    }
    let mut texts: Vec<(String, String, usize)> = Vec::new();
    if let Some(i) = &s.investigator {
        texts.push(("investigator.hypothesis".into(), i.hypothesis.clone(), 5));
    }
    if let Some(w) = &s.web_search {
        texts.push(("web_search.summary".into(), w.base.summary.clone(), 4));
    }
    if let Some(c) = &s.codebase {
        texts.push((
            "codebase_search.explanation".into(),
            c.base.reasoning.clone(),
            5,
        ));
    }
    if let Some(c) = &s.critique {
        texts.push(("critic.summary".into(), c.base.summary.clone(), 4));
        for g in &c.gaps {
            texts.push(("critic.gap".into(), g.clone(), 2));
        }
    }
    if let Some(w) = &s.writer {
        texts.push(("writer.root_cause".into(), w.report.root_cause.clone(), 8));
        texts.push((
            "writer.suggested_fix".into(),
            w.report.suggested_fix.clone(),
            6,
        ));
        texts.push(("writer.ticket_title".into(), w.ticket_title.clone(), 3));
        // The comment is judged line by line, without its Markdown emphasis: it restates the
        // fields above it, and its file list repeats one form per file.
        for (i, line) in check::comment_lines(&w.github_comment_markdown)
            .into_iter()
            .enumerate()
        {
            texts.push((format!("writer.comment.line{}", i + 1), line, 0));
        }
    }
    let mut j = TextJudgement::default();
    if let Some(w) = &s.writer {
        // Reproduction steps are the report's own lines, verbatim: they must only exist.
        j.fields.push(JudgedField {
            field: "writer.reproduction_steps".into(),
            degenerate: w
                .report
                .reproduction_steps
                .iter()
                .any(|x| x.0.trim().is_empty()),
            invented: Vec::new(),
        });
    }
    for (field, text, min_words) in texts {
        let problems = known.problems(&text, min_words);
        let degenerate = problems.iter().any(|p| {
            matches!(
                p,
                Problem::Empty
                    | Problem::TooShort { .. }
                    | Problem::Repetition(_)
                    | Problem::Placeholder(_)
            )
        });
        let invented = problems
            .iter()
            .filter_map(|p| match p {
                Problem::UnknownName(n) => Some(n.clone()),
                _ => None,
            })
            .collect();
        j.fields.push(JudgedField {
            field,
            degenerate,
            invented,
        });
    }
    if let Some(w) = &s.writer {
        if !w.ticket_assignee_suggestion.is_empty()
            && !vocabulary.contains(&w.ticket_assignee_suggestion)
        {
            j.fields.push(JudgedField {
                field: "writer.assignee".into(),
                degenerate: false,
                invented: vec![w.ticket_assignee_suggestion.clone()],
            });
        }
        let bad_labels: Vec<String> = w
            .ticket_labels
            .iter()
            .filter(|l| !vocabulary.contains(l))
            .cloned()
            .collect();
        if !bad_labels.is_empty() {
            j.fields.push(JudgedField {
                field: "writer.labels".into(),
                degenerate: false,
                invented: bad_labels,
            });
        }
        let bad_paths: Vec<String> = w
            .report
            .affected_files
            .iter()
            .filter(|p| !repo_files.contains(p))
            .cloned()
            .collect();
        if !bad_paths.is_empty() {
            j.fields.push(JudgedField {
                field: "writer.affected_files".into(),
                degenerate: false,
                invented: bad_paths,
            });
        }
    }
    for c in &s.field_checks {
        match c.source.as_str() {
            "model" => j.from_model += 1,
            "model_retry" => j.from_retry += 1,
            _ => j.composed += 1,
        }
    }
    for r in &s.agent_runs {
        for c in &r.calls {
            j.calls += 1;
            if c.error.is_none() {
                j.schema_valid_calls += 1;
            }
        }
    }
    j
}

/// The plain-search baselines' query: the issue's title, its error lines, then its text.
pub fn baseline_query(title: &str, body: &str) -> String {
    let mut q = title.to_string();
    for e in error_lines(body) {
        q.push('\n');
        q.push_str(&e);
    }
    q.push('\n');
    q.push_str(body);
    q
}

/// One case run with one model.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CaseResult {
    /// The case.
    pub case: String,
    /// The model (its file name), or `none`.
    pub model: String,
    /// The triage's status (`COMPLETED` or `FAILED`), or the error that stopped it.
    pub status: String,
    /// The codebase finding's files, in order (at most 10).
    pub ranked: Vec<String>,
    /// Rank of the fixed file among them.
    pub rank: Option<usize>,
    /// Rank of the fixed file in plain lexical (BM25) search of the issue text.
    pub lexical_rank: Option<usize>,
    /// Rank of the fixed file in plain vector (MiniLM + HNSW) search of the issue text.
    pub vector_rank: Option<usize>,
    /// The text judgement.
    pub text: TextJudgement,
    /// Wall time of the triage, in seconds (the index build included).
    pub seconds: f64,
    /// Tokens the model generated.
    pub completion_tokens: u64,
}

impl CaseResult {
    /// The measures of one triage state.
    #[allow(clippy::too_many_arguments)]
    pub fn from_state(
        case: &EvalCase,
        model: &str,
        s: &TriageState,
        repo_files: &[String],
        code: &str,
        vocabulary: &[String],
        baselines: (Option<usize>, Option<usize>),
        seconds: f64,
    ) -> CaseResult {
        let ranked: Vec<String> = s
            .codebase
            .as_ref()
            .map(|c| {
                c.relevant_files
                    .iter()
                    .take(10)
                    .map(|f| f.path.clone())
                    .collect()
            })
            .unwrap_or_default();
        CaseResult {
            case: case.id.clone(),
            model: model.to_string(),
            status: s.status.clone(),
            rank: rank_of(&ranked, &case.fixed_files),
            ranked,
            lexical_rank: baselines.0,
            vector_rank: baselines.1,
            text: judge(s, repo_files, code, vocabulary),
            seconds,
            completion_tokens: s
                .agent_runs
                .iter()
                .flat_map(|r| &r.calls)
                .map(|c| u64::from(c.completion_tokens))
                .sum(),
        }
    }
}

/// A model's measures over the cases.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ModelSummary {
    /// The model.
    pub model: String,
    /// Cases run.
    pub cases: usize,
    /// Fixed file first among the codebase findings.
    pub hit1: f64,
    /// Fixed file among the first five.
    pub hit5: f64,
    /// Plain lexical search: hit@1.
    pub lexical_hit1: f64,
    /// Plain lexical search: hit@5.
    pub lexical_hit5: f64,
    /// Plain vector search: hit@1.
    pub vector_hit1: f64,
    /// Plain vector search: hit@5.
    pub vector_hit5: f64,
    /// Degenerate or empty free-text fields over all judged fields.
    pub degenerate_rate: f64,
    /// Invented names, labels, paths or people, in all.
    pub invented_names: usize,
    /// Checked fields composed in code (both model answers refused) over all checked fields.
    pub fallback_rate: f64,
    /// Checked fields the model wrote on its second try.
    pub retry_rate: f64,
    /// Model calls whose answer parsed into its schema.
    pub schema_valid_rate: f64,
    /// Mean seconds per case.
    pub mean_seconds: f64,
    /// Slowest case, seconds.
    pub max_seconds: f64,
}

fn rate(n: usize, d: usize) -> f64 {
    if d == 0 {
        0.0
    } else {
        n as f64 / d as f64
    }
}

/// Summarizes one model's results.
pub fn summarize(model: &str, results: &[CaseResult]) -> ModelSummary {
    let n = results.len();
    let count = |f: &dyn Fn(&CaseResult) -> bool| results.iter().filter(|r| f(r)).count();
    let fields: usize = results.iter().map(|r| r.text.fields.len()).sum();
    let checked: usize = results
        .iter()
        .map(|r| r.text.from_model + r.text.from_retry + r.text.composed)
        .sum();
    let calls: usize = results.iter().map(|r| r.text.calls).sum();
    ModelSummary {
        model: model.to_string(),
        cases: n,
        hit1: rate(count(&|r| hit(r.rank, 1)), n),
        hit5: rate(count(&|r| hit(r.rank, 5)), n),
        lexical_hit1: rate(count(&|r| hit(r.lexical_rank, 1)), n),
        lexical_hit5: rate(count(&|r| hit(r.lexical_rank, 5)), n),
        vector_hit1: rate(count(&|r| hit(r.vector_rank, 1)), n),
        vector_hit5: rate(count(&|r| hit(r.vector_rank, 5)), n),
        degenerate_rate: rate(results.iter().map(|r| r.text.degenerate()).sum(), fields),
        invented_names: results.iter().map(|r| r.text.invented()).sum(),
        fallback_rate: rate(results.iter().map(|r| r.text.composed).sum(), checked),
        retry_rate: rate(results.iter().map(|r| r.text.from_retry).sum(), checked),
        schema_valid_rate: rate(
            results.iter().map(|r| r.text.schema_valid_calls).sum(),
            calls,
        ),
        mean_seconds: if n == 0 {
            0.0
        } else {
            results.iter().map(|r| r.seconds).sum::<f64>() / n as f64
        },
        max_seconds: results.iter().map(|r| r.seconds).fold(0.0, f64::max),
    }
}

/// The Markdown table of the summaries (one row per model, baselines beside).
pub fn markdown_table(summaries: &[ModelSummary]) -> String {
    let mut t = String::from(
        "| model | cases | hit@1 | hit@5 | lexical hit@1 / @5 | vector hit@1 / @5 | degenerate or empty | invented names | composed (fallback) | retried | schema-valid calls | s / case (mean, max) |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in summaries {
        let _ = writeln!(
            t,
            "| {} | {} | {:.2} | {:.2} | {:.2} / {:.2} | {:.2} / {:.2} | {:.1}% | {} | {:.1}% | {:.1}% | {:.1}% | {:.1}, {:.1} |",
            s.model,
            s.cases,
            s.hit1,
            s.hit5,
            s.lexical_hit1,
            s.lexical_hit5,
            s.vector_hit1,
            s.vector_hit5,
            100.0 * s.degenerate_rate,
            s.invented_names,
            100.0 * s.fallback_rate,
            100.0 * s.retry_rate,
            100.0 * s.schema_valid_rate,
            s.mean_seconds,
            s.max_seconds
        );
    }
    t
}

/// A grouped bar chart as a standalone SVG: one group per label, one bar per series.
/// Values are drawn on a 0..`max` axis (`max` <= 0 means the largest value).
pub fn svg_bars(
    title: &str,
    unit: &str,
    labels: &[String],
    series: &[(String, Vec<f64>)],
    max: f64,
) -> String {
    const W: f64 = 720.0;
    const H: f64 = 360.0;
    const LEFT: f64 = 60.0;
    const BOTTOM: f64 = 70.0;
    const TOP: f64 = 40.0;
    const COLORS: [&str; 6] = [
        "#2f6fb0", "#e08a1e", "#4a9a4a", "#b03a3a", "#7a5aa8", "#777777",
    ];
    let top = if max > 0.0 {
        max
    } else {
        series
            .iter()
            .flat_map(|(_, v)| v.iter().copied())
            .fold(0.0, f64::max)
            .max(1e-9)
            * 1.1
    };
    let plot_h = H - BOTTOM - TOP;
    let plot_w = W - LEFT - 20.0;
    let groups = labels.len().max(1) as f64;
    let group_w = plot_w / groups;
    let bar_w = (group_w * 0.8) / series.len().max(1) as f64;
    let esc = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        W / 2.0,
        esc(title)
    );
    for i in 0..=4 {
        let v = top * f64::from(i) / 4.0;
        let y = TOP + plot_h - plot_h * f64::from(i) / 4.0;
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            W - 20.0,
            LEFT - 6.0,
            y + 4.0,
            format_tick(v)
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="14" y="{:.1}" transform="rotate(-90 14 {:.1})" text-anchor="middle">{}</text>"#,
        TOP + plot_h / 2.0,
        TOP + plot_h / 2.0,
        esc(unit)
    );
    for (g, label) in labels.iter().enumerate() {
        let gx = LEFT + group_w * g as f64 + group_w * 0.1;
        for (si, (_, values)) in series.iter().enumerate() {
            let v = values.get(g).copied().unwrap_or(0.0).max(0.0);
            let h = plot_h * (v / top).min(1.0);
            let x = gx + bar_w * si as f64;
            let _ = writeln!(
                svg,
                r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{h:.1}" fill="{}"><title>{}: {}</title></rect>"#,
                TOP + plot_h - h,
                (bar_w - 2.0).max(1.0),
                COLORS[si % COLORS.len()],
                esc(&series[si].0),
                format_tick(v)
            );
        }
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            LEFT + group_w * (g as f64 + 0.5),
            TOP + plot_h + 16.0,
            esc(label)
        );
    }
    let mut lx = LEFT;
    for (si, (name, _)) in series.iter().enumerate() {
        let _ = writeln!(
            svg,
            r#"<rect x="{lx:.1}" y="{:.1}" width="12" height="12" fill="{}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            H - 28.0,
            COLORS[si % COLORS.len()],
            lx + 16.0,
            H - 18.0,
            esc(name)
        );
        lx += 24.0 + 7.0 * name.chars().count() as f64;
    }
    svg.push_str("</svg>\n");
    svg
}

fn format_tick(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// Whether `text` is a regression of the judged quality that a test should flag: kept for
/// callers that judge one text outside a triage.
pub fn is_degenerate(text: &str) -> bool {
    text.trim().is_empty()
        || check::repetition(text).is_some()
        || check::placeholder(text).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CASES: &str = r#"
[[case]]
id = "demo-1"
ecosystem = "pypi"
package = "demo"
buggy_version = "1.0.0"
fixed_version = "1.0.1"
artifact_file = "demo-1.0.0.tar.gz"
artifact_url = "https://files.pythonhosted.org/packages/demo-1.0.0.tar.gz"
sha256 = "0000000000000000000000000000000000000000000000000000000000000000"
report_url = "https://github.com/demo/demo/issues/1"
fixed_files = ["demo/core.py"]
title = "crash"
issue = "it crashes"
"#;

    #[test]
    fn a_missing_case_file_says_where_it_was_looked_for() {
        let rel = Path::new("no/such/folder/triage-cases.toml");
        match load_cases(rel) {
            Err(e @ EvalError::NotHere { .. }) => {
                let text = e.to_string();
                assert!(text.contains("no/such/folder/triage-cases.toml"), "{text}");
                assert!(text.contains("repository's root") && text.contains("--cases"));
            }
            other => panic!("{other:?}"),
        }
        // An absolute path that is missing stays a read error, with the system's reason.
        let abs = std::env::temp_dir().join("ferrograph-no-such-case-file.toml");
        assert!(matches!(load_cases(&abs), Err(EvalError::Read { .. })));
    }

    #[test]
    fn cases_parse_and_bad_cases_are_refused() {
        let c = parse_cases(CASES, Path::new("x.toml")).unwrap();
        assert_eq!(c[0].ecosystem, Ecosystem::Pypi);
        assert!(!c[0].smoke);
        assert!(c[0].issue_markdown().starts_with("# crash\n"));
        let dup = format!("{CASES}\n{CASES}");
        assert!(parse_cases(&dup, Path::new("x.toml"))
            .unwrap_err()
            .to_string()
            .contains("duplicate"));
        let hostile = CASES.replace("demo/core.py", "../etc/passwd");
        assert!(matches!(
            parse_cases(&hostile, Path::new("x.toml")),
            Err(EvalError::Case { .. })
        ));
        let unknown = CASES
            .replace("smoke", "smokey")
            .replace("title =", "colour = \"red\"\ntitle =");
        assert!(matches!(
            parse_cases(&unknown, Path::new("x.toml")),
            Err(EvalError::Parse { .. })
        ));
    }

    #[test]
    fn line_numbers_of_retrieved_regions_are_known_others_are_not() {
        let s = TriageState {
            issue_title: "crash".into(),
            issue_body: "it crashes in parse".into(),
            codebase: Some(crate::models::CodebaseFinding {
                base: crate::models::FindingBase {
                    reasoning: "The error occurs at line 346 of sqlparse/sql.py, not line 512."
                        .into(),
                    ..Default::default()
                },
                evidence: vec![
                    "sqlparse/sql.py:346-357 (0.1162)".into(),
                    // Not a file of the repository: its numbers stay unknown.
                    "elsewhere/x.py:512-520 (0.1000)".into(),
                ],
                ..Default::default()
            }),
            ..Default::default()
        };
        let files = ["sqlparse/sql.py".to_string()];
        let j = judge(&s, &files, "", &[]);
        let f = j
            .fields
            .iter()
            .find(|f| f.field == "codebase_search.explanation")
            .unwrap();
        assert_eq!(f.invented, vec!["512".to_string()]);
    }

    #[test]
    fn ranks_and_hits() {
        let ranked: Vec<String> = ["README.md", "demo/core.py", "tests/test_core.py"]
            .map(String::from)
            .to_vec();
        let fixed = vec!["demo/core.py".to_string()];
        assert_eq!(rank_of(&ranked, &fixed), Some(2));
        assert!(!hit(Some(2), 1) && hit(Some(2), 5) && !hit(None, 5));
        assert_eq!(rank_of(&ranked, &["other.py".to_string()]), None);
    }

    #[test]
    fn summary_rates() {
        let r = |rank, lex, text: TextJudgement| CaseResult {
            case: "c".into(),
            model: "m".into(),
            status: "COMPLETED".into(),
            ranked: vec![],
            rank,
            lexical_rank: lex,
            vector_rank: None,
            text,
            seconds: 2.0,
            completion_tokens: 0,
        };
        let good = TextJudgement {
            fields: vec![JudgedField {
                field: "f".into(),
                degenerate: false,
                invented: vec![],
            }],
            from_model: 3,
            from_retry: 0,
            composed: 1,
            calls: 4,
            schema_valid_calls: 4,
        };
        let mut bad = good.clone();
        bad.fields[0].degenerate = true;
        bad.fields[0].invented = vec!["Leyla".into()];
        let s = summarize("m", &[r(Some(1), Some(3), good), r(Some(4), None, bad)]);
        assert_eq!((s.hit1, s.hit5), (0.5, 1.0));
        assert_eq!((s.lexical_hit1, s.lexical_hit5), (0.0, 0.5));
        assert_eq!(s.degenerate_rate, 0.5);
        assert_eq!(s.invented_names, 1);
        assert_eq!(s.fallback_rate, 0.25);
        assert_eq!(s.schema_valid_rate, 1.0);
        assert!(markdown_table(&[s]).contains("| m | 2 | 0.50 | 1.00 |"));
    }

    #[test]
    fn svg_is_well_formed_enough() {
        let svg = svg_bars(
            "hit@5 <by model>",
            "rate",
            &["smollm2".into(), "gemma".into()],
            &[
                ("workflow".into(), vec![0.8, 0.9]),
                ("lexical".into(), vec![0.5, 0.5]),
            ],
            1.0,
        );
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<rect").count(), 1 + 4 + 2);
        assert!(svg.contains("&lt;by model&gt;"));
    }

    #[test]
    fn degenerate_text() {
        assert!(is_degenerate(""));
        assert!(is_degenerate(
            "to 0.10.0 to 0.10.0 to 0.10.0 to 0.10.0 to 0.10.0 to 0.10.0"
        ));
        assert!(!is_degenerate(
            "apply_discounts adds the percentages instead of compounding them."
        ));
    }
}
