//! The seed's Prometheus metrics, kept per process and rendered by `ferrograph serve` at
//! `/metrics`:
//! - `ops_agent_planner_decisions_total{selected_tool, used_fallback}` (counter);
//! - `ops_agent_tool_execution_latency_seconds{tool_name, status}` (histogram);
//! - `ops_agent_investigation_steps` (histogram, buckets 1..20);
//! - `ops_agent_investigation_completed_total{status, severity}` (counter).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Mutex, OnceLock};

const LATENCY_BUCKETS: [f64; 10] = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0];

#[derive(Clone, Default)]
struct Hist {
    counts: Vec<u64>,
    count: u64,
    sum: f64,
}

impl Hist {
    fn observe(&mut self, bounds: &[f64], v: f64) {
        if self.counts.len() != bounds.len() {
            self.counts = vec![0; bounds.len()];
        }
        for (i, b) in bounds.iter().enumerate() {
            if v <= *b {
                self.counts[i] += 1;
            }
        }
        self.count += 1;
        self.sum += v;
    }
}

#[derive(Default)]
struct Data {
    decisions: BTreeMap<(String, bool), u64>,
    latency: BTreeMap<(String, String), Hist>,
    steps: Hist,
    completed: BTreeMap<(String, String), u64>,
}

fn data() -> &'static Mutex<Data> {
    static DATA: OnceLock<Mutex<Data>> = OnceLock::new();
    DATA.get_or_init(|| Mutex::new(Data::default()))
}

fn with(f: impl FnOnce(&mut Data)) {
    if let Ok(mut d) = data().lock() {
        f(&mut d);
    }
}

fn step_buckets() -> Vec<f64> {
    (1..=20).map(f64::from).collect()
}

/// Counts a planner decision.
pub fn planner_decision(tool: &str, used_fallback: bool) {
    with(|d| {
        *d.decisions
            .entry((tool.to_string(), used_fallback))
            .or_default() += 1
    });
}

/// Observes a tool execution.
pub fn tool_latency(tool: &str, status: &str, secs: f64) {
    with(|d| {
        d.latency
            .entry((tool.to_string(), status.to_string()))
            .or_default()
            .observe(&LATENCY_BUCKETS, secs)
    });
}

/// Observes a finished investigation.
pub fn investigation_completed(status: &str, severity: &str, steps: u32) {
    with(|d| {
        *d.completed
            .entry((status.to_string(), severity.to_string()))
            .or_default() += 1;
        d.steps.observe(&step_buckets(), f64::from(steps));
    });
}

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The metrics in the Prometheus text format.
pub fn render() -> String {
    let mut o = String::new();
    let Ok(d) = data().lock() else {
        return o;
    };
    let _ = writeln!(o, "# HELP ops_agent_planner_decisions_total Planner decisions by selected tool and whether the deterministic fallback chose.\n# TYPE ops_agent_planner_decisions_total counter");
    for ((tool, fb), n) in &d.decisions {
        let _ = writeln!(
            o,
            "ops_agent_planner_decisions_total{{selected_tool=\"{}\",used_fallback=\"{fb}\"}} {n}",
            esc(tool)
        );
    }
    let _ = writeln!(o, "# HELP ops_agent_tool_execution_latency_seconds Tool execution latency by tool and status.\n# TYPE ops_agent_tool_execution_latency_seconds histogram");
    for ((tool, status), h) in &d.latency {
        let l = format!("tool_name=\"{}\",status=\"{}\"", esc(tool), esc(status));
        for (b, c) in LATENCY_BUCKETS.iter().zip(&h.counts) {
            let _ = writeln!(
                o,
                "ops_agent_tool_execution_latency_seconds_bucket{{{l},le=\"{b}\"}} {c}"
            );
        }
        let _ = writeln!(
            o,
            "ops_agent_tool_execution_latency_seconds_bucket{{{l},le=\"+Inf\"}} {}",
            h.count
        );
        let _ = writeln!(
            o,
            "ops_agent_tool_execution_latency_seconds_sum{{{l}}} {}",
            h.sum
        );
        let _ = writeln!(
            o,
            "ops_agent_tool_execution_latency_seconds_count{{{l}}} {}",
            h.count
        );
    }
    let _ = writeln!(o, "# HELP ops_agent_investigation_steps Planner steps per finished investigation.\n# TYPE ops_agent_investigation_steps histogram");
    let buckets = step_buckets();
    let counts = if d.steps.counts.is_empty() {
        vec![0; buckets.len()]
    } else {
        d.steps.counts.clone()
    };
    for (b, c) in buckets.iter().zip(&counts) {
        let _ = writeln!(o, "ops_agent_investigation_steps_bucket{{le=\"{b}\"}} {c}");
    }
    let _ = writeln!(
        o,
        "ops_agent_investigation_steps_bucket{{le=\"+Inf\"}} {}",
        d.steps.count
    );
    let _ = writeln!(o, "ops_agent_investigation_steps_sum {}", d.steps.sum);
    let _ = writeln!(o, "ops_agent_investigation_steps_count {}", d.steps.count);
    let _ = writeln!(o, "# HELP ops_agent_investigation_completed_total Finished investigations by status and severity.\n# TYPE ops_agent_investigation_completed_total counter");
    for ((status, sev), n) in &d.completed {
        let _ = writeln!(
            o,
            "ops_agent_investigation_completed_total{{status=\"{}\",severity=\"{}\"}} {n}",
            esc(status),
            esc(sev)
        );
    }
    o
}
