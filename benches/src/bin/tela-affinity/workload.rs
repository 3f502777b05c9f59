//! The workload: the system prompts, first messages and follow-up questions every conversation
//! sends, deterministic filler text so that they are the same in every phase.

use super::args::Args;

/// The words the prompts are made of (~4 characters and a space each).
const WORDS: &[&str] = &[
    "data", "node", "slurm", "queue", "model", "token", "cache", "batch", "graph", "tensor", "shard", "layer",
    "kernel", "stream", "route", "block", "prefix", "merge", "epoch", "score", "field", "table", "index", "query",
];

/// Deterministic filler text of about `tokens` tokens (4 characters each) drawn by `seed`.
fn text(seed: u64, tokens: usize) -> String {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut s = String::with_capacity(tokens * 4 + 8);
    while s.len() < tokens * 4 {
        // xorshift64: enough to make every text its own.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push_str(WORDS[(x % WORDS.len() as u64) as usize]);
        s.push(' ');
    }
    s
}

/// What every conversation says, the same in every phase.
pub(crate) struct Workload {
    pub(crate) systems: Vec<String>,
    firsts: Vec<String>,
    followup_tokens: usize,
    pub(crate) turns: usize,
    pub(crate) max_tokens: u64,
}

impl Workload {
    /// The prompts `args` ask for.
    pub(crate) fn new(args: &Args) -> Workload {
        let systems = (0..args.groups)
            .map(|g| {
                format!(
                    "You are assistant number {g} of the research computing centre. {}",
                    text(1000 + g as u64, args.system_tokens)
                )
            })
            .collect();
        let firsts = (0..args.conversations)
            .map(|c| format!("Conversation {c}. Here is my document: {}", text(50_000 + c as u64, args.first_tokens)))
            .collect();
        Workload {
            systems,
            firsts,
            followup_tokens: args.followup_tokens,
            turns: args.turns,
            max_tokens: args.max_tokens,
        }
    }

    /// The user message of turn `turn` (from 0) of conversation `conversation`.
    pub(crate) fn user_turn(&self, conversation: usize, turn: usize) -> String {
        if turn == 0 {
            return self.firsts[conversation].clone();
        }
        let seed = 1_000_000 + (conversation * 1000 + turn) as u64;
        format!("Question {turn}: {}?", text(seed, self.followup_tokens))
    }
}
