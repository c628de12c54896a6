//! The seed's Prometheus metrics, kept per process through the `prometheus-client` crate (the
//! Prometheus project's Rust client) and rendered by `ferrograph serve` at `/metrics`:
//! - `ops_agent_planner_decisions_total{selected_tool, used_fallback}` (counter);
//! - `ops_agent_tool_execution_latency_seconds{tool_name, status}` (histogram);
//! - `ops_agent_investigation_steps` (histogram, buckets 1..20);
//! - `ops_agent_investigation_completed_total{status, severity}` (counter).

use ferrograph::runtime::registry::metric_label;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::OnceLock;

const LATENCY_BUCKETS: [f64; 10] = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Decision {
    selected_tool: String,
    used_fallback: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolRun {
    tool_name: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Completed {
    status: String,
    severity: String,
}

type LatencyFamily = Family<ToolRun, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

struct Metrics {
    registry: Registry,
    decisions: Family<Decision, Counter>,
    latency: LatencyFamily,
    steps: Histogram,
    completed: Family<Completed, Counter>,
}

fn metrics() -> &'static Metrics {
    static M: OnceLock<Metrics> = OnceLock::new();
    M.get_or_init(|| {
        let mut registry = Registry::with_prefix("ops_agent");
        let decisions = Family::<Decision, Counter>::default();
        registry.register(
            "planner_decisions",
            "Planner decisions by selected tool and whether the deterministic fallback chose",
            decisions.clone(),
        );
        let latency: LatencyFamily = Family::new_with_constructor(latency_histogram);
        registry.register(
            "tool_execution_latency_seconds",
            "Tool execution latency by tool and status",
            latency.clone(),
        );
        let steps = Histogram::new((1..=20).map(f64::from));
        registry.register(
            "investigation_steps",
            "Planner steps per finished investigation",
            steps.clone(),
        );
        let completed = Family::<Completed, Counter>::default();
        registry.register(
            "investigation_completed",
            "Finished investigations by status and severity",
            completed.clone(),
        );
        Metrics {
            registry,
            decisions,
            latency,
            steps,
            completed,
        }
    })
}

/// Counts a planner decision.
pub fn planner_decision(tool: &str, used_fallback: bool) {
    metrics()
        .decisions
        .get_or_create(&Decision {
            selected_tool: metric_label(tool),
            used_fallback: used_fallback.to_string(),
        })
        .inc();
}

/// Observes a tool execution.
pub fn tool_latency(tool: &str, status: &str, secs: f64) {
    metrics()
        .latency
        .get_or_create(&ToolRun {
            tool_name: metric_label(tool),
            status: metric_label(status),
        })
        .observe(secs.max(0.0));
}

/// Observes a finished investigation.
pub fn investigation_completed(status: &str, severity: &str, steps: u32) {
    let m = metrics();
    m.completed
        .get_or_create(&Completed {
            status: metric_label(status),
            severity: metric_label(severity),
        })
        .inc();
    m.steps.observe(f64::from(steps));
}

/// The metrics in the text exposition format (without the final `# EOF`, so that they can be
/// concatenated with the server's and the other workflows').
pub fn render() -> String {
    let mut out = String::new();
    if encode(&mut out, &metrics().registry).is_err() {
        return String::new();
    }
    match out.trim_end().strip_suffix("# EOF") {
        Some(body) => body.to_string(),
        None => out,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_latencies_and_steps_are_rendered() {
        planner_decision("context_tool", true);
        tool_latency("context_tool", "success", 0.002);
        investigation_completed("COMPLETED", "HIGH", 4);
        let text = render();
        for needle in [
            "ops_agent_planner_decisions_total{selected_tool=\"context_tool\",used_fallback=\"true\"} 1",
            "ops_agent_tool_execution_latency_seconds_bucket{le=\"0.005\",tool_name=\"context_tool\",status=\"success\"} 1",
            "ops_agent_investigation_steps_count 1",
            "ops_agent_investigation_completed_total{status=\"COMPLETED\",severity=\"HIGH\"} 1",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
        assert!(!text.contains("# EOF"));
    }
}
