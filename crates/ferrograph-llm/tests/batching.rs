//! Continuous batching on the real SmolLM2-135M-Instruct Q4_1: a batched forward pass gives
//! every sequence bit for bit the logits it gets alone, and requests served together by one
//! model actor give, token for token, what they give served one at a time.
//!
//! The model is fetched with `scripts/fetch-models.sh` when missing; only outside CI do the
//! tests skip (loudly) when that fails.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used, missing_docs)]

use candle_core::quantized::gguf_file;
use ferrograph_core::message::Message;
use ferrograph_kernels::decoder::{forward_batch, BatchItem, DecoderModel};
use ferrograph_llm::manifest::{ensure_model, DEFAULT_CHAT_MODEL};
use ferrograph_llm::{GenerateOptions, Generation, LoadOptions, ModelHandle, PromptInput};
use serde_json::json;
use std::path::PathBuf;
use std::sync::OnceLock;

fn model_path() -> Option<PathBuf> {
    static PATH: OnceLock<Option<PathBuf>> = OnceLock::new();
    // Two kernel threads whatever the machine (every test asks for the model before its
    // first product): a decode step of sequences split evenly over two threads takes its own
    // path (`attention_in_one_dispatch` in the kernels' decoder).
    ferrograph_kernels::pool::set_threads(2);
    PATH.get_or_init(|| match ensure_model(DEFAULT_CHAT_MODEL) {
        Ok(p) => Some(p),
        Err(e) => {
            if std::env::var_os("CI").is_some() {
                panic!("cannot fetch {DEFAULT_CHAT_MODEL} in CI: {e}");
            }
            eprintln!("\n\n!!!!!! SKIPPING BATCHING TESTS: the model is missing: {e}\n");
            None
        }
    })
    .clone()
}

fn decoder(path: &PathBuf) -> DecoderModel {
    let mut f = std::fs::File::open(path).unwrap();
    let ct = gguf_file::Content::read(&mut f).unwrap();
    DecoderModel::load(&ct, &mut f).unwrap()
}

/// Token ids spread over the vocabulary (a deterministic stand-in for text).
fn tokens(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (seed * 7919 + i * 104_729) % 49_000 + 10)
        .collect()
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

#[test]
fn a_batched_pass_gives_each_sequence_its_logits_alone() {
    let Some(path) = model_path() else { return };
    let base = decoder(&path);
    // Four sequences in different states: a prompt from empty, a decode step deep in a
    // context, a prompt chunk continuing a cached prefix, and a decode step right after a
    // one-token prompt.
    let mut states: Vec<DecoderModel> = Vec::new();
    let mut feeds: Vec<(Vec<u32>, usize)> = Vec::new();
    for (seed, cached, new) in [(1, 0, 40), (2, 300, 1), (3, 21, 7), (4, 1, 1)] {
        let mut m = base.clone();
        m.reset();
        let all = tokens(seed, cached + new);
        if cached > 0 {
            m.forward(&all[..cached], 0).unwrap();
        }
        states.push(m);
        feeds.push((all[cached..].to_vec(), cached));
    }
    let alone: Vec<Vec<f32>> = states
        .iter()
        .zip(&feeds)
        .map(|(m, (toks, pos))| m.clone().forward(toks, *pos).unwrap())
        .collect();
    let mut batched_states = states.clone();
    // Each sequence hands in a used buffer for its logits (shorter or longer than the
    // vocabulary, full of NaN): what it held must not show.
    let mut items: Vec<BatchItem<'_>> = batched_states
        .iter_mut()
        .zip(&feeds)
        .enumerate()
        .map(|(i, (m, (toks, pos)))| BatchItem {
            model: m,
            tokens: toks,
            pos: *pos,
            logits: vec![f32::NAN; [0, 7, 49_152, 100_000][i]],
        })
        .collect();
    let batched = forward_batch(&mut items).unwrap();
    assert_eq!(batched.len(), 4);
    for (i, (a, b)) in alone.iter().zip(&batched).enumerate() {
        assert!(a == b, "sequence {i}: batched logits differ from alone");
    }
    for (m, (toks, pos)) in batched_states.iter().zip(&feeds) {
        assert_eq!(m.cached(), pos + toks.len());
    }

    // Greedy decoding of three sequences, batched step by step, against each alone: the
    // same 24 tokens.
    let prompts = [tokens(5, 12), tokens(6, 90), tokens(7, 33)];
    let tokens_of = |runs: Vec<Vec<Vec<f32>>>| -> Vec<Vec<u32>> {
        runs.iter()
            .map(|steps| steps.iter().map(|l| argmax(l)).collect())
            .collect()
    };
    let alone = tokens_of(greedy_alone(&base, &prompts, 23));
    let batched = tokens_of(greedy_batched(&base, &prompts, 23));
    assert_eq!(batched, alone);
}

