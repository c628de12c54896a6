//! Identifiers: random ids for messages and checkpoints, stable hashes for tasks and interrupts.

use rand::RngCore;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Longest thread id, in bytes.
pub const MAX_THREAD_ID: usize = 128;

/// A thread id (or another caller-chosen id used as a key or a path component) that breaks
/// the rule of [`check_thread_id`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid id `{shown}`: {reason}")]
pub struct InvalidId {
    /// The id, escaped and shortened for messages.
    pub shown: String,
    /// Which part of the rule it breaks.
    pub reason: &'static str,
}

/// The one rule for caller-chosen ids, on every surface (HTTP, CLI, the runtime): 1 to
/// [`MAX_THREAD_ID`] bytes of `A-Z a-z 0-9 - _ . :`, not starting with a dot. Ids become path
/// components (a run's output folder) and key prefixes, so `.`, `..`, `/` and hidden names are
/// out, and since no id contains `/`, `id/` is never a prefix of another id's keys.
pub fn check_thread_id(id: &str) -> Result<(), InvalidId> {
    let reason = if id.is_empty() {
        Some("it is empty")
    } else if id.len() > MAX_THREAD_ID {
        Some("it is longer than 128 bytes")
    } else if id.starts_with('.') {
        Some("it starts with a dot")
    } else if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
    {
        Some("only A-Z a-z 0-9 - _ . : are allowed")
    } else {
        None
    };
    match reason {
        None => Ok(()),
        Some(reason) => Err(InvalidId {
            shown: id.chars().take(64).flat_map(char::escape_debug).collect(),
            reason,
        }),
    }
}

/// A fresh random identifier: 32 lowercase hex characters.
pub fn random_id() -> String {
    let mut bytes = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut bytes);
    hex(&bytes)
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

static LAST_ORDERED: AtomicU64 = AtomicU64::new(0);

/// A time-ordered identifier: 16 hex digits of a strictly increasing microsecond stamp followed
/// by 8 random hex digits. Identifiers made later in this process always sort after earlier ones,
/// so checkpoint ids order like their creation.
pub fn ordered_id() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0);
    let mut prev = LAST_ORDERED.load(Ordering::Relaxed);
    let stamp = loop {
        let next = now.max(prev + 1);
        match LAST_ORDERED.compare_exchange_weak(prev, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => break next,
            Err(actual) => prev = actual,
        }
    };
    let tail = rand::thread_rng().next_u32();
    let mut out = String::with_capacity(24);
    push_hex_u64(&mut out, stamp);
    for shift in (0..8).rev() {
        out.push(b"0123456789abcdef"[((tail >> (shift * 4)) & 0xf) as usize] as char);
    }
    out
}

/// A stable 128-bit hash of the given parts, as 32 hex characters. Stable across processes,
/// builds and platforms (little-endian 8-byte words, fixed constants), so a resumed run computes
/// the same task and interrupt ids as the run that was stopped.
pub fn stable_hash(parts: &[&[u8]]) -> String {
    const K1: u64 = 0x9e37_79b9_7f4a_7c15;
    const K2: u64 = 0xc2b2_ae3d_27d4_eb4f;
    const M: u64 = 0xff51_afd7_ed55_8ccd;
    fn mix(h: u64, w: u64, k: u64) -> u64 {
        (h ^ w.wrapping_mul(k)).rotate_left(31).wrapping_mul(M) ^ (h >> 29)
    }
    let mut a: u64 = 0x243f_6a88_85a3_08d3;
    let mut b: u64 = 0x1319_8a2e_0370_7344;
    for part in parts {
        let mut chunks = part.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            let w = u64::from_le_bytes(w);
            a = mix(a, w, K1);
            b = mix(b, w, K2);
        }
        let rest = chunks.remainder();
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        // Length and a separator, so that part boundaries matter.
        let tail = u64::from_le_bytes(w) ^ ((part.len() as u64) << 56) ^ 0xff;
        a = mix(a, tail, K2);
        b = mix(b, tail, K1);
    }
    a ^= b.rotate_left(17);
    b ^= a.rotate_left(41);
    let mut out = String::with_capacity(32);
    push_hex_u64(&mut out, a.wrapping_mul(K2));
    push_hex_u64(&mut out, b.wrapping_mul(K1));
    out
}

fn push_hex_u64(out: &mut String, v: u64) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for shift in (0..16).rev() {
        out.push(DIGITS[((v >> (shift * 4)) & 0xf) as usize] as char);
    }
}

/// A fast, non-cryptographic hasher (FNV-1a) for small maps keyed by node names.
#[derive(Clone, Copy, Debug, Default)]
pub struct FnvBuildHasher;

/// The hasher built by [`FnvBuildHasher`].
#[derive(Clone, Copy, Debug)]
pub struct FnvHasher(u64);

impl std::hash::BuildHasher for FnvBuildHasher {
    type Hasher = FnvHasher;
    fn build_hasher(&self) -> FnvHasher {
        FnvHasher(0xcbf2_9ce4_8422_2325)
    }
}

impl std::hash::Hasher for FnvHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 0xf) as usize] as char);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_ids_follow_one_rule() {
        for ok in ["w1", "job-0", "a.b", "ns:thread_9", &"x".repeat(128)] {
            assert_eq!(check_thread_id(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "a/b",
            "../x",
            "a b",
            "a\0b",
            "é",
            &"x".repeat(129),
        ] {
            assert!(check_thread_id(bad).is_err(), "{bad}");
        }
        let e = check_thread_id("a\nb/..").unwrap_err().to_string();
        assert!(e.contains("only A-Z"), "{e}");
    }

    const GOLDEN: &str = "b07189e925272fbc7edb95719334a401";

    #[test]
    fn ordered_ids_increase() {
        let mut prev = ordered_id();
        for _ in 0..1000 {
            let next = ordered_id();
            assert!(next > prev, "{next} <= {prev}");
            prev = next;
        }
    }

    #[test]
    fn stable_hash_has_no_collisions_on_similar_inputs() {
        let mut seen = std::collections::HashSet::new();
        for i in 0..20_000 {
            let ns = format!("sub:{i:032x}");
            assert!(seen.insert(stable_hash(&[ns.as_bytes(), b"task", b"0"])));
        }
        // Ids written by earlier builds must stay valid: the value is pinned.
        assert_eq!(stable_hash(&[b"abc", b"def"]), GOLDEN);
    }

    #[test]
    fn stable_hash_is_stable_and_separates_parts() {
        assert_eq!(stable_hash(&[b"ab", b"c"]), stable_hash(&[b"ab", b"c"]));
        assert_ne!(stable_hash(&[b"ab", b"c"]), stable_hash(&[b"a", b"bc"]));
        assert_eq!(stable_hash(&[b"x"]).len(), 32);
        assert_eq!(random_id().len(), 32);
    }
}
