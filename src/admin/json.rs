//! JSON bodies of the admin API, read strictly.
//!
//! serde_json takes the last of a repeated name without a word:
//! `{"token": 5, "token": 9}` would raise a fence to 9 while whoever
//! reviewed the request (or a proxy in front that checks the first) read 5.
//! Every admin endpoint that takes a JSON body reads it through
//! [`object`], which refuses that (400), as it refuses anything but an
//! object: serde would also read `[45]` as a struct's fields in order.

use serde::de::{DeserializeOwned, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};

/// `body` as a `T`, when it is one JSON object in which no name appears
/// twice (at any depth); otherwise why not, for a 400's detail.
pub(crate) fn object<T: DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    let Unique(value) = serde_json::from_slice::<Unique>(body).map_err(|e| e.to_string())?;
    if !value.is_object() {
        return Err("the body is not a JSON object".to_owned());
    }
    serde_json::from_value(value).map_err(|e| e.to_string())
}

/// A JSON value read with every object's names checked for repeats.
struct Unique(Value);

impl<'de> Deserialize<'de> for Unique {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(UniqueVisitor)
    }
}

struct UniqueVisitor;

impl<'de> Visitor<'de> for UniqueVisitor {
    type Value = Unique;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Unique, E> {
        Ok(Unique(Value::Bool(v)))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Unique, E> {
        Ok(Unique(Value::from(v)))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Unique, E> {
        Ok(Unique(Value::from(v)))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Unique, E> {
        Ok(Unique(Value::from(v)))
    }

    fn visit_str<E>(self, v: &str) -> Result<Unique, E> {
        Ok(Unique(Value::String(v.to_owned())))
    }

    fn visit_string<E>(self, v: String) -> Result<Unique, E> {
        Ok(Unique(Value::String(v)))
    }

    fn visit_unit<E>(self) -> Result<Unique, E> {
        Ok(Unique(Value::Null))
    }

    fn visit_none<E>(self) -> Result<Unique, E> {
        Ok(Unique(Value::Null))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Unique, A::Error> {
        let mut items = Vec::new();
        while let Some(Unique(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Unique(Value::Array(items)))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Unique, A::Error> {
        let mut object = Map::new();
        while let Some(name) = map.next_key::<String>()? {
            if object.contains_key(&name) {
                return Err(A::Error::custom(format!("the name {name:?} appears more than once in an object")));
            }
            let Unique(value) = map.next_value()?;
            object.insert(name, value);
        }
        Ok(Unique(Value::Object(object)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Raise {
        token: u64,
    }

    #[test]
    fn a_repeated_name_is_refused_at_any_depth() {
        for body in [r#"{"token": 5, "token": 9}"#, r#"{"token": 9, "token": 9}"#, r#"{"token": 5, "token": "x"}"#] {
            let e = object::<Raise>(body.as_bytes()).unwrap_err();
            assert!(e.contains("more than once"), "{body}: {e}");
        }
        let e = object::<Value>(br#"{"a": [{"b": 1, "b": 2}]}"#).unwrap_err();
        assert!(e.contains("more than once"), "{e}");
        // The same name in two different objects is no repeat.
        assert!(object::<Value>(br#"{"a": {"b": 1}, "c": {"b": 2}}"#).is_ok());
    }

    #[test]
    fn only_an_object_of_the_right_fields_and_types_is_read() {
        assert_eq!(object::<Raise>(br#"{"token": 18446744073709551615}"#).unwrap().token, u64::MAX);
        for body in ["[5]", "5", "null", "", r#"{"token": 1e3}"#, r#"{"token": -1}"#, r#"{"token": 5, "x": 1}"#] {
            assert!(object::<Raise>(body.as_bytes()).is_err(), "{body}");
        }
    }
}