/// Greedy decoding of `prompts` one sequence at a time: each step's logits.
fn greedy_alone(base: &DecoderModel, prompts: &[Vec<u32>], steps: usize) -> Vec<Vec<Vec<f32>>> {
    prompts
        .iter()
        .map(|p| {
            let mut m = base.clone();
            m.reset();
            let mut logits = m.forward(p, 0).unwrap();
            let mut all = vec![logits.clone()];
            for step in 0..steps {
                let t = argmax(&logits);
                logits = m.forward(&[t], p.len() + step).unwrap();
                all.push(logits.clone());
            }
            all
        })
        .collect()
}

/// Greedy decoding of `prompts` together: one batched pass of the prompts, then one
/// batched pass a step; each step's logits per sequence. Each pass refills the previous
/// pass's logits buffers, as the model actor's steps do.
fn greedy_batched(base: &DecoderModel, prompts: &[Vec<u32>], steps: usize) -> Vec<Vec<Vec<f32>>> {
    let mut ms: Vec<DecoderModel> = prompts
        .iter()
        .map(|_| {
            let mut m = base.clone();
            m.reset();
            m
        })
        .collect();
    let mut feed: Vec<(Vec<u32>, usize)> = prompts.iter().map(|p| (p.clone(), 0)).collect();
    let mut all: Vec<Vec<Vec<f32>>> = vec![Vec::new(); prompts.len()];
    let mut logits: Vec<Vec<f32>> = vec![Vec::new(); prompts.len()];
    for _ in 0..=steps {
        let mut items: Vec<BatchItem<'_>> = ms
            .iter_mut()
            .zip(&feed)
            .zip(logits.iter_mut())
            .map(|((m, (toks, pos)), l)| BatchItem {
                model: m,
                tokens: toks,
                pos: *pos,
                logits: std::mem::take(l),
            })
            .collect();
        logits = forward_batch(&mut items).unwrap();
        for (i, l) in logits.iter().enumerate() {
            let pos = feed[i].1 + feed[i].0.len();
            feed[i] = (vec![argmax(l)], pos);
            all[i].push(l.clone());
        }
    }
    all
}

#[test]
fn sequences_decoding_at_even_depths_give_each_its_logits_alone() {
    let Some(path) = model_path() else { return };
    let base = decoder(&path);
    // Four prompts of nearly the same length, so that each decode step splits them evenly
    // over the two threads and runs their attention in one dispatch; then two sequences (one
    // each); then four whose depths are far apart (a 200-token context with three short ones),
    // which keeps attention's units shared out as threads free up.
    for lengths in [&[30, 33, 31, 32][..], &[21, 24], &[200, 9, 12, 10]] {
        let prompts: Vec<Vec<u32>> = lengths
            .iter()
            .enumerate()
            .map(|(i, &n)| tokens(11 + i as u32, n))
            .collect();
        let alone = greedy_alone(&base, &prompts, 20);
        let batched = greedy_batched(&base, &prompts, 20);
        for (i, (a, b)) in alone.iter().zip(&batched).enumerate() {
            for (step, (la, lb)) in a.iter().zip(b).enumerate() {
                assert!(
                    la == lb,
                    "lengths {lengths:?}, sequence {i}, step {step}: batched logits differ from alone"
                );
            }
        }
    }
}

#[test]
fn a_long_prompt_in_passes_gives_the_logits_of_one_pass() {
    let Some(path) = model_path() else { return };
    let mut base = decoder(&path);
    base.reset();
    let prompt = tokens(9, 700);
    assert!(prompt.len() > ferrograph_kernels::decoder::MAX_PASS_ROWS);
    // `forward` runs it in passes of MAX_PASS_ROWS; `forward_batch` in one.
    let mut chunked = base.clone();
    let in_passes = chunked.forward(&prompt, 0).unwrap();
    let mut whole = base.clone();
    let one_pass = forward_batch(&mut [BatchItem {
        model: &mut whole,
        tokens: &prompt,
        pos: 0,
        logits: Vec::new(),
    }])
    .unwrap()
    .pop()
    .unwrap();
    assert!(in_passes == one_pass, "logits differ");
    assert_eq!(chunked.cached(), 700);
    // The caches continue alike.
    let next = [argmax(&in_passes)];
    assert!(chunked.forward(&next, 700).unwrap() == whole.forward(&next, 700).unwrap());
}

