//! `bench_llm`: load time, time to first token, prefill and decode speed and peak memory of a
//! GGUF model on this machine (what `ferrograph bench llm` prints).

use ferrograph_llm::sampling::argmax;
use ferrograph_llm::DeviceKind;
use ferrograph_llm::Engine;
use ferrograph_llm::LlmError;
use ferrograph_llm::LoadOptions;
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
    /// Threads the worker pool actually uses (fixed by the first inference in a process).
    pub threads_effective: usize,
    /// The device the model ran on (`cpu`, `cuda`, `metal`).
    pub device: String,
    /// Which forward pass ran: `fast` (our kernels) or `candle`.
    pub kernels: String,
    /// Instruction set of our kernels (`avx2` or `scalar`).
    pub isa: String,
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
    /// What one decode step reads and how close that comes to this machine's memory
    /// (our kernels only).
    pub memory_roof: Option<MemoryRoof>,
    /// Measured runs (after one warm-up).
    pub runs: usize,
    /// Aggregate decode speed with several sequences decoded together (continuous
    /// batching), per number of sequences.
    pub concurrency: Vec<ConcurrencyLevel>,
    /// Time to the first token of a request that joins a busy batch, against an idle model.
    pub newcomer: Option<NewcomerReport>,
    /// On a device other than the CPU: how its logits compare with the CPU's on the same
    /// tokens.
    pub agreement: Option<DeviceAgreement>,
}

/// Decode against the speed at which this machine reads memory: a decode step reads every
/// weight once, so `weight_mib_per_token` times the decode rate can approach, but not pass,
/// the rate at which the same threads stream a buffer of that size.
#[derive(Clone, Debug, Serialize)]
pub struct MemoryRoof {
    /// Weight bytes one decode step reads, in MiB.
    pub weight_mib_per_token: f64,
    /// Those bytes times the decode rate (from a one-token context), in GB/s.
    pub decode_gb_s: f64,
    /// The best of five passes of the same threads summing a buffer as large as the weights
    /// (so that a model that fits the CPU's caches is compared with a buffer that does too),
    /// in GB/s.
    pub stream_read_gb_s: f64,
}

/// Decode speed with `sequences` sequences decoded together.
#[derive(Clone, Debug, Serialize)]
pub struct ConcurrencyLevel {
    /// Sequences in the batch.
    pub sequences: usize,
    /// Generated tokens per second, all sequences together, median of the runs.
    pub decode_tok_s: f64,
    /// `decode_tok_s` over the one-sequence figure of the same run.
    pub speedup: f64,
}

/// Time to the first token of a `prompt_tokens` request sent to the model actor.
#[derive(Clone, Debug, Serialize)]
pub struct NewcomerReport {
    /// Prompt length of the newcomer.
    pub prompt_tokens: usize,
    /// With nothing else running, median.
    pub idle_ms: f64,
    /// While `busy_sequences` others are decoding (it joins their batch), median.
    pub busy_ms: f64,
    /// How many requests were decoding when it arrived.
    pub busy_sequences: usize,
}

/// Logits of the same prompt and continuation on a device and on the CPU (teacher forced,
/// one row per position).
#[derive(Clone, Debug, Serialize)]
pub struct DeviceAgreement {
    /// Positions compared.
    pub positions: usize,
    /// Positions whose most likely token is the same on both.
    pub top1_same: usize,
    /// Largest absolute difference of one logit.
    pub max_abs_diff: f32,
    /// Smallest cosine similarity of two rows.
    pub min_cosine: f32,
}

/// Compares the logits of `engine` (on a device) with a CPU engine's on the same tokens.
fn agreement(
    engine: &mut Engine,
    path: &Path,
    prompt: &[u32],
) -> Result<DeviceAgreement, LlmError> {
    let split = prompt.len().clamp(2, 96) - 1;
    let end = prompt.len().min(split + 32);
    let (head, tail) = (&prompt[..split], &prompt[split..end]);
    let on_device = engine.teacher_forced_logits(head, tail)?;
    let mut cpu = Engine::load(path, &LoadOptions::default())?;
    let on_cpu = cpu.teacher_forced_logits(head, tail)?;
    let mut report = DeviceAgreement {
        positions: on_device.len(),
        top1_same: 0,
        max_abs_diff: 0.0,
        min_cosine: 1.0,
    };
    for (a, b) in on_device.iter().zip(&on_cpu) {
        if argmax(a) == argmax(b) {
            report.top1_same += 1;
        }
        let (mut dot, mut na, mut nb) = (0f64, 0f64, 0f64);
        for (&x, &y) in a.iter().zip(b) {
            report.max_abs_diff = report.max_abs_diff.max((x - y).abs());
            dot += f64::from(x) * f64::from(y);
            na += f64::from(x) * f64::from(x);
            nb += f64::from(y) * f64::from(y);
        }
        let cosine = (dot / (na.sqrt() * nb.sqrt()).max(f64::MIN_POSITIVE)) as f32;
        report.min_cosine = report.min_cosine.min(cosine);
    }
    Ok(report)
}

