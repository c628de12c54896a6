//! The long-term store under SIGKILL: a worker process (`src/bin/store_worker.rs`) puts and
//! deletes items in a semantic store (item in sled, vector in the HNSW index) and is killed at
//! a different moment in each trial. After every kill, reopening the store must hold every
//! acknowledged put, none of the acknowledged deletes, at most the one operation in flight
//! besides, and a vector for exactly the items present (each found first by its own text).
//!
//! `FERROGRAPH_STORE_KILL_TRIALS` sets the number of trials (default 6; `scripts/store-kill.sh`
//! runs hundreds).

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

const WORKER: &str = env!("CARGO_BIN_EXE_store_worker");

#[test]
fn acknowledged_puts_and_deletes_survive_sigkill_and_vectors_match_items() {
    let trials: u64 = std::env::var("FERROGRAPH_STORE_KILL_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap().to_string();
    let mut present: BTreeSet<String> = BTreeSet::new();
    let mut deleted: BTreeSet<String> = BTreeSet::new();
    let mut repaired = 0;
    for trial in 0..trials {
        // Kill after a varying number of acknowledgements (the worker keeps writing).
        let acks_before_kill = 3 + (trial * 7) % 23;
        let start = trial * 1000;
        let mut child = Command::new(WORKER)
            .args(["write", &path, &start.to_string(), "500"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let mut acked = 0;
        // The delete the worker does next, if any: it may be on disk without its line.
        let mut next_delete: Option<String> = None;
        let mut record = |line: &str| {
            let (op, key) = line.split_once(' ').unwrap();
            match op {
                "put" => {
                    present.insert(key.to_string());
                    deleted.remove(key);
                    let i: u64 = key[1..].parse().unwrap();
                    next_delete =
                        (i.is_multiple_of(3) && i >= start + 2).then(|| format!("k{}", i - 2));
                }
                "del" => {
                    present.remove(key);
                    deleted.insert(key.to_string());
                    next_delete = None;
                }
                other => panic!("unexpected line {other}"),
            }
        };
        while acked < acks_before_kill {
            let Some(Ok(line)) = lines.next() else {
                panic!("the worker stopped early (trial {trial})");
            };
            record(&line);
            acked += 1;
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        // Whatever the worker acknowledged after we stopped reading is still acknowledged.
        for line in lines.map_while(Result::ok) {
            record(&line);
        }

        let mut args = vec!["check".to_string(), path.clone()];
        args.extend(present.iter().cloned());
        let out = Command::new(WORKER).args(&args).output().unwrap();
        assert!(
            out.status.success(),
            "check failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        repaired +=
            report["reembedded"].as_u64().unwrap() + report["orphans_removed"].as_u64().unwrap();
        let on_disk: BTreeSet<String> = report["present"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        let missing: Vec<String> = present.difference(&on_disk).cloned().collect();
        match (missing.as_slice(), &next_delete) {
            ([], _) => {}
            ([one], Some(d)) if one == d => {
                // The in-flight delete reached the disk before its acknowledgement.
                present.remove(one);
                deleted.insert(one.clone());
            }
            _ => panic!("trial {trial}: acknowledged puts lost: {missing:?}"),
        }
        let resurrected: Vec<&String> = deleted.intersection(&on_disk).collect();
        assert!(
            resurrected.is_empty(),
            "trial {trial}: acknowledged deletes undone: {resurrected:?}"
        );
        // At most the one operation that was in flight when the kill came.
        let extra: Vec<String> = on_disk.difference(&present).cloned().collect();
        assert!(
            extra.len() <= 1,
            "trial {trial}: unacknowledged items: {extra:?}"
        );
        present.extend(extra);
        for (key, first) in report["found_first"].as_object().unwrap() {
            if on_disk.contains(key) {
                assert_eq!(
                    first, true,
                    "trial {trial}: `{key}` is not found by its own text"
                );
            }
        }
    }
    eprintln!(
        "{trials} kills, {} items kept, {repaired} vectors repaired on reopen",
        present.len()
    );
}
