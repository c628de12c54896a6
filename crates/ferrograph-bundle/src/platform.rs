//! The platform a binary was built for: architecture, operating system, and the CPU features
//! the compiler was allowed to use (`-C target-cpu=native` turns on every feature of the build
//! machine, and such a binary dies of an illegal instruction on an older CPU).

use serde::{Deserialize, Serialize};

/// Architecture, operating system and compiled-in CPU features of a binary.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    /// `std::env::consts::ARCH` of the build (`x86_64`, `aarch64`, ...).
    pub arch: String,
    /// `std::env::consts::OS` of the build (`linux`, `macos`, ...).
    pub os: String,
    /// CPU features the build was compiled to assume (beyond the architecture's baseline),
    /// as rustc names them.
    pub cpu_features: Vec<String>,
}

/// Calls `$m!` with the x86-64 features a bundle records and checks, in one list for both.
macro_rules! with_x86_features {
    ($m:ident $(, $arg:expr)?) => {
        $m!($($arg,)? "sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "avx", "avx2", "fma", "f16c",
            "bmi1", "bmi2", "lzcnt", "movbe", "avx512f", "avx512bw", "avx512vl", "avx512dq",
            "avx512cd", "avx512vnni", "avx512bf16", "avxvnni")
    };
}

/// Lists the named target features that this build was compiled with.
macro_rules! compiled_features {
    ($($name:tt),* $(,)?) => {{
        let mut out: Vec<String> = Vec::new();
        $( if cfg!(target_feature = $name) { out.push($name.to_string()); } )*
        out
    }};
}

/// Whether the running CPU has feature `$f` (one of the names listed), `None` for a name this
/// build cannot ask about.
#[cfg(target_arch = "x86_64")]
macro_rules! detect_x86 {
    ($f:expr, $($name:tt),* $(,)?) => {
        match $f {
            $( $name => Some(std::arch::is_x86_feature_detected!($name)), )*
            _ => None,
        }
    };
}

/// Lists the named features among `wanted` that the running CPU lacks.
#[cfg(target_arch = "x86_64")]
fn missing_on_this_cpu(wanted: &[String]) -> Vec<String> {
    wanted
        .iter()
        // A feature this build cannot ask about is taken as missing: refusing is safer than
        // a crash.
        .filter(|f| with_x86_features!(detect_x86, f.as_str()) != Some(true))
        .cloned()
        .collect()
}

/// Lists the named features among `wanted` that the running CPU lacks.
#[cfg(target_arch = "aarch64")]
fn missing_on_this_cpu(wanted: &[String]) -> Vec<String> {
    wanted
        .iter()
        .filter(|f| {
            let found = match f.as_str() {
                "neon" => Some(std::arch::is_aarch64_feature_detected!("neon")),
                "dotprod" => Some(std::arch::is_aarch64_feature_detected!("dotprod")),
                "fp16" => Some(std::arch::is_aarch64_feature_detected!("fp16")),
                "i8mm" => Some(std::arch::is_aarch64_feature_detected!("i8mm")),
                _ => None,
            };
            found != Some(true)
        })
        .cloned()
        .collect()
}

/// Lists the named features among `wanted` that the running CPU lacks.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn missing_on_this_cpu(wanted: &[String]) -> Vec<String> {
    wanted.to_vec()
}

impl Platform {
    /// The platform of the running binary, as it was compiled.
    pub fn of_this_build() -> Self {
        #[cfg(target_arch = "x86_64")]
        let cpu_features = with_x86_features!(compiled_features);
        #[cfg(target_arch = "aarch64")]
        let cpu_features = compiled_features!("dotprod", "fp16", "i8mm");
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        let cpu_features: Vec<String> = Vec::new();
        Self {
            arch: std::env::consts::ARCH.to_string(),
            os: std::env::consts::OS.to_string(),
            cpu_features,
        }
    }

    /// `arch-os`, as shown to people.
    pub fn label(&self) -> String {
        format!("{}-{}", self.arch, self.os)
    }

    /// Whether a binary built for `self` is for the same architecture and operating system as
    /// the running one.
    pub fn same_target_as_this_machine(&self) -> bool {
        self.arch == std::env::consts::ARCH && self.os == std::env::consts::OS
    }

    /// The features of `self` that the running CPU does not have.
    pub fn missing_cpu_features(&self) -> Vec<String> {
        missing_on_this_cpu(&self.cpu_features)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_build_runs_on_this_cpu() {
        let p = Platform::of_this_build();
        assert!(p.same_target_as_this_machine());
        assert!(p.missing_cpu_features().is_empty(), "{p:?}");
    }

    #[test]
    fn unknown_features_count_as_missing() {
        let p = Platform {
            arch: std::env::consts::ARCH.into(),
            os: std::env::consts::OS.into(),
            cpu_features: vec!["no-such-feature".into()],
        };
        assert_eq!(
            p.missing_cpu_features(),
            vec!["no-such-feature".to_string()]
        );
    }
}
