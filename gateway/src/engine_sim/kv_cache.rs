//! The simulated engine's prefix cache: which leading blocks of a token sequence already have
//! their KV entries computed, as vLLM's automatic prefix caching keeps them.
//!
//! A sequence (the prompt, then the answer) is cut into blocks of [`BLOCK_TOKENS`] tokens from
//! its start. Without a tokenizer, a token is [`CHARS_PER_TOKEN`] characters — the same
//! approximation the usage counts use — so a block is 64 characters. Each full block is keyed
//! by a hash chained over every block before it (and the model), so a block is a hit only when
//! the whole text before it matches too; a partial last block is never cached. The cache holds
//! at most `capacity_tokens / BLOCK_TOKENS` blocks and evicts the least recently used first;
//! within one sequence the deepest block counts as the least recent, so a chain loses its tail
//! before its head (vLLM frees a finished request's blocks tail first for the same reason: a
//! block whose parent is gone can never be hit).
//!
//! Everything here is pure: no clock, no locking. The caller owns the cache behind a lock.

use std::collections::{BTreeMap, HashMap};

use super::generate::{fnv1a64, CHARS_PER_TOKEN};

/// Tokens per KV block (vLLM's default `--block-size`).
pub const BLOCK_TOKENS: u32 = 16;

/// Characters per block.
const BLOCK_CHARS: usize = CHARS_PER_TOKEN * BLOCK_TOKENS as usize;

/// The chained hashes of the full blocks of `text` for `model`, in order: the hash of block `i`
/// depends on the model and on every character up to the end of block `i`.
pub(crate) fn block_hashes(model: &str, text: &str) -> Vec<u64> {
    let mut hashes = Vec::with_capacity(text.len() / BLOCK_CHARS);
    let mut chain = fnv1a64(&[b"kv-block\0", model.as_bytes()]);
    let mut block_start = 0;
    let mut chars_in_block = 0;
    for (at, c) in text.char_indices() {
        chars_in_block += 1;
        if chars_in_block == BLOCK_CHARS {
            let block_end = at + c.len_utf8();
            chain = fnv1a64(&[&chain.to_le_bytes(), &text.as_bytes()[block_start..block_end]]);
            hashes.push(chain);
            block_start = block_end;
            chars_in_block = 0;
        }
    }
    hashes
}

/// How many of a prompt's leading blocks may be looked up: every full block that ends before
/// the prompt's last character, so that at least one token is always computed (an engine needs
/// the last prompt token's forward pass to produce the first output token).
pub(crate) fn lookup_blocks(prompt_chars: usize) -> usize {
    prompt_chars.saturating_sub(1) / BLOCK_CHARS
}

/// Leading blocks of token sequences, bounded in count, least recently used evicted first.
#[derive(Debug, Default)]
pub(crate) struct PrefixCache {
    capacity_blocks: usize,
    /// Block hash → the tick it was last used at.
    blocks: HashMap<u64, u64>,
    /// Tick → block hash; the first entry is the least recently used block.
    by_age: BTreeMap<u64, u64>,
    tick: u64,
}

impl PrefixCache {
    /// A cache of `capacity_tokens` tokens (rounded down to whole blocks); 0 disables it.
    pub(crate) fn new(capacity_tokens: u64) -> Self {
        let capacity_blocks = usize::try_from(capacity_tokens / u64::from(BLOCK_TOKENS)).unwrap_or(usize::MAX);
        Self { capacity_blocks, ..Self::default() }
    }

    /// How many blocks fit.
    pub(crate) fn capacity_blocks(&self) -> usize {
        self.capacity_blocks
    }

