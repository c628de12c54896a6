//! One chat turn with a long prompt read from a file, greedy, the answer printed as it
//! streams: `cargo run --release -p ferrograph-llm --example prompt_file -- MODEL.gguf
//! PROMPT.txt [MAX_TOKENS] [SYSTEM.txt]` (turns in PROMPT.txt separated by `=== assistant ===` and
//! `=== user ===` lines). For checking what a model does with a long task
//! (the context is 16,384 tokens; `FERROGRAPH_KERNELS=candle` runs candle's reference path).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use ferrograph_core::message::Message;
use ferrograph_llm::{ChatModel, GenerateOptions, LoadOptions, LocalChatModel, TokenSink};
use std::io::Write;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, prompt, rest @ ..] = args.as_slice() else {
        return Err("usage: prompt_file MODEL.gguf PROMPT.txt [MAX_TOKENS] [SYSTEM.txt]".into());
    };
    let max: usize = rest.first().map_or(Ok(200), |n| n.parse())?;
    let mut messages = Vec::new();
    if let Some(system) = rest.get(1) {
        messages.push(Message::system(std::fs::read_to_string(system)?));
    }
    // Turns separated by `=== assistant ===` and `=== user ===` lines (a few-shot exchange
    // before the task); a file without them is one user turn.
    let text = std::fs::read_to_string(prompt)?;
    let mut human = true;
    let mut turn = String::new();
    for line in text.lines() {
        match line.trim() {
            // A dump's recorded answer (FERROGRAPH_TICKET_PROMPTS) is not part of the prompt.
            "=== answer ===" => break,
            "=== assistant ===" | "=== user ===" => {
                if !turn.trim().is_empty() {
                    messages.push(if human {
                        Message::human(turn.trim_end())
                    } else {
                        Message::ai(turn.trim_end())
                    });
                }
                human = line.trim() == "=== user ===";
                turn.clear();
            }
            _ => {
                turn.push_str(line);
                turn.push('\n');
            }
        }
    }
    if !turn.trim().is_empty() {
        messages.push(Message::human(turn.trim_end()));
    }
    let model = LocalChatModel::with_options(
        model,
        LoadOptions {
            max_context: 16384,
            ..LoadOptions::default()
        },
    );
    let sink = TokenSink::callback(|_, piece| {
        print!("{piece}");
        let _ = std::io::stdout().flush();
    });
    let start = std::time::Instant::now();
    let answer = model
        .invoke(
            &messages,
            &GenerateOptions::greedy().max_tokens(max).max_context(16384),
            Some(sink),
        )
        .await?;
    println!(
        "\n-- {:?}, finish {:?}, {:.2} s",
        answer.usage,
        answer.finish_reason,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
