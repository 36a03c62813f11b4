//! What leaves a shard: [`Removed`] entries tagged with their [`Door`],
//! collected in a [`Sink`] for the map to publish or drop after it
//! releases the shard lock (`map::leave::doors`), and a put's [`PutOutcome`].
//!
//! Plain data; nothing here drops a user value (the map does, unlocked).

/// Why an entry left the shard. Mirrors the public `Cause` for the doors a
/// shard operation can open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Door {
    /// Past its deadline when it left.
    Expired,
    /// Explicitly removed (or cleared) while live.
    Removed,
    /// Overwritten by `put` while live.
    Replaced,
    /// Pushed out by the capacity bound, or refused by it.
    Size,
}

/// Where a shard operation puts the entries that leave it.
pub(crate) trait Sink<K, V> {
    fn push(&mut self, r: Removed<K, V>);
    fn len(&self) -> usize;
}

impl<K, V> Sink<K, V> for Vec<Removed<K, V>> {
    #[inline]
    fn push(&mut self, r: Removed<K, V>) {
        Vec::push(self, r);
    }
    #[inline]
    fn len(&self) -> usize {
        Vec::len(self)
    }
}

/// The entries one `put` pushes out: usually none or one, kept inline, so
/// a put into a full shard does not allocate; more go to a `Vec`.
pub(crate) struct Out<K, V> {
    pub(super) first: Option<Removed<K, V>>,
    pub(super) rest: Vec<Removed<K, V>>,
    /// Of those, pushed out by [`Door::Size`] and not yet counted
    /// ([`take_size`](Self::take_size)).
    size: u64,
}

impl<K, V> Out<K, V> {
    pub(crate) fn new() -> Self {
        Self {
            first: None,
            rest: Vec::new(),
            size: 0,
        }
    }

    /// How many entries were pushed out by [`Door::Size`] since the last
    /// call, for the caller to count while it holds the shard's lock.
    #[inline]
    pub(crate) fn take_size(&mut self) -> u64 {
        std::mem::take(&mut self.size)
    }

    /// Nothing was pushed.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    /// Hands each entry to `f`, in the order pushed, and leaves this empty.
    #[inline]
    pub(crate) fn take_each(&mut self, mut f: impl FnMut(Removed<K, V>)) {
        if let Some(r) = self.first.take() {
            f(r);
        }
        if !self.rest.is_empty() {
            std::mem::take(&mut self.rest).into_iter().for_each(f);
        }
    }

    /// Every entry pushed left by [`Door::Size`].
    #[inline]
    pub(crate) fn all_size(&self) -> bool {
        self.first.as_ref().is_none_or(|r| r.door == Door::Size)
            && self.rest.iter().all(|r| r.door == Door::Size)
    }

    /// Empties this, dropping the entries here: for entries whose drop
    /// runs no code and which nobody is to be told of.
    #[inline]
    pub(crate) fn clear(&mut self) {
        self.first = None;
        self.rest.clear();
    }

    /// Takes back the last entry pushed (no longer counted as pushed out).
    pub(crate) fn take_last(&mut self) -> Option<Removed<K, V>> {
        let last = self.rest.pop().or_else(|| self.first.take());
        if let Some(Removed {
            door: Door::Size, ..
        }) = last
        {
            self.size = self.size.saturating_sub(1);
        }
        last
    }
}

impl<K, V> Sink<K, V> for Out<K, V> {
    #[inline]
    fn push(&mut self, r: Removed<K, V>) {
        self.size += u64::from(r.door == Door::Size);
        if self.first.is_none() {
            self.first = Some(r);
        } else {
            self.rest.push(r);
        }
    }
    #[inline]
    fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.len()
    }
}

impl<K, V> IntoIterator for Out<K, V> {
    type Item = Removed<K, V>;
    type IntoIter =
        std::iter::Chain<std::option::IntoIter<Removed<K, V>>, std::vec::IntoIter<Removed<K, V>>>;
    fn into_iter(self) -> Self::IntoIter {
        self.first.into_iter().chain(self.rest)
    }
}

/// An entry that left the shard, to be published or dropped after unlock.
pub(crate) struct Removed<K, V> {
    pub(crate) key: K,
    pub(crate) value: V,
    pub(crate) deadline: u64,
    pub(crate) door: Door,
}

/// Result of [`Shard::put`].
pub(crate) enum PutOutcome<K, V> {
    /// A new entry; nothing left the shard.
    Inserted,
    /// An existing entry was overwritten; its old value left by `door`
    /// (`Replaced` if it was live, `Expired` if it was past its deadline).
    /// `key` is the caller's key (equal to the stored one, which stays).
    Overwrote(Removed<K, V>),
    /// The key was absent and the bound refused the new entry: it is in
    /// `out`, as `Size`.
    Refused,
    /// The map's budget has no room for `need` more weight and this shard
    /// has nothing more to give: nothing was stored, the key and value are
    /// still the caller's. The caller makes room in the other shards (with
    /// this lock released) and tries again. `candidate`: the new key's
    /// estimated frequency, for their admission checks (`None` for an
    /// overwrite, which is always admitted).
    NoRoom { need: u64, candidate: Option<u64> },
}

/// How [`Shard::make_room`](super::Shard::make_room) ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Room {
    /// The budget has room for what was asked.
    Made,
    /// The candidate lost to a victim (TinyLFU): it is not to be stored.
    Refused,
    /// This shard has nothing more to give (empty, or only what was to be
    /// skipped); the budget may still have no room.
    Short,
}
