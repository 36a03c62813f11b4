//! Keys and values to bytes and back, with postcard.
//!
//! A Redis key is the cache's prefix followed by the postcard bytes of the
//! key; a Redis value is the postcard bytes of the value, nothing else (no
//! version byte, no length: Redis keeps the length). A value must decode
//! with no bytes left over, so that bytes of another type are more likely
//! to be refused than misread.

use crate::error::CodecError;
use serde::Serialize;
use serde::de::DeserializeOwned;

fn err(encoding: bool, part: &'static str, e: impl std::fmt::Display) -> CodecError {
    CodecError {
        encoding,
        part,
        message: e.to_string(),
    }
}

/// `prefix ++ postcard(key)`.
pub(crate) fn redis_key<K: Serialize>(prefix: &[u8], key: &K) -> Result<Vec<u8>, CodecError> {
    postcard::to_extend(key, prefix.to_vec()).map_err(|e| err(true, "key", e))
}

/// The key of a Redis key name under `prefix`, or `None` if the name is not
/// one the cache could have written (outside the prefix, or not a key).
pub(crate) fn key_of<K: DeserializeOwned>(prefix: &[u8], name: &[u8]) -> Option<K> {
    let bytes = name.strip_prefix(prefix)?;
    match postcard::take_from_bytes(bytes) {
        Ok((k, [])) => Some(k),
        _ => None,
    }
}

pub(crate) fn encode_value<V: Serialize>(value: &V) -> Result<Vec<u8>, CodecError> {
    postcard::to_stdvec(value).map_err(|e| err(true, "value", e))
}

pub(crate) fn decode_value<V: DeserializeOwned>(bytes: &[u8]) -> Result<V, CodecError> {
    match postcard::take_from_bytes(bytes) {
        Ok((v, [])) => Ok(v),
        Ok((_, rest)) => Err(err(
            false,
            "value",
            format_args!("{} bytes left over", rest.len()),
        )),
        Err(e) => Err(err(false, "value", e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_round_trip() {
        let name = redis_key(b"p:", &("a".to_string(), 7u32)).unwrap();
        assert!(name.starts_with(b"p:"));
        assert_eq!(
            key_of::<(String, u32)>(b"p:", &name),
            Some(("a".to_string(), 7))
        );
        assert_eq!(key_of::<(String, u32)>(b"q:", &name), None);
        let mut longer = name.clone();
        longer.push(0);
        assert_eq!(key_of::<(String, u32)>(b"p:", &longer), None);
    }

    #[test]
    fn value_left_over_is_an_error() {
        let mut bytes = encode_value(&5u8).unwrap();
        assert_eq!(decode_value::<u8>(&bytes), Ok(5));
        bytes.push(1);
        let e = decode_value::<u8>(&bytes).unwrap_err();
        assert!(!e.encoding && e.part == "value", "{e}");
    }
}
