//! `bench_llm`: load time, time to first token, prefill and decode speed and peak memory of a
//! GGUF model on this machine (what `ferrograph bench llm` prints).

use crate::engine::Engine;
use crate::error::LlmError;
use crate::options::LoadOptions;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Measured figures of one model at one thread count.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    /// Model name (file stem).
    pub model: String,
    /// The GGUF file.
    pub path: PathBuf,
    /// `general.architecture`.
    pub architecture: String,
    /// Threads asked for.
    pub threads: usize,
    /// Threads candle's worker pool actually uses (fixed by the first inference in a process).
    pub threads_effective: usize,
    /// Prompt length of the prefill measurement.
    pub prompt_tokens: usize,
    /// Tokens decoded in the decode measurement.
    pub gen_tokens: usize,
    /// Time to load the model (read, dequantize what needs it, build the tokenizer).
    pub load_ms: f64,
    /// Time from the start of a call to the first token (prefill plus one sampling), median.
    pub ttft_ms: f64,
    /// Prompt tokens per second, median of the runs.
    pub prefill_tok_s: f64,
    /// Generated tokens per second from a one-token context (what llama-bench's `tg` measures),
    /// median of the runs.
    pub decode_tok_s: f64,
    /// Generated tokens per second right after the `prompt_tokens` prompt (attention over a
    /// longer cache), median of the runs.
    pub decode_after_prompt_tok_s: f64,
    /// Peak resident memory of the process (`VmHWM`), in MiB.
    pub peak_rss_mib: f64,
    /// Measured runs (after one warm-up).
    pub runs: usize,
}

static STARTED: AtomicBool = AtomicBool::new(false);

/// Sets the number of threads candle's CPU kernels use. Candle fixes its worker pool at the
/// first quantized matmul of the process, so this only takes effect before any inference;
/// returns the count in effect.
pub fn set_threads(threads: usize) -> usize {
    if !STARTED.load(Ordering::SeqCst) && threads > 0 {
        std::env::set_var("CANDLE_NUM_THREADS", threads.to_string());
        std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
    }
    candle_core::utils::get_num_threads()
}

/// Peak resident set size of this process in MiB (`VmHWM` in `/proc/self/status`; 0 where
/// that does not exist).
pub fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Benchmarks the GGUF at `path` with `threads` threads: a fresh load, then one warm-up and
/// three measured runs of prefilling `prompt_tokens` tokens and greedily decoding
/// `gen_tokens` more (end-of-sequence ignored), plus decoding `gen_tokens` from a one-token
/// context (llama-bench's `tg`). Runs on a blocking thread.
pub async fn bench_llm(
    path: &Path,
    threads: usize,
    prompt_tokens: usize,
    gen_tokens: usize,
) -> Result<BenchReport, LlmError> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || bench_blocking(&path, threads, prompt_tokens, gen_tokens))
        .await
        .map_err(|e| LlmError::Backend(format!("bench task failed: {e}")))?
}

/// The synchronous body of [`bench_llm`].
pub fn bench_blocking(
    path: &Path,
    threads: usize,
    prompt_tokens: usize,
    gen_tokens: usize,
) -> Result<BenchReport, LlmError> {
    let threads_effective = set_threads(threads);
    STARTED.store(true, Ordering::SeqCst);
    let load_start = Instant::now();
    let mut engine = Engine::load(path, &LoadOptions::default())?;
    let load = load_start.elapsed();
    let shared = engine.shared();
    let needed = prompt_tokens.max(1) + gen_tokens + 1;
    if needed > shared.info.context_length {
        return Err(LlmError::Validation(format!(
            "{needed} tokens do not fit the model's context of {}",
            shared.info.context_length
        )));
    }
    let text = "The quick brown fox jumps over the lazy dog while the orchestra tunes its \
                instruments and the city wakes up to another ordinary, remarkable day. ";
    let unit = shared.encode(text)?;
    if unit.is_empty() {
        return Err(LlmError::Tokenizer("bench text encodes to nothing".into()));
    }
    let prompt: Vec<u32> = unit
        .iter()
        .copied()
        .cycle()
        .take(prompt_tokens.max(1))
        .collect();
    engine.bench_forward(&prompt[..prompt.len().min(8)], 4)?;
    let (mut prefill, mut ttft, mut decode, mut decode_after) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let runs = 3;
    let rate = |n: usize, d: Duration| n as f64 / d.max(Duration::from_nanos(1)).as_secs_f64();
    for _ in 0..runs {
        let (p, t, d) = engine.bench_forward(&prompt, gen_tokens)?;
        prefill.push(rate(prompt.len(), p));
        ttft.push(t.as_secs_f64() * 1e3);
        decode_after.push(rate(gen_tokens, d));
        let (_, _, d) = engine.bench_forward(&prompt[..1], gen_tokens)?;
        decode.push(rate(gen_tokens, d));
    }
    Ok(BenchReport {
        model: shared.info.name.clone(),
        path: path.to_path_buf(),
        architecture: shared.info.architecture.clone(),
        threads,
        threads_effective,
        prompt_tokens: prompt.len(),
        gen_tokens,
        load_ms: load.as_secs_f64() * 1e3,
        ttft_ms: median(ttft),
        prefill_tok_s: median(prefill),
        decode_tok_s: median(decode),
        decode_after_prompt_tok_s: median(decode_after),
        peak_rss_mib: peak_rss_mib(),
        runs,
    })
}

impl BenchReport {
    /// One line for people.
    pub fn summary(&self) -> String {
        format!(
            "{} ({}), {} thread(s): load {:.0} ms, ttft {:.1} ms, prefill {:.1} tok/s ({} tokens), decode {:.1} tok/s ({} tokens; {:.1} after the prompt), peak RSS {:.0} MiB",
            self.model,
            self.architecture,
            self.threads_effective,
            self.load_ms,
            self.ttft_ms,
            self.prefill_tok_s,
            self.prompt_tokens,
            self.decode_tok_s,
            self.gen_tokens,
            self.decode_after_prompt_tok_s,
            self.peak_rss_mib
        )
    }
}
