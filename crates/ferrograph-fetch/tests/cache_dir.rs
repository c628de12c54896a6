//! `cache_dir` and `find_repo_root` (one test: it changes the environment).

use ferrograph_fetch::{cache_dir, find_repo_root};
use std::path::PathBuf;

#[test]
fn cache_dir_resolution() {
    std::env::set_var("FERROGRAPH_CACHE_DIR", "/tmp/some-cache");
    assert_eq!(cache_dir(), PathBuf::from("/tmp/some-cache"));

    std::env::remove_var("FERROGRAPH_CACHE_DIR");
    std::env::set_var("FERROGRAPH_HOME", "/opt/ferrograph");
    assert_eq!(find_repo_root(), Some(PathBuf::from("/opt/ferrograph")));
    assert_eq!(
        cache_dir(),
        PathBuf::from("/opt/ferrograph/.cache/ferrograph")
    );

    // Walking up from a folder inside a checkout finds it.
    std::env::remove_var("FERROGRAPH_HOME");
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("models")).unwrap();
    std::fs::write(root.path().join("models/models.toml"), "").unwrap();
    let deep = root.path().join("a/b");
    std::fs::create_dir_all(&deep).unwrap();
    std::env::set_current_dir(&deep).unwrap();
    let found = find_repo_root().unwrap();
    assert_eq!(
        found.canonicalize().unwrap(),
        root.path().canonicalize().unwrap()
    );
    assert_eq!(cache_dir(), found.join(".cache").join("ferrograph"));

    // Outside any checkout: the home cache.
    let elsewhere = tempfile::tempdir().unwrap();
    std::env::set_current_dir(elsewhere.path()).unwrap();
    std::env::set_var("HOME", "/home/someone");
    assert_eq!(
        cache_dir(),
        PathBuf::from("/home/someone/.cache/ferrograph")
    );
}
