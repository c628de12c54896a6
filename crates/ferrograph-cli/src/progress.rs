//! Progress of a run on standard error (indicatif): index builds (files, chunks,
//! embeddings per second), then one line per agent as it works (round, tokens generated,
//! tokens per second, prompt tokens served from the prefix cache, elapsed time).
//!
//! It reads the run's own events (`agent_start`, `agent_run` and `index_progress` custom
//! events, token events), so any workflow that emits them gets the same display. On a
//! terminal the lines update in place; elsewhere (CI logs, pipes) each finished line is
//! printed once.

use ferrograph::runtime::JsonEvent;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::Value;
use std::collections::HashMap;
use std::io::IsTerminal as _;
use std::time::{Duration, Instant};

/// One agent line.
struct AgentLine {
    bar: ProgressBar,
    round: u64,
    started: Instant,
    first_token: Option<Instant>,
    pieces: u64,
}

/// The progress display of one run.
pub struct Progress {
    multi: MultiProgress,
    live: bool,
    agents: HashMap<String, AgentLine>,
    indexes: HashMap<String, (ProgressBar, Instant)>,
}

impl Progress {
    /// A display on standard error; animated when it is a terminal.
    pub fn new() -> Self {
        let live = std::io::stderr().is_terminal();
        let multi = MultiProgress::with_draw_target(if live {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        });
        Progress {
            multi,
            live,
            agents: HashMap::new(),
            indexes: HashMap::new(),
        }
    }

    /// A line that is printed once (on a terminal, above the live lines).
    pub fn println(&self, text: impl AsRef<str>) {
        if self.live {
            let _ = self.multi.println(text.as_ref());
        } else {
            eprintln!("{}", text.as_ref());
        }
    }

    fn spinner(&self, msg: String) -> ProgressBar {
        let bar = self.multi.add(ProgressBar::new_spinner());
        bar.set_style(
            ProgressStyle::with_template("{spinner} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar.set_message(msg);
        if self.live {
            bar.enable_steady_tick(Duration::from_millis(120));
        }
        bar
    }

    /// Updates the display with one event of the run.
    pub fn event(&mut self, ev: &JsonEvent) {
        let d = &ev.data;
        match ev.kind {
            "custom" => {
                let p = d.get("payload").cloned().unwrap_or(Value::Null);
                match p.get("event").and_then(Value::as_str) {
                    Some("agent_start") => self.agent_start(&p),
                    Some("agent_run") => self.agent_end(&p),
                    Some("index_progress") => self.index_progress(&p),
                    _ => {}
                }
            }
            "token" => {
                let node = d.get("node").and_then(Value::as_str).unwrap_or("");
                if let Some(a) = self.agents.get_mut(node) {
                    a.pieces += 1;
                    let now = Instant::now();
                    let first = *a.first_token.get_or_insert(now);
                    let secs = now.duration_since(first).as_secs_f64().max(1e-3);
                    a.bar.set_message(format!(
                        "{node} · round {} · ~{} tokens · {:.0} tok/s · {:.1} s",
                        a.round,
                        a.pieces,
                        a.pieces as f64 / secs,
                        a.started.elapsed().as_secs_f64()
                    ));
                }
            }
            _ => {}
        }
    }

    fn agent_start(&mut self, p: &Value) {
        let name = p
            .get("agent")
            .and_then(Value::as_str)
            .unwrap_or("agent")
            .to_string();
        let round = p.get("round").and_then(Value::as_u64).unwrap_or(1);
        let bar = self.spinner(format!("{name} · round {round} · working"));
        self.agents.insert(
            name,
            AgentLine {
                bar,
                round,
                started: Instant::now(),
                first_token: None,
                pieces: 0,
            },
        );
    }

    fn agent_end(&mut self, p: &Value) {
        let run = p.get("run").cloned().unwrap_or(Value::Null);
        let name = run
            .get("agent")
            .and_then(Value::as_str)
            .unwrap_or("agent")
            .to_string();
        let round = run.get("round").and_then(Value::as_u64).unwrap_or(1);
        let ms = run
            .get("duration_ms")
            .and_then(Value::as_f64)
            .unwrap_or(0.0);
        let calls = run
            .get("calls")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let sum = |k: &str| -> u64 {
            calls
                .iter()
                .filter_map(|c| c.get(k).and_then(Value::as_u64))
                .sum()
        };
        let (generated, cached, prompt) = (
            sum("completion_tokens"),
            sum("cached_prompt_tokens"),
            sum("prompt_tokens"),
        );
        let decode_secs = self
            .agents
            .get(&name)
            .and_then(|a| a.first_token.map(|f| f.elapsed().as_secs_f64()))
            .unwrap_or(ms / 1e3)
            .max(1e-3);
        let checks = p
            .get("checks")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let composed = checks
            .iter()
            .filter(|c| c.get("source").and_then(Value::as_str) == Some("composed"))
            .count();
        let error = run.get("error").and_then(Value::as_str).map(str::to_string);
        let mark = if error.is_some() { "✘" } else { "✔" };
        let mut line = format!(
            "{mark} {name} · round {round} · {} call(s) · {generated} tokens · {:.0} tok/s · {cached}/{prompt} prompt tokens cached · {:.1} s",
            calls.len(),
            generated as f64 / decode_secs,
            ms / 1e3
        );
        if composed > 0 {
            line.push_str(&format!(" · {composed} field(s) composed from evidence"));
        }
        if let Some(e) = error {
            line.push_str(&format!(" · {}", e.chars().take(160).collect::<String>()));
        }
        if let Some(a) = self.agents.remove(&name) {
            a.bar.finish_and_clear();
            self.multi.remove(&a.bar);
        }
        self.println(line);
    }

    fn index_progress(&mut self, p: &Value) {
        let folder = p
            .get("folder")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let total = p.get("files_total").and_then(Value::as_u64).unwrap_or(0);
        let done = p.get("files_done").and_then(Value::as_u64).unwrap_or(0);
        let chunks = p
            .get("chunks_embedded")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let secs = p
            .get("seconds")
            .and_then(Value::as_f64)
            .unwrap_or(0.0)
            .max(1e-3);
        let short = folder.rsplit('/').next().unwrap_or(&folder).to_string();
        let msg = format!(
            "indexing {short}: {done}/{total} files · {chunks} chunks embedded · {:.0} chunks/s",
            chunks as f64 / secs
        );
        let finished = total > 0 && done >= total;
        let entry = self.indexes.entry(folder.clone()).or_insert_with(|| {
            let bar = self.multi.add(ProgressBar::new(total.max(1)));
            bar.set_style(
                ProgressStyle::with_template("{bar:24} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            (bar, Instant::now())
        });
        entry.0.set_length(total.max(1));
        entry.0.set_position(done);
        entry.0.set_message(msg.clone());
        if finished {
            let (bar, _) = entry.clone();
            bar.finish_and_clear();
            self.multi.remove(&bar);
            self.indexes.remove(&folder);
            self.println(format!("✔ {msg} · {secs:.1} s"));
        }
    }

    /// Clears whatever is still drawn.
    pub fn finish(&mut self) {
        for (_, a) in self.agents.drain() {
            a.bar.finish_and_clear();
        }
        for (_, (b, _)) in self.indexes.drain() {
            b.finish_and_clear();
        }
        let _ = self.multi.clear();
    }
}
