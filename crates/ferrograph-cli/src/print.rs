//! Readable printing of run events.

use ferrograph::core::stream::TaskOutcome;
use ferrograph::prelude::*;

/// Prints one event as a line.
pub fn event<S: State>(ev: &StreamEvent<S>) {
    let ns = |n: &str| {
        if n.is_empty() {
            String::new()
        } else {
            format!("[{n}] ")
        }
    };
    match ev {
        StreamEvent::TaskStart {
            namespace,
            step,
            node,
            attempt,
            ..
        } => {
            let retry = if *attempt > 1 {
                format!(" (attempt {attempt})")
            } else {
                String::new()
            };
            println!("  {}step {step:>2}  ▶ {node}{retry}", ns(namespace));
        }
        StreamEvent::TaskEnd {
            namespace,
            step,
            node,
            duration,
            outcome,
            ..
        } => {
            let what = match outcome {
                TaskOutcome::Ok => "✔".to_string(),
                TaskOutcome::Cached => "✔ (reused)".to_string(),
                TaskOutcome::Interrupted => "⏸ interrupted".to_string(),
                TaskOutcome::Error { error, will_retry } => {
                    format!(
                        "✘ {error}{}",
                        if *will_retry { " (will retry)" } else { "" }
                    )
                }
            };
            println!(
                "  {}step {step:>2}  {what} {node} in {:.2} ms",
                ns(namespace),
                duration.as_secs_f64() * 1e3
            );
        }
        StreamEvent::Custom {
            namespace,
            node,
            payload,
        } => println!("  {}{node}: {payload}", ns(namespace)),
        StreamEvent::Token { text, .. } => {
            print!("{text}");
        }
        StreamEvent::Interrupt { interrupts, .. } => {
            for i in interrupts {
                println!("  ⏸ interrupt {} at {}: {}", i.id, i.node, i.value);
            }
        }
        _ => {}
    }
}
