//! `ferrograph bench llm --peer llama-cpp`: our engine and llama.cpp's own tools side by side,
//! in alternating rounds of one run, on the same GGUF and thread count, at the shapes agent
//! workloads have:
//!
//! - prefill at [`PREFILL`] prompt tokens, and decode at [`DEPTHS`] tokens of context, against
//!   `llama-bench` (`pp` and `tg` at `-d` depth; its own repetitions and warm-up);
//! - aggregate decode with [`CONCURRENCY`] sequences at once (ours: one batched pass per
//!   step; three passes over the levels per round, medians), against `llama-server
//!   --parallel N` sent the same number of requests at once (greedy, end-of-sequence
//!   ignored, prompt cache off);
//! - peak resident memory: ours is this process's high-water mark after all of the above;
//!   llama.cpp's that of `llama-bench` over the same prefill and decode shapes.
//!
//! Both binaries come from `scripts/setup-llama-cpp.sh` (llama.cpp as vendored in the
//! llama-cpp-python sdist), found in `.peers/llama.cpp/bin` or through
//! `FERROGRAPH_LLAMA_CPP_BIN`.

use crate::llm::{
    concurrent_prompts, interleaved_levels, median, peak_rss_mib, set_threads, tok_per_s,
    CONCURRENCY, CONCURRENT_PROMPT,
};
use ferrograph_llm::{Engine, LlmError, LoadOptions};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Prompt lengths of the prefill measurement.
pub const PREFILL: [usize; 4] = [128, 512, 2048, 4096];
/// Context lengths (depths) of the decode measurement.
pub const DEPTHS: [usize; 3] = [0, 512, 2048];

/// tok/s at one shape.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Point {
    /// Prompt tokens (prefill), context tokens (decode) or sequences (concurrency).
    pub at: usize,
    /// Tokens per second (all sequences together for concurrency).
    pub tok_s: f64,
}

/// One engine's figures in one round.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Figures {
    /// Prefill tok/s per prompt length.
    pub prefill: Vec<Point>,
    /// Decode tok/s per depth.
    pub decode: Vec<Point>,
    /// Aggregate decode tok/s per number of concurrent sequences.
    pub concurrent: Vec<Point>,
    /// Peak resident memory, MiB.
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
            median: median(v.clone()),
            max: v.last().copied().unwrap_or(0.0),
        }
    }
}

/// One shape, both engines.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// `prefill`, `decode` or `concurrent`.
    pub shape: &'static str,
    /// See [`Point::at`].
    pub at: usize,
    /// Our median tok/s over the rounds.
    pub ours: f64,
    /// llama.cpp's median tok/s over the rounds.
    pub llama_cpp: f64,
    /// Per-round ratios ours / llama.cpp.
    pub ratio: Ratio,
}

/// The whole comparison.
#[derive(Clone, Debug, Serialize)]
pub struct ShapeComparison {
    /// Model name (file stem).
    pub model: String,
    /// `general.architecture`.
    pub architecture: String,
    /// Threads of both engines.
    pub threads: usize,
    /// Tokens generated per decode measurement.
    pub gen_tokens: usize,
    /// llama.cpp's build (`llama-bench`'s `build_commit`).
    pub llama_cpp_build: String,
    /// Our figures, per round.
    pub ours: Vec<Figures>,
    /// llama.cpp's figures, per round.
    pub llama_cpp: Vec<Figures>,
    /// Every shape with both medians and the ratios.
    pub rows: Vec<Row>,
    /// Peak RSS ours / llama.cpp's (below 1 is smaller).
    pub rss_ratio: Ratio,
}

/// Where the llama.cpp binaries are.
fn bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("FERROGRAPH_LLAMA_CPP_BIN") {
        return PathBuf::from(d);
    }
    let local = PathBuf::from(".peers/llama.cpp/bin");
    if local.exists() {
        return local;
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../.peers/llama.cpp/bin")
}

fn tool(name: &str) -> Result<PathBuf, LlmError> {
    let p = bin_dir().join(name);
    if p.is_file() {
        Ok(p)
    } else {
        Err(LlmError::Validation(format!(
            "{} not found: build llama.cpp's tools with scripts/setup-llama-cpp.sh (or set FERROGRAPH_LLAMA_CPP_BIN)",
            p.display()
        )))
    }
}