static STARTED: AtomicBool = AtomicBool::new(false);

/// Sets the number of threads the CPU kernels use (ours and candle's). Both fix their worker
/// pools at the first inference of the process, so this only takes effect before any;
/// returns the count in effect.
pub fn set_threads(threads: usize) -> usize {
    if !STARTED.load(Ordering::SeqCst) && threads > 0 {
        std::env::set_var("CANDLE_NUM_THREADS", threads.to_string());
        std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
    }
    let ours = ferrograph_kernels::pool::set_threads(threads);
    if ferrograph_kernels::decoder::Kernels::Auto.resolve()
        == ferrograph_kernels::decoder::Kernels::Candle
    {
        candle_core::utils::get_num_threads()
    } else {
        ours
    }
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

/// The median of `v` (0 when empty).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
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
    device: DeviceKind,
) -> Result<BenchReport, LlmError> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        bench_blocking(&path, threads, prompt_tokens, gen_tokens, device)
    })
    .await
    .map_err(|e| LlmError::Backend(format!("bench task failed: {e}")))?
}

/// The synchronous body of [`bench_llm`].
pub fn bench_blocking(
    path: &Path,
    threads: usize,
    prompt_tokens: usize,
    gen_tokens: usize,
    device: DeviceKind,
) -> Result<BenchReport, LlmError> {
    let threads_effective = set_threads(threads);
    STARTED.store(true, Ordering::SeqCst);
    let load_start = Instant::now();
    let options = LoadOptions {
        device,
        // Room for the longest prompt asked for plus the decoded tokens.
        max_context: (prompt_tokens + gen_tokens + 64).max(LoadOptions::default().max_context),
        ..LoadOptions::default()
    };
    let mut engine = Engine::load(path, &options)?;
    let load = load_start.elapsed();
    let shared = engine.shared();
    let kernels = engine.kernels_name();
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
    for _ in 0..runs {
        let (p, t, d) = engine.bench_forward(&prompt, gen_tokens)?;
        prefill.push(tok_per_s(prompt.len(), p));
        ttft.push(t.as_secs_f64() * 1e3);
        decode_after.push(tok_per_s(gen_tokens, d));
        let (_, _, d) = engine.bench_forward(&prompt[..1], gen_tokens)?;
        decode.push(tok_per_s(gen_tokens, d));
    }
    let concurrency = concurrency(&mut engine, &unit, gen_tokens)?;
    let agreement = match device {
        DeviceKind::Cpu => None,
        _ => Some(agreement(&mut engine, path, &prompt)?),
    };
    let weight_bytes = engine.weight_bytes_per_token();
    let newcomer = if engine.batches() {
        Some(newcomer(engine, &prompt)?)
    } else {
        None
    };
    // Taken before the read probe, whose buffer is as large as the weights.
    let peak_rss_mib = peak_rss_mib();
    let decode_tok_s = median(decode);
    let memory_roof = weight_bytes.map(|bytes| MemoryRoof {
        weight_mib_per_token: bytes as f64 / (1 << 20) as f64,
        decode_gb_s: bytes as f64 * decode_tok_s / 1e9,
        stream_read_gb_s: ferrograph_kernels::pool::global().stream_read_gb_s(bytes),
    });
    Ok(BenchReport {
        model: shared.info.name.clone(),
        path: path.to_path_buf(),
        architecture: shared.info.architecture.clone(),
        threads,
        threads_effective,
        device: format!("{device:?}").to_lowercase(),
        kernels: kernels.to_string(),
        isa: format!("{:?}", ferrograph_kernels::detected_isa()).to_lowercase(),
        prompt_tokens: prompt.len(),
        gen_tokens,
        load_ms: load.as_secs_f64() * 1e3,
        ttft_ms: median(ttft),
        prefill_tok_s: median(prefill),
        decode_tok_s,
        decode_after_prompt_tok_s: median(decode_after),
        peak_rss_mib,
        memory_roof,
        runs,
        concurrency,
        newcomer,
        agreement,
    })
}

/// Sequence counts of the concurrency measurement.
pub const CONCURRENCY: [usize; 4] = [1, 2, 4, 8];

/// Aggregate decode speed at each of [`CONCURRENCY`] ([`batch_decode_tok_s`]), median of
/// three runs ([`interleaved_levels`]).
fn concurrency(
    engine: &mut Engine,
    unit: &[u32],
    gen_tokens: usize,
) -> Result<Vec<ConcurrencyLevel>, LlmError> {
    let mut out: Vec<ConcurrencyLevel> = Vec::new();
    for (k, decode_tok_s) in interleaved_levels(engine, unit, gen_tokens, 3)? {
        let one = out.first().map_or(decode_tok_s, |l| l.decode_tok_s);
        out.push(ConcurrencyLevel {
            sequences: k,
            decode_tok_s,
            speedup: decode_tok_s / one.max(f64::MIN_POSITIVE),
        });
    }
    Ok(out)
}

