//! The key prefixes of the live caches of this process, by server: a
//! cache's prefix must not alias another's on the same server.

use crate::error::Error;
use std::sync::{Mutex, PoisonError};

/// The key prefixes in use in this process, by server (`host:port/db`):
/// a cache whose prefix starts another's, or starts with it, on the same
/// server, is refused (their keys could alias: `"a"` followed by the key
/// bytes `b...` is `"ab"` followed by `...`). Equal prefixes are allowed:
/// caches that share data share a prefix.
static PREFIXES: Mutex<Vec<(String, Vec<u8>)>> = Mutex::new(Vec::new());

/// A claim on a prefix in [`PREFIXES`], released on drop.
pub(crate) struct PrefixClaim {
    server: String,
    prefix: Vec<u8>,
}

impl PrefixClaim {
    pub(crate) fn take(server: String, prefix: &[u8]) -> Result<Self, Error> {
        let mut table = PREFIXES.lock().unwrap_or_else(PoisonError::into_inner);
        let clash = table.iter().find(|(s, p)| {
            *s == server && p[..] != prefix[..] && (p.starts_with(prefix) || prefix.starts_with(p))
        });
        if let Some((_, other)) = clash {
            return Err(Error::Config(format!(
                "the key prefix {:?} overlaps the prefix {:?} of another cache of this process \
                 on the same server: their keys could alias (one prefix must not start the \
                 other)",
                String::from_utf8_lossy(prefix),
                String::from_utf8_lossy(other)
            )));
        }
        table.push((server.clone(), prefix.to_vec()));
        Ok(PrefixClaim {
            server,
            prefix: prefix.to_vec(),
        })
    }
}

impl Drop for PrefixClaim {
    fn drop(&mut self) {
        let mut table = PREFIXES.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = table
            .iter()
            .position(|(s, p)| *s == self.server && *p == self.prefix)
        {
            table.swap_remove(i);
        }
    }
}
