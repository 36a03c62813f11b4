//! The Lua scripts of the cache's commands ([`FETCH`], [`REMOVE`], and the
//! lease's [`LEASE`], [`STAGE`], [`STORE`] and [`RELEASE`]), what
//! [`LEASE`] found ([`Leased`]), and the names a lease holder writes under:
//! its [`token`] and its staging name ([`staging_of`]). The protocol they
//! make up is in [`crate::lease`]'s docs; a link sends them
//! ([`crate::link`]).

use crate::slots::{crc16, crc16_from, slot};
use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Slots of a Redis Cluster, as a CRC16's modulus.
const SLOTS: u16 = crate::slots::SLOTS as u16;

/// Reads a key's value and its remaining time in one round trip, atomically.
/// A missing key reads as `false` (GET) and `-2` (PTTL), and so does a key
/// that holds a lease (a hash with a `lease` field: see `lease`); a key of
/// another type is an error (`WRONGTYPE`). Sent as `EVAL_RO`
/// where the server has it (Redis 7 and later, Valkey): a read-only script
/// is not held up by `CLIENT PAUSE ... WRITE` (failovers use it), nor
/// refused by a read-only replica. Plain `EVAL` on Redis 6.2.
pub(crate) const FETCH: &str = "local t = redis.call('TYPE', KEYS[1]).ok \
if t == 'string' then return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])} end \
if t == 'none' or (t == 'hash' and redis.call('HEXISTS', KEYS[1], 'lease') == 1) then \
return {false, -2} end \
return redis.error_reply('WRONGTYPE the key holds neither a value nor a lease')";

/// `KEYS[1]` the key; `ARGV[1]` a token, `ARGV[2]` the lease TTL in ms.
/// Answers `{value, pttl}` if the key has a value; `{false, -3}` if the
/// lease is this token's (taken now: the key was missing, and now holds
/// the lease, a hash `{lease: token}` with the lease TTL); else `{false,
/// pttl of the lease}`. A key of another type is an error.
pub(crate) const LEASE: &str = "local t = redis.call('TYPE', KEYS[1]).ok \
if t == 'string' then return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])} end \
if t == 'none' then redis.call('HSET', KEYS[1], 'lease', ARGV[1]) \
redis.call('PEXPIRE', KEYS[1], ARGV[2]) return {false, -3} end \
local l = t == 'hash' and redis.call('HGET', KEYS[1], 'lease') \
if not l then return redis.error_reply('WRONGTYPE the key holds neither a value nor a lease') end \
if l == ARGV[1] then return {false, -3} end \
return {false, redis.call('PTTL', KEYS[1])}";

/// `true` in Lua if `KEYS[1]` holds the lease of the token `ARGV[1]`.
macro_rules! holds {
    () => {
        "redis.call('TYPE', KEYS[1]).ok == 'hash' and redis.call('HGET', KEYS[1], 'lease') == ARGV[1]"
    };
}

/// The lease holder's write, first half (in a `MULTI`, before `RENAME
/// staging key`): `KEYS[1]` the key, `KEYS[2]` the staging name
/// ([`staging_of`]); `ARGV[1]` the token, `ARGV[2]` the value, `ARGV[3]`
/// its TTL in ms. If the key holds the token's lease: writes the value
/// under the staging name, 1 (the `RENAME` then replaces the lease with
/// it). Else 0, and nothing is written (the lease was void: the key was
/// written or removed, the lease taken over or lapsed).
pub(crate) const STAGE: &str = concat!(
    "if ",
    holds!(),
    " then redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3]) return 1 end return 0"
);

/// The lease holder's write in one script, on one key (a Cluster slot in
/// migration, where the `MULTI` of [`STAGE`] is refused, or a user
/// without `MULTI`): `KEYS[1]` the key; `ARGV` as [`STAGE`]'s. 1 if
/// stored, 0 if the lease was void.
pub(crate) const STORE: &str = concat!(
    "if ",
    holds!(),
    " then redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1 end return 0"
);

/// A holder giving its lease up (`KEYS[1]` the key, `ARGV[1]` the token).
pub(crate) const RELEASE: &str = concat!(
    "if ",
    holds!(),
    " then return redis.call('DEL', KEYS[1]) end return 0"
);

/// `remove`: the value (`GETDEL`); a lease is deleted (its load then
/// stores nothing) and reads as none; a key of another type is an error.
/// On one key.
pub(crate) const REMOVE: &str = "local t = redis.call('TYPE', KEYS[1]).ok \
if t == 'string' then return redis.call('GETDEL', KEYS[1]) end \
if t == 'hash' and redis.call('HEXISTS', KEYS[1], 'lease') == 1 then \
redis.call('DEL', KEYS[1]) return false end \
if t == 'none' then return false end \
return redis.error_reply('WRONGTYPE the key holds neither a value nor a lease')";

/// What [`LEASE`] found.
pub(crate) enum Leased<V> {
    /// The key's value (a near copy was kept, as by a fetch).
    Value(V),
    /// The lease is this caller's: load and [`STORE`].
    Mine,
    /// Another holds the lease, for this long at most (`None`: unknown).
    Held(Option<Duration>),
}

