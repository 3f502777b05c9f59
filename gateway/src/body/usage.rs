//! The engine's usage, read from a tunnelled body on its way to the client.
//!
//! On the way through, a successful body is read for the token counts the engine reports
//! ([`EngineUsage`]), which [`Ending`](super::Ending) hands to the observer: the key's limits and the usage
//! ledger charge those, not an estimate ([`UsageTap`]). A JSON answer's `usage` is found in
//! its last bytes (every OpenAI-compatible engine writes it after the choices or vectors, so
//! only a bounded tail is kept, never the body). A stream's usage is the last event that
//! carries one: the engine sends it after the finish when the request asks for
//! `stream_options: {"include_usage": true}`. When the client did not ask, the gateway asks
//! for it ([`ask_for_usage`]) and takes it back out, so the client gets what it would have
//! got: the usage-only event is dropped, and the `"usage": null` that engines then add to
//! every other event is removed. That needs whole events: such a stream is passed on event by
//! event (each as soon as its blank line arrives), every other body chunk by chunk.

use bytes::{Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE};

/// The token counts of an engine's `usage` object.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineUsage {
    /// `prompt_tokens` (the Responses API's `input_tokens`).
    pub prompt_tokens: u64,
    /// `completion_tokens` (`output_tokens`); 0 for embeddings.
    pub completion_tokens: u64,
    /// `total_tokens`, else the sum of the two.
    pub total_tokens: u64,
}

impl EngineUsage {
    /// Reads a `usage` object; `None` for anything else (`null`, a number, an object without
    /// token counts).
    pub fn from_json(usage: &serde_json::Value) -> Option<EngineUsage> {
        let count = |names: [&str; 2]| names.iter().find_map(|n| usage.get(*n).and_then(serde_json::Value::as_u64));
        let prompt = count(["prompt_tokens", "input_tokens"]);
        let completion = count(["completion_tokens", "output_tokens"]);
        let total = usage.get("total_tokens").and_then(serde_json::Value::as_u64);
        if prompt.is_none() && completion.is_none() && total.is_none() {
            return None;
        }
        let (prompt, completion) = (prompt.unwrap_or(0), completion.unwrap_or(0));
        Some(EngineUsage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: total.unwrap_or(prompt.saturating_add(completion)),
        })
    }
}

/// How a tunnelled body is read for the engine's usage (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UsageTap {
    /// Not at all: an error answer, or a body the gateway cannot read (compressed, say).
    Off,
    /// A JSON answer: its `usage`, found in its last bytes.
    Json,
    /// Server-sent events: the last `usage` an event carries. With `strip`, the gateway asked
    /// for it and the client did not: the usage-only event and `"usage": null` are removed.
    Events {
        /// Remove what the client did not ask for.
        strip: bool,
    },
}

/// What a response head says about its body: enough to pick its [`UsageTap`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BodyShape {
    /// `text/event-stream`.
    pub sse: bool,
    /// `application/json`.
    pub json: bool,
    /// Compressed (a `content-encoding` other than `identity`).
    pub encoded: bool,
    /// Its `content-length`.
    pub length: Option<u64>,
}

impl BodyShape {
    /// Notes one header of the head (`name` lower-case).
    pub fn note(&mut self, name: &HeaderName, value: &HeaderValue) {
        if name == CONTENT_TYPE {
            self.sse |= value.as_bytes().starts_with(b"text/event-stream");
            self.json |= value.as_bytes().starts_with(b"application/json");
        }
        self.encoded |= name == CONTENT_ENCODING && !value.as_bytes().eq_ignore_ascii_case(b"identity");
        if name == CONTENT_LENGTH {
            self.length = value.to_str().ok().and_then(|v| v.trim().parse().ok());
        }
    }

