//! Identifiers: random ids for messages and checkpoints, stable hashes for tasks and interrupts.

use rand::RngCore;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

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
    format!("{stamp:016x}{tail:08x}")
}

/// A stable 128-bit hash of the given parts, as 32 hex characters. Stable across processes and
/// builds (FNV-1a over the parts with separators), so a resumed run computes the same task and
/// interrupt ids as the run that was stopped.
pub fn stable_hash(parts: &[&[u8]]) -> String {
    const OFFSET_A: u64 = 0xcbf2_9ce4_8422_2325;
    const OFFSET_B: u64 = 0x84222325_cbf29ce4;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut a = OFFSET_A;
    let mut b = OFFSET_B;
    for part in parts {
        for &byte in part.iter().chain(std::iter::once(&0xffu8)) {
            a ^= u64::from(byte);
            a = a.wrapping_mul(PRIME);
            b ^= u64::from(byte.rotate_left(3));
            b = b.wrapping_mul(PRIME).rotate_left(5);
        }
    }
    format!("{a:016x}{b:016x}")
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
    fn ordered_ids_increase() {
        let mut prev = ordered_id();
        for _ in 0..1000 {
            let next = ordered_id();
            assert!(next > prev, "{next} <= {prev}");
            prev = next;
        }
    }

    #[test]
    fn stable_hash_is_stable_and_separates_parts() {
        assert_eq!(stable_hash(&[b"ab", b"c"]), stable_hash(&[b"ab", b"c"]));
        assert_ne!(stable_hash(&[b"ab", b"c"]), stable_hash(&[b"a", b"bc"]));
        assert_eq!(stable_hash(&[b"x"]).len(), 32);
        assert_eq!(random_id().len(), 32);
    }
}
