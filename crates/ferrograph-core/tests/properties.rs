//! Property tests of the core: the messages merge rule against a reference model, and the
//! checkpoint envelope under corruption.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use ferrograph_core::checkpoint::{decode, encode, open, CodecError};
use ferrograph_core::message::{Message, MessageOp, MessagesUpdate};
use ferrograph_core::state::{Messages, Reducer};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Upsert(u8, u16),
    Remove(u8),
    Clear,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..12, any::<u16>()).prop_map(|(id, v)| Op::Upsert(id, v)),
        3 => (0u8..12).prop_map(Op::Remove),
        1 => Just(Op::Clear),
    ]
}

proptest! {
    /// The messages rule behaves like an ordered map keyed by id: upserts replace in place or
    /// append, removals of present ids delete, removals of absent ids are errors that leave the
    /// list as it was before the whole update.
    #[test]
    fn messages_rule_matches_reference_model(batches in proptest::collection::vec(proptest::collection::vec(op(), 1..6), 1..20)) {
        let mut list: Vec<Message> = Vec::new();
        let mut model: Vec<(String, String)> = Vec::new();
        for batch in batches {
            let mut next_model = model.clone();
            let mut ok = true;
            for o in &batch {
                match o {
                    Op::Upsert(id, v) => {
                        let id = format!("m{id}");
                        match next_model.iter().rposition(|(k, _)| *k == id) {
                            Some(p) => next_model[p].1 = v.to_string(),
                            None => next_model.push((id, v.to_string())),
                        }
                    }
                    Op::Remove(id) => {
                        let id = format!("m{id}");
                        match next_model.iter().rposition(|(k, _)| *k == id) {
                            Some(p) => { next_model.remove(p); }
                            None => { ok = false; break; }
                        }
                    }
                    Op::Clear => next_model.clear(),
                }
            }
            let update = MessagesUpdate(batch.iter().map(|o| match o {
                Op::Upsert(id, v) => MessageOp::from(Message::human(v.to_string()).with_id(format!("m{id}"))),
                Op::Remove(id) => MessageOp::remove(format!("m{id}")),
                Op::Clear => MessageOp::RemoveAll,
            }).collect());
            let mut attempt = list.clone();
            let result = Messages::reduce(&mut attempt, update);
            prop_assert_eq!(result.is_ok(), ok);
            if ok {
                list = attempt;
                model = next_model;
            }
            let got: Vec<(String, String)> = list.iter().map(|m| (m.id.clone(), m.content.clone())).collect();
            prop_assert_eq!(&got, &model);
        }
    }

    /// Any damage to a sealed record is detected as a typed error, never a panic or a wrong value.
    #[test]
    fn corrupted_envelopes_are_typed_errors(value in proptest::collection::vec(any::<u32>(), 0..40), flip in any::<usize>(), bit in 0u8..8, cut in any::<usize>()) {
        let bytes = encode(4, &value).unwrap();
        prop_assert_eq!(decode::<Vec<u32>>(4, &bytes).unwrap(), value.clone());
        let mut damaged = bytes.clone();
        let i = flip % damaged.len();
        damaged[i] ^= 1 << bit;
        match decode::<Vec<u32>>(4, &damaged) {
            Ok(v) => prop_assert!(false, "damage at byte {} went unnoticed: {:?}", i, v),
            Err(e) => {
                let typed = matches!(
                    e,
                    CodecError::Checksum { .. }
                        | CodecError::BadMagic
                        | CodecError::UnsupportedFormat(_)
                        | CodecError::SchemaMismatch { .. }
                        | CodecError::Truncated { .. }
                );
                prop_assert!(typed, "unexpected error {:?}", e);
            }
        }
        let cut = cut % bytes.len();
        prop_assert!(open(&bytes[..cut]).is_err());
    }
}
