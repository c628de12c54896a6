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
    /// Measured runs (after one warm-up).
    pub runs: usize,
    /// On a device other than the CPU: how its logits compare with the CPU's on the same
    /// tokens.
    pub agreement: Option<DeviceAgreement>,
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
    let rate = |n: usize, d: Duration| n as f64 / d.max(Duration::from_nanos(1)).as_secs_f64();
    for _ in 0..runs {
        let (p, t, d) = engine.bench_forward(&prompt, gen_tokens)?;
        prefill.push(rate(prompt.len(), p));
        ttft.push(t.as_secs_f64() * 1e3);
        decode_after.push(rate(gen_tokens, d));
        let (_, _, d) = engine.bench_forward(&prompt[..1], gen_tokens)?;
        decode.push(rate(gen_tokens, d));
    }
    let agreement = match device {
        DeviceKind::Cpu => None,
        _ => Some(agreement(&mut engine, path, &prompt)?),
    };
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
        decode_tok_s: median(decode),
        decode_after_prompt_tok_s: median(decode_after),
        peak_rss_mib: peak_rss_mib(),
        runs,
        agreement,
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

/// llama.cpp's figures on the same GGUF and thread count, from
/// `benches/peers/llama_cpp_bench.py` (llama-cpp-python).
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct PeerReport {
    /// `llama.cpp`.
    pub engine: String,
    /// llama-cpp-python's version.
    #[serde(default)]
    pub llama_cpp_python: String,
    /// Threads.
    pub threads: usize,
    /// Prompt length of the prefill measurement.
    pub prompt_tokens: usize,
    /// Load time.
    pub load_ms: f64,
    /// Time to first token.
    pub ttft_ms: f64,
    /// Prompt tokens per second.
    pub prefill_tok_s: f64,
    /// Generated tokens per second from a one-token context.
    pub decode_tok_s: f64,
    /// Generated tokens per second after the prompt.
    #[serde(default)]
    pub decode_after_prompt_tok_s: f64,
    /// Peak resident memory of the peer process, in MiB.
    pub peak_rss_mib: f64,
}

/// Smallest, median and largest of the per-round ratios ours / llama.cpp's.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Ratio {
    /// Smallest.
    pub min: f64,
    /// Median.
    pub median: f64,
    /// Largest.
    pub max: f64,
}

impl Ratio {
    fn of(pairs: impl Iterator<Item = (f64, f64)>) -> Ratio {
        let mut v: Vec<f64> = pairs
            .map(|(a, b)| if b > 0.0 { a / b } else { 0.0 })
            .collect();
        v.sort_by(f64::total_cmp);
        Ratio {
            min: v.first().copied().unwrap_or(0.0),
            median: v.get(v.len() / 2).copied().unwrap_or(0.0),
            max: v.last().copied().unwrap_or(0.0),
        }
    }
}

/// Ours and llama.cpp's figures on the same model and thread count, measured in alternating
/// rounds of one run, with per-round ratios (ours / theirs: above 1 is faster for speeds,
/// smaller for memory).
#[derive(Clone, Debug, Serialize)]
pub struct PeerComparison {
    /// Our reports, one per round.
    pub ours: Vec<BenchReport>,
    /// llama.cpp's reports, one per round.
    pub peer: Vec<PeerReport>,
    /// Prefill tok/s ratio.
    pub prefill_ratio: Ratio,
    /// Decode tok/s ratio (one-token context).
    pub decode_ratio: Ratio,
    /// Decode tok/s ratio after the prompt.
    pub decode_after_prompt_ratio: Ratio,
    /// Peak RSS ratio.
    pub rss_ratio: Ratio,
}

fn peer_command() -> (PathBuf, PathBuf) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = std::env::var_os("FERROGRAPH_PEER_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let local = PathBuf::from("benches/peers/.venv/bin/python");
            if local.exists() {
                local
            } else {
                root.join("benches/peers/.venv/bin/python")
            }
        });
    let script = std::env::var_os("FERROGRAPH_PEER_SCRIPT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let local = PathBuf::from("benches/peers/llama_cpp_bench.py");
            if local.exists() {
                local
            } else {
                root.join("benches/peers/llama_cpp_bench.py")
            }
        });
    (python, script)
}