/// Our figures for one round.
fn ours_round(engine: &mut Engine, unit: &[u32], gen: usize) -> Result<Figures, LlmError> {
    let take = |n: usize| -> Vec<u32> { unit.iter().copied().cycle().take(n.max(1)).collect() };
    let mut f = Figures::default();
    // One untimed pass first, as llama-bench runs a warm-up: the round starts right after
    // llama.cpp's, with our weights out of the caches (the prefix cache is cleared before
    // every pass, so nothing of it is reused).
    engine.bench_forward(&take(PREFILL[0]), 0)?;
    for n in PREFILL {
        let (p, _, _) = engine.bench_forward(&take(n), 0)?;
        f.prefill.push(Point {
            at: n,
            tok_s: tok_per_s(n, p),
        });
    }
    for depth in DEPTHS {
        let (_, _, d) = engine.bench_forward(&take(depth), gen)?;
        f.decode.push(Point {
            at: depth,
            tok_s: tok_per_s(gen, d),
        });
    }
    // Three passes over the levels, medians (see `interleaved_levels`).
    for (k, tok_s) in interleaved_levels(engine, unit, gen, 3)? {
        f.concurrent.push(Point { at: k, tok_s });
    }
    f.peak_rss_mib = peak_rss_mib();
    Ok(f)
}

/// Runs `llama-bench` with `args`: its JSON rows and its peak RSS in MiB.
fn llama_bench(
    model: &Path,
    threads: usize,
    args: &[String],
) -> Result<(Vec<serde_json::Value>, f64), LlmError> {
    let bin = tool("llama-bench")?;
    let mut cmd = Command::new(&bin);
    cmd.arg("-m")
        .arg(model)
        .args(["-t", &threads.to_string(), "-r", "2", "-o", "json"])
        .args(args);
    let (out, rss) = run_watching_rss(cmd)?;
    if !out.status.success() {
        return Err(LlmError::Backend(format!(
            "llama-bench failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let rows = serde_json::from_slice(&out.stdout).map_err(|e| {
        LlmError::Backend(format!(
            "unreadable llama-bench output ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        ))
    })?;
    Ok((rows, rss))
}

/// The high-water RSS (`VmHWM`) of process `pid`, MiB.
fn vm_hwm_mib(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = s
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse::<f64>()
        .ok()?;
    Some(kb / 1024.0)
}

/// Runs `cmd` to its end, reading its high-water RSS every 20 ms while it runs (a child's
/// `getrusage` figure would include this process's RSS at the fork, so it cannot be used).
fn run_watching_rss(mut cmd: Command) -> Result<(std::process::Output, f64), LlmError> {
    use std::io::Read;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| LlmError::Backend(format!("cannot run {cmd:?}: {e}")))?;
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let mut peak: f64 = 0.0;
    let status = loop {
        if let Some(m) = vm_hwm_mib(child.id()) {
            peak = peak.max(m);
        }
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(LlmError::Backend(format!("waiting for {cmd:?}: {e}"))),
        }
    };
    let out = std::process::Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    };
    Ok((out, peak))
}

fn field(row: &serde_json::Value, key: &str) -> usize {
    row.get(key)
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0) as usize
}

/// A `llama-server` that is killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> Result<u16, LlmError> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| LlmError::Backend(format!("no free port: {e}")))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| LlmError::Backend(format!("no free port: {e}")))
}

