//! The `ferrograph` binary end to end: a run that interrupts, resumes from a new process,
//! thread commands, exit codes and configuration errors.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

fn ferrograph(data: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrograph"))
        .args(args)
        .env("FERROGRAPH_DATA_DIR", data)
        .env_remove("FERROGRAPH_CONFIG")
        .env_remove("FERROGRAPH_MAX_STEPS")
        .output()
        .expect("run ferrograph")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn review_interrupts_resumes_in_new_processes_and_lists_threads() {
    let dir = tempfile::tempdir().unwrap();
    let out = ferrograph(dir.path(), &["run", "review", "--thread", "t1", "--stream"]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    let text = stdout(&out);
    assert!(text.contains("ferrograph resume t1 --approve"), "{text}");
    assert!(text.contains("▶ human_review"), "{text}");

    let out = ferrograph(dir.path(), &["threads", "list", "--status", "interrupted"]);
    assert!(stdout(&out).contains("t1"), "{}", stdout(&out));

    let out = ferrograph(dir.path(), &["resume", "t1", "--feedback", "more tests"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stdout(&out).contains("Revision 2"));

    let out = ferrograph(dir.path(), &["resume", "t1", "--approve"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(stdout(&out).contains("\"published\": true"));

    let out = ferrograph(dir.path(), &["threads", "show", "t1"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["thread"]["status"], "done");
    assert_eq!(v["state"]["values"]["decision"], "approved");

    let out = ferrograph(dir.path(), &["threads", "history", "t1"]);
    let history = stdout(&out);
    assert_eq!(history.lines().count(), 1 + 6, "{history}");
    let first = history
        .lines()
        .last()
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();

    let out = ferrograph(
        dir.path(),
        &[
            "threads",
            "fork",
            "t1",
            "--checkpoint",
            &first,
            "--into",
            "t2",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = ferrograph(dir.path(), &["resume", "t2"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "the fork starts before the review"
    );

    let out = ferrograph(dir.path(), &["threads", "rm", "t1"]);
    assert_eq!(out.status.code(), Some(0));
    let out = ferrograph(dir.path(), &["threads", "show", "t1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));
}

#[test]
fn demo_finishes_and_bad_input_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("commits.txt");
    std::fs::write(&input, "feat: one\nfix: two\n").unwrap();
    let out = ferrograph(
        dir.path(),
        &["run", "demo", "--input", input.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).contains("\"classified\": 2"));

    let out = ferrograph(dir.path(), &["run", "nope"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown workflow"));

    let out = ferrograph(dir.path(), &["resume", "missing", "--approve"]);
    assert_eq!(out.status.code(), Some(1));

    let out = Command::new(env!("CARGO_BIN_EXE_ferrograph"))
        .args(["config"])
        .env("FERROGRAPH_DATA_DIR", dir.path())
        .env("FERROGRAPH_MAX_STEPS", "many")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("FERROGRAPH_MAX_STEPS"));

    let cfg = dir.path().join("ferrograph.toml");
    std::fs::write(&cfg, "max_steps = 7\nmax_runtime_seconds = 12.5\n").unwrap();
    let out = ferrograph(dir.path(), &["config"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["max_steps"], 7);
    assert_eq!(v["max_runtime_seconds"], 12.5);
}

/// Flips one byte in every `step` bytes of `file`.
fn damage(file: &std::path::Path, step: usize) {
    let mut bytes = std::fs::read(file).unwrap();
    for i in (step / 2..bytes.len()).step_by(step) {
        bytes[i] ^= 0x5a;
    }
    std::fs::write(file, bytes).unwrap();
}

#[test]
fn a_damaged_store_is_named_and_a_backup_brings_every_thread_back() {
    let dir = tempfile::tempdir().unwrap();
    for t in ["t1", "t2"] {
        let out = ferrograph(dir.path(), &["run", "review", "--thread", t, "--quiet"]);
        assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    }
    let out = ferrograph(dir.path(), &["store", "verify"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(stdout(&out).contains("all readable"), "{}", stdout(&out));

    let backup = dir.path().join("backups/store.fgb");
    let out = ferrograph(
        dir.path(),
        &["store", "backup", "--out", backup.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(backup.is_file());

    // A damaged backup is refused before the store is touched.
    let bad = dir.path().join("bad.fgb");
    std::fs::copy(&backup, &bad).unwrap();
    damage(&bad, 4096);
    let out = ferrograph(dir.path(), &["store", "restore", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(err.contains("not a readable ferrograph backup"), "{err}");
    let out = ferrograph(dir.path(), &["threads", "list"]);
    assert!(stdout(&out).contains("t1"), "{}", stdout(&out));

    // Damage the store's log throughout: verification fails and names the store.
    let log = dir.path().join("checkpoints/db");
    assert!(log.is_file(), "sled's log file");
    damage(&log, 64);
    let out = ferrograph(dir.path(), &["store", "verify"]);
    assert_ne!(out.status.code(), Some(0), "{}", stdout(&out));
    let said = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    assert!(said.contains("checkpoints"), "{said}");

    // Restore: the damaged store is kept aside, every thread is back and can go on.
    let out = ferrograph(dir.path(), &["store", "restore", backup.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(stdout(&out).contains("kept at"), "{}", stdout(&out));
    let kept = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("checkpoints.before-restore-")
        });
    assert!(kept, "the damaged store was kept aside");
    let out = ferrograph(dir.path(), &["store", "verify"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let out = ferrograph(dir.path(), &["threads", "list", "--status", "interrupted"]);
    let listed = stdout(&out);
    assert!(listed.contains("t1") && listed.contains("t2"), "{listed}");
    let out = ferrograph(dir.path(), &["resume", "t1", "--approve"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(stdout(&out).contains("\"published\": true"));
}

#[test]
fn serve_backs_the_store_up_on_schedule_and_keeps_the_newest() {
    let dir = tempfile::tempdir().unwrap();
    let out = ferrograph(dir.path(), &["run", "review", "--thread", "t1", "--quiet"]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    let backups = dir.path().join("backups");
    let mut server = Command::new(env!("CARGO_BIN_EXE_ferrograph"))
        .args([
            "serve",
            "--bind",
            "127.0.0.1:0",
            "--backup-dir",
            backups.to_str().unwrap(),
            "--backup-every",
            "0.2",
            "--backup-keep",
            "2",
        ])
        .env("FERROGRAPH_DATA_DIR", dir.path())
        .env_remove("FERROGRAPH_CONFIG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let list = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&backups)
            .map(|d| {
                d.filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".fgb"))
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < 4 && std::time::Instant::now() < deadline {
        seen.extend(list());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    server.kill().unwrap();
    let _ = server.wait();
    assert!(seen.len() >= 4, "backups made: {seen:?}");
    let left = list();
    assert!(left.len() <= 2, "only the newest are kept: {left:?}");

    // The newest backup restores the thread.
    std::fs::remove_dir_all(dir.path().join("checkpoints")).unwrap();
    let newest = backups.join(left.last().unwrap());
    let out = ferrograph(dir.path(), &["store", "restore", newest.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let out = ferrograph(dir.path(), &["threads", "list", "--status", "interrupted"]);
    assert!(stdout(&out).contains("t1"), "{}", stdout(&out));
}

#[test]
fn a_store_sled_no_longer_opens_is_salvaged_and_what_was_lost_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let threads: Vec<String> = (0..12).map(|i| format!("t{i:02}")).collect();
    for t in &threads {
        let out = ferrograph(dir.path(), &["run", "review", "--thread", t, "--quiet"]);
        assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    }
    // One byte flipped in the middle of the used part of sled's log.
    let log = dir.path().join("checkpoints/db");
    let mut bytes = std::fs::read(&log).unwrap();
    let used = bytes.len() - bytes.iter().rev().take_while(|b| **b == 0).count();
    bytes[used / 2] ^= 0x5a;
    std::fs::write(&log, &bytes).unwrap();

    let out = ferrograph(dir.path(), &["store", "salvage", "--dry-run"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("nothing was changed"),
        "{}",
        stdout(&out)
    );
    assert_eq!(
        std::fs::read(&log).unwrap(),
        bytes,
        "a dry run changed the store"
    );

    let out = ferrograph(dir.path(), &["store", "salvage", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let text = stdout(&out);
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let saved: Vec<String> = json["threads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["status"] != "none")
        .map(|t| t["thread_id"].as_str().unwrap().to_string())
        .collect();
    let lost: Vec<String> = json["lost_threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["thread_id"].as_str().unwrap().to_string())
        .collect();
    assert!(!saved.is_empty(), "{text}");
    // Every thread is saved or named (one damaged record may hide one).
    let unaccounted = threads
        .iter()
        .filter(|t| !saved.contains(t) && !lost.contains(t))
        .count() as u64;
    assert!(
        unaccounted <= json["damaged_seen"].as_u64().unwrap(),
        "{text}"
    );
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(said.contains("kept at"), "{said}");

    // The salvaged store is in place: it verifies, lists the saved threads, and one goes on.
    let out = ferrograph(dir.path(), &["store", "verify"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let listed = stdout(&ferrograph(dir.path(), &["threads", "list"]));
    for t in &saved {
        assert!(listed.contains(t.as_str()), "{t} not listed: {listed}");
    }
    let out = ferrograph(dir.path(), &["resume", &saved[0], "--approve"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(stdout(&out).contains("\"published\": true"));
}

/// Every file of the store, concatenated.
fn store_bytes(data: &std::path::Path) -> Vec<u8> {
    let mut out = Vec::new();
    let mut stack = vec![data.join("checkpoints")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.extend(std::fs::read(&path).unwrap());
            }
        }
    }
    out
}

#[test]
fn encrypted_checkpoints_hold_no_plaintext_and_a_wrong_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let secret = "TOP-SECRET-7731 migrate the ledger";
    let input = dir.path().join("input.json");
    std::fs::write(
        &input,
        format!(r#"{{"title": "{secret}", "files": ["src/ledger.rs"]}}"#),
    )
    .unwrap();
    let input = input.to_str().unwrap();
    let key = stdout(&ferrograph(dir.path(), &["store", "keygen"]))
        .trim()
        .to_string();
    assert_eq!(key.len(), 64, "{key}");
    let with_key = |key: &str, args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_ferrograph"))
            .args(args)
            .env("FERROGRAPH_DATA_DIR", dir.path())
            .env("FERROGRAPH_CHECKPOINT_KEY", key)
            .env_remove("FERROGRAPH_CONFIG")
            .output()
            .unwrap()
    };
    let out = with_key(
        &key,
        &["run", "review", "--thread", "enc", "--input", input],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    let raw = store_bytes(dir.path());
    assert!(!raw.is_empty());
    let needle = b"TOP-SECRET-7731";
    assert!(
        !raw.windows(needle.len()).any(|w| w == needle),
        "the secret is on disk in the clear"
    );
    // With the key, everything reads back and the thread resumes to the end.
    let out = with_key(&key, &["threads", "show", "enc"]);
    assert!(stdout(&out).contains(secret), "{}", stdout(&out));
    let out = with_key(&key, &["resume", "enc", "--approve"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    // Another key, or none, is a clear error, never garbage.
    let other = "ab".repeat(32);
    let out = with_key(&other, &["threads", "show", "enc"]);
    assert_ne!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("another key"), "{err}");
    let out = ferrograph(dir.path(), &["threads", "show", "enc"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(!stdout(&out).contains(secret));
    // The scan finds the secret in a store written without a key (it would catch a leak).
    let plain = tempfile::tempdir().unwrap();
    let out = ferrograph(
        plain.path(),
        &["run", "review", "--thread", "p", "--input", input],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    let raw = store_bytes(plain.path());
    assert!(raw.windows(needle.len()).any(|w| w == needle));
    let out = with_key("not-a-key", &["threads", "list"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("64 hexadecimal digits"));
}

#[test]
fn json_lines_are_all_json_and_end_with_the_outcome() {
    let dir = tempfile::tempdir().unwrap();
    // `--json` after the workflow name, as the README writes it.
    let out = ferrograph(dir.path(), &["run", "review", "--json", "--thread", "j1"]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    let text = stdout(&out);
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| {
            serde_json::from_str(l)
                .map_err(|e| format!("not JSON ({e}): {l}"))
                .unwrap()
        })
        .collect();
    let kinds: Vec<&str> = lines.iter().map(|v| v["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds.first(), Some(&"task_start"), "{kinds:?}");
    assert!(kinds.contains(&"interrupt"), "{kinds:?}");
    let last = lines.last().unwrap();
    assert_eq!(last["kind"], "outcome");
    assert_eq!(last["status"], "interrupted");
    assert_eq!(last["interrupts"][0]["value"]["kind"], "review");

    // Resuming in JSON: the outcome is done.
    let out = ferrograph(dir.path(), &["resume", "j1", "--approve", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let last: serde_json::Value =
        serde_json::from_str(stdout(&out).lines().last().unwrap()).unwrap();
    assert_eq!(
        (last["kind"].as_str(), last["status"].as_str()),
        (Some("outcome"), Some("done"))
    );
    assert_eq!(last["state"]["published"], true);

    // `--stream` after the workflow name streams too.
    let out = ferrograph(dir.path(), &["run", "demo", "--stream"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(stdout(&out).contains("▶ classify"), "{}", stdout(&out));
}

#[test]
fn graph_draws_the_workflow_and_a_threads_path() {
    let dir = tempfile::tempdir().unwrap();
    let out = ferrograph(dir.path(), &["graph", "review", "--format", "svg"]);
    assert_eq!(out.status.code(), Some(0));
    let svg = stdout(&out);
    assert!(
        svg.starts_with("<svg") && svg.contains(r#"data-node="human_review""#),
        "{svg}"
    );
    let out = ferrograph(dir.path(), &["run", "review", "--thread", "g1", "-q"]);
    assert_eq!(out.status.code(), Some(2));
    let out = ferrograph(dir.path(), &["graph", "review", "--thread", "g1"]);
    let m = stdout(&out);
    assert!(m.contains("class human_review current"), "{m}");
    assert!(m.contains("class draft visited"), "{m}");
    let out = ferrograph(dir.path(), &["graph", "nope"]);
    assert_ne!(out.status.code(), Some(0));
}

#[test]
fn bench_llm_reports_batched_decode_and_a_newcomer_and_names_a_missing_peer() {
    let dir = tempfile::tempdir().unwrap();
    let out = ferrograph(
        dir.path(),
        &[
            "bench",
            "llm",
            "--prompt-tokens",
            "16",
            "--gen-tokens",
            "4",
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let r: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let levels: Vec<u64> = r["concurrency"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            assert!(l["decode_tok_s"].as_f64().unwrap() > 0.0, "{l}");
            l["sequences"].as_u64().unwrap()
        })
        .collect();
    assert_eq!(levels, [1, 2, 4, 8]);
    let n = &r["newcomer"];
    assert!(n["idle_ms"].as_f64().unwrap() > 0.0, "{n}");
    assert!(n["busy_ms"].as_f64().unwrap() > 0.0, "{n}");
    assert_eq!(n["busy_sequences"], 3);
    // SmolLM2's repacked weights (about 105 MiB) are read once per decode step, at a rate
    // that the kernels' threads streaming as many bytes bound (with room for noise).
    let m = &r["memory_roof"];
    let mib = m["weight_mib_per_token"].as_f64().unwrap();
    assert!((60.0..160.0).contains(&mib), "{m}");
    let (decode, stream) = (
        m["decode_gb_s"].as_f64().unwrap(),
        m["stream_read_gb_s"].as_f64().unwrap(),
    );
    assert!(decode > 0.0 && stream > 0.0 && decode < 2.0 * stream, "{m}");

    // Without llama.cpp's tools the comparison stops before measuring, naming the script.
    let out = Command::new(env!("CARGO_BIN_EXE_ferrograph"))
        .args(["bench", "llm", "--peer", "llama-cpp"])
        .env("FERROGRAPH_DATA_DIR", dir.path())
        .env("FERROGRAPH_LLAMA_CPP_BIN", dir.path().join("no-such-dir"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("scripts/setup-llama-cpp.sh"), "{err}");
}

#[test]
fn bench_embed_measures_our_encoder_against_candles_with_their_cosine() {
    let dir = tempfile::tempdir().unwrap();
    let sentences = dir.path().join("sentences.txt");
    let lines: Vec<String> = (0..12)
        .map(|i| {
            format!("Sentence {i}: the checkpoint saver writes thread {i} to sled and fsyncs.")
        })
        .chain([
            "fn main() { println!(\"hello\"); }".to_string(),
            String::new(),
        ])
        .collect();
    std::fs::write(&sentences, lines.join("\n")).unwrap();
    let vectors = dir.path().join("v.f32");
    let out = ferrograph(
        dir.path(),
        &[
            "index",
            "bench-embed",
            "--sentences",
            sentences.to_str().unwrap(),
            "--runs",
            "1",
            "--vectors-out",
            vectors.to_str().unwrap(),
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(r["engine"], "kernels", "{r}");
    assert_eq!(r["sentences"], 13, "{r}");
    assert!(r["sentences_per_s"].as_f64().unwrap() > 0.0, "{r}");
    let reference = &r["reference"];
    assert_eq!(reference["engine"], "candle", "{r}");
    assert!(reference["cosine_min"].as_f64().unwrap() >= 0.9999, "{r}");
    // 13 vectors of 384 floats.
    assert_eq!(std::fs::metadata(&vectors).unwrap().len(), 13 * 384 * 4);
}