/// A hash tag (`{t}`) of each slot, found once: the shortest alphanumeric
/// strings whose CRC16 gives the slot.
fn tags() -> &'static [Box<[u8]>] {
    static TAGS: OnceLock<Vec<Box<[u8]>>> = OnceLock::new();
    TAGS.get_or_init(|| {
        const A: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
        let mut tags: Vec<Option<Box<[u8]>>> = vec![None; crate::slots::SLOTS];
        let mut left = tags.len();
        let mut len = 1;
        while left > 0 {
            let mut idx = vec![0usize; len];
            loop {
                let t: Vec<u8> = idx.iter().map(|&i| A[i]).collect();
                let s = usize::from(crc16(&t)) % tags.len();
                if tags[s].is_none() {
                    tags[s] = Some(t.into());
                    left -= 1;
                }
                // The next string of this length (odometer), or done.
                let mut i = 0;
                while i < len && idx[i] + 1 == A.len() {
                    idx[i] = 0;
                    i += 1;
                }
                if i == len {
                    break;
                }
                idx[i] += 1;
            }
            len += 1;
        }
        tags.into_iter().map(Option::unwrap_or_default).collect()
    })
}

/// Where the holder of the lease on the key named `name` with `token`
/// stages its value: `name:lease:token`, in the slot of `name` (a hash tag
/// or a suffix is added where needed). Never a key's name: a key's
/// encoding is self-delimiting, so `name` followed by more bytes does not
/// decode as a key (its invalidation drops no near copy); nor another
/// holder's (tokens are unique).
pub(crate) fn staging_of(name: &[u8], token: &str) -> Vec<u8> {
    let mut staging = name.to_vec();
    staging.extend_from_slice(b":lease:");
    staging.extend_from_slice(token.as_bytes());
    in_slot(staging, slot(name))
}

/// `name`, with what it takes to hash to `want` appended if it does not.
fn in_slot(mut name: Vec<u8>, want: u16) -> Vec<u8> {
    if slot(&name) == want {
        // A hash tag in `name`, which the suffix kept.
        return name;
    }
    if !name.contains(&b'{') {
        name.push(b'{');
        name.extend_from_slice(&tags()[usize::from(want)]);
        name.push(b'}');
        return name;
    }
    // A `{` without a usable tag: the slot is the CRC16 of the whole name.
    // One pass over `name`, then a search over short suffixes (`:` and hex
    // digits, no brace) from that CRC state: 16,384 suffixes of a few
    // bytes expected, whatever the name's length.
    let state = crc16_from(0, &name);
    name.push(b':');
    let base = name.len();
    let at_colon = crc16_from(state, b":");
    let mut digits = [0u8; 16];
    for n in 0u64.. {
        let hex = hex_of(n, &mut digits);
        if crc16_from(at_colon, hex) % SLOTS == want {
            name.truncate(base);
            name.extend_from_slice(hex);
            break;
        }
    }
    debug_assert_eq!(slot(&name), want);
    name
}

/// `n` in lower-case hex, in `buf`.
fn hex_of(mut n: u64, buf: &mut [u8; 16]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b"0123456789abcdef"[(n & 15) as usize];
        n >>= 4;
        if n == 0 {
            return &buf[i..];
        }
    }
}

/// A token no other lease of any process has: 128 bits from the std
/// hasher's random keys, the process id, a counter and the time.
pub(crate) fn token() -> String {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut out = String::with_capacity(32);
    for half in 0..2u64 {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(half);
        h.write_u32(std::process::id());
        h.write_u64(n);
        h.write_u128(t);
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_staging_name_shares_the_keys_slot_and_never_names_a_key() {
        for n in [
            &b"p:\x03abc"[..],
            b"p:{user1}x",
            b"p:{x",
            b"p:{}x",
            b"p:}{",
            b"",
        ] {
            let t = token();
            let st = staging_of(n, &t);
            assert_eq!(slot(&st), slot(n), "{:?}", String::from_utf8_lossy(&st));
            assert!(st.starts_with(n) && st.len() > n.len());
            assert_ne!(st, staging_of(n, &token()));
        }
        assert_ne!(token(), token());
    }

    /// A name with an unusable `{` hashes whole: its staging name's slot is
    /// found by a suffix search from the name's CRC state, not by hashing
    /// the whole name again per try (16,384 tries expected: 0.4 s a call
    /// for a 4 KiB key). Counted in bytes through the CRC: a few passes
    /// over the name (the checks), and a short suffix a try.
    #[test]
    fn a_long_name_with_an_open_brace_costs_a_few_passes_over_it() {
        use crate::slots::CRC_BYTES;
        let mut name = b"p:{".to_vec();
        name.extend(std::iter::repeat_n(b'x', 4096));
        for t in ["a", "b", "c", "d"] {
            CRC_BYTES.with(|n| n.set(0));
            let st = staging_of(&name, t);
            let bytes = CRC_BYTES.with(|n| n.get());
            assert!(
                bytes < 6 * 4096 + 1_000_000,
                "{bytes} bytes through the CRC"
            );
            assert_eq!(slot(&st), slot(&name));
            // The suffix: ":lease:", the token, ':' and a few hex digits.
            let tail = &st[name.len()..];
            assert!(tail.len() <= b":lease:".len() + t.len() + 1 + 8, "{tail:?}");
            assert!(!tail.contains(&b'{') && !tail.contains(&b'}'));
        }
    }

    #[test]
    fn hex_digits() {
        let mut buf = [0u8; 16];
        assert_eq!(hex_of(0, &mut buf), b"0");
        assert_eq!(hex_of(0xbeef, &mut buf), b"beef");
        assert_eq!(hex_of(u64::MAX, &mut buf), b"ffffffffffffffff");
    }
}
