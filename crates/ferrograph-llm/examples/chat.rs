//! One chat turn with a local GGUF, tokens printed as they stream:
//! `cargo run --release -p ferrograph-llm --example chat -- [MODEL.gguf] "question" [MAX_TOKENS]`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use ferrograph_core::message::Message;
use ferrograph_llm::{ChatModel, GenerateOptions, LocalChatModel, TokenSink};
use std::io::Write;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (model, question, max) = match args.as_slice() {
        [q] => (LocalChatModel::from_env()?, q.clone(), 64),
        [m, q] => (LocalChatModel::new(m), q.clone(), 64),
        [m, q, n, ..] => (LocalChatModel::new(m), q.clone(), n.parse()?),
        [] => (LocalChatModel::from_env()?, "Say hello.".to_string(), 64),
    };
    let sink = TokenSink::callback(|_, piece| {
        print!("{piece}");
        let _ = std::io::stdout().flush();
    });
    let start = std::time::Instant::now();
    let answer = model
        .invoke(
            &[Message::human(question)],
            &GenerateOptions::greedy().max_tokens(max),
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
