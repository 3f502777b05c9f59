//! A request's head as chained block hashes ([`Prefix`], built by [`PrefixHasher`]), and the
//! rendezvous weight that ranks nodes for its key: steps 1 to 4 of the [routing](super) rules.

use crate::id::NodeId;
use sha2::{Digest, Sha256};

/// Bytes per hashed block of a request's head.
const BLOCK_BYTES: usize = 256;
/// Blocks hashed at most per request: the head is bounded to `MAX_BLOCKS × BLOCK_BYTES` bytes.
const MAX_BLOCKS: usize = 64;
/// Bytes of one message's content that enter the head at most.
const MESSAGE_BYTES: usize = 4096;
/// Bytes of one message's role that enter the head at most.
const ROLE_BYTES: usize = 32;

const HEAD_BYTES: usize = BLOCK_BYTES * MAX_BLOCKS;
const CHAT_TAG: u8 = b'C';
const PROMPT_TAG: u8 = b'P';

/// A request's leading content as chained block hashes, and the key routing uses (see the
/// [routing](super) rules). Build it with [`PrefixHasher`]; the default is a request without content.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Prefix {
    blocks: Vec<u64>,
    content: bool,
}

impl Prefix {
    /// Bytes per hashed block of a request's head.
    pub const BLOCK_BYTES: usize = BLOCK_BYTES;
    /// Blocks hashed at most per request: the head is bounded to `MAX_BLOCKS × BLOCK_BYTES` bytes.
    pub const MAX_BLOCKS: usize = MAX_BLOCKS;
    /// Bytes of one message's content that enter the head at most.
    pub const MESSAGE_BYTES: usize = MESSAGE_BYTES;
    /// Bytes of one message's role that enter the head at most.
    pub const ROLE_BYTES: usize = ROLE_BYTES;

    /// The chained hash of each block of the head, in order (at most [`Prefix::MAX_BLOCKS`]).
    pub fn blocks(&self) -> &[u64] {
        &self.blocks
    }

    /// The rendezvous key: the last block's chained hash; `None` without content.
    pub fn key(&self) -> Option<u64> {
        self.blocks.last().copied().filter(|_| self.content)
    }

    /// `node`'s rendezvous weight for this prefix (step 4 of the [routing](super) rules): prefix
    /// routing sends the request to the candidate of highest weight within the load bound.
    /// `None` without a key.
    pub fn weight(&self, node: &NodeId) -> Option<u64> {
        self.key().map(|key| rendezvous_weight(key, node))
    }

    /// The prefix of a chat request whose messages are `(role, content)`, in order.
    pub fn of_messages<'a>(messages: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> Prefix {
        let mut hasher = PrefixHasher::new();
        for (role, content) in messages {
            if !hasher.message(role, content) {
                break;
            }
        }
        hasher.finish()
    }

    /// The prefix of a completions request whose prompt is `text`.
    pub fn of_prompt(text: &[u8]) -> Prefix {
        let mut hasher = PrefixHasher::new();
        hasher.prompt(text);
        hasher.finish()
    }
}

/// What the head is made of; a request is either a chat or a prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Chat,
    Prompt,
}

/// Builds a [`Prefix`] from a request's content as it is read: [`PrefixHasher::message`] for
/// each chat message in order, or [`PrefixHasher::prompt`] for each piece of a prompt, then
/// [`PrefixHasher::finish`]. Both return `false` once the head is complete: further content
/// cannot change the prefix, and the caller may skip it unread. Input beyond the bounds in the
/// [routing](super) rules is ignored, so the work is bounded whatever the request holds.
#[derive(Clone, Debug)]
pub struct PrefixHasher {
    /// The previous block's hash (zeros before the first).
    chain: [u8; 32],
    /// SHA-256 over `chain` and the current block's bytes so far.
    block: Sha256,
    /// Bytes in the current block.
    filled: usize,
    /// Bytes taken into the head so far.
    taken: usize,
    blocks: Vec<u64>,
    kind: Option<Kind>,
    content: bool,
    complete: bool,
}

