//! The workflow's Prometheus metrics, rendered by `ferrograph serve` at `/metrics` through
//! the `prometheus-client` crate (the Prometheus project's Rust client):
//! - `ticket_pr_runs_total{outcome}`: finished runs by outcome (`pr_opened`, `rejected`,
//!   `revision_limit`, `unknown_ticket`, `failed`);
//! - `ticket_pr_generations`: generations per finished run (1 to 3);
//! - `ticket_pr_review_wait_seconds`: from the gate opening to the reviewer's answer.

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::OnceLock;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    outcome: String,
}

struct Metrics {
    registry: Registry,
    runs: Family<Outcome, Counter>,
    generations: Histogram,
    review_wait: Histogram,
}

fn metrics() -> &'static Metrics {
    static M: OnceLock<Metrics> = OnceLock::new();
    M.get_or_init(|| {
        let mut registry = Registry::with_prefix("ticket_pr");
        let runs = Family::<Outcome, Counter>::default();
        registry.register("runs", "Finished runs by outcome", runs.clone());
        let generations = Histogram::new([1.0, 2.0, 3.0]);
        registry.register(
            "generations",
            "Generations of the change per finished run",
            generations.clone(),
        );
        let review_wait = Histogram::new([1.0, 10.0, 60.0, 300.0, 1800.0, 3600.0, 86400.0]);
        registry.register(
            "review_wait_seconds",
            "Time from the review gate opening to the reviewer's answer",
            review_wait.clone(),
        );
        Metrics {
            registry,
            runs,
            generations,
            review_wait,
        }
    })
}

/// Counts a finished run.
pub fn run_finished(outcome: &str, generations: u32) {
    let m = metrics();
    m.runs
        .get_or_create(&Outcome {
            outcome: outcome.replace(' ', "_"),
        })
        .inc();
    if generations > 0 {
        m.generations.observe(f64::from(generations));
    }
}

/// Records how long the gate waited for an answer.
pub fn review_answered(wait_seconds: f64) {
    metrics().review_wait.observe(wait_seconds.max(0.0));
}

/// The metrics in the Prometheus text format (without the final `# EOF`, so that they can
/// be concatenated with the other workflows').
pub fn render() -> String {
    let mut out = String::new();
    if encode(&mut out, &metrics().registry).is_err() {
        return String::new();
    }
    out.trim_end()
        .strip_suffix("# EOF")
        .unwrap_or(&out)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_and_waits_are_rendered() {
        run_finished("pr opened", 2);
        review_answered(3.0);
        let text = render();
        assert!(
            text.contains("ticket_pr_runs_total{outcome=\"pr_opened\"}"),
            "{text}"
        );
        assert!(text.contains("ticket_pr_generations_bucket"), "{text}");
        assert!(
            text.contains("ticket_pr_review_wait_seconds_count"),
            "{text}"
        );
        assert!(!text.contains("# EOF"));
    }
}
