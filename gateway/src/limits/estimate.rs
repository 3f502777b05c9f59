//! A request's token estimate: what it is charged when admitted, until the engine's usage
//! replaces it.

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

/// The completion tokens a request is assumed to ask for when it sets no `max_tokens`.
pub const DEFAULT_COMPLETION_TOKENS: u64 = 256;

/// The tokens a request is estimated to use (see [the module docs](super)): text characters / 4 plus
/// its completion allowance. `path` tells embeddings (no completion) from the rest.
pub fn estimate_tokens(path: &str, body: &[u8]) -> u64 {
    #[derive(Deserialize, Default)]
    struct Fields {
        #[serde(default)]
        messages: Option<TextChars>,
        #[serde(default)]
        prompt: Option<TextChars>,
        #[serde(default)]
        input: Option<TextChars>,
        #[serde(default)]
        max_tokens: Option<u64>,
        #[serde(default)]
        max_completion_tokens: Option<u64>,
        #[serde(default)]
        n: Option<u64>,
    }
    let Ok(f) = serde_json::from_slice::<Fields>(body) else {
        // Not the shape expected: charge by size rather than not at all.
        return (body.len() as u64).div_ceil(4).max(1);
    };
    let chars: u64 = [f.messages, f.prompt, f.input].into_iter().flatten().map(|t| t.0).sum();
    let completion = if path.ends_with("/embeddings") {
        0
    } else {
        let each = f.max_completion_tokens.or(f.max_tokens).unwrap_or(DEFAULT_COMPLETION_TOKENS);
        each.saturating_mul(f.n.unwrap_or(1).clamp(1, 128))
    };
    chars.div_ceil(4).saturating_add(completion).max(1)
}

/// The characters of every string in a JSON value, except those under keys that carry images,
/// audio or files (their tokens are not a function of their text).
struct TextChars(u64);

/// Keys whose values are media, not text.
const MEDIA_KEYS: &[&str] = &["image_url", "input_audio", "audio_url", "video_url", "file"];

impl<'de> Deserialize<'de> for TextChars {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<TextChars, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = u64;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<u64, E> {
                Ok(s.chars().count() as u64)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<u64, E> {
                Ok(0)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<u64, E> {
                Ok(4)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<u64, E> {
                // A token id of a pre-tokenized prompt: four characters' worth, one token.
                Ok(4)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<u64, E> {
                Ok(0)
            }
            fn visit_unit<E: de::Error>(self) -> Result<u64, E> {
                Ok(0)
            }
            fn visit_none<E: de::Error>(self) -> Result<u64, E> {
                Ok(0)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<u64, A::Error> {
                let mut n = 0u64;
                while let Some(TextChars(c)) = seq.next_element()? {
                    n = n.saturating_add(c);
                }
                Ok(n)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<u64, A::Error> {
                let mut n = 0u64;
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    if MEDIA_KEYS.contains(&key.as_ref()) {
                        map.next_value::<IgnoredAny>()?;
                    } else {
                        n = n.saturating_add(map.next_value::<TextChars>()?.0);
                    }
                }
                Ok(n)
            }
        }
        deserializer.deserialize_any(V).map(TextChars)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates_count_text_and_the_completion_allowance() {
        let chat = br#"{"model":"m","messages":[{"role":"user","content":"abcdefgh"}],"max_tokens":10}"#;
        assert_eq!(estimate_tokens("/v1/chat/completions", chat), 3 + 10, "12 chars ('user' + 8) / 4, + 10");
        let parts = br#"{"messages":[{"role":"user","content":[{"type":"text","text":"abcd"},
                        {"type":"image_url","image_url":{"url":"data:image/png;base64,AAAAAAAAAAAAAAAA"}}]}],
                        "max_completion_tokens":5,"max_tokens":99,"n":2}"#;
        assert_eq!(estimate_tokens("/v1/chat/completions", parts), 6 + 10, "image bytes are not text; n=2");
        let prompt = br#"{"model":"m","prompt":"abcdefgh"}"#;
        assert_eq!(estimate_tokens("/v1/completions", prompt), 2 + DEFAULT_COMPLETION_TOKENS);
        let embed = br#"{"model":"m","input":["abcd","efgh"]}"#;
        assert_eq!(estimate_tokens("/v1/embeddings", embed), 2);
        assert_eq!(estimate_tokens("/v1/completions", br#"{"prompt":[1,2,3],"max_tokens":1}"#), 3 + 1);
        assert_eq!(estimate_tokens("/v1/completions", br#"{"prompt": 5}"#), 1 + DEFAULT_COMPLETION_TOKENS);
        assert_eq!(estimate_tokens("/v1/embeddings", b"not json at all!"), 4, "odd bodies by size");
    }
}