impl Default for PrefixHasher {
    fn default() -> Self {
        PrefixHasher::new()
    }
}

impl PrefixHasher {
    /// An empty head.
    pub fn new() -> PrefixHasher {
        let chain = [0u8; 32];
        let mut block = Sha256::new();
        block.update(chain);
        PrefixHasher {
            chain,
            block,
            filled: 0,
            taken: 0,
            blocks: Vec::new(),
            kind: None,
            content: false,
            complete: false,
        }
    }

    /// Whether more content can still change the prefix.
    pub fn wants_more(&self) -> bool {
        !self.complete
    }

    /// Adds the next chat message; `content` is its text (the text parts of a multi-part
    /// content, concatenated). Returns [`PrefixHasher::wants_more`].
    pub fn message(&mut self, role: &str, content: &[u8]) -> bool {
        if self.complete || !self.start(Kind::Chat) {
            return false;
        }
        let role = &role.as_bytes()[..role.len().min(ROLE_BYTES)];
        let content = &content[..content.len().min(MESSAGE_BYTES)];
        self.feed(&[role.len() as u8]);
        self.feed(role);
        self.feed(&(content.len() as u32).to_le_bytes());
        self.feed(content);
        self.content |= !content.is_empty();
        if role == b"user" || self.taken == HEAD_BYTES {
            self.complete = true;
        }
        !self.complete
    }

    /// Adds the next piece of a prompt (its text, or token ids as little-endian bytes); pieces
    /// are joined with a zero byte. Returns [`PrefixHasher::wants_more`].
    pub fn prompt(&mut self, piece: &[u8]) -> bool {
        if self.complete {
            return false;
        }
        if self.kind == Some(Kind::Prompt) {
            self.feed(&[0]);
        } else if !self.start(Kind::Prompt) {
            return false;
        }
        let room = BLOCK_BYTES.saturating_sub(self.taken);
        self.feed(&piece[..piece.len().min(room)]);
        self.content |= !piece.is_empty();
        if self.taken >= BLOCK_BYTES {
            self.complete = true;
        }
        !self.complete
    }

    /// The prefix of everything added.
    pub fn finish(mut self) -> Prefix {
        if self.filled > 0 {
            self.close_block();
        }
        Prefix { blocks: self.blocks, content: self.content }
    }

    /// Starts the head as `kind`; false if it already is of the other kind (a request has
    /// messages or a prompt, and messages win).
    fn start(&mut self, kind: Kind) -> bool {
        match self.kind {
            Some(k) => k == kind,
            None => {
                self.kind = Some(kind);
                self.feed(&[match kind {
                    Kind::Chat => CHAT_TAG,
                    Kind::Prompt => PROMPT_TAG,
                }]);
                true
            }
        }
    }

    fn feed(&mut self, bytes: &[u8]) {
        let mut rest = &bytes[..bytes.len().min(HEAD_BYTES - self.taken)];
        self.taken += rest.len();
        while !rest.is_empty() {
            let n = rest.len().min(BLOCK_BYTES - self.filled);
            self.block.update(&rest[..n]);
            self.filled += n;
            rest = &rest[n..];
            if self.filled == BLOCK_BYTES {
                self.close_block();
            }
        }
    }

    fn close_block(&mut self) {
        let digest = self.block.finalize_reset();
        self.chain.copy_from_slice(&digest);
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        self.blocks.push(u64::from_le_bytes(first));
        self.block.update(self.chain);
        self.filled = 0;
    }
}

