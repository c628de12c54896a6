//! Encrypted checkpoints: a saver that encrypts what it hands to another saver.
//!
//! [`EncryptedSaver`] wraps any [`CheckpointSaver`]. It encrypts with XChaCha20-Poly1305 (the
//! RustCrypto `chacha20poly1305` crate; a random 192-bit nonce per record, so nonces never need
//! coordinating) everything that holds the graph's data: checkpoint payloads (the state and the
//! updates), every pending write (task outputs, interrupt values, resume answers, errors,
//! subgraph states) and the interrupts and error text of thread records. Ids, step numbers,
//! times, node names, statuses and thread metadata stay in the clear: they are what listing and
//! maintenance need, and they hold no state.
//!
//! Each sealed value names the record it belongs to in its associated data (thread, record
//! kind, checkpoint, task), so a ciphertext moved onto another record fails authentication
//! instead of decrypting into the wrong place. Each also carries an 8-byte id of the key it was
//! sealed with, so that a wrong key is reported as [`DecryptError::WrongKey`] rather than as
//! damage; a record stored in the clear is [`DecryptError::NotEncrypted`]. Nothing is ever
//! returned undecrypted.

use async_trait::async_trait;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::XChaCha20Poly1305;
use ferrograph_core::checkpoint::{
    decode, encode, CheckpointError, CheckpointRecord, CheckpointSaver, DecryptError, PendingKind,
    PendingWrite, ThreadInfo, ThreadStatus,
};
use ferrograph_core::Interrupt;
use sha2::{Digest, Sha256};
use std::fmt;
use std::sync::Arc;

/// The environment variable that holds the key: 64 hexadecimal digits (32 bytes).
pub const KEY_ENV: &str = "FERROGRAPH_CHECKPOINT_KEY";

/// Metadata entry of a thread record that holds its sealed interrupts and error.
pub const SEALED_THREAD_FIELD: &str = "ferrograph.sealed";

const MAGIC: &[u8; 4] = b"FGX1";
const KEY_ID_LEN: usize = 8;
const NONCE_LEN: usize = 24;
const HEADER: usize = MAGIC.len() + KEY_ID_LEN + NONCE_LEN;

/// A key that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// Not 64 hexadecimal digits.
    #[error("{KEY_ENV} must be 64 hexadecimal digits (32 bytes), e.g. from `ferrograph store keygen` or `openssl rand -hex 32`; it has {found} characters{detail}")]
    Malformed {
        /// Characters found.
        found: usize,
        /// What else is wrong.
        detail: &'static str,
    },
}

/// A 256-bit checkpoint key.
#[derive(Clone)]
pub struct CheckpointKey {
    cipher: XChaCha20Poly1305,
    id: [u8; KEY_ID_LEN],
}

impl fmt::Debug for CheckpointKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key itself.
        f.debug_struct("CheckpointKey")
            .field("id", &hex(&self.id))
            .finish()
    }
}

impl CheckpointKey {
    /// A key from 32 bytes.
    pub fn from_bytes(bytes: &[u8; 32]) -> Self {
        let digest = Sha256::new()
            .chain_update(b"ferrograph checkpoint key id\0")
            .chain_update(bytes)
            .finalize();
        let mut id = [0u8; KEY_ID_LEN];
        id.copy_from_slice(&digest[..KEY_ID_LEN]);
        CheckpointKey {
            cipher: XChaCha20Poly1305::new(bytes.into()),
            id,
        }
    }

    /// A key from 64 hexadecimal digits (surrounding whitespace ignored).
    pub fn from_hex(text: &str) -> Result<Self, KeyError> {
        let text = text.trim();
        let malformed = |detail| KeyError::Malformed {
            found: text.chars().count(),
            detail,
        };
        if text.len() != 64 {
            return Err(malformed(""));
        }
        let bytes: [u8; 32] = unhex(text)
            .and_then(|v| v.try_into().ok())
            .ok_or_else(|| malformed(", not all of them hexadecimal digits"))?;
        Ok(Self::from_bytes(&bytes))
    }

    /// The key in [`KEY_ENV`], if it is set (and not empty).
    pub fn from_env() -> Result<Option<Self>, KeyError> {
        match std::env::var(KEY_ENV) {
            Ok(v) if !v.trim().is_empty() => Self::from_hex(&v).map(Some),
            _ => Ok(None),
        }
    }

