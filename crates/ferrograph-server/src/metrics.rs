//! Prometheus metrics, written in the text exposition format by hand.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Upper bounds of the node latency histogram, in seconds.
const BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0,
];

#[derive(Default, Clone)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, secs: f64) {
        for (i, b) in BUCKETS.iter().enumerate() {
            if secs <= *b {
                self.counts[i] += 1;
            }
        }
        self.count += 1;
        self.sum += secs;
    }
}

#[derive(Default)]
struct Data {
    runs: BTreeMap<(String, String), u64>,
    steps: BTreeMap<String, u64>,
    tasks: BTreeMap<(String, String, String), u64>,
    node_latency: BTreeMap<(String, String), Histogram>,
    tools: BTreeMap<(String, String), u64>,
    tokens: BTreeMap<String, u64>,
    generation_secs: BTreeMap<String, f64>,
    tokens_per_sec: BTreeMap<String, f64>,
    http: BTreeMap<(String, u16), u64>,
}

/// Counters and histograms of the server's runs.
pub(crate) struct Metrics {
    data: Mutex<Data>,
    started: Instant,
}

/// What one run reported, gathered while it streams and recorded once it ends.
#[derive(Default)]
pub(crate) struct RunTracker {
    steps: std::collections::BTreeSet<u64>,
    tasks: Vec<(String, String, f64)>,
    tools: Vec<(String, String)>,
    tokens: BTreeMap<String, (u64, Instant, Instant)>,
}