/// Each of [`CONCURRENCY`]'s aggregate decode speed, the median of `passes` runs taken in
/// passes over all the levels (1, 2, 4, 8, then 1, 2, 4, 8 again...) rather than level by
/// level: on a shared machine whose speed drifts over seconds, a slow stretch then falls on
/// every level alike instead of on one, and the ratios between levels (what the
/// concurrency figures are read for) stay put.
pub fn interleaved_levels(
    engine: &mut Engine,
    unit: &[u32],
    gen_tokens: usize,
    passes: usize,
) -> Result<Vec<(usize, f64)>, LlmError> {
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); CONCURRENCY.len()];
    for _ in 0..passes.max(1) {
        for (k, r) in CONCURRENCY.iter().zip(rates.iter_mut()) {
            r.push(batch_decode_tok_s(engine, unit, *k, gen_tokens)?);
        }
    }
    Ok(CONCURRENCY
        .iter()
        .zip(rates)
        .map(|(k, r)| (*k, median(r)))
        .collect())
}

/// Prompt length of each sequence in the concurrency measurements.
pub const CONCURRENT_PROMPT: usize = 32;

/// Tokens per second: `n` tokens in `d`.
pub fn tok_per_s(n: usize, d: Duration) -> f64 {
    n as f64 / d.max(Duration::from_nanos(1)).as_secs_f64()
}

/// Aggregate decode tok/s of `k` different [`CONCURRENT_PROMPT`]-token prompts (`unit`
/// repeated, each starting three tokens further into it) prefilled together, then decoded
/// `gen` tokens each in batched steps ([`Engine::bench_batch`]); one run.
pub fn batch_decode_tok_s(
    engine: &mut Engine,
    unit: &[u32],
    k: usize,
    gen: usize,
) -> Result<f64, LlmError> {
    let (_, d) = engine.bench_batch(&concurrent_prompts(unit, k), gen)?;
    Ok(tok_per_s(k * gen, d))
}

/// The `k` prompts of [`batch_decode_tok_s`] (also what the peer is sent).
pub fn concurrent_prompts(unit: &[u32], k: usize) -> Vec<Vec<u32>> {
    (0..k)
        .map(|i| {
            unit.iter()
                .copied()
                .cycle()
                .skip(i * 3)
                .take(CONCURRENT_PROMPT)
                .collect()
        })
        .collect()
}

/// Requests decoding when the newcomer arrives.
const BUSY: usize = 3;

/// Time to the first token of a request for `prompt` sent to the model actor (the engine
/// moves into one), idle and while [`BUSY`] long requests decode; three of each, median.
fn newcomer(engine: Engine, prompt: &[u32]) -> Result<NewcomerReport, LlmError> {
    use ferrograph_llm::{GenerateOptions, ModelHandle, PromptInput};
    let rt = tokio::runtime::Handle::current();
    // Room for the newcomer's prompt (the default request context is 2,048 tokens).
    let context = (prompt.len() + 64).max(GenerateOptions::default().max_context);
    let handle = ModelHandle::from_engine(engine, 64, 8);
    let ask = |tokens: Vec<u32>, max: usize, user: String| {
        let h = handle.clone();
        async move {
            let options = GenerateOptions {
                user: Some(user),
                ..GenerateOptions::greedy()
                    .max_tokens(max)
                    .max_context(context)
            };
            let t = Instant::now();
            h.generate(PromptInput::Tokens(tokens), options, None)
                .await
                .map(|_| t.elapsed())
        }
    };
    // A different first token each time, so that no cached prefix serves the prompt.
    let fresh = |i: usize| {
        let mut p = prompt.to_vec();
        p[0] = 1000 + i as u32;
        p
    };
    let (mut idle, mut busy) = (Vec::new(), Vec::new());
    for i in 0..3 {
        idle.push(
            rt.block_on(ask(fresh(i), 1, "newcomer".into()))?
                .as_secs_f64()
                * 1e3,
        );
    }
    for i in 0..3 {
        let busy_prompt: Vec<u32> = prompt.iter().copied().take(16).collect();
        let others: Vec<_> = (0..BUSY)
            .map(|b| {
                let mut p = busy_prompt.clone();
                p[0] = 2000 + (i * BUSY + b) as u32;
                rt.spawn(ask(p, 100_000, format!("busy-{b}")))
            })
            .collect();
        // Wait until they are all decoding.
        let start = handle.batch_stats();
        let deadline = Instant::now() + Duration::from_secs(30);
        while handle.batch_stats().steps < start.steps + 8 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        busy.push(
            rt.block_on(ask(fresh(10 + i), 1, "newcomer".into()))?
                .as_secs_f64()
                * 1e3,
        );
        for o in others {
            o.abort();
        }
        // Let the actor notice the cancellations before the next round.
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(NewcomerReport {
        prompt_tokens: prompt.len(),
        idle_ms: median(idle),
        busy_ms: median(busy),
        busy_sequences: BUSY,
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