#[test]
fn a_batch_of_two_models_is_refused() {
    let Some(path) = model_path() else { return };
    let mut a = decoder(&path);
    let mut b = decoder(&path);
    let t = tokens(1, 3);
    let mut items = vec![
        BatchItem {
            model: &mut a,
            tokens: &t,
            pos: 0,
            logits: Vec::new(),
        },
        BatchItem {
            model: &mut b,
            tokens: &t,
            pos: 0,
            logits: Vec::new(),
        },
    ];
    let err = forward_batch(&mut items).unwrap_err();
    assert!(err.contains("different models"), "{err}");
}

/// The mixed requests the actor tests send together: chat turns of different lengths, a
/// stop string, a structured (JSON schema) answer, a raw text prompt of over 600 tokens (so
/// its prompt is computed in chunks while the others decode) and seeded sampling.
fn requests() -> Vec<(PromptInput, GenerateOptions)> {
    let chat = |text: &str| PromptInput::Chat {
        messages: vec![
            Message::system("You are a concise assistant."),
            Message::human(text),
        ],
        tools: None,
        assistant_prefix: String::new(),
    };
    let long: String = (0..60)
        .map(|i| {
            format!(
                "Line {i}: the ledger total for account {i} is {}.\n",
                i * 17
            )
        })
        .collect();
    vec![
        (
            chat("What is the capital of France?"),
            GenerateOptions::greedy().max_tokens(40),
        ),
        (
            chat("Write three words about the sea."),
            GenerateOptions::greedy().max_tokens(48).stop("."),
        ),
        (
            chat("Give a name and an age for a fictional person."),
            GenerateOptions::greedy().max_tokens(60).json_schema(
                "person",
                json!({
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                    "required": ["name", "age"]
                }),
            ),
        ),
        (
            PromptInput::Text(format!("{long}\nThe account with the largest total is")),
            GenerateOptions::greedy().max_tokens(24),
        ),
        (
            chat("Name a colour."),
            GenerateOptions::sampled(0.8, 7).max_tokens(30),
        ),
        (
            chat("Count from one to ten in words."),
            GenerateOptions::greedy().max_tokens(64),
        ),
    ]
}