/// SplitMix64's finaliser: a fixed bijection of `u64` that scatters every input bit.
fn mix64(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A node's rendezvous weight for `key`: higher ranks first.
pub(super) fn rendezvous_weight(key: u64, node: &NodeId) -> u64 {
    let mut halves = [0u8; 8];
    halves.copy_from_slice(&node.0[..8]);
    let high = u64::from_le_bytes(halves);
    halves.copy_from_slice(&node.0[8..]);
    let low = u64::from_le_bytes(halves);
    mix64(key ^ mix64(high ^ mix64(low)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(messages: &[(&str, &str)]) -> Prefix {
        Prefix::of_messages(messages.iter().map(|(r, c)| (*r, c.as_bytes())))
    }

    #[test]
    fn every_turn_of_a_conversation_has_its_key_and_other_conversations_do_not() {
        let system = ("system", "You are a careful assistant.");
        let first = chat(&[system, ("user", "Plan a trip to Lisbon")]);
        let third = chat(&[
            system,
            ("user", "Plan a trip to Lisbon"),
            ("assistant", "Day one: Alfama."),
            ("user", "And day two?"),
            ("assistant", "Belém."),
            ("user", "Thanks"),
        ]);
        assert!(first.key().is_some());
        assert_eq!(first.key(), third.key(), "later turns resend the head");
        assert_eq!(first.blocks(), third.blocks(), "content after the head is not hashed");
        let other_question = chat(&[system, ("user", "Plan a trip to Porto")]);
        let other_system = chat(&[("system", "You are terse."), ("user", "Plan a trip to Lisbon")]);
        let no_system = chat(&[("user", "Plan a trip to Lisbon")]);
        for other in [&other_question, &other_system, &no_system] {
            assert_ne!(first.key(), other.key());
        }
        // The role is part of the head: an assistant message is not a user message.
        assert_ne!(chat(&[("assistant", "hi"), ("user", "x")]).key(), chat(&[("user", "hi"), ("user", "x")]).key());
    }

    #[test]
    fn a_huge_head_costs_bounded_work() {
        let huge = "long document ".repeat(100_000);
        let prefix = chat(&[("system", &huge), ("user", "summarise it")]);
        let capped = chat(&[("system", &huge[..MESSAGE_BYTES]), ("user", "summarise it")]);
        assert_eq!(prefix.key(), capped.key(), "only the first MESSAGE_BYTES of a message count");
        assert!(prefix.blocks().len() <= MESSAGE_BYTES / BLOCK_BYTES + 2, "{}", prefix.blocks().len());
        // The first user turn still tells conversations with one huge system prompt apart.
        assert_ne!(prefix.key(), chat(&[("system", &huge), ("user", "translate it")]).key());
        // Many leading messages: the head stops at MAX_BLOCKS blocks.
        let many: Vec<(&str, &str)> = (0..1000).map(|_| ("system", &huge[..MESSAGE_BYTES])).collect();
        let bounded = chat(&many);
        assert_eq!(bounded.blocks().len(), MAX_BLOCKS);
        assert_eq!(bounded.key(), chat(&many[..10]).key());
    }

    #[test]
    fn a_prompt_is_keyed_by_its_first_block() {
        let session = "<|system|>You answer questions about the weather in detail.".repeat(8);
        let turn1 = format!("{session}<|user|>Is it raining?");
        let turn2 = format!("{turn1}<|assistant|>No.<|user|>Will it?");
        assert!(turn1.len() > BLOCK_BYTES);
        let p1 = Prefix::of_prompt(turn1.as_bytes());
        assert_eq!(p1.blocks().len(), 1);
        assert_eq!(p1.key(), Prefix::of_prompt(turn2.as_bytes()).key());
        assert_ne!(p1.key(), Prefix::of_prompt(b"a different prompt").key());
        // A chat and a prompt never share a key by accident of framing.
        assert_ne!(Prefix::of_prompt(b"user").key(), chat(&[("user", "")]).key());
    }

    #[test]
    fn no_content_means_no_key() {
        assert_eq!(Prefix::default().key(), None);
        assert_eq!(chat(&[]).key(), None);
        assert_eq!(chat(&[("user", "")]).key(), None);
        assert_eq!(Prefix::of_prompt(b"").key(), None);
        // Messages win over a prompt in the same request.
        let mut h = PrefixHasher::new();
        h.message("user", b"hello");
        assert!(!h.prompt(b"something else"));
        assert_eq!(h.finish().key(), chat(&[("user", "hello")]).key());
    }
}
