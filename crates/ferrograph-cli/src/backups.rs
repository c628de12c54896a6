//! Backups on a schedule while `ferrograph serve` runs.

use ferrograph::checkpoint_savers::{maintenance, SledSaver};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Prefix and extension of scheduled backup files: `store-<ms since the epoch>.fgb`.
const PREFIX: &str = "store-";
const EXT: &str = ".fgb";

/// Backs the store up into `dir` every `every` (the first one at once), keeping the newest
/// `keep` files. A failed backup is logged and tried again at the next tick.
pub(crate) async fn every(
    saver: Arc<SledSaver>,
    store: PathBuf,
    dir: PathBuf,
    every: Duration,
    keep: usize,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (saver, store, dir) = (saver.clone(), store.clone(), dir.clone());
        let done = tokio::task::spawn_blocking(move || once(&saver, &store, &dir, keep)).await;
        match done {
            Ok(Ok(path)) => tracing::info!(backup = %path.display(), "store backed up"),
            Ok(Err(e)) => tracing::error!(error = %e, "scheduled backup failed"),
            Err(e) => tracing::error!(error = %e, "scheduled backup panicked"),
        }
    }
}

fn once(saver: &SledSaver, store: &Path, dir: &Path, keep: usize) -> anyhow::Result<PathBuf> {
    let name = format!("{PREFIX}{:013}{EXT}", ferrograph::core::id::now_millis());
    let out = dir.join(name);
    maintenance::backup(saver.db(), store, &out)?;
    prune(dir, keep)?;
    Ok(out)
}

/// Removes all but the newest `keep` scheduled backups in `dir` (by name, which sorts by time).
fn prune(dir: &Path, keep: usize) -> std::io::Result<()> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(PREFIX) && n.ends_with(EXT))
        })
        .collect();
    files.sort();
    let extra = files.len().saturating_sub(keep);
    for old in files.into_iter().take(extra) {
        std::fs::remove_file(old)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prune_keeps_the_newest_backups_and_nothing_else_is_touched() {
        let dir = tempfile::tempdir().unwrap();
        for ms in [1_u64, 2, 3, 4] {
            let p = dir.path().join(format!("{PREFIX}{ms:013}{EXT}"));
            std::fs::write(p, b"x").unwrap();
        }
        std::fs::write(dir.path().join("notes.txt"), b"x").unwrap();
        prune(dir.path(), 2).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "notes.txt",
                "store-0000000000003.fgb",
                "store-0000000000004.fgb"
            ]
        );
    }
}