    /// A new random key, as 64 hexadecimal digits.
    pub fn generate_hex() -> String {
        hex(&XChaCha20Poly1305::generate_key(&mut OsRng))
    }

    /// The key's public id (8 bytes of a hash of it), as hex.
    pub fn id_hex(&self) -> String {
        hex(&self.id)
    }

    fn seal(&self, aad: &[u8], plaintext: &[u8]) -> Result<Vec<u8>, CheckpointError> {
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let sealed = self
            .cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: plaintext,
                    aad,
                },
            )
            .map_err(|_| CheckpointError::Backend {
                message: "encryption failed".into(),
                source: None,
            })?;
        let mut out = Vec::with_capacity(HEADER + sealed.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.id);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    fn open(&self, aad: &[u8], bytes: &[u8]) -> Result<Vec<u8>, DecryptError> {
        if bytes.len() < HEADER || &bytes[..MAGIC.len()] != MAGIC {
            return Err(DecryptError::NotEncrypted);
        }
        let (id, rest) = bytes[MAGIC.len()..].split_at(KEY_ID_LEN);
        if id != self.id {
            return Err(DecryptError::WrongKey);
        }
        let (nonce, sealed) = rest.split_at(NONCE_LEN);
        self.cipher
            .decrypt(nonce.into(), Payload { msg: sealed, aad })
            .map_err(|_| DecryptError::Tampered)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    text.as_bytes()
        .chunks(2)
        .map(|p| {
            let h = (p[0] as char).to_digit(16)?;
            let l = (p[1] as char).to_digit(16)?;
            Some((h * 16 + l) as u8)
        })
        .collect()
}

/// Associated data: what record a sealed value belongs to.
fn aad(kind: &str, thread: &str, parts: &[&str]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    for p in [kind, thread].iter().chain(parts) {
        out.extend_from_slice(&(p.len() as u64).to_le_bytes());
        out.extend_from_slice(p.as_bytes());
    }
    out
}

/// The part of a thread record that is sealed.
#[derive(serde::Serialize, serde::Deserialize)]
struct SealedThread {
    error: Option<String>,
    interrupts: Vec<Interrupt>,
}

/// A saver that encrypts what it stores in `inner` (see the module docs).
pub struct EncryptedSaver {
    inner: Arc<dyn CheckpointSaver>,
    key: CheckpointKey,
}

