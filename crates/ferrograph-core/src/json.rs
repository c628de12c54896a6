//! A JSON value that travels through both self-describing (JSON) and compact (bincode) encodings.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// A JSON value that can be stored inside bincode-encoded checkpoints.
///
/// Human-readable formats see the value itself; compact formats such as bincode, which cannot
/// carry arbitrary JSON, see its canonical text. Used for interrupt payloads, resume values, tool
/// call arguments and custom stream payloads: the places where user data crosses a process
/// boundary and has no Rust type of ours.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Json(pub serde_json::Value);

impl Json {
    /// JSON `null`.
    pub fn null() -> Self {
        Json(serde_json::Value::Null)
    }

    /// Serializes any value into a [`Json`].
    pub fn from_serialize<T: Serialize + ?Sized>(value: &T) -> Result<Self, serde_json::Error> {
        serde_json::to_value(value).map(Json)
    }

    /// Deserializes the value into `T`.
    pub fn to_typed<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        T::deserialize(&self.0)
    }

    /// The inner value.
    pub fn into_inner(self) -> serde_json::Value {
        self.0
    }
}

impl From<serde_json::Value> for Json {
    fn from(value: serde_json::Value) -> Self {
        Json(value)
    }
}

impl fmt::Display for Json {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl Serialize for Json {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            self.0.serialize(serializer)
        } else {
            serializer.serialize_str(&self.0.to_string())
        }
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        if deserializer.is_human_readable() {
            serde_json::Value::deserialize(deserializer).map(Json)
        } else {
            let text = String::deserialize(deserializer)?;
            serde_json::from_str(&text)
                .map(Json)
                .map_err(serde::de::Error::custom)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrips_through_bincode_and_json() {
        let v = Json(serde_json::json!({"a": [1, 2, {"b": null}], "c": "x"}));
        let bytes = bincode::serde::encode_to_vec(&v, bincode::config::standard()).unwrap();
        let (back, _): (Json, usize) =
            bincode::serde::decode_from_slice(&bytes, bincode::config::standard()).unwrap();
        assert_eq!(back, v);
        let text = serde_json::to_string(&v).unwrap();
        assert_eq!(text, r#"{"a":[1,2,{"b":null}],"c":"x"}"#);
        let back: Json = serde_json::from_str(&text).unwrap();
        assert_eq!(back, v);
    }
}
