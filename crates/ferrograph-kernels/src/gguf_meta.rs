//! The workspace's one reader of GGUF metadata values: the decoder's shapes, the engine's
//! architecture and context length, the tokenizer's vocabulary all go through it. Numbers are
//! accepted in any integer or float width a writer may have chosen (llama.cpp's converters
//! and others differ), matched by variant (candle's `to_*` accessors build an error, with a
//! backtrace when `RUST_BACKTRACE` is set, for every mismatch: seconds on a 262k vocabulary).

use candle_core::quantized::gguf_file::{Content, Value};

/// Why a metadata value could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MetadataError {
    /// The key is absent.
    #[error("no `{0}` metadata")]
    Missing(String),
    /// The key holds another type than the one asked for.
    #[error("`{key}` is not {expected}")]
    WrongType {
        /// The key.
        key: String,
        /// What was asked for ("an array of strings").
        expected: &'static str,
    },
}

/// The raw value of `key`.
pub fn value<'a>(ct: &'a Content, key: &str) -> Option<&'a Value> {
    ct.metadata.get(key)
}

/// `key` as a string.
pub fn string<'a>(ct: &'a Content, key: &str) -> Option<&'a str> {
    match value(ct, key)? {
        Value::String(s) => Some(s.as_str()),
        _ => None,
    }
}

/// `key` as a boolean.
pub fn boolean(ct: &Content, key: &str) -> Option<bool> {
    match value(ct, key)? {
        Value::Bool(b) => Some(*b),
        _ => None,
    }
}

/// A non-negative integer value (any width, signed or not).
pub fn as_u64(v: &Value) -> Option<u64> {
    match *v {
        Value::U8(x) => Some(u64::from(x)),
        Value::U16(x) => Some(u64::from(x)),
        Value::U32(x) => Some(u64::from(x)),
        Value::U64(x) => Some(x),
        Value::I8(x) => u64::try_from(x).ok(),
        Value::I16(x) => u64::try_from(x).ok(),
        Value::I32(x) => u64::try_from(x).ok(),
        Value::I64(x) => u64::try_from(x).ok(),
        _ => None,
    }
}

/// A number value (any integer or float width) as `f64`.
pub fn as_f64(v: &Value) -> Option<f64> {
    match *v {
        Value::F32(x) => Some(f64::from(x)),
        Value::F64(x) => Some(x),
        Value::I8(x) => Some(f64::from(x)),
        Value::I16(x) => Some(f64::from(x)),
        Value::I32(x) => Some(f64::from(x)),
        Value::U8(x) => Some(f64::from(x)),
        Value::U16(x) => Some(f64::from(x)),
        Value::U32(x) => Some(f64::from(x)),
        Value::I64(x) => Some(x as f64),
        Value::U64(x) => Some(x as f64),
        _ => None,
    }
}

/// `key` as a non-negative integer that fits a `usize`.
pub fn usize(ct: &Content, key: &str) -> Option<usize> {
    value(ct, key)
        .and_then(as_u64)
        .and_then(|x| usize::try_from(x).ok())
}

/// `key` as a non-negative integer that fits a `u32` (token ids).
pub fn u32(ct: &Content, key: &str) -> Option<u32> {
    value(ct, key)
        .and_then(as_u64)
        .and_then(|x| u32::try_from(x).ok())
}

/// `key` as a float (an integer value is accepted).
pub fn f32(ct: &Content, key: &str) -> Option<f32> {
    value(ct, key).and_then(as_f64).map(|x| x as f32)
}

/// `key` as an array of strings.
pub fn strings(ct: &Content, key: &str) -> Result<Vec<String>, MetadataError> {
    let wrong = || MetadataError::WrongType {
        key: key.to_string(),
        expected: "an array of strings",
    };
    match value(ct, key).ok_or_else(|| MetadataError::Missing(key.to_string()))? {
        Value::Array(items) => items
            .iter()
            .map(|x| match x {
                Value::String(s) => Ok(s.clone()),
                _ => Err(wrong()),
            })
            .collect(),
        _ => Err(wrong()),
    }
}

/// `key` as an array of numbers.
pub fn numbers(ct: &Content, key: &str) -> Result<Vec<f64>, MetadataError> {
    let wrong = || MetadataError::WrongType {
        key: key.to_string(),
        expected: "an array of numbers",
    };
    match value(ct, key).ok_or_else(|| MetadataError::Missing(key.to_string()))? {
        Value::Array(items) => items.iter().map(|x| as_f64(x).ok_or_else(wrong)).collect(),
        _ => Err(wrong()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::collections::HashMap;

    fn content(pairs: Vec<(&str, Value)>) -> Content {
        Content {
            magic: candle_core::quantized::gguf_file::VersionedMagic::GgufV3,
            metadata: pairs
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect::<HashMap<_, _>>(),
            tensor_infos: HashMap::new(),
            tensor_data_offset: 0,
        }
    }

    #[test]
    fn numbers_of_any_width_are_read() {
        let ct = content(vec![
            ("a", Value::U64(7)),
            ("b", Value::I32(5)),
            ("c", Value::I32(-1)),
            ("d", Value::F64(0.5)),
            ("e", Value::String("llama".into())),
            (
                "v",
                Value::Array(vec![Value::String("x".into()), Value::U8(1)]),
            ),
            ("s", Value::Array(vec![Value::F32(-1.5), Value::I16(2)])),
        ]);
        assert_eq!(usize(&ct, "a"), Some(7));
        assert_eq!(u32(&ct, "b"), Some(5));
        assert_eq!(u32(&ct, "c"), None, "negative ids are not ids");
        assert_eq!(f32(&ct, "d"), Some(0.5));
        assert_eq!(f32(&ct, "a"), Some(7.0));
        assert_eq!(string(&ct, "e"), Some("llama"));
        assert_eq!(string(&ct, "a"), None);
        assert!(matches!(
            strings(&ct, "v"),
            Err(MetadataError::WrongType { .. })
        ));
        assert!(matches!(strings(&ct, "zz"), Err(MetadataError::Missing(_))));
        assert_eq!(numbers(&ct, "s").unwrap(), vec![-1.5, 2.0]);
    }
}