impl fmt::Debug for EncryptedSaver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EncryptedSaver")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl EncryptedSaver {
    /// Encrypts what is stored in `inner` with `key`.
    pub fn new(inner: Arc<dyn CheckpointSaver>, key: CheckpointKey) -> Self {
        EncryptedSaver { inner, key }
    }

    /// `inner` wrapped in an encrypting saver when [`KEY_ENV`] holds a key, as it is otherwise.
    pub fn from_env(inner: Arc<dyn CheckpointSaver>) -> Result<Arc<dyn CheckpointSaver>, KeyError> {
        Ok(match CheckpointKey::from_env()? {
            Some(key) => Arc::new(EncryptedSaver::new(inner, key)),
            None => inner,
        })
    }

    fn decrypt_err(thread: &str, record: String, reason: DecryptError) -> CheckpointError {
        CheckpointError::Decrypt {
            thread: thread.to_string(),
            record,
            reason,
        }
    }

    fn seal_record(
        &self,
        mut record: CheckpointRecord,
    ) -> Result<CheckpointRecord, CheckpointError> {
        let aad = aad("checkpoint", &record.thread_id, &[&record.checkpoint_id]);
        record.payload = self.key.seal(&aad, &record.payload)?;
        Ok(record)
    }

    fn open_record(
        &self,
        mut record: CheckpointRecord,
    ) -> Result<CheckpointRecord, CheckpointError> {
        let aad = aad("checkpoint", &record.thread_id, &[&record.checkpoint_id]);
        record.payload = self
            .key
            .open(&aad, &record.payload)
            .map_err(|r| Self::decrypt_err(&record.thread_id, record.checkpoint_id.clone(), r))?;
        Ok(record)
    }

    fn seal_write(
        &self,
        thread: &str,
        checkpoint: &str,
        write: PendingWrite,
    ) -> Result<PendingWrite, CheckpointError> {
        let plain = encode(0, &write.kind).map_err(|source| CheckpointError::Corrupt {
            thread: thread.to_string(),
            checkpoint: checkpoint.to_string(),
            source,
        })?;
        let aad = aad("write", thread, &[checkpoint, &write.task_id, &write.node]);
        Ok(PendingWrite {
            kind: PendingKind::Sealed(self.key.seal(&aad, &plain)?),
            ..write
        })
    }

    fn seal_writes(
        &self,
        thread: &str,
        checkpoint: &str,
        writes: Vec<PendingWrite>,
    ) -> Result<Vec<PendingWrite>, CheckpointError> {
        writes
            .into_iter()
            .map(|w| self.seal_write(thread, checkpoint, w))
            .collect()
    }

    fn open_write(
        &self,
        thread: &str,
        checkpoint: &str,
        write: PendingWrite,
    ) -> Result<PendingWrite, CheckpointError> {
        let record = || {
            format!(
                "pending write of task `{}` after `{checkpoint}`",
                write.task_id
            )
        };
        let PendingKind::Sealed(bytes) = &write.kind else {
            return Err(Self::decrypt_err(
                thread,
                record(),
                DecryptError::NotEncrypted,
            ));
        };
        let aad = aad("write", thread, &[checkpoint, &write.task_id, &write.node]);
        let plain = self
            .key
            .open(&aad, bytes)
            .map_err(|r| Self::decrypt_err(thread, record(), r))?;
        let kind: PendingKind = decode(0, &plain).map_err(|source| CheckpointError::Corrupt {
            thread: thread.to_string(),
            checkpoint: checkpoint.to_string(),
            source,
        })?;
        Ok(PendingWrite { kind, ..write })
    }

    fn seal_thread(&self, mut info: ThreadInfo) -> Result<ThreadInfo, CheckpointError> {
        let secret = SealedThread {
            error: info.error.take(),
            interrupts: std::mem::take(&mut info.interrupts),
        };
        let plain = encode(0, &secret).map_err(|source| CheckpointError::Corrupt {
            thread: info.thread_id.clone(),
            checkpoint: "thread record".into(),
            source,
        })?;
        let aad = aad("thread", &info.thread_id, &[]);
        let sealed = self.key.seal(&aad, &plain)?;
        info.metadata
            .insert(SEALED_THREAD_FIELD.to_string(), hex(&sealed));
        Ok(info)
    }

    fn open_thread(&self, mut info: ThreadInfo) -> Result<ThreadInfo, CheckpointError> {
        let fail = |info: &ThreadInfo, r| {
            Self::decrypt_err(&info.thread_id, "thread record".to_string(), r)
        };
        let Some(sealed) = info.metadata.remove(SEALED_THREAD_FIELD) else {
            return Err(fail(&info, DecryptError::NotEncrypted));
        };
        let bytes = unhex(&sealed).ok_or_else(|| fail(&info, DecryptError::Tampered))?;
        let aad = aad("thread", &info.thread_id, &[]);
        let plain = self.key.open(&aad, &bytes).map_err(|r| fail(&info, r))?;
        let secret: SealedThread =
            decode(0, &plain).map_err(|source| CheckpointError::Corrupt {
                thread: info.thread_id.clone(),
                checkpoint: "thread record".into(),
                source,
            })?;
        info.error = secret.error;
        info.interrupts = secret.interrupts;
        Ok(info)
    }
}

#[async_trait]
impl CheckpointSaver for EncryptedSaver {
    async fn put(&self, record: CheckpointRecord) -> Result<(), CheckpointError> {
        self.inner.put(self.seal_record(record)?).await
    }

    async fn put_writes(
        &self,
        thread_id: &str,
        checkpoint_id: &str,
        writes: Vec<PendingWrite>,
    ) -> Result<(), CheckpointError> {
        let sealed = self.seal_writes(thread_id, checkpoint_id, writes)?;
        self.inner
            .put_writes(thread_id, checkpoint_id, sealed)
            .await
    }

    async fn get(
        &self,
        thread_id: &str,
        checkpoint_id: Option<&str>,
    ) -> Result<Option<CheckpointRecord>, CheckpointError> {
        match self.inner.get(thread_id, checkpoint_id).await? {
            Some(r) => Ok(Some(self.open_record(r)?)),
            None => Ok(None),
        }
    }

