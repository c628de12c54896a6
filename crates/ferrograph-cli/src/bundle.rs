//! `ferrograph bundle`: make, check and install air-gapped bundles.

use crate::print;
use anyhow::{Context, Result};
use clap::Subcommand;
use std::path::PathBuf;

/// The `bundle` subcommands.
#[derive(Subcommand, Debug)]
pub enum BundleCommand {
    /// Writes one archive for a machine with no registry: this binary, the chosen models
    /// (sha256-checked), licence files and a manifest with the sha256 of everything.
    Create {
        /// Models to include, comma-separated or repeated (default: the required ones and
        /// the models the workflows' evaluations chose; see `ferrograph models list`). Each
        /// must be fetched first.
        #[arg(long, value_delimiter = ',')]
        models: Vec<String>,
        /// The archive to write (`.tar.gz`).
        #[arg(long)]
        out: PathBuf,
        /// Leave out the third-party crate list and licence texts.
        #[arg(long)]
        no_third_party: bool,
    },
    /// Reads a bundle and checks every file against its manifest, writing nothing; says
    /// whether its binary runs on this machine.
    Verify {
        /// The bundle.
        file: PathBuf,
    },
    /// Verifies a bundle and installs it: `<prefix>/bin/ferrograph`, `<prefix>/models`,
    /// `<prefix>/licenses`. Needs no network. The installed binary finds its models beside it.
    Install {
        /// The bundle.
        file: PathBuf,
        /// Install folder [default: $XDG_DATA_HOME/ferrograph/install, or
        /// ~/.local/share/ferrograph/install].
        #[arg(long)]
        prefix: Option<PathBuf>,
    },
}

/// Runs a `bundle` subcommand.
pub fn run(what: BundleCommand) -> Result<()> {
    match what {
        BundleCommand::Create {
            models,
            out,
            no_third_party,
        } => {
            let models = if models.is_empty() {
                // The required models and those the workflows' evaluations chose, so that an
                // installed bundle runs each workflow on its chosen model.
                let manifest = ferrograph_llm::manifest::Manifest::default_manifest()?;
                let mut names: Vec<String> = manifest
                    .models
                    .iter()
                    .filter(|m| m.required)
                    .map(|m| m.name.clone())
                    .collect();
                for d in &manifest.workflow_defaults {
                    if !names.contains(&d.model) {
                        names.push(d.model.clone());
                    }
                }
                names
            } else {
                models
            };
            let mut options = ferrograph_bundle::CreateOptions::new(models, out);
            options.third_party = !no_third_party;
            let made = ferrograph_bundle::create(&options)?;
            print::line(format!(
                "wrote {} ({:.1} MiB): {} files ({:.1} MiB) for {}{}, models: {}",
                made.path.display(),
                made.archive_bytes as f64 / 1048576.0,
                made.files,
                made.bytes as f64 / 1048576.0,
                made.manifest.platform.label(),
                cpu_note(&made.manifest.platform),
                made.manifest.models.join(", ")
            ));
            print::line(format!(
                "on the other machine: ferrograph bundle install {}",
                made.path.display()
            ));
        }
        BundleCommand::Verify { file } => {
            let checked = ferrograph_bundle::verify(&file)?;
            let m = &checked.manifest;
            print::line(format!(
                "{}: ok, {} files ({:.1} MiB) match the manifest; ferrograph {} for {}{}; models: {}",
                file.display(),
                m.files.len(),
                m.total_bytes() as f64 / 1048576.0,
                m.ferrograph_version,
                m.platform.label(),
                cpu_note(&m.platform),
                m.models.join(", ")
            ));
            if !checked.runs_here {
                anyhow::bail!(
                    "its binary does not run on this machine ({}-{}{})",
                    std::env::consts::ARCH,
                    std::env::consts::OS,
                    match m.platform.missing_cpu_features() {
                        missing if missing.is_empty() => String::new(),
                        missing => format!("; this CPU lacks {}", missing.join(", ")),
                    }
                );
            }
        }
        BundleCommand::Install { file, prefix } => {
            let prefix = match prefix {
                Some(p) => p,
                None => default_prefix().context("no --prefix and no home folder to default to")?,
            };
            let done = ferrograph_bundle::install(&file, &prefix)?;
            print::line(format!(
                "installed {} files ({:.1} MiB) into {}; models: {}",
                done.files,
                done.bytes as f64 / 1048576.0,
                done.prefix.display(),
                done.manifest.models.join(", ")
            ));
            print::line(format!(
                "run {} (or add {} to PATH)",
                done.binary.display(),
                done.prefix.join("bin").display()
            ));
        }
    }
    Ok(())
}

/// ` (CPU features: ...)` when the binary assumes features beyond the baseline.
fn cpu_note(p: &ferrograph_bundle::Platform) -> String {
    if p.cpu_features.is_empty() {
        String::new()
    } else {
        format!(" (CPU features: {})", p.cpu_features.join(" "))
    }
}

/// `$XDG_DATA_HOME/ferrograph/install`, else `~/.local/share/ferrograph/install`.
fn default_prefix() -> Option<PathBuf> {
    let non_empty = |v: &str| {
        std::env::var_os(v)
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
    };
    non_empty("XDG_DATA_HOME")
        .or_else(|| non_empty("HOME").map(|h| h.join(".local").join("share")))
        .map(|d| d.join("ferrograph").join("install"))
}
