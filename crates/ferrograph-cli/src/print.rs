//! Readable printing of run events and outcomes.

use ferrograph::runtime::{JsonEvent, JsonOutcome};
use serde_json::Value;
use std::io::Write;

/// The node whose model tokens are being printed on the current line, if one is open.
static TOKEN_LINE: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

fn token_line() -> std::sync::MutexGuard<'static, Option<String>> {
    TOKEN_LINE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Writes a line to standard output (ending an open line of model tokens first, so that an
/// event never shares a line with them); a closed pipe ends the program quietly.
pub fn line(text: impl std::fmt::Display) {
    let mut open = token_line();
    let mut out = std::io::stdout().lock();
    if write_line(&mut out, &mut open, &text).is_err() {
        std::process::exit(0);
    }
}

fn write_line(
    out: &mut impl Write,
    open: &mut Option<String>,
    text: &impl std::fmt::Display,
) -> std::io::Result<()> {
    if open.take().is_some() {
        writeln!(out)?;
    }
    writeln!(out, "{text}")
}

/// Prints one event as a JSON line (`--json`).
pub fn json_line(ev: &JsonEvent) {
    line(serde_json::to_string(ev).unwrap_or_else(|_| "{}".to_string()));
}

/// Prints a model token: on a line of its own that names the node (`  node ✎ text…`), each
/// newline in the text starting another such line, so a reader can tell tokens from events.
fn token(namespace: &str, node: &str, text: &str) {
    let mut open = token_line();
    let mut out = std::io::stdout().lock();
    if write_token(&mut out, &mut open, namespace, node, text)
        .and_then(|()| out.flush())
        .is_err()
    {
        std::process::exit(0);
    }
}

fn write_token(
    out: &mut impl Write,
    open: &mut Option<String>,
    namespace: &str,
    node: &str,
    text: &str,
) -> std::io::Result<()> {
    let prefix = format!("  {}{node} ✎ ", ns(namespace));
    if open.as_deref() != Some(prefix.as_str()) {
        if open.is_some() {
            writeln!(out)?;
        }
        write!(out, "{prefix}")?;
        *open = Some(prefix.clone());
    }
    let mut parts = text.split('\n');
    if let Some(first) = parts.next() {
        write!(out, "{first}")?;
    }
    for part in parts {
        write!(out, "\n{prefix}{part}")?;
    }
    Ok(())
}

fn ns(n: &str) -> String {
    if n.is_empty() {
        String::new()
    } else {
        format!("[{n}] ")
    }
}

/// Prints one event as a line (tokens are printed as they come).
pub fn event(ev: &JsonEvent) {
    let d = &ev.data;
    let s = |k: &str| d.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let step = d.get("step").and_then(Value::as_u64).unwrap_or(0);
    match ev.kind {
        "task_start" => {
            let attempt = d.get("attempt").and_then(Value::as_u64).unwrap_or(1);
            let retry = if attempt > 1 {
                format!(" (attempt {attempt})")
            } else {
                String::new()
            };
            line(format!(
                "  {}step {step:>2}  ▶ {}{retry}",
                ns(&ev.namespace),
                s("node")
            ));
        }
        "task_end" => {
            let ms = d.get("duration_ms").and_then(Value::as_f64).unwrap_or(0.0);
            let what = match d.get("outcome") {
                Some(Value::String(o)) if o == "ok" => "✔".to_string(),
                Some(Value::String(o)) if o == "cached" => "✔ (reused)".to_string(),
                Some(Value::String(o)) if o == "interrupted" => "⏸ interrupted".to_string(),
                Some(Value::Object(e)) => format!(
                    "✘ {}{}",
                    e.get("error").and_then(Value::as_str).unwrap_or("error"),
                    if e.get("will_retry").and_then(Value::as_bool) == Some(true) {
                        " (will retry)"
                    } else {
                        ""
                    }
                ),
                _ => "?".to_string(),
            };
            line(format!(
                "  {}step {step:>2}  {what} {} in {ms:.2} ms",
                ns(&ev.namespace),
                s("node")
            ));
        }
        "custom" => line(format!(
            "  {}{}: {}",
            ns(&ev.namespace),
            s("node"),
            d.get("payload").cloned().unwrap_or(Value::Null)
        )),
        "tool" => line(format!(
            "  {}{}: tool {}",
            ns(&ev.namespace),
            s("node"),
            d.get("event").cloned().unwrap_or(Value::Null)
        )),
        "token" => token(&ev.namespace, &s("node"), &s("text")),
        _ => {}
    }
}

/// Whether a run that finished reports failure in its own state (`status: FAILED`, or
/// ticket-to-pr's `failed` and `unknown ticket`).
pub fn failed(o: &JsonOutcome) -> bool {
    matches!(
        o.state.get("status").and_then(Value::as_str),
        Some(
            "FAILED" | "failed" | "unknown ticket" | "blocked" | "abandoned" | "deployment failed"
        )
    )
}

/// A state whose `messages` are progress lines (ticket-to-pr): those lines, the status, the
/// error and the pull request, instead of the whole state (`ferrograph threads show` has it).
fn progress_lines(state: &Value, thread: &str) -> Option<Vec<String>> {
    let msgs = state.get("messages")?.as_array()?;
    let mut out: Vec<String> = msgs
        .iter()
        .map(|m| m.as_str().map(|s| format!("  {s}")))
        .collect::<Option<_>>()?;
    if let Some(st) = state.get("status").and_then(Value::as_str) {
        out.push(format!("status: {st}"));
    }
    if let Some(err) = state.get("error").and_then(Value::as_str) {
        out.push(format!("error: {err}"));
    }
    if let Some(pr) = state.get("pr").filter(|p| p.is_object()) {
        out.push(format!(
            "pull request #{}: {} (ferrograph prs show {})",
            pr["number"],
            pr["title"].as_str().unwrap_or(""),
            pr["number"]
        ));
        if let Some(b) = state.get("branch").and_then(Value::as_str) {
            let repo = state.get("repo").and_then(Value::as_str).unwrap_or(".");
            let base = state
                .get("base_branch")
                .and_then(Value::as_str)
                .unwrap_or("HEAD");
            out.push(format!(
                "branch: {b} (git -C {repo} log --oneline {base}..{b})"
            ));
        }
    }
    if let (Some(l), Some(dir)) = (
        state.get("lifecycle").and_then(Value::as_str),
        state.get("run_dir").and_then(Value::as_str),
    ) {
        out.push(format!("lifecycle: {l}"));
        out.push(format!("run folder: {dir} (ferrograph team show {thread})"));
        if let Some(p) = state
            .pointer("/deployment/status/deployment_path")
            .and_then(Value::as_str)
        {
            if state
                .pointer("/deployment/status/status")
                .and_then(Value::as_str)
                == Some("deployed")
            {
                out.push(format!("release: {p}"));
            }
        }
    }
    out.push(format!("full state: ferrograph threads show {thread}"));
    Some(out)
}

/// Prints how a run ended; for interrupts, the payload and the exact resume commands.
pub fn outcome(o: &JsonOutcome, workflow: &str) {
    match o.state.get("report_files").filter(|f| f.is_object()) {
        // A workflow that writes report files: say where they are instead of dumping the
        // whole state (the JSON report holds it).
        Some(files) => {
            let get = |k: &str| {
                files
                    .get(k)
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            };
            if let Some(status) = o.state.get("status").and_then(Value::as_str) {
                line(format!("status: {status}"));
            }
            if let Some(err) = o.state.get("error").and_then(Value::as_str) {
                line(format!("error: {err}"));
            }
            line(format!("report (Markdown): {}", get("markdown")));
            line(format!("report (JSON):     {}", get("json")));
            line(format!("event trace:       {}", get("events")));
        }
        None => {
            let thread = o.thread_id.clone().unwrap_or_default();
            match progress_lines(&o.state, &thread) {
                Some(lines) => lines.into_iter().for_each(line),
                None => line(serde_json::to_string_pretty(&o.state).unwrap_or_default()),
            }
        }
    }
    let thread = o.thread_id.clone().unwrap_or_default();
    match o.status {
        "done" if failed(o) => line(format!(
            "\n✘ {workflow} failed (thread {thread}); see the error above{}",
            if o.state.get("report_files").is_some_and(Value::is_object) {
                " and the report"
            } else {
                ""
            }
        )),
        "done" => line(format!("\n✔ {workflow} finished (thread {thread})")),
        "interrupted" => {
            line(format!(
                "\n⏸ {workflow} is waiting for input (thread {thread})"
            ));
            for i in &o.interrupts {
                line(format!("\ninterrupt {} at {}:", i.id, i.node));
                if let Some(summary) = i.value.0.get("summary").and_then(Value::as_str) {
                    line(summary);
                    if let Some(how) = i.value.0.get("instructions").and_then(Value::as_str) {
                        line(format!("\n{how}"));
                    }
                    // A review gate's proposed change, as a unified diff.
                    if let Some(diff) = i.value.0.get("diff").and_then(Value::as_str) {
                        line(format!("\n{}", diff.trim_end()));
                    }
                } else {
                    line(serde_json::to_string_pretty(&i.value.0).unwrap_or_default());
                }
            }
            let choices: Vec<String> = o
                .interrupts
                .first()
                .and_then(|i| i.value.0.get("choices"))
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|c| c.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            line("\nresume with:");
            if o.interrupts.iter().all(|i| i.static_) {
                line(format!("  ferrograph resume {thread}"));
            } else if choices.iter().any(|c| c == "approve") {
                line(format!("  ferrograph resume {thread} --approve"));
                line(format!("  ferrograph resume {thread} --reject"));
                line(format!(
                    "  ferrograph resume {thread} --feedback \"what to change\""
                ));
            } else {
                line(format!("  ferrograph resume {thread} --value '<json>'"));
            }
        }
        other => line(format!(
            "\n■ {workflow} stopped ({other}); continue with: ferrograph resume {thread}"
        )),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn tokens_never_share_a_line_with_events() {
        let mut out = Vec::new();
        let mut open = None;
        write_token(&mut out, &mut open, "", "writer", "Hel").unwrap();
        write_token(&mut out, &mut open, "", "writer", "lo\nworld").unwrap();
        write_line(&mut out, &mut open, &"  step  3  ✔ writer in 2.00 ms").unwrap();
        write_token(&mut out, &mut open, "", "critic", "ok").unwrap();
        write_token(&mut out, &mut open, "sub:1", "writer", "x").unwrap();
        write_line(&mut out, &mut open, &"{\"kind\":\"end\"}").unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "  writer ✎ Hello\n  writer ✎ world\n  step  3  ✔ writer in 2.00 ms\n  critic ✎ ok\n  [sub:1] writer ✎ x\n{\"kind\":\"end\"}\n"
        );
    }
}