    /// How the body is read for usage: only a successful answer has it, and a compressed one
    /// cannot be read on the way. `strip` as in [`UsageTap::Events`].
    pub fn tap(&self, success: bool, strip: bool) -> UsageTap {
        match (success && !self.encoded, self.sse, self.json) {
            (false, _, _) => UsageTap::Off,
            (true, true, _) => UsageTap::Events { strip },
            (true, false, true) => UsageTap::Json,
            (true, false, false) => UsageTap::Off,
        }
    }
}

/// How many trailing bytes of a JSON answer are kept to find its `usage`.
const JSON_TAIL: usize = 8 * 1024;

/// The longest event the tap holds whole; a longer one passes through as it comes.
const MAX_EVENT: usize = 256 * 1024;

/// A [`UsageTap`] at work.
pub(super) struct Tap {
    mode: UsageTap,
    /// The last bytes of a JSON answer, or the unfinished event of a stream.
    pending: BytesMut,
    usage: Option<EngineUsage>,
}

impl Tap {
    pub(super) fn new(mode: UsageTap) -> Tap {
        Tap { mode, pending: BytesMut::new(), usage: None }
    }

    pub(super) fn usage(&self) -> Option<EngineUsage> {
        self.usage
    }

    /// Takes a chunk from the node; gives what the client gets now.
    pub(super) fn pass(&mut self, chunk: Bytes) -> Bytes {
        match self.mode {
            UsageTap::Off => chunk,
            UsageTap::Json => {
                self.pending.extend_from_slice(&chunk[chunk.len().saturating_sub(JSON_TAIL)..]);
                let excess = self.pending.len().saturating_sub(JSON_TAIL);
                let _ = self.pending.split_to(excess);
                chunk
            }
            UsageTap::Events { strip: false } => {
                self.pending.extend_from_slice(&chunk);
                while let Some(end) = event_end(&self.pending) {
                    let event = self.pending.split_to(end);
                    self.read_event(&event);
                }
                if self.pending.len() > MAX_EVENT {
                    self.pending.clear();
                }
                chunk
            }
            UsageTap::Events { strip: true } => {
                self.pending.extend_from_slice(&chunk);
                let mut out = BytesMut::new();
                while let Some(end) = event_end(&self.pending) {
                    let event = self.pending.split_to(end);
                    self.strip_event(&event, &mut out);
                }
                if self.pending.len() > MAX_EVENT {
                    // Not a usage event (they are small): no reason to hold it any longer.
                    out.extend_from_slice(&self.pending.split());
                }
                out.freeze()
            }
        }
    }

    /// The body has ended: reads what was kept, gives what is still to be sent.
    pub(super) fn finish(&mut self) -> Bytes {
        match self.mode {
            UsageTap::Off => Bytes::new(),
            UsageTap::Json => {
                self.usage = usage_in_json_tail(&self.pending);
                self.pending.clear();
                Bytes::new()
            }
            UsageTap::Events { strip } => {
                // An event cut off without its blank line: clients drop it, so it is passed on
                // (if held) as it came, and read only when nothing is held back.
                let rest = self.pending.split().freeze();
                if strip {
                    rest
                } else {
                    self.read_event(&rest);
                    Bytes::new()
                }
            }
        }
    }

    /// Notes the usage `event` carries; gives its parsed data when it mentions usage at all.
    fn read_event(&mut self, event: &[u8]) -> Option<serde_json::Value> {
        find(event, b"\"usage\"")?;
        let data = event_data(event)?;
        let value: serde_json::Value = serde_json::from_slice(&data).ok()?;
        // The Responses API nests it in its final `response` object.
        let usage = value.get("usage").or_else(|| value.get("response").and_then(|r| r.get("usage")));
        if let Some(usage) = usage.and_then(EngineUsage::from_json) {
            self.usage = Some(usage);
        }
        Some(value)
    }