    async fn get_writes(
        &self,
        thread_id: &str,
        checkpoint_id: &str,
    ) -> Result<Vec<PendingWrite>, CheckpointError> {
        self.inner
            .get_writes(thread_id, checkpoint_id)
            .await?
            .into_iter()
            .map(|w| self.open_write(thread_id, checkpoint_id, w))
            .collect()
    }

    async fn list(
        &self,
        thread_id: &str,
        before: Option<&str>,
        limit: Option<usize>,
    ) -> Result<Vec<CheckpointRecord>, CheckpointError> {
        self.inner
            .list(thread_id, before, limit)
            .await?
            .into_iter()
            .map(|r| self.open_record(r))
            .collect()
    }

    async fn put_thread(&self, info: ThreadInfo) -> Result<(), CheckpointError> {
        self.inner.put_thread(self.seal_thread(info)?).await
    }

    async fn put_writes_and_thread(
        &self,
        thread_id: &str,
        checkpoint_id: &str,
        writes: Vec<PendingWrite>,
        info: ThreadInfo,
    ) -> Result<(), CheckpointError> {
        let sealed = self.seal_writes(thread_id, checkpoint_id, writes)?;
        let info = self.seal_thread(info)?;
        self.inner
            .put_writes_and_thread(thread_id, checkpoint_id, sealed, info)
            .await
    }

    async fn get_thread(&self, thread_id: &str) -> Result<Option<ThreadInfo>, CheckpointError> {
        match self.inner.get_thread(thread_id).await? {
            Some(info) => Ok(Some(self.open_thread(info)?)),
            None => Ok(None),
        }
    }

    async fn list_threads(
        &self,
        status: Option<ThreadStatus>,
    ) -> Result<Vec<ThreadInfo>, CheckpointError> {
        self.inner
            .list_threads(status)
            .await?
            .into_iter()
            .map(|info| self.open_thread(info))
            .collect()
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<bool, CheckpointError> {
        self.inner.delete_thread(thread_id).await
    }

    async fn delete_before(
        &self,
        thread_id: &str,
        checkpoint_id: &str,
    ) -> Result<usize, CheckpointError> {
        self.inner.delete_before(thread_id, checkpoint_id).await
    }

    async fn flush(&self) -> Result<(), CheckpointError> {
        self.inner.flush().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_parse_and_identify_themselves() {
        let hex_key = CheckpointKey::generate_hex();
        assert_eq!(hex_key.len(), 64);
        let a = CheckpointKey::from_hex(&hex_key).unwrap();
        let b = CheckpointKey::from_hex(&format!(" {hex_key}\n")).unwrap();
        assert_eq!(a.id_hex(), b.id_hex());
        assert!(!format!("{a:?}").contains(&hex_key));
        assert!(matches!(
            CheckpointKey::from_hex("abc"),
            Err(KeyError::Malformed { found: 3, .. })
        ));
        assert!(CheckpointKey::from_hex(&"zz".repeat(32)).is_err());
    }

    #[test]
    fn sealed_values_open_only_with_their_key_and_record() {
        let key = CheckpointKey::from_hex(&"11".repeat(32)).unwrap();
        let other = CheckpointKey::from_hex(&"22".repeat(32)).unwrap();
        let sealed = key.seal(b"record-a", b"secret state").unwrap();
        assert!(!sealed.windows(6).any(|w| w == b"secret"));
        assert_eq!(key.open(b"record-a", &sealed).unwrap(), b"secret state");
        assert_eq!(
            other.open(b"record-a", &sealed),
            Err(DecryptError::WrongKey)
        );
        assert_eq!(key.open(b"record-b", &sealed), Err(DecryptError::Tampered));
        let mut flipped = sealed.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert_eq!(key.open(b"record-a", &flipped), Err(DecryptError::Tampered));
        assert_eq!(
            key.open(b"record-a", b"plain bytes, never sealed"),
            Err(DecryptError::NotEncrypted)
        );
        // Two seals of the same value differ (random nonces).
        assert_ne!(sealed, key.seal(b"record-a", b"secret state").unwrap());
    }
}
