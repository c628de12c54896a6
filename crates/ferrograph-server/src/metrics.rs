//! Prometheus metrics of the server's runs, through the `prometheus-client` crate (the
//! Prometheus project's Rust client), rendered in the text exposition format at `/metrics`.

use ferrograph::runtime::registry::metric_label;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

/// Upper bounds of the node latency histogram, in seconds.
const BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunLabels {
    workflow: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WorkflowLabel {
    workflow: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaskLabels {
    workflow: String,
    node: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    workflow: String,
    node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    tool: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabel {
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpLabels {
    method: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;
type FloatCounter = Counter<f64, AtomicU64>;
type LatencyFamily = Family<NodeLabels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// Counters and histograms of the server's runs.
pub(crate) struct Metrics {
    registry: Registry,
    runs: Family<RunLabels, Counter>,
    active: Gauge,
    steps: Family<WorkflowLabel, Counter>,
    tasks: Family<TaskLabels, Counter>,
    node_latency: LatencyFamily,
    tools: Family<ToolLabels, Counter>,
    pending: Gauge,
    threads: Family<StatusLabel, Gauge>,
    tokens: Family<ModelLabel, Counter>,
    generation_secs: Family<ModelLabel, FloatCounter>,
    tokens_per_sec: Family<ModelLabel, FloatGauge>,
    http: Family<HttpLabels, Counter>,
    uptime: FloatGauge,
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

impl Metrics {
    pub(crate) fn new() -> Self {
        let mut r = Registry::with_prefix("ferrograph");
        let runs = Family::<RunLabels, Counter>::default();
        r.register(
            "runs",
            "Runs ended through the API, by workflow and status (done, interrupted, drained, failed)",
            runs.clone(),
        );
        let active = Gauge::default();
        r.register("runs_active", "Runs in progress", active.clone());
        let steps = Family::<WorkflowLabel, Counter>::default();
        r.register(
            "steps",
            "Supersteps executed by runs started through the API",
            steps.clone(),
        );
        let tasks = Family::<TaskLabels, Counter>::default();
        r.register(
            "tasks",
            "Node tasks ended, by workflow, node and outcome",
            tasks.clone(),
        );
        let node_latency: LatencyFamily = Family::new_with_constructor(latency_histogram);
        r.register(
            "node_duration_seconds",
            "Node task latency, by workflow and node",
            node_latency.clone(),
        );
        let tools = Family::<ToolLabels, Counter>::default();
        r.register(
            "tool_executions",
            "Tool executions ended, by tool and status (success, error, timeout)",
            tools.clone(),
        );
        let pending = Gauge::default();
        r.register(
            "interrupts_pending",
            "Interrupts waiting for a resume value, over all thread records",
            pending.clone(),
        );
        let threads = Family::<StatusLabel, Gauge>::default();
        r.register("threads", "Thread records by status", threads.clone());
        let tokens = Family::<ModelLabel, Counter>::default();
        r.register(
            "tokens_generated",
            "Tokens generated by models, by model",
            tokens.clone(),
        );
        let generation_secs = Family::<ModelLabel, FloatCounter>::default();
        r.register(
            "generation_seconds",
            "Time spent generating tokens, by model (rate(tokens)/rate(seconds) gives tokens/s)",
            generation_secs.clone(),
        );
        let tokens_per_sec = Family::<ModelLabel, FloatGauge>::default();
        r.register(
            "tokens_per_second",
            "Generation speed of the latest run that produced tokens, by model",
            tokens_per_sec.clone(),
        );
        let http = Family::<HttpLabels, Counter>::default();
        r.register(
            "http_responses",
            "HTTP responses by method and status",
            http.clone(),
        );
        let uptime = FloatGauge::default();
        r.register(
            "uptime_seconds",
            "Seconds since the server started",
            uptime.clone(),
        );
        Metrics {
            registry: r,
            runs,
            active,
            steps,
            tasks,
            node_latency,
            tools,
            pending,
            threads,
            tokens,
            generation_secs,
            tokens_per_sec,
            http,
            uptime,
            started: Instant::now(),
        }
    }

    /// Records a finished run: its status (`done`, `interrupted`, `drained`, `failed`) and what
    /// its events reported.
    pub(crate) fn record_run(&self, workflow: &str, status: &str, run: RunTracker, wall: Duration) {
        let wf = || metric_label(workflow);
        self.runs
            .get_or_create(&RunLabels {
                workflow: wf(),
                status: metric_label(status),
            })
            .inc();
        self.steps
            .get_or_create(&WorkflowLabel { workflow: wf() })
            .inc_by(run.steps.len() as u64);
        for (node, outcome, secs) in run.tasks {
            self.node_latency
                .get_or_create(&NodeLabels {
                    workflow: wf(),
                    node: metric_label(&node),
                })
                .observe(secs);
            self.tasks
                .get_or_create(&TaskLabels {
                    workflow: wf(),
                    node: metric_label(&node),
                    outcome: metric_label(&outcome),
                })
                .inc();
        }
        for (tool, status) in run.tools {
            self.tools
                .get_or_create(&ToolLabels {
                    tool: metric_label(&tool),
                    status: metric_label(&status),
                })
                .inc();
        }
        for (model, (n, first, last)) in run.tokens {
            let label = ModelLabel {
                model: metric_label(&model),
            };
            self.tokens.get_or_create(&label).inc_by(n);
            // One token has no span of its own: count it against the run's wall time.
            let span = if n > 1 {
                last.duration_since(first)
            } else {
                wall
            }
            .as_secs_f64();
            self.generation_secs.get_or_create(&label).inc_by(span);
            if span > 0.0 {
                self.tokens_per_sec
                    .get_or_create(&label)
                    .set(n as f64 / span);
            }
        }
    }

    /// Counts an HTTP response.
    pub(crate) fn record_http(&self, method: &str, status: u16) {
        self.http
            .get_or_create(&HttpLabels {
                method: metric_label(method),
                status: status.to_string(),
            })
            .inc();
    }

    /// The exposition text (without the final `# EOF`, so that the workflows' metrics can
    /// follow). `threads` counts thread records by status, `pending` the pending interrupts,
    /// `active` the runs in progress.
    pub(crate) fn render(
        &self,
        threads: &BTreeMap<String, u64>,
        pending: u64,
        active: usize,
    ) -> String {
        self.threads.clear();
        for (status, n) in threads {
            self.threads
                .get_or_create(&StatusLabel {
                    status: metric_label(status),
                })
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
        self.pending.set(i64::try_from(pending).unwrap_or(i64::MAX));
        self.active.set(i64::try_from(active).unwrap_or(i64::MAX));
        self.uptime.set(self.started.elapsed().as_secs_f64());
        let mut out = String::with_capacity(4096);
        if let Err(e) = encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "could not encode the metrics");
            return String::new();
        }
        match out.trim_end().strip_suffix("# EOF") {
            Some(body) => body.to_string(),
            None => out,
        }
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
            "ferrograph_node_duration_seconds_bucket{le=\"0.001\",workflow=\"wf\",node=\"a\"} 0",
            "ferrograph_node_duration_seconds_bucket{le=\"0.005\",workflow=\"wf\",node=\"a\"} 1",
            "ferrograph_node_duration_seconds_count{workflow=\"wf\",node=\"a\"} 1",
            "ferrograph_tool_executions_total{tool=\"t\\\"x\",status=\"error\"} 1",
            "ferrograph_tokens_generated_total{model=\"m\"} 1",
            "ferrograph_tokens_per_second{model=\"m\"} 100.0",
            "ferrograph_interrupts_pending 2",
            "ferrograph_threads{status=\"done\"} 1",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
    }
}
