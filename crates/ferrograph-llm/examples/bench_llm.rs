//! Runs `bench_llm` on a GGUF: `cargo run --release -p ferrograph-llm --example bench_llm --
//! [MODEL.gguf] [THREADS] [PROMPT_TOKENS] [GEN_TOKENS] [--json]`. Build with
//! `RUSTFLAGS="-C target-cpu=native"` for representative numbers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let json = args.iter().any(|a| a == "--json");
    let pos: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let path = match pos.first() {
        Some(p) => PathBuf::from(p),
        None => ferrograph_llm::manifest::default_chat_model_path()?,
    };
    let num = |i: usize, d: usize| pos.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let report = ferrograph_llm::bench_llm(&path, num(1, 2), num(2, 128), num(3, 64)).await?;
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!("{}", report.summary());
    }
    Ok(())
}
