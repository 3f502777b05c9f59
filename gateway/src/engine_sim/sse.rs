//! Server-sent events as OpenAI-compatible servers write them: one `data:` event per chunk, a
//! blank line after each, and `data: [DONE]` to end the stream.

use bytes::Bytes;
use serde::Serialize;

/// The event that ends every OpenAI stream.
pub const DONE: &[u8] = b"data: [DONE]\n\n";

/// Encodes `data` as one event. Each line of `data` becomes its own `data:` field, as the SSE
/// specification requires, so a client reassembles exactly `data`.
pub fn event(data: &str) -> Bytes {
    let mut out = String::with_capacity(data.len() + 8);
    for line in data.split('\n') {
        out.push_str("data: ");
        out.push_str(line.strip_suffix('\r').unwrap_or(line));
        out.push('\n');
    }
    out.push('\n');
    Bytes::from(out)
}

/// Encodes `value` as compact JSON in one `data: {json}\n\n` event. Compact JSON escapes every
/// newline inside strings, so the event is always a single line.
pub fn json_event(value: &impl Serialize) -> Bytes {
    // Serialising plain data (maps, strings, numbers) to a Vec cannot fail; fall back to an
    // empty object rather than panic if a caller passes a type with a failing Serialize.
    let json = serde_json::to_string(value).unwrap_or_else(|_| "{}".to_owned());
    event(&json)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_chunk_is_one_data_line_and_a_blank_line() {
        let chunk = serde_json::json!({"choices": [{"delta": {"content": "a\nb"}}]});
        assert_eq!(&json_event(&chunk)[..], b"data: {\"choices\":[{\"delta\":{\"content\":\"a\\nb\"}}]}\n\n");
    }

    #[test]
    fn multi_line_data_gets_one_field_per_line() {
        assert_eq!(&event("one\ntwo")[..], b"data: one\ndata: two\n\n");
        assert_eq!(&event("crlf\r\nend")[..], b"data: crlf\ndata: end\n\n");
        assert_eq!(&event("")[..], b"data: \n\n");
    }

    #[test]
    fn done_is_the_openai_terminator() {
        assert_eq!(DONE, &event("[DONE]")[..]);
    }
}