    /// Appends `event` to `out` without what the client did not ask for.
    fn strip_event(&mut self, event: &[u8], out: &mut BytesMut) {
        let Some(value) = self.read_event(event) else {
            out.extend_from_slice(event);
            return;
        };
        let usage = value.get("usage");
        let no_choices = value.get("choices").map_or(true, |c| c.as_array().is_some_and(Vec::is_empty));
        match usage {
            Some(u) if u.is_object() && no_choices => {} // the usage-only event: dropped
            Some(serde_json::Value::Null) => match without_null_usage(event) {
                Some(stripped) => out.extend_from_slice(&stripped),
                None => out.extend_from_slice(event),
            },
            _ => out.extend_from_slice(event),
        }
    }
}

/// The length of the first whole event in `buf` (through its blank line), if there is one.
fn event_end(buf: &[u8]) -> Option<usize> {
    let lf = find(buf, b"\n\n").map(|i| i + 2);
    let crlf = find(buf, b"\n\r\n").map(|i| i + 3);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The data of an event: its `data:` lines, joined by newlines as the SSE format says.
fn event_data(event: &[u8]) -> Option<Vec<u8>> {
    let mut data: Option<Vec<u8>> = None;
    for line in event.split(|b| *b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(rest) = line.strip_prefix(b"data:") else { continue };
        let rest = rest.strip_prefix(b" ").unwrap_or(rest);
        match &mut data {
            Some(d) => {
                d.push(b'\n');
                d.extend_from_slice(rest);
            }
            None => data = Some(rest.to_vec()),
        }
    }
    data
}

/// `event` without its `"usage": null` member (and the comma that separated it), or `None` if
/// it has none. Byte-exact otherwise: the rest of the event is what the engine sent.
fn without_null_usage(event: &[u8]) -> Option<Vec<u8>> {
    let space = |b: u8| b == b' ' || b == b'\t';
    let mut from = 0;
    while let Some(found) = find(&event[from..], b"\"usage\"") {
        let key = from + found;
        from = key + 1;
        // An escaped quote is inside a string, not a key.
        if key > 0 && event[key - 1] == b'\\' {
            continue;
        }
        let mut i = key + b"\"usage\"".len();
        while i < event.len() && space(event[i]) {
            i += 1;
        }
        if event.get(i) != Some(&b':') {
            continue;
        }
        i += 1;
        while i < event.len() && space(event[i]) {
            i += 1;
        }
        if !event[i..].starts_with(b"null") {
            continue;
        }
        let value_end = i + 4;
        let mut before = key;
        while before > 0 && space(event[before - 1]) {
            before -= 1;
        }
        let (cut_from, cut_to) = if before > 0 && event[before - 1] == b',' {
            let mut after = value_end;
            while after < event.len() && space(event[after]) {
                after += 1;
            }
            (before - 1, after)
        } else {
            let mut after = value_end;
            while after < event.len() && space(event[after]) {
                after += 1;
            }
            if event.get(after) == Some(&b',') {
                after += 1;
                while after < event.len() && space(event[after]) {
                    after += 1;
                }
            }
            (key, after)
        };
        let mut out = Vec::with_capacity(event.len());
        out.extend_from_slice(&event[..cut_from]);
        out.extend_from_slice(&event[cut_to..]);
        return Some(out);
    }
    None
}

/// The `usage` of a JSON answer whose last bytes are `tail`: the value of its last `"usage"`
/// key.
fn usage_in_json_tail(tail: &[u8]) -> Option<EngineUsage> {
    let mut end = tail.len();
    while let Some(key) = rfind(&tail[..end], b"\"usage\"") {
        end = key;
        if key > 0 && tail[key - 1] == b'\\' {
            continue;
        }
        let rest = &tail[key + b"\"usage\"".len()..];
        let rest = rest.trim_ascii_start();
        let Some(value) = rest.strip_prefix(b":") else { continue };
        let mut values = serde_json::Deserializer::from_slice(value).into_iter::<serde_json::Value>();
        if let Some(Ok(v)) = values.next() {
            return EngineUsage::from_json(&v);
        }
    }
    None
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn rfind(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).rposition(|w| w == needle)
}

/// The body of a streamed request, asking the engine for the final usage event
/// (`stream_options.include_usage`); `None` if it cannot be changed (not a JSON object).
/// Only called when the client did not ask for it itself.
pub fn ask_for_usage(body: &[u8]) -> Option<Bytes> {
    const OPTION: &[u8] = br#""stream_options":{"include_usage":true}"#;
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let object = value.as_object()?;
    if !object.contains_key("stream_options") {
        // The common case: insert the member before the closing brace, leaving every other
        // byte as the client sent it.
        let trimmed = body.trim_ascii_end();
        let inner = trimmed.strip_suffix(b"}")?;
        let mut out = BytesMut::with_capacity(body.len() + OPTION.len() + 1);
        out.extend_from_slice(inner);
        if !object.is_empty() {
            out.extend_from_slice(b",");
        }
        out.extend_from_slice(OPTION);
        out.extend_from_slice(b"}");
        return Some(out.freeze());
    }
    // `stream_options` without `include_usage: true`: rewritten whole.
    let mut value = value;
    let options = value.get_mut("stream_options")?;
    if !options.is_object() {
        *options = serde_json::json!({});
    }
    options.as_object_mut()?.insert("include_usage".into(), serde_json::Value::Bool(true));
    serde_json::to_vec(&value).ok().map(Bytes::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `chunks` through a tap; gives what the client got and the usage found.
    fn tap(mode: UsageTap, chunks: &[&[u8]]) -> (String, Option<EngineUsage>) {
        let mut tap = Tap::new(mode);
        let mut out = Vec::new();
        for c in chunks {
            out.extend_from_slice(&tap.pass(Bytes::copy_from_slice(c)));
        }
        out.extend_from_slice(&tap.finish());
        (String::from_utf8(out).expect("utf-8"), tap.usage())
    }

    const ROLE: &str =
        "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"},\"index\":0}],\"id\":\"c1\",\"usage\":null}\n\n";
    const TOKEN: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"say \\\"usage\\\":null\"},\"index\":0}],\"usage\": null ,\"id\":\"c1\"}\n\n";
    const USAGE: &str = "data: {\"choices\":[],\"id\":\"c1\",\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":4,\"total_tokens\":13}}\n\n";
    const DONE: &str = "data: [DONE]\n\n";

    fn usage(prompt: u64, completion: u64) -> Option<EngineUsage> {
        Some(EngineUsage { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion })
    }

    #[test]
    fn a_stream_the_client_asked_usage_of_passes_unchanged() {
        let whole = [ROLE, TOKEN, USAGE, DONE].concat();
        // Split anywhere, even inside an event: the bytes pass as they come.
        for cut in [1, 17, ROLE.len(), ROLE.len() + TOKEN.len() + 5, whole.len() - 1] {
            let (a, b) = whole.as_bytes().split_at(cut);
            let (out, found) = tap(UsageTap::Events { strip: false }, &[a, b]);
            assert_eq!(out, whole);
            assert_eq!(found, usage(9, 4), "cut at {cut}");
        }
    }

    #[test]
    fn usage_the_gateway_asked_for_is_taken_out_byte_exactly() {
        let whole = [ROLE, TOKEN, USAGE, DONE].concat();
        let want = [
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"},\"index\":0}],\"id\":\"c1\"}\n\n",
            // The quoted text inside the content is not a member, and stays.
            "data: {\"choices\":[{\"delta\":{\"content\":\"say \\\"usage\\\":null\"},\"index\":0}],\"id\":\"c1\"}\n\n",
            DONE,
        ]
        .concat();
        for cut in [1, 17, ROLE.len(), ROLE.len() + TOKEN.len() + 5, whole.len() - 1] {
            let (a, b) = whole.as_bytes().split_at(cut);
            let (out, found) = tap(UsageTap::Events { strip: true }, &[a, b]);
            assert_eq!(out, want, "cut at {cut}");
            assert_eq!(found, usage(9, 4));
        }
        // An engine that puts usage in its last choice chunk (as llama.cpp does) keeps it there.
        let last = "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\r\n\r\n";
        let (out, found) = tap(UsageTap::Events { strip: true }, &[last.as_bytes(), DONE.as_bytes()]);
        assert_eq!(out, [last, DONE].concat());
        assert_eq!(found, usage(1, 2));
        // A last event cut off without its blank line is passed on as it came.
        let (out, _) = tap(UsageTap::Events { strip: true }, &[ROLE.as_bytes(), b"data: {\"choi"]);
        assert!(out.ends_with("data: {\"choi"), "{out}");
    }

    #[test]
    fn null_usage_members_are_cut_with_their_comma() {
        let cut = |s: &str| without_null_usage(s.as_bytes()).map(|v| String::from_utf8(v).expect("utf-8"));
        assert_eq!(cut(r#"{"a":1,"usage":null}"#).as_deref(), Some(r#"{"a":1}"#));
        assert_eq!(cut(r#"{"usage": null, "a":1}"#).as_deref(), Some(r#"{"a":1}"#));
        assert_eq!(cut(r#"{"a":1 , "usage" : null ,"b":2}"#).as_deref(), Some(r#"{"a":1 ,"b":2}"#));
        assert_eq!(cut(r#"{"usage":{"prompt_tokens":1}}"#), None);
        assert_eq!(cut(r#"{"a":"\"usage\":null"}"#), None, "inside a string");
    }

    #[test]
    fn a_json_answer_gives_its_usage_from_its_tail() {
        let answer = format!(
            "{{\"id\":\"x\",\"choices\":[{{\"message\":{{\"content\":\"{}\"}}}}],\"usage\":{{\"prompt_tokens\":12,\"completion_tokens\":30,\"total_tokens\":42,\"prompt_tokens_details\":{{\"cached_tokens\":0}}}},\"system_fingerprint\":null}}",
            "word ".repeat(10_000)
        );
        let chunks: Vec<&[u8]> = answer.as_bytes().chunks(4096).collect();
        let (out, found) = tap(UsageTap::Json, &chunks);
        assert_eq!(out, answer, "passed unchanged");
        assert_eq!(found, usage(12, 30));
        let (_, embeddings) = tap(UsageTap::Json, &[br#"{"data":[],"usage":{"prompt_tokens":5,"total_tokens":5}}"#]);
        assert_eq!(embeddings, Some(EngineUsage { prompt_tokens: 5, completion_tokens: 0, total_tokens: 5 }));
        let (_, responses) = tap(UsageTap::Json, &[br#"{"usage":{"input_tokens":3,"output_tokens":4}}"#]);
        assert_eq!(responses, usage(3, 4), "the Responses API's names");
        assert_eq!(tap(UsageTap::Json, &[br#"{"usage":null}"#]).1, None);
        assert_eq!(tap(UsageTap::Off, &[USAGE.as_bytes()]).1, None);
    }

    #[test]
    fn streamed_requests_ask_for_usage_and_keep_the_rest() {
        let plain = br#"{"model":"m","stream":true,"messages":[]}  "#;
        let asked = ask_for_usage(plain).expect("changed");
        assert_eq!(&asked[..], br#"{"model":"m","stream":true,"messages":[],"stream_options":{"include_usage":true}}"#);
        let off = ask_for_usage(br#"{"model":"m","stream_options":{"include_usage":false,"x":1}}"#).expect("changed");
        let v: serde_json::Value = serde_json::from_slice(&off).expect("json");
        assert_eq!(v["stream_options"], serde_json::json!({"include_usage": true, "x": 1}));
        assert_eq!(v["model"], "m");
        assert!(ask_for_usage(b"[1,2]").is_none());
        assert!(ask_for_usage(b"not json").is_none());
    }
}
