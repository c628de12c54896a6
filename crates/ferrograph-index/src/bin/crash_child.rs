//! Test helper for the crash tests (`tests/crash.rs`): replays a deterministic sequence of
//! index operations ([`ferrograph_index::bench::crash_ops`]) from a given step, printing
//! `ok N` after each one returns, until it is killed.
//!
//! Usage: `ferrograph-index-crash-child DIR START_STEP [END_STEP]`

use ferrograph_index::bench::{crash_config, crash_ops, CrashOp};
use ferrograph_index::{HashEmbedder, Index};
use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (Some(dir), Some(start)) = (
        args.get(1),
        args.get(2).and_then(|s| s.parse::<usize>().ok()),
    ) else {
        eprintln!("usage: ferrograph-index-crash-child DIR START_STEP [END_STEP]");
        return ExitCode::from(2);
    };
    let end = args
        .get(3)
        .and_then(|s| s.parse::<usize>().ok())
        .unwrap_or(usize::MAX);
    let embedder = HashEmbedder::new(crash_config().dim);
    let index = match Index::open_or_create(dir, crash_config()) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("open: {e}");
            return ExitCode::from(1);
        }
    };
    let mut out = std::io::stdout().lock();
    for step in start..end {
        let r = match crash_ops(step, &embedder) {
            CrashOp::Upsert(docs) => index.upsert_documents(docs).map(|_| ()),
            CrashOp::Delete(paths) => index.delete_documents(&paths).map(|_| ()),
            CrashOp::Add(chunks) => index.add_chunks(chunks).map(|_| ()),
            CrashOp::Save => index.save(),
            CrashOp::Rebuild => {
                index.rebuild_graph();
                index.save()
            }
        };
        if let Err(e) = r {
            eprintln!("step {step}: {e}");
            return ExitCode::from(1);
        }
        if writeln!(out, "ok {step}")
            .and_then(|_| out.flush())
            .is_err()
        {
            return ExitCode::from(1);
        }
    }
    ExitCode::SUCCESS
}