/// Aggregate decode tok/s of `llama-server --parallel k`, sent `k` requests at once: the
/// tokens they generated over the longest generation time any of them reports; best of two
/// tries after a warm-up.
async fn server_round(
    model: &Path,
    threads: usize,
    prompts: &[Vec<u32>],
    gen: usize,
) -> Result<f64, LlmError> {
    let bin = tool("llama-server")?;
    let k = prompts.len();
    let port = free_port()?;
    let ctx = k * (CONCURRENT_PROMPT + gen + 64);
    let _server = Server(
        Command::new(&bin)
            .arg("-m")
            .arg(model)
            .args(["-t", &threads.to_string(), "-tb", &threads.to_string()])
            .args(["--parallel", &k.to_string(), "-c", &ctx.to_string()])
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["-ngl", "0", "--no-webui"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| LlmError::Backend(format!("cannot run {}: {e}", bin.display())))?,
    );
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let ok = client
            .get(format!("{base}/health"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ok {
            break;
        }
        if Instant::now() > deadline {
            return Err(LlmError::Backend(
                "llama-server did not become healthy within 120 s".into(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ask = |prompt: Vec<u32>| {
        let client = client.clone();
        let url = format!("{base}/completion");
        async move {
            let body = serde_json::json!({
                "prompt": prompt,
                "n_predict": gen,
                "ignore_eos": true,
                "cache_prompt": false,
                "temperature": 0.0,
            });
            let r: serde_json::Value = client
                .post(url)
                .json(&body)
                .send()
                .await
                .map_err(|e| LlmError::Backend(format!("llama-server request: {e}")))?
                .json()
                .await
                .map_err(|e| LlmError::Backend(format!("llama-server answer: {e}")))?;
            let t = &r["timings"];
            let n = t["predicted_n"].as_f64().unwrap_or(0.0);
            let ms = t["predicted_ms"].as_f64().unwrap_or(0.0);
            Ok::<(f64, f64), LlmError>((n, ms))
        }
    };
    ask(prompts[0].clone()).await?;
    let mut best: f64 = 0.0;
    for _ in 0..2 {
        let mut set = tokio::task::JoinSet::new();
        for p in prompts {
            set.spawn(ask(p.clone()));
        }
        let (mut tokens, mut longest) = (0.0, 0.0f64);
        while let Some(r) = set.join_next().await {
            let (n, ms) = r.map_err(|e| LlmError::Backend(format!("request task: {e}")))??;
            tokens += n;
            longest = longest.max(ms);
        }
        if longest > 0.0 {
            best = best.max(tokens / (longest / 1e3));
        }
    }
    Ok(best)
}

/// llama.cpp's figures for one round.
async fn llama_cpp_round(
    model: &Path,
    threads: usize,
    unit: &[u32],
    gen: usize,
) -> Result<(Figures, String), LlmError> {
    let join = |v: &[usize]| v.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
    let (m, pp_args) = (
        model.to_path_buf(),
        vec!["-p".to_string(), join(&PREFILL), "-n".into(), "0".into()],
    );
    let tg_args = vec![
        "-p".to_string(),
        "0".into(),
        "-n".into(),
        gen.to_string(),
        "-d".into(),
        join(&DEPTHS),
    ];
    let (rows, rss) = tokio::task::spawn_blocking(move || -> Result<_, LlmError> {
        let (mut rows, a) = llama_bench(&m, threads, &pp_args)?;
        let (more, b) = llama_bench(&m, threads, &tg_args)?;
        rows.extend(more);
        Ok((rows, a.max(b)))
    })
    .await
    .map_err(|e| LlmError::Backend(format!("llama-bench task: {e}")))??;
    let build = rows
        .first()
        .and_then(|r| r.get("build_commit"))
        .and_then(serde_json::Value::as_str)
        .unwrap_or("?")
        .to_string();
    let mut f = Figures::default();
    for r in &rows {
        let ts = r["avg_ts"].as_f64().unwrap_or(0.0);
        let (p, g, d) = (field(r, "n_prompt"), field(r, "n_gen"), field(r, "n_depth"));
        if g == 0 && p > 0 {
            f.prefill.push(Point { at: p, tok_s: ts });
        } else if p == 0 && g > 0 {
            f.decode.push(Point { at: d, tok_s: ts });
        }
    }
    f.peak_rss_mib = rss;
    for k in CONCURRENCY {
        let prompts = concurrent_prompts(unit, k);
        f.concurrent.push(Point {
            at: k,
            tok_s: server_round(model, threads, &prompts, gen).await?,
        });
    }
    Ok((f, build))
}

/// Picks one shape's points out of [`Figures`].
type PickPoints = fn(&Figures) -> &Vec<Point>;

/// `rounds` alternating rounds of ours and llama.cpp's on `path` with `threads` threads.
pub async fn compare_llama_cpp(
    path: &Path,
    threads: usize,
    gen_tokens: usize,
    rounds: usize,
) -> Result<ShapeComparison, LlmError> {
    // Fail before measuring anything when the peer is missing.
    tool("llama-bench")?;
    tool("llama-server")?;
    let gen = gen_tokens.max(1);
    let p = path.to_path_buf();
    let (engine, unit) = tokio::task::spawn_blocking(move || -> Result<_, LlmError> {
        set_threads(threads);
        let options = LoadOptions {
            max_context: PREFILL[PREFILL.len() - 1] + gen + 64,
            ..LoadOptions::default()
        };
        let engine = Engine::load(&p, &options)?;
        let unit = engine.shared().encode(
            "The quick brown fox jumps over the lazy dog while the orchestra tunes its \
             instruments and the city wakes up to another ordinary, remarkable day. ",
        )?;
        Ok((engine, unit))
    })
    .await
    .map_err(|e| LlmError::Backend(format!("load task: {e}")))??;
    let info = engine.shared().info.clone();
    let mut engine = Some(engine);
    let (mut ours, mut theirs, mut build) = (Vec::new(), Vec::new(), String::new());
    for _ in 0..rounds.max(1) {
        let (mut e, u) = (
            engine
                .take()
                .ok_or_else(|| LlmError::Backend("engine lost".into()))?,
            unit.clone(),
        );
        let (e, f) = tokio::task::spawn_blocking(move || {
            let f = ours_round(&mut e, &u, gen);
            (e, f)
        })
        .await
        .map_err(|e| LlmError::Backend(format!("bench task: {e}")))?;
        engine = Some(e);
        ours.push(f?);
        let (f, b) = llama_cpp_round(path, threads, &unit, gen).await?;
        theirs.push(f);
        build = b;
    }
    let mut rows = Vec::new();
    let shapes: [(&'static str, PickPoints); 3] = [
        ("prefill", |f| &f.prefill),
        ("decode", |f| &f.decode),
        ("concurrent", |f| &f.concurrent),
    ];
    for (shape, pick) in shapes {
        let ats: Vec<usize> = ours
            .first()
            .map(|f| pick(f).iter().map(|p| p.at).collect())
            .unwrap_or_default();
        for at in ats {
            let get = |f: &Figures| pick(f).iter().find(|p| p.at == at).map_or(0.0, |p| p.tok_s);
            let (a, b): (Vec<f64>, Vec<f64>) = ours
                .iter()
                .zip(&theirs)
                .map(|(x, y)| (get(x), get(y)))
                .unzip();
            rows.push(Row {
                shape,
                at,
                ratio: Ratio::of(a.iter().copied().zip(b.iter().copied())),
                ours: median(a),
                llama_cpp: median(b),
            });
        }
    }
    let rss_ratio = Ratio::of(
        ours.iter()
            .zip(&theirs)
            .map(|(a, b)| (a.peak_rss_mib, b.peak_rss_mib)),
    );
    Ok(ShapeComparison {
        model: info.name,
        architecture: info.architecture,
        threads,
        gen_tokens: gen,
        llama_cpp_build: build,
        ours,
        llama_cpp: theirs,
        rows,
        rss_ratio,
    })
}

impl ShapeComparison {
    /// A table for people.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{} ({}), {} thread(s), {} rounds, llama.cpp {}; tok/s, medians; ratio ours/llama.cpp (min-max over rounds)\n",
            self.model,
            self.architecture,
            self.threads,
            self.ours.len(),
            self.llama_cpp_build
        );
        s.push_str(&format!(
            "{:<28} {:>10} {:>10} {:>8} {:>14}\n",
            "shape", "ours", "llama.cpp", "ratio", "range"
        ));
        for r in &self.rows {
            let what = match r.shape {
                "prefill" => format!("prefill {} tokens", r.at),
                "decode" => format!("decode at depth {}", r.at),
                _ => format!("decode, {} sequences", r.at),
            };
            s.push_str(&format!(
                "{:<28} {:>10.1} {:>10.1} {:>7.2}x {:>6.2}-{:<6.2}\n",
                what, r.ours, r.llama_cpp, r.ratio.median, r.ratio.min, r.ratio.max
            ));
        }
        let rss = |v: &[Figures]| median(v.iter().map(|f| f.peak_rss_mib).collect());
        s.push_str(&format!(
            "peak RSS: ours {:.0} MiB, llama.cpp {:.0} MiB ({:.2}x)",
            rss(&self.ours),
            rss(&self.llama_cpp),
            self.rss_ratio.median
        ));
        s
    }
}
