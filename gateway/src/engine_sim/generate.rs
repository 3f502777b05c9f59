//! Deterministic placeholder output: the text "generated" for a prompt, token counts and
//! embedding vectors. Everything here is a pure function of its arguments.

use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

/// The vocabulary of the placeholder text. Fixed: changing it changes every recorded answer.
const WORDS: [&str; 64] = [
    "tela", "node", "gateway", "stream", "token", "model", "cluster", "gossip", "lattice", "replica", "drain",
    "walltime", "tunnel", "engine", "router", "batch", "queue", "tier", "signal", "record", "merge", "probe", "anchor",
    "fabric", "kernel", "tensor", "weight", "prompt", "answer", "vector", "shard", "latency", "quorum", "epoch",
    "beacon", "harbor", "river", "lantern", "meadow", "copper", "violet", "orbit", "summit", "canyon", "ember",
    "glacier", "willow", "falcon", "pebble", "thunder", "marble", "cedar", "compass", "prism", "velvet", "echo",
    "nimbus", "quartz", "saffron", "timber", "zephyr", "harvest", "mosaic", "aurora",
];

/// Natural answer lengths (before `max_tokens` cuts them) lie in this range.
const NATURAL_LEN: std::ops::RangeInclusive<u64> = 8..=64;

/// 64-bit FNV-1a over the concatenation of `parts`. Used instead of `std`'s hasher because its
/// output must never change between Rust releases: recorded answers depend on it.
pub(crate) fn fnv1a64(parts: &[&[u8]]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &byte in *part {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    hash
}

/// Why generation ended, as OpenAI spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FinishReason {
    /// The answer reached its natural end.
    Stop,
    /// `max_tokens` cut the answer.
    Length,
}

impl FinishReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// A generated answer, token by token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Generation {
    /// Each token's text; concatenated they form the answer.
    pub(crate) tokens: Vec<String>,
    pub(crate) finish_reason: FinishReason,
}

impl Generation {
    pub(crate) fn text(&self) -> String {
        self.tokens.concat()
    }

    pub(crate) fn token_count(&self) -> u32 {
        u32::try_from(self.tokens.len()).unwrap_or(u32::MAX)
    }
}

/// The answer to `prompt` under `seed`, at most `max_tokens` tokens long (at least one).
///
/// Each prompt has a natural length; an answer that reaches it ends with a `"."` token and
/// finish reason `stop`, one cut short by `max_tokens` has reason `length`.
pub(crate) fn generate(seed: u64, prompt: &str, max_tokens: u32) -> Generation {
    let mut rng = ChaCha8Rng::seed_from_u64(fnv1a64(&[&seed.to_le_bytes(), prompt.as_bytes()]));
    let span = NATURAL_LEN.end() - NATURAL_LEN.start() + 1;
    let natural = NATURAL_LEN.start() + rng.next_u64() % span;
    let max = u64::from(max_tokens.max(1));
    let (len, finish_reason) = if natural <= max { (natural, FinishReason::Stop) } else { (max, FinishReason::Length) };
    let tokens = (0..len)
        .map(|i| {
            if finish_reason == FinishReason::Stop && i + 1 == len {
                return ".".to_owned();
            }
            let word = WORDS[(rng.next_u32() as usize) % WORDS.len()];
            if i == 0 {
                capitalise(word)
            } else {
                format!(" {word}")
            }
        })
        .collect();
    Generation { tokens, finish_reason }
}

fn capitalise(word: &str) -> String {
    let mut chars = word.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// Characters per simulated token: the approximation behind every token count of the simulator,
/// usage and the prefix cache's blocks alike.
pub(crate) const CHARS_PER_TOKEN: usize = 4;

/// The simulator's stand-in for a tokenizer: [`CHARS_PER_TOKEN`] characters per token, at least
/// one.
pub(crate) fn count_tokens(text: &str) -> u32 {
    let chars = text.chars().count().div_ceil(CHARS_PER_TOKEN).max(1);
    u32::try_from(chars).unwrap_or(u32::MAX)
}

/// A unit vector of `dim` components derived only from `text`: equal texts give equal
/// vectors, different texts (practically always) different ones.
pub(crate) fn embed(text: &str, dim: usize) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(fnv1a64(&[b"embedding\0", text.as_bytes()]));
    let raw: Vec<f64> = (0..dim).map(|_| f64::from(rng.next_u32()) / f64::from(u32::MAX) * 2.0 - 1.0).collect();
    let norm = raw.iter().map(|x| x * x).sum::<f64>().sqrt();
    if norm == 0.0 {
        // Only reachable if every draw hit the midpoint exactly; still return a unit vector.
        let mut unit = vec![0.0; dim];
        if let Some(first) = unit.first_mut() {
            *first = 1.0;
        }
        return unit;
    }
    raw.iter().map(|x| (x / norm) as f32).collect()
}

/// Standard base64 (RFC 4648, with padding) — what OpenAI's `encoding_format: "base64"` uses
/// for the little-endian `f32` bytes of an embedding.
pub(crate) fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], chunk.get(1).copied().unwrap_or(0), chunk.get(2).copied().unwrap_or(0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> shift) & 0x3f) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_and_prompt_give_the_same_answer() {
        assert_eq!(generate(7, "hello", 32), generate(7, "hello", 32));
        assert_ne!(generate(7, "hello", 32), generate(8, "hello", 32));
        assert_ne!(generate(7, "hello", 32), generate(7, "hello!", 32));
    }

    #[test]
    fn max_tokens_cuts_the_answer_and_says_length() {
        let cut = generate(1, "a prompt", 3);
        assert_eq!(cut.tokens.len(), 3);
        assert_eq!(cut.finish_reason, FinishReason::Length);
        // A shorter limit yields a prefix of the longer answer.
        let longer = generate(1, "a prompt", 5);
        assert_eq!(cut.tokens[..], longer.tokens[..3]);
    }

    #[test]
    fn a_natural_end_is_a_full_stop_with_reason_stop() {
        let full = generate(3, "tell me", 4096);
        assert_eq!(full.finish_reason, FinishReason::Stop);
        assert!(NATURAL_LEN.contains(&(full.tokens.len() as u64)));
        assert_eq!(full.tokens.last().map(String::as_str), Some("."));
        assert!(full.text().chars().next().is_some_and(char::is_uppercase));
    }

    #[test]
    fn embeddings_are_deterministic_unit_vectors() {
        let a = embed("the quick brown fox", 48);
        assert_eq!(a.len(), 48);
        let norm: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "norm {norm}");
        assert_eq!(a, embed("the quick brown fox", 48));
        assert_ne!(a, embed("the quick brown fox.", 48));
    }

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (input, expected) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(input.as_bytes()), expected, "input {input:?}");
        }
        assert_eq!(base64(&[0xfb, 0xff]), "+/8=");
    }

    #[test]
    fn token_count_is_about_four_characters_per_token() {
        assert_eq!(count_tokens(""), 1);
        assert_eq!(count_tokens("abcd"), 1);
        assert_eq!(count_tokens("abcde"), 2);
    }
}
