//! The fixture brief: a small Python program of our own (word statistics for a support
//! team), with a reference implementation the engineer falls back to, and a vague brief
//! that must end blocked.

use crate::error::TeamError;
use std::path::{Path, PathBuf};

const BRIEF: &str = include_str!("../fixture/wordstats/brief.md");
const REFERENCE: &str = include_str!("../fixture/wordstats/reference/wordstats.py");
const REFERENCE_TESTS: &str = include_str!("../fixture/wordstats/reference/test_wordstats.py");
const VAGUE: &str = include_str!("../fixture/vague.md");

/// Where [`create`] put the briefs.
#[derive(Clone, Debug)]
pub struct Fixture {
    /// The word-statistics brief (a folder with `brief.md` and `reference/`).
    pub brief: PathBuf,
    /// The same brief without the reference implementation (`brief.md` only).
    pub brief_only: PathBuf,
    /// A brief too vague to start.
    pub vague: PathBuf,
}

/// Writes the fixture briefs under `dir`.
pub fn create(dir: &Path) -> Result<Fixture, TeamError> {
    let brief = dir.join("wordstats");
    let write = |p: PathBuf, text: &str| -> Result<(), TeamError> {
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).map_err(|e| TeamError::io(parent, e))?;
        }
        std::fs::write(&p, text).map_err(|e| TeamError::io(&p, e))
    };
    write(brief.join("brief.md"), BRIEF)?;
    write(brief.join("reference").join("wordstats.py"), REFERENCE)?;
    write(
        brief.join("reference").join("test_wordstats.py"),
        REFERENCE_TESTS,
    )?;
    let brief_only = dir.join("wordstats-no-reference.md");
    write(brief_only.clone(), BRIEF)?;
    let vague = dir.join("vague.md");
    write(vague.clone(), VAGUE)?;
    Ok(Fixture {
        brief,
        brief_only,
        vague,
    })
}
