//! Keys and values to bytes and back, with postcard.
//!
//! A Redis key is the cache's prefix followed by the postcard bytes of the
//! key; a Redis value is the postcard bytes of the value, nothing else (no
//! version byte, no length: Redis keeps the length). A value must decode
//! with no bytes left over, so that bytes of another type are more likely
//! to be refused than misread.
//!
//! Decoding runs user code (`Deserialize`) on bytes anyone may have
//! written, mostly on the cache's reader thread, so it is fenced in twice:
//!
//! * a panic in it is caught and becomes a [`CodecError`] (the reader
//!   thread must live on: calls wait on it);
//! * it may use at most [`STACK_BUDGET`] bytes of stack: a value nested
//!   deeper than that (a recursive `V` and a hostile 30 KB value nested
//!   30,000 deep) is a `CodecError`, not a stack overflow that aborts the
//!   process. The check is made on every byte postcard reads, and a
//!   recursive type reads at least one byte (an enum or option tag, a
//!   length) per level, so no recursion escapes it.
//!
//! Keys must also *round-trip*: a key's name must decode back to an equal
//! key, because an invalidation names the Redis key and the near copy is
//! found by decoding that name. [`redis_key`] refuses a key that does not,
//! before anything is sent or stored (serde's untagged and internally
//! tagged enums, `skip_serializing_if`, and the like).
//!
//! What a key and a value of a cache must be ([`CacheKey`], [`CacheValue`])
//! is said here, where they are encoded: every layer above names them.

use crate::error::CodecError;
use postcard::de_flavors::Flavor;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::hash::Hash;

/// What a key of a [`NearCache`](crate::NearCache) must be: hashable,
/// cloneable and serde-encodable. Implemented for every such type.
pub trait CacheKey:
    Hash + Eq + Clone + Serialize + DeserializeOwned + Send + Sync + 'static
{
}
impl<T> CacheKey for T where
    T: Hash + Eq + Clone + Serialize + DeserializeOwned + Send + Sync + 'static
{
}

/// What a value of a [`NearCache`](crate::NearCache) must be: cloneable
/// and serde-encodable. Implemented for every such type.
pub trait CacheValue: Clone + Serialize + DeserializeOwned + Send + Sync + 'static {}
impl<T> CacheValue for T where T: Clone + Serialize + DeserializeOwned + Send + Sync + 'static {}
use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe};

/// The most stack one decode may use, counted from where it starts. Far
/// more than any reasonable value needs (several hundred levels of a
/// recursive enum in a release build), and far less than a thread's
/// stack (2 MiB for the cache's threads).
pub(crate) const STACK_BUDGET: usize = 256 * 1024;

fn err(encoding: bool, part: &'static str, e: impl std::fmt::Display) -> CodecError {
    CodecError {
        encoding,
        part,
        message: e.to_string(),
    }
}

/// Where the stack is now (any local's address will do).
#[inline(always)]
fn stack_position() -> usize {
    let here = 0u8;
    std::hint::black_box(&here) as *const u8 as usize
}

/// postcard's slice flavor, refusing to read on once the decode has used
/// more than [`STACK_BUDGET`] of stack.
struct Guarded<'de> {
    rest: &'de [u8],
    base: usize,
    too_deep: &'de Cell<bool>,
}

impl Guarded<'_> {
    fn check(&mut self) -> postcard::Result<()> {
        if stack_position().abs_diff(self.base) > STACK_BUDGET {
            self.too_deep.set(true);
            return Err(postcard::Error::DeserializeBadEncoding);
        }
        Ok(())
    }
}

impl<'de> Flavor<'de> for Guarded<'de> {
    type Remainder = &'de [u8];
    type Source = &'de [u8];

    fn pop(&mut self) -> postcard::Result<u8> {
        self.check()?;
        let (&b, rest) = self
            .rest
            .split_first()
            .ok_or(postcard::Error::DeserializeUnexpectedEnd)?;
        self.rest = rest;
        Ok(b)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.rest.len())
    }

    fn try_take_n(&mut self, ct: usize) -> postcard::Result<&'de [u8]> {
        self.check()?;
        if self.rest.len() < ct {
            return Err(postcard::Error::DeserializeUnexpectedEnd);
        }
        let (taken, rest) = self.rest.split_at(ct);
        self.rest = rest;
        Ok(taken)
    }

    fn finalize(self) -> postcard::Result<&'de [u8]> {
        Ok(self.rest)
    }
}