impl RunTracker {
    /// Looks at one streamed event (`kind` and `data` as in `JsonEvent`).
    pub(crate) fn observe(&mut self, kind: &str, data: &serde_json::Value) {
        let node = || {
            data.get("node")
                .and_then(|n| n.as_str())
                .unwrap_or("")
                .to_string()
        };
        match kind {
            "task_start" => {
                if let Some(step) = data.get("step").and_then(|s| s.as_u64()) {
                    self.steps.insert(step);
                }
            }
            "task_end" => {
                let secs = data
                    .get("duration_ms")
                    .and_then(|d| d.as_f64())
                    .unwrap_or(0.0)
                    / 1e3;
                let outcome = match data.get("outcome") {
                    Some(serde_json::Value::String(s)) => s.clone(),
                    Some(_) => "error".to_string(),
                    None => "unknown".to_string(),
                };
                self.tasks.push((node(), outcome, secs));
            }
            "tool" => {
                let ev = data.get("event");
                let is_end = ev
                    .and_then(|e| e.get("event"))
                    .and_then(|e| e.as_str())
                    .is_some_and(|e| e == "tool_end");
                if is_end {
                    let get = |k: &str| {
                        ev.and_then(|e| e.get(k))
                            .and_then(|v| v.as_str())
                            .unwrap_or("")
                            .to_string()
                    };
                    self.tools.push((get("tool"), get("status")));
                }
            }
            "token" => {
                let model = data
                    .get("model")
                    .and_then(|m| m.as_str())
                    .unwrap_or("")
                    .to_string();
                let now = Instant::now();
                let e = self.tokens.entry(model).or_insert((0, now, now));
                e.0 += 1;
                e.2 = now;
            }
            _ => {}
        }
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Metrics {
    pub(crate) fn new() -> Self {
        Metrics {
            data: Mutex::new(Data::default()),
            started: Instant::now(),
        }
    }

    fn data(&self) -> std::sync::MutexGuard<'_, Data> {
        self.data.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a finished run: its status (`done`, `interrupted`, `drained`, `failed`) and what
    /// its events reported.
    pub(crate) fn record_run(&self, workflow: &str, status: &str, run: RunTracker, wall: Duration) {
        let mut d = self.data();
        *d.runs
            .entry((workflow.to_string(), status.to_string()))
            .or_default() += 1;
        *d.steps.entry(workflow.to_string()).or_default() += run.steps.len() as u64;
        for (node, outcome, secs) in run.tasks {
            d.node_latency
                .entry((workflow.to_string(), node.clone()))
                .or_default()
                .observe(secs);
            *d.tasks
                .entry((workflow.to_string(), node, outcome))
                .or_default() += 1;
        }
        for (tool, status) in run.tools {
            *d.tools.entry((tool, status)).or_default() += 1;
        }
        for (model, (n, first, last)) in run.tokens {
            *d.tokens.entry(model.clone()).or_default() += n;
            // One token has no span of its own: count it against the run's wall time.
            let span = if n > 1 {
                last.duration_since(first)
            } else {
                wall
            }
            .as_secs_f64();
            *d.generation_secs.entry(model.clone()).or_default() += span;
            if span > 0.0 {
                d.tokens_per_sec.insert(model, n as f64 / span);
            }
        }
    }

    /// Counts an HTTP response.
    pub(crate) fn record_http(&self, method: &str, status: u16) {
        *self
            .data()
            .http
            .entry((method.to_string(), status))
            .or_default() += 1;
    }

    /// The exposition text. `threads` counts thread records by status, `pending` the pending
    /// interrupts, `active` the runs in progress.
    pub(crate) fn render(
        &self,
        threads: &BTreeMap<String, u64>,
        pending: u64,
        active: usize,
    ) -> String {
        let d = self.data();
        let mut o = String::with_capacity(4096);
        let head = |o: &mut String, name: &str, kind: &str, help: &str| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };
        head(
            &mut o,
            "ferrograph_runs_total",
            "counter",
            "Runs ended through the API, by workflow and status (done, interrupted, drained, failed).",
        );
        for ((wf, st), n) in &d.runs {
            let _ = writeln!(
                o,
                "ferrograph_runs_total{{workflow=\"{}\",status=\"{}\"}} {n}",
                escape(wf),
                escape(st)
            );
        }
        head(
            &mut o,
            "ferrograph_runs_active",
            "gauge",
            "Runs in progress.",
        );
        let _ = writeln!(o, "ferrograph_runs_active {active}");
        head(
            &mut o,
            "ferrograph_steps_total",
            "counter",
            "Supersteps executed by runs started through the API.",
        );
        for (wf, n) in &d.steps {
            let _ = writeln!(
                o,
                "ferrograph_steps_total{{workflow=\"{}\"}} {n}",
                escape(wf)
            );
        }
        head(
            &mut o,
            "ferrograph_tasks_total",
            "counter",
            "Node tasks ended, by workflow, node and outcome.",
        );
        for ((wf, node, out), n) in &d.tasks {
            let _ = writeln!(
                o,
                "ferrograph_tasks_total{{workflow=\"{}\",node=\"{}\",outcome=\"{}\"}} {n}",
                escape(wf),
                escape(node),
                escape(out)
            );
        }
        head(
            &mut o,
            "ferrograph_node_duration_seconds",
            "histogram",
            "Node task latency, by workflow and node.",
        );
        for ((wf, node), h) in &d.node_latency {
            let labels = format!("workflow=\"{}\",node=\"{}\"", escape(wf), escape(node));
            for (b, c) in BUCKETS.iter().zip(h.counts.iter()) {
                let _ = writeln!(
                    o,
                    "ferrograph_node_duration_seconds_bucket{{{labels},le=\"{b}\"}} {c}"
                );
            }
            let _ = writeln!(
                o,
                "ferrograph_node_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}",
                h.count
            );
            let _ = writeln!(
                o,
                "ferrograph_node_duration_seconds_sum{{{labels}}} {}",
                h.sum
            );
            let _ = writeln!(
                o,
                "ferrograph_node_duration_seconds_count{{{labels}}} {}",
                h.count
            );
        }
        head(
            &mut o,
            "ferrograph_tool_executions_total",
            "counter",
            "Tool executions ended, by tool and status (success, error, timeout).",
        );
        for ((tool, st), n) in &d.tools {
            let _ = writeln!(
                o,
                "ferrograph_tool_executions_total{{tool=\"{}\",status=\"{}\"}} {n}",
                escape(tool),
                escape(st)
            );
        }
        head(
            &mut o,
            "ferrograph_interrupts_pending",
            "gauge",
            "Interrupts waiting for a resume value, over all thread records.",
        );
        let _ = writeln!(o, "ferrograph_interrupts_pending {pending}");
        head(
            &mut o,
            "ferrograph_threads",
            "gauge",
            "Thread records by status.",
        );
        for (st, n) in threads {
            let _ = writeln!(o, "ferrograph_threads{{status=\"{}\"}} {n}", escape(st));
        }
        head(
            &mut o,
            "ferrograph_tokens_generated_total",
            "counter",
            "Tokens generated by models, by model.",
        );
        for (m, n) in &d.tokens {
            let _ = writeln!(
                o,
                "ferrograph_tokens_generated_total{{model=\"{}\"}} {n}",
                escape(m)
            );
        }
        head(
            &mut o,
            "ferrograph_generation_seconds_total",
            "counter",
            "Time spent generating tokens, by model (rate(tokens)/rate(seconds) gives tokens/s).",
        );
        for (m, s) in &d.generation_secs {
            let _ = writeln!(
                o,
                "ferrograph_generation_seconds_total{{model=\"{}\"}} {s}",
                escape(m)
            );
        }
        head(
            &mut o,
            "ferrograph_tokens_per_second",
            "gauge",
            "Generation speed of the latest run that produced tokens, by model.",
        );
        for (m, r) in &d.tokens_per_sec {
            let _ = writeln!(
                o,
                "ferrograph_tokens_per_second{{model=\"{}\"}} {r}",
                escape(m)
            );
        }
        head(
            &mut o,
            "ferrograph_http_responses_total",
            "counter",
            "HTTP responses by method and status.",
        );
        for ((m, s), n) in &d.http {
            let _ = writeln!(
                o,
                "ferrograph_http_responses_total{{method=\"{}\",status=\"{s}\"}} {n}",
                escape(m)
            );
        }
        head(
            &mut o,
            "ferrograph_uptime_seconds",
            "gauge",
            "Seconds since the server started.",
        );
        let _ = writeln!(
            o,
            "ferrograph_uptime_seconds {}",
            self.started.elapsed().as_secs_f64()
        );
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn runs_are_rendered_in_the_text_format() {
        let m = Metrics::new();
        let mut t = RunTracker::default();
        t.observe("task_start", &json!({"node": "a", "step": 1}));
        t.observe(
            "task_end",
            &json!({"node": "a", "step": 1, "duration_ms": 2.0, "outcome": "ok"}),
        );
        t.observe(
            "tool",
            &json!({"node": "a", "event": {"event": "tool_end", "tool": "t\"x", "status": "error"}}),
        );
        t.observe("token", &json!({"node": "a", "model": "m", "text": "x"}));
        m.record_run("wf", "done", t, Duration::from_millis(10));
        let text = m.render(&BTreeMap::from([("done".to_string(), 1)]), 2, 0);
        for needle in [
            "ferrograph_runs_total{workflow=\"wf\",status=\"done\"} 1",
            "ferrograph_steps_total{workflow=\"wf\"} 1",
            "ferrograph_node_duration_seconds_bucket{workflow=\"wf\",node=\"a\",le=\"0.001\"} 0",
            "ferrograph_node_duration_seconds_bucket{workflow=\"wf\",node=\"a\",le=\"0.005\"} 1",
            "ferrograph_node_duration_seconds_count{workflow=\"wf\",node=\"a\"} 1",
            "ferrograph_tool_executions_total{tool=\"t\\\"x\",status=\"error\"} 1",
            "ferrograph_tokens_generated_total{model=\"m\"} 1",
            "ferrograph_tokens_per_second{model=\"m\"} 100",
            "ferrograph_interrupts_pending 2",
            "ferrograph_threads{status=\"done\"} 1",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
    }
}
