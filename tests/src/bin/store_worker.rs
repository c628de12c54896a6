//! Worker process of the long-term store's kill test (`tests/tests/store_crash.rs`).
//!
//! ```text
//! store_worker write DIR START COUNT
//!     Opens the store in DIR (semantic search with a hashing embedder, so that embedding is
//!     quick and deterministic) and, for i in START..START+COUNT, puts item `k<i>` under
//!     ["kill", "w"] and prints `put k<i>` once the put returned; every third item also deletes
//!     the item two before it and prints `del k<j>`. The parent kills it with SIGKILL at a
//!     moment of its choosing.
//! store_worker check DIR KEYS...
//!     Opens the store (which reconciles items and vectors) and prints JSON: what opening
//!     repaired, the keys present, and for each key given whether searching by its item's
//!     text finds it first.
//! ```

use ferrograph::core::store::{PutOptions, SearchRequest, Store};
use ferrograph_index::HashEmbedder;
use ferrograph_store::{SledStore, StoreHandle, StoreOptions};
use serde_json::json;
use std::io::Write;
use std::sync::Arc;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn text_of(i: u64) -> String {
    format!(
        "note {i} about subject {} and detail {}",
        i % 7,
        i * 31 % 97
    )
}

fn open(dir: &str) -> Result<(StoreHandle, ferrograph_store::OpenReport), BoxError> {
    let options = StoreOptions::semantic(Arc::new(HashEmbedder::new(64))).fields(["text"]);
    let (store, report) = SledStore::open(dir, options)?;
    Ok((StoreHandle::new(store), report))
}

fn space() -> Vec<String> {
    vec!["kill".to_string(), "w".to_string()]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("write") => {
            let dir = args.get(2).ok_or("DIR")?;
            let start: u64 = args.get(3).ok_or("START")?.parse()?;
            let count: u64 = args.get(4).ok_or("COUNT")?.parse()?;
            let (store, _) = open(dir)?;
            let mut out = std::io::stdout();
            for i in start..start + count {
                let key = format!("k{i}");
                store
                    .put(
                        &space(),
                        &key,
                        json!({"text": text_of(i), "i": i}),
                        PutOptions::default(),
                    )
                    .await?;
                writeln!(out, "put {key}")?;
                out.flush()?;
                if i.is_multiple_of(3) && i >= start + 2 {
                    let gone = format!("k{}", i - 2);
                    store.delete(&space(), &gone).await?;
                    writeln!(out, "del {gone}")?;
                    out.flush()?;
                }
            }
            Ok(())
        }
        Some("check") => {
            let dir = args.get(2).ok_or("DIR")?;
            let (store, report) = open(dir)?;
            let items = store
                .search(SearchRequest::under(["kill", "w"]).limit(100_000))
                .await?;
            let present: Vec<String> = items.iter().map(|h| h.item.key.clone()).collect();
            let mut found_first = serde_json::Map::new();
            for key in &args[3..] {
                let i: u64 = key.trim_start_matches('k').parse()?;
                let hits = store
                    .search(
                        SearchRequest::under(["kill", "w"])
                            .query(text_of(i))
                            .limit(1),
                    )
                    .await?;
                let first = hits.first().map(|h| h.item.key.clone());
                found_first.insert(key.clone(), json!(first.as_deref() == Some(key.as_str())));
            }
            println!(
                "{}",
                json!({
                    "items": report.items,
                    "reembedded": report.reembedded,
                    "orphans_removed": report.orphans_removed,
                    "present": present,
                    "found_first": found_first,
                })
            );
            Ok(())
        }
        _ => Err("usage: store_worker write DIR START COUNT | check DIR KEYS...".into()),
    }
}