/// Decodes a `T` from the whole of `bytes`: no bytes left over, no panic
/// escaping, no more than [`STACK_BUDGET`] of stack.
fn decode<T: DeserializeOwned>(part: &'static str, bytes: &[u8]) -> Result<T, CodecError> {
    let too_deep = Cell::new(false);
    let run = || {
        let mut de = postcard::Deserializer::from_flavor(Guarded {
            rest: bytes,
            base: stack_position(),
            too_deep: &too_deep,
        });
        let v = T::deserialize(&mut de)?;
        Ok::<_, postcard::Error>((v, de.finalize()?))
    };
    // AssertUnwindSafe: after a panic nothing is observed but its payload
    // (the bytes are only read, the flag is only set).
    match panic::catch_unwind(AssertUnwindSafe(run)) {
        Ok(Ok((v, []))) => Ok(v),
        Ok(Ok((_, rest))) => Err(err(
            false,
            part,
            format_args!("{} bytes left over", rest.len()),
        )),
        Ok(Err(_)) if too_deep.get() => Err(err(
            false,
            part,
            format_args!(
                "nested too deep (decoding it needs more than {} KiB of stack)",
                STACK_BUDGET / 1024
            ),
        )),
        Ok(Err(e)) => Err(err(false, part, e)),
        Err(payload) => Err(err(
            false,
            part,
            format_args!("its Deserialize panicked: {}", panic_message(&*payload)),
        )),
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "(a non-string payload)"
    }
}

/// `prefix ++ postcard(key)`, for a key whose name decodes back to an equal
/// key (see the module docs); otherwise a [`CodecError`] that says so.
pub(crate) fn redis_key<K>(prefix: &[u8], key: &K) -> Result<Vec<u8>, CodecError>
where
    K: Serialize + DeserializeOwned + PartialEq,
{
    let name = postcard::to_extend(key, prefix.to_vec()).map_err(|e| err(true, "key", e))?;
    match decode::<K>("key", &name[prefix.len()..]) {
        Ok(back) if back == *key => Ok(name),
        Ok(_) => Err(err(
            true,
            "key",
            "it does not round-trip: its encoding decodes to another key, so an \
             invalidation naming it could not find its near copy (serde attributes such as \
             skip_serializing_if, untagged or internally tagged enums do this with postcard)",
        )),
        Err(e) => Err(err(
            true,
            "key",
            format_args!(
                "it does not round-trip: its encoding does not decode ({}), so an \
                 invalidation naming it could not find its near copy (serde attributes such as \
                 skip_serializing_if, untagged or internally tagged enums do this with postcard)",
                e.message
            ),
        )),
    }
}

/// The key of a Redis key name under `prefix`, or `None` if the name is not
/// one the cache could have written (outside the prefix, or not a key: it
/// does not decode, has bytes left over, nests too deep, or its
/// `Deserialize` panicked).
pub(crate) fn key_of<K: DeserializeOwned>(prefix: &[u8], name: &[u8]) -> Option<K> {
    decode("key", name.strip_prefix(prefix)?).ok()
}

pub(crate) fn encode_value<V: Serialize>(value: &V) -> Result<Vec<u8>, CodecError> {
    postcard::to_stdvec(value).map_err(|e| err(true, "value", e))
}

pub(crate) fn decode_value<V: DeserializeOwned>(bytes: &[u8]) -> Result<V, CodecError> {
    decode("value", bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::{Deserialize, Deserializer};

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

    #[derive(Debug, PartialEq, Deserialize, serde::Serialize)]
    enum Tree {
        Leaf,
        Node(Box<Tree>),
    }

    #[test]
    fn deep_values_are_errors_and_shallow_ones_decode() {
        let mut bytes = vec![1u8; 1_000_000];
        bytes.push(0);
        let e = decode_value::<Tree>(&bytes).unwrap_err();
        assert!(e.message.contains("deep"), "{e}");
        assert_eq!(key_of::<Tree>(b"", &bytes), None);
        let shallow = [1, 1, 0];
        assert_eq!(
            decode_value::<Tree>(&shallow),
            Ok(Tree::Node(Box::new(Tree::Node(Box::new(Tree::Leaf)))))
        );
    }

    #[test]
    fn a_panicking_deserialize_is_an_error() {
        #[derive(Debug)]
        struct Panics;
        impl<'de> Deserialize<'de> for Panics {
            fn deserialize<D: Deserializer<'de>>(_: D) -> Result<Self, D::Error> {
                panic!("no")
            }
        }
        let e = decode_value::<Panics>(&[0]).unwrap_err();
        assert!(e.message.contains("panicked: no"), "{e}");
        assert!(key_of::<Panics>(b"", &[0]).is_none());
    }
}
