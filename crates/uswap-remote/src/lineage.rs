//! Values shared across fork(2): a forked child reads the values its ancestors wrote
//! before the fork, and writes its own under a prefix of its own.
//!
//! A child cannot use its parent's connections or runtime (their threads do not exist
//! in it). The parent, just before the fork, takes an [`Inheritance`]: its settings, a
//! copy of its live set (the generation of every id it holds a value of) with its prefix,
//! the same for the values it inherited itself, and a random token naming the child. The
//! child connects a store of its own from it ([`crate::RemoteStore::connect_child`]):
//! writes and deletes go to its own prefix; a read of an id its own store does not hold
//! is looked up in the ancestors' live sets, newest first, and read from that ancestor's
//! keys, with the same checks (the prefix is in every value's checksum).
//!
//! # Who deletes a value two processes can read
//!
//! While the owner of a prefix lives, it alone deletes its values: the engine keeps a
//! reference to every slot a child may read until the child and all its descendants are
//! gone (as the kernel's swap map counts a slot's users across fork), so it never frees a
//! value a child reads. When the owner closes while children live, it deletes what none
//! of them holds and leaves the groups they hold, listed under the prefix's meta keys
//! (one hash tag, so a Lua script sees them together):
//!
//! - `users`: tokens of the processes that may still read the prefix's values;
//! - `gone`: tokens of those that said they are done (so a late registration of one is
//!   ignored: whoever runs second sees the other's mark);
//! - `closed`: set when the owner closed;
//! - `left`: the group keys the owner did not delete.
//!
//! A process that closes registers its live children in each ancestor's `users` (they
//! read those values too) and removes itself; the one that leaves `users` empty after
//! `closed` is set deletes the `left` groups and the meta keys. A process killed never
//! leaves: its prefix's keys and meta keys expire after `key_ttl`, since every key is
//! written with an expiry and each live reader refreshes the keys it reads.

use std::sync::Arc;

use crate::layout::Prefix;
use crate::live::LiveSet;
use crate::RemoteConfig;

/// What a forked child needs to read its ancestors' values (taken in the parent, just
/// before the fork: [`crate::RemoteStore::fork_inheritance`]).
pub struct Inheritance {
    pub(crate) cfg: RemoteConfig,
    pub(crate) ancestors: Vec<Ancestor>,
    pub(crate) token: u64,
    /// The child's own prefix, made by the parent, which deletes what the child left
    /// once the child and its descendants are gone ([`crate::RemoteStore::reap_child`]).
    pub(crate) prefix: Prefix,
}

impl Inheritance {
    /// The child's token: what the parent passes to [`crate::RemoteStore::close_with`] as
    /// long as the child may read its values ([`ChildHold`]).
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The child's prefix: what the parent passes to [`crate::RemoteStore::reap_child`]
    /// once the child and its descendants are gone.
    pub fn child_prefix(&self) -> Prefix {
        self.prefix.clone()
    }
}

/// An ancestor's values, read-only: its prefix and the generation of each id it held a
/// value of at the fork.
#[derive(Clone)]
pub(crate) struct Ancestor {
    pub(crate) prefix: Prefix,
    pub(crate) live: Arc<LiveSet>,
}

/// The ancestors of a store (none for a store that was not forked).
#[derive(Clone, Default)]
pub(crate) struct Lineage {
    /// Oldest first.
    pub(crate) ancestors: Vec<Ancestor>,
    /// This process's token in its ancestors' `users`.
    pub(crate) token: Option<u64>,
}

/// A live child at its parent's close: its token, and the ids of the parent's values it
/// may still read (their groups are left to it).
#[derive(Debug, Clone, Default)]
pub struct ChildHold {
    /// From [`Inheritance::token`].
    pub token: u64,
    /// Ids of the closing store's values.
    pub ids: Vec<u64>,
}

/// The meta keys of a prefix, in the order the scripts take them: users, gone, closed,
/// left; then `groups`, the group keys a forked child wrote (for its parent to delete
/// when the child ended without closing its store: `_exit`, exec, a kill).
pub(crate) fn meta_keys(prefix: &Prefix) -> [String; 5] {
    // "m" is not a hex digit: no group key has this hash tag
    let tag = format!("uswap:{{{}.m}}", prefix.as_hex());
    [
        format!("{tag}:users"),
        format!("{tag}:gone"),
        format!("{tag}:closed"),
        format!("{tag}:left"),
        format!("{tag}:groups"),
    ]
}

/// A process is done with an ancestor's values. KEYS: users, gone, closed. ARGV: ttl in
/// ms, its own token, then the tokens of its live children (they read them too, unless
/// they said they are done). Returns 1 when the owner closed and nobody is left: the
/// caller deletes the `left` groups and the meta keys.
pub(crate) const LEAVE: &str = r#"
for i = 3, #ARGV do
  if redis.call('SISMEMBER', KEYS[2], ARGV[i]) == 0 then
    redis.call('SADD', KEYS[1], ARGV[i])
  end
end
redis.call('SADD', KEYS[2], ARGV[2])
redis.call('SREM', KEYS[1], ARGV[2])
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], ARGV[1]) end
if redis.call('EXISTS', KEYS[3]) == 1 and redis.call('SCARD', KEYS[1]) == 0 then
  return 1
end
return 0
"#;

/// The owner closes with live children. KEYS: users, gone, closed, left. ARGV: ttl in
/// ms, the number of children n, their n tokens, then the group keys left to them.
/// Returns how many readers remain (0: the caller deletes what it left, and the meta
/// keys).
pub(crate) const CLOSE: &str = r#"
local n = tonumber(ARGV[2])
for i = 3, 2 + n do
  if redis.call('SISMEMBER', KEYS[2], ARGV[i]) == 0 then
    redis.call('SADD', KEYS[1], ARGV[i])
  end
end
for i = 3 + n, #ARGV do redis.call('SADD', KEYS[4], ARGV[i]) end
redis.call('SET', KEYS[3], '1')
for i = 1, 4 do redis.call('PEXPIRE', KEYS[i], ARGV[1]) end
return redis.call('SCARD', KEYS[1])
"#;