/// Runs llama.cpp's side (`benches/peers/llama_cpp_bench.py` under
/// `benches/peers/.venv/bin/python`, or `FERROGRAPH_PEER_PYTHON` / `FERROGRAPH_PEER_SCRIPT`).
pub fn run_llama_cpp(
    path: &Path,
    threads: usize,
    prompt_tokens: usize,
    gen_tokens: usize,
) -> Result<PeerReport, LlmError> {
    let (python, script) = peer_command();
    let out = std::process::Command::new(&python)
        .arg(&script)
        .arg(path)
        .args(["--threads", &threads.to_string()])
        .args(["--prompt-tokens", &prompt_tokens.to_string()])
        .args(["--gen-tokens", &gen_tokens.to_string()])
        .arg("--json")
        .output()
        .map_err(|e| {
            LlmError::Backend(format!(
                "cannot run {} {} (set up with scripts/setup-peers.sh): {e}",
                python.display(),
                script.display()
            ))
        })?;
    if !out.status.success() {
        return Err(LlmError::Backend(format!(
            "llama.cpp peer failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or("");
    serde_json::from_str(line)
        .map_err(|e| LlmError::Backend(format!("unreadable llama.cpp peer output ({e}): {text}")))
}

/// `rounds` alternating rounds of [`bench_blocking`] and [`run_llama_cpp`] on the same model
/// and thread count, with the ratios. Runs on a blocking thread.
pub async fn compare_llama_cpp(
    path: &Path,
    threads: usize,
    prompt_tokens: usize,
    gen_tokens: usize,
    rounds: usize,
) -> Result<PeerComparison, LlmError> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let mut ours = Vec::new();
        let mut peer = Vec::new();
        for _ in 0..rounds.max(1) {
            ours.push(bench_blocking(
                &path,
                threads,
                prompt_tokens,
                gen_tokens,
                DeviceKind::Cpu,
            )?);
            peer.push(run_llama_cpp(&path, threads, prompt_tokens, gen_tokens)?);
        }
        let pairs = |f: &dyn Fn(&BenchReport, &PeerReport) -> (f64, f64)| {
            Ratio::of(ours.iter().zip(&peer).map(|(a, b)| f(a, b)))
        };
        Ok(PeerComparison {
            prefill_ratio: pairs(&|a, b| (a.prefill_tok_s, b.prefill_tok_s)),
            decode_ratio: pairs(&|a, b| (a.decode_tok_s, b.decode_tok_s)),
            decode_after_prompt_ratio: pairs(&|a, b| {
                (a.decode_after_prompt_tok_s, b.decode_after_prompt_tok_s)
            }),
            rss_ratio: pairs(&|a, b| (a.peak_rss_mib, b.peak_rss_mib)),
            ours,
            peer,
        })
    })
    .await
    .map_err(|e| LlmError::Backend(format!("bench task failed: {e}")))?
}

impl PeerComparison {
    /// A few lines for people.
    pub fn summary(&self) -> String {
        let r = |x: &Ratio| format!("{:.2}x ({:.2}-{:.2})", x.median, x.min, x.max);
        let mut s = String::new();
        for (i, (a, b)) in self.ours.iter().zip(&self.peer).enumerate() {
            s.push_str(&format!(
                "round {}: ours ({}) prefill {:.1} decode {:.1} (after prompt {:.1}) tok/s, RSS {:.0} MiB | llama.cpp prefill {:.1} decode {:.1} (after prompt {:.1}) tok/s, RSS {:.0} MiB\n",
                i + 1, a.kernels, a.prefill_tok_s, a.decode_tok_s, a.decode_after_prompt_tok_s, a.peak_rss_mib,
                b.prefill_tok_s, b.decode_tok_s, b.decode_after_prompt_tok_s, b.peak_rss_mib
            ));
        }
        if let Some(a) = self.ours.first() {
            s.push_str(&format!(
                "{} ({}), {} thread(s), prompt {} tokens: ours / llama.cpp: prefill {}, decode {}, decode after prompt {}, peak RSS {}",
                a.model, a.architecture, a.threads_effective, a.prompt_tokens,
                r(&self.prefill_ratio), r(&self.decode_ratio), r(&self.decode_after_prompt_ratio), r(&self.rss_ratio)
            ));
        }
        s
    }
}