async fn serve_all(handle: &ModelHandle) -> Vec<Generation> {
    let calls = requests()
        .into_iter()
        .enumerate()
        .map(|(i, (input, opts))| {
            let h = handle.clone();
            // Each request from its own user, so that they may share the batch.
            let opts = GenerateOptions {
                user: Some(format!("user-{i}")),
                ..opts
            };
            tokio::spawn(async move { h.generate(input, opts, None).await })
        });
    futures::future::join_all(calls)
        .await
        .into_iter()
        .map(|r| r.unwrap().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_served_together_equal_requests_served_alone() {
    let Some(path) = model_path() else { return };
    let one = LoadOptions {
        max_batch: 1,
        prefix_cache_entries: 0,
        ..LoadOptions::default()
    };
    let many = LoadOptions {
        max_batch: 8,
        prefix_cache_entries: 0,
        ..LoadOptions::default()
    };
    let alone = ModelHandle::spawn(&path, &one).unwrap();
    let together = ModelHandle::spawn(&path, &many).unwrap();
    let a = serve_all(&alone).await;
    let b = serve_all(&together).await;
    assert_eq!(alone.batch_stats().peak, 1);
    let stats = together.batch_stats();
    assert!(stats.peak >= 4, "the requests were not batched: {stats:?}");
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_eq!(
            x.tokens, y.tokens,
            "request {i}: tokens differ when batched"
        );
        assert_eq!(x.text, y.text, "request {i}");
        assert_eq!(x.finish_reason, y.finish_reason, "request {i}");
        assert!(!y.text.trim().is_empty(), "request {i} gave no text");
    }
    // The structured answer is the schema's JSON, batched too.
    let person: serde_json::Value = serde_json::from_str(&b[2].text).unwrap();
    assert!(
        person["name"].is_string() && person["age"].is_i64(),
        "{person}"
    );
    // The stop string ended its request.
    assert!(!b[1].text.contains('.'), "{:?}", b[1].text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_request_leaves_the_batch_and_the_others_finish() {
    let Some(path) = model_path() else { return };
    let opts = LoadOptions {
        max_batch: 8,
        ..LoadOptions::default()
    };
    let h = ModelHandle::spawn(&path, &opts).unwrap();
    let ask = |text: &str, user: &str, n: usize| {
        let h = h.clone();
        let input = PromptInput::Text(text.to_string());
        let opts = GenerateOptions {
            user: Some(user.to_string()),
            ..GenerateOptions::greedy().max_tokens(n)
        };
        async move { h.generate(input, opts, None).await }
    };
    let reference = ask("Once upon a time", "r", 48).await.unwrap();
    // A long request, dropped after a moment, beside the reference request.
    let long = tokio::spawn(ask("The history of the world begins", "x", 4000));
    let kept = tokio::spawn(ask("Once upon a time", "y", 48));
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    long.abort();
    let kept = kept.await.unwrap().unwrap();
    assert_eq!(kept.tokens, reference.tokens);
    // The actor serves on after the cancellation.
    let again = ask("Once upon a time", "z", 48).await.unwrap();
    assert_eq!(again.tokens, reference.tokens);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_sharing_a_system_prompt_compute_it_once() {
    let Some(path) = model_path() else { return };
    let system: String = (1..=14)
        .map(|i| {
            format!(
                "Rule {i}: answer in one short sentence, cite the file and line you rely on, and \
                 never invent a name that the evidence does not contain. "
            )
        })
        .collect();
    let questions = [
        "Which file computes the discount?",
        "What does apply_discounts return?",
        "Where is the ledger total written?",
    ];
    let input = |q: &str| PromptInput::Chat {
        messages: vec![Message::system(system.clone()), Message::human(q)],
        tools: None,
        assistant_prefix: String::new(),
    };
    let opts = |i: usize| GenerateOptions {
        user: Some(format!("user-{i}")),
        ..GenerateOptions::greedy().max_tokens(24)
    };
    // The references: one at a time, no prefix cache.
    let alone = ModelHandle::spawn(
        &path,
        &LoadOptions {
            max_batch: 1,
            prefix_cache_entries: 0,
            ..LoadOptions::default()
        },
    )
    .unwrap();
    let mut reference = Vec::new();
    for (i, q) in questions.iter().enumerate() {
        reference.push(alone.generate(input(q), opts(i), None).await.unwrap());
    }
    assert!(reference.iter().all(|g| g.cached_prompt_tokens == 0));
    drop(alone);

    // All at once to an actor that keeps prefixes: whichever starts first computes the shared
    // start of the prompts; the others start from it, whether they waited for it in flight
    // or found it cached.
    let together = ModelHandle::spawn(&path, &LoadOptions::default()).unwrap();
    let calls = questions.iter().enumerate().map(|(i, q)| {
        let h = together.clone();
        let (input, opts) = (input(q), opts(i));
        tokio::spawn(async move { h.generate(input, opts, None).await })
    });
    let got: Vec<Generation> = futures::future::join_all(calls)
        .await
        .into_iter()
        .map(|r| r.unwrap().unwrap())
        .collect();
    let stats = together.batch_stats();
    eprintln!("batching: {stats:?}");
    for (i, (a, b)) in reference.iter().zip(&got).enumerate() {
        assert_eq!(a.tokens, b.tokens, "request {i}: tokens differ");
        assert!(!b.text.trim().is_empty(), "request {i} gave no text");
    }
    let prompt = got.iter().map(|g| g.prompt_tokens).min().unwrap();
    assert!(
        prompt > 300,
        "the system prompt is too short: {prompt} tokens"
    );
    let computed: usize = got
        .iter()
        .map(|g| g.prompt_tokens - g.cached_prompt_tokens)
        .sum();
    let starts: Vec<usize> = got.iter().map(|g| g.cached_prompt_tokens).collect();
    assert_eq!(
        starts.iter().filter(|&&c| c > 300).count(),
        2,
        "two requests should start from the shared prefix: {starts:?}"
    );
    assert!(
        computed < prompt + 2 * 40,
        "the shared prefix was computed more than once: {computed} prompt tokens computed, {starts:?}"
    );
}