    /// Blocks held now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.blocks.len()
    }

    /// How many leading blocks of `hashes` are cached (the first miss ends the prefix).
    pub(crate) fn cached_prefix(&self, hashes: &[u64]) -> usize {
        hashes.iter().take_while(|hash| self.blocks.contains_key(hash)).count()
    }

    /// Marks every block of one sequence as just used, adding the missing ones, then evicts the
    /// least recently used blocks down to capacity. A sequence longer than the cache keeps its
    /// leading blocks.
    pub(crate) fn insert(&mut self, hashes: &[u64]) {
        if self.capacity_blocks == 0 {
            return;
        }
        // The deepest block gets the oldest tick of the sequence, the first block the newest.
        for &hash in hashes.iter().rev() {
            self.tick += 1;
            if let Some(old) = self.blocks.insert(hash, self.tick) {
                self.by_age.remove(&old);
            }
            self.by_age.insert(self.tick, hash);
        }
        while self.blocks.len() > self.capacity_blocks {
            let Some((_, hash)) = self.by_age.pop_first() else { break };
            self.blocks.remove(&hash);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` blocks of distinct text.
    fn text(seed: &str, blocks: usize) -> String {
        (0..blocks).map(|i| format!("{seed}{i:0>width$}", width = BLOCK_CHARS - seed.len())).collect()
    }

    #[test]
    fn only_full_blocks_are_hashed_and_each_hash_covers_its_prefix() {
        let base = text("a", 3);
        assert_eq!(block_hashes("m", &base[..BLOCK_CHARS - 1]), Vec::<u64>::new());
        let three = block_hashes("m", &base);
        assert_eq!(three.len(), 3);
        // A partial fourth block adds nothing; a longer text extends the same chain.
        assert_eq!(block_hashes("m", &format!("{base}tail")), three);
        let mut longer = base.clone();
        longer.push_str(&text("z", 1));
        assert_eq!(block_hashes("m", &longer)[..3], three[..]);
        // Equal second blocks after different first blocks are different blocks.
        let other = format!("{}{}", text("b", 1), &base[BLOCK_CHARS..]);
        let other_hashes = block_hashes("m", &other);
        assert_ne!(other_hashes[1], three[1]);
        // Another model never shares blocks.
        assert_ne!(block_hashes("n", &base)[0], three[0]);
    }

    #[test]
    fn blocks_count_characters_not_bytes() {
        let wide = "é".repeat(BLOCK_CHARS * 2);
        assert_eq!(block_hashes("m", &wide).len(), 2);
        assert_eq!(block_hashes("m", &wide[..wide.len() - 2]).len(), 1);
    }

    #[test]
    fn a_shared_prefix_hits_and_a_divergence_misses_from_there_on() {
        let mut cache = PrefixCache::new(1024);
        let first = block_hashes("m", &text("a", 4));
        assert_eq!(cache.cached_prefix(&first), 0);
        cache.insert(&first);
        assert_eq!(cache.cached_prefix(&first), 4);

        // The same two leading blocks, then different text: two hits, then misses even though
        // the fourth block's text is the same as before.
        let a = text("a", 4);
        let diverged = format!("{}{}{}", &a[..2 * BLOCK_CHARS], text("x", 1), &a[3 * BLOCK_CHARS..]);
        assert_eq!(cache.cached_prefix(&block_hashes("m", &diverged)), 2);
        // A change in the first block misses everything.
        let changed = format!("{}{}", text("y", 1), &a[BLOCK_CHARS..]);
        assert_eq!(cache.cached_prefix(&block_hashes("m", &changed)), 0);
    }

    #[test]
    fn the_least_recently_used_blocks_are_evicted_at_capacity() {
        // Room for 4 blocks.
        let mut cache = PrefixCache::new(4 * u64::from(BLOCK_TOKENS));
        assert_eq!(cache.capacity_blocks(), 4);
        let a = block_hashes("m", &text("a", 2));
        let b = block_hashes("m", &text("b", 2));
        let c = block_hashes("m", &text("c", 2));
        cache.insert(&a);
        cache.insert(&b);
        cache.insert(&a); // a is now more recent than b
        cache.insert(&c);
        assert_eq!(cache.len(), 4);
        assert_eq!(cache.cached_prefix(&a), 2);
        assert_eq!(cache.cached_prefix(&c), 2);
        assert_eq!(cache.cached_prefix(&b), 0, "b was the least recently used");

        // One more block evicts the tail of the oldest chain (a), keeping its head.
        let d = block_hashes("m", &text("d", 1));
        cache.insert(&d);
        assert_eq!(cache.len(), 4);
        assert_eq!(cache.cached_prefix(&a), 1);
        assert_eq!(cache.cached_prefix(&c), 2);
    }

    #[test]
    fn a_sequence_longer_than_the_cache_keeps_its_head() {
        let mut cache = PrefixCache::new(3 * u64::from(BLOCK_TOKENS));
        let long = block_hashes("m", &text("a", 10));
        cache.insert(&long);
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.cached_prefix(&long), 3);
    }

    #[test]
    fn capacity_zero_disables_the_cache() {
        let mut cache = PrefixCache::new(0);
        let blocks = block_hashes("m", &text("a", 4));
        cache.insert(&blocks);
        assert_eq!(cache.len(), 0);
        assert_eq!(cache.cached_prefix(&blocks), 0);
        // Less than one block of capacity is no cache either.
        assert_eq!(PrefixCache::new(u64::from(BLOCK_TOKENS) - 1).capacity_blocks(), 0);
    }

    #[test]
    fn the_last_prompt_character_is_never_looked_up() {
        assert_eq!(lookup_blocks(0), 0);
        assert_eq!(lookup_blocks(BLOCK_CHARS), 0);
        assert_eq!(lookup_blocks(BLOCK_CHARS + 1), 1);
        assert_eq!(lookup_blocks(3 * BLOCK_CHARS), 2);
    }
}
