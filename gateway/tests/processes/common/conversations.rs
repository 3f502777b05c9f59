//! Multi-turn conversations for the prefix-affinity tests: openings that differ in their first
//! question, turns that resend the whole conversation, and the node order the documented rule
//! ranks each conversation by (computed here, from the head and the node ids alone).

use serde_json::{json, Value};
use tela_core::routing::Prefix;
use tela_core::NodeId;

use super::{post, Fed, MODEL};

/// The system prompt every opening shares.
pub const SYSTEM: &str = "You are a patient tutor. Answer in one short paragraph.";

/// The next turn's body: `messages` so far plus a new user message.
pub fn turn(messages: &mut Vec<Value>, question: &str) -> Value {
    messages.push(json!({"role": "user", "content": question}));
    json!({"model": MODEL, "messages": messages, "max_tokens": 6})
}

/// Sends the next turn of a conversation to `base`; records the answer in `messages` and
/// returns the node that served it.
pub async fn next_turn(base: &str, messages: &mut Vec<Value>, question: &str) -> String {
    let reply = post(base, "/v1/chat/completions", turn(messages, question)).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let answer = reply.json()["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_string();
    messages.push(json!({"role": "assistant", "content": answer}));
    reply.header("x-tela-node").expect("x-tela-node")
}

/// A conversation's opening: one shared system prompt, its own first question.
pub fn opening(i: usize) -> (Vec<Value>, String) {
    (vec![json!({"role": "system", "content": SYSTEM})], format!("Conversation {i}: explain topic number {i} to me."))
}

/// The nodes in the order the documented rule ranks them for conversation `i` (highest
/// rendezvous weight of its head's key first), as short ids.
pub fn ranking(fed: &Fed, i: usize) -> Vec<String> {
    let (_, first) = opening(i);
    let head = Prefix::of_messages([("system", SYSTEM.as_bytes()), ("user", first.as_bytes())]);
    assert!(head.key().is_some(), "a head with content has a key");
    let mut ids: Vec<NodeId> = fed.nodes.iter().map(|n| n.id).collect();
    ids.sort_by_key(|id| std::cmp::Reverse(head.weight(id)));
    ids.iter().map(NodeId::to_string).collect()
}
