//! State schema migrations: registered upgrade steps from schema version N to N+1, applied when
//! a checkpoint written by an older version of a state type is loaded.
//!
//! ```ignore
//! // Version 1 had `title`; version 2 renamed it to `subject` and added `priority`.
//! Migrations::<TicketV2>::new()
//!     .step::<TicketV1, TicketV2>(
//!         |old| TicketV2 { subject: old.title, priority: 0 },
//!         |u| TicketV2Update { subject: u.title, priority: None },
//!     )
//!     .install()?;
//! ```
//!
//! Each step converts whole states (full snapshots, `SendTo` payloads) and updates (deltas,
//! pending outputs). Payloads are rewritten in memory as they are read; stored records keep
//! their version until they are written again (for example by `prune`).

use crate::checkpoint::{
    encode, migrate_frame_body, migrate_output_body, migrate_subgraph_body, open, CodecError,
};
use crate::state::State;
use parking_lot::RwLock;
use std::any::TypeId;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};

/// What kind of payload is being upgraded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Payload {
    /// A checkpoint's frame body.
    Frame,
    /// A pending write's task output.
    Output,
    /// An interrupted subgraph.
    Subgraph,
}

type Transform = Arc<dyn Fn(Payload, &[u8]) -> Result<Vec<u8>, CodecError> + Send + Sync>;

/// The installed steps of one state type: (from, to, transform).
type Chain = Vec<(u32, u32, Transform)>;

/// Installed chains by state type.
type Registry = RwLock<HashMap<TypeId, Chain>>;

struct Step {
    from: u32,
    to: u32,
    transform: Transform,
}

/// Why a migration chain was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MigrationError {
    /// A step does not go from N to N+1.
    #[error("a migration step must go from version N to N+1, not {from} to {to}")]
    NotConsecutive {
        /// From version.
        from: u32,
        /// To version.
        to: u32,
    },
    /// The chain does not end at the state's current schema version.
    #[error("the migration chain ends at version {end}, but the state is at version {current}")]
    WrongEnd {
        /// Last version of the chain.
        end: u32,
        /// The state's version.
        current: u32,
    },
}

/// The upgrade chain of state type `S`, built step by step and installed once.
pub struct Migrations<S: State> {
    steps: Vec<Step>,
    _state: PhantomData<fn() -> S>,
}

impl<S: State> Default for Migrations<S> {
    fn default() -> Self {
        Migrations {
            steps: Vec::new(),
            _state: PhantomData,
        }
    }
}

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| RwLock::new(HashMap::new()))
}

impl<S: State> Migrations<S> {
    /// An empty chain.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the step from `Old` (schema version N) to `New` (version N+1).
    #[must_use]
    pub fn step<Old: State, New: State>(
        mut self,
        state: fn(Old) -> New,
        update: fn(Old::Update) -> New::Update,
    ) -> Self {
        let transform: Transform = Arc::new(move |kind, body: &[u8]| match kind {
            Payload::Frame => migrate_frame_body::<Old, New>(body, state, update),
            Payload::Output => migrate_output_body::<Old, New>(body, state, update),
            Payload::Subgraph => migrate_subgraph_body::<Old, New>(body, state, update),
        });
        self.steps.push(Step {
            from: Old::SCHEMA_VERSION,
            to: New::SCHEMA_VERSION,
            transform,
        });
        self
    }

    /// Checks the chain and makes it apply to every load of `S` in this process.
    pub fn install(self) -> Result<(), MigrationError> {
        for s in &self.steps {
            if s.to != s.from + 1 {
                return Err(MigrationError::NotConsecutive {
                    from: s.from,
                    to: s.to,
                });
            }
        }
        if let Some(last) = self.steps.iter().map(|s| s.to).max() {
            if last != S::SCHEMA_VERSION {
                return Err(MigrationError::WrongEnd {
                    end: last,
                    current: S::SCHEMA_VERSION,
                });
            }
        }
        let steps = self
            .steps
            .into_iter()
            .map(|s| (s.from, s.to, s.transform))
            .collect();
        registry().write().insert(TypeId::of::<S>(), steps);
        Ok(())
    }
}

/// Brings a sealed payload of `S` written at any registered older version up to
/// `S::SCHEMA_VERSION`. Payloads already current are returned unchanged (borrowed).
pub(crate) fn upgrade<'a, S: State>(
    kind: Payload,
    bytes: &'a [u8],
) -> Result<std::borrow::Cow<'a, [u8]>, CodecError> {
    let (mut version, _) = open(bytes)?;
    if version == S::SCHEMA_VERSION {
        return Ok(std::borrow::Cow::Borrowed(bytes));
    }
    let mismatch = CodecError::SchemaMismatch {
        found: version,
        expected: S::SCHEMA_VERSION,
    };
    if version > S::SCHEMA_VERSION {
        return Err(mismatch);
    }
    let steps = registry().read().get(&TypeId::of::<S>()).cloned();
    let Some(steps) = steps else {
        return Err(mismatch);
    };
    let mut current: Vec<u8> = bytes.to_vec();
    while version < S::SCHEMA_VERSION {
        let Some((_, to, transform)) = steps.iter().find(|(from, _, _)| *from == version) else {
            return Err(mismatch);
        };
        let (_, body) = open(&current)?;
        current = transform(kind, body)?;
        version = *to;
    }
    Ok(std::borrow::Cow::Owned(current))
}

/// Seals `value` at version `New::SCHEMA_VERSION` (used by the step transforms).
pub(crate) fn reseal<New: State, T: serde::Serialize>(value: &T) -> Result<Vec<u8>, CodecError> {
    encode(New::SCHEMA_VERSION, value)
}
