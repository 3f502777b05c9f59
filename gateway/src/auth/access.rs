//! Who may call the API ([`Access`]: anyone, or holders of a key) and who is calling
//! ([`Caller`]), with the models and limits its key gives it.

use std::sync::Arc;
use std::time::Instant;

use http::header::HeaderMap;
use tela_runtime::snapshot::SnapshotCell;

use crate::limits::{KeyGuard, Now, RateHeaders, Refusal};

use super::entry::{KeyEntry, ModelScope};
use super::key_set::KeySet;

/// Who is calling: anyone (no keys) or the holder of a key, with what its limits said about
/// this request.
#[derive(Debug, Default)]
pub struct Caller {
    key: Option<Arc<KeyEntry>>,
    headers: Option<RateHeaders>,
}

/// The scope of a caller without a key.
static EVERY_MODEL: ModelScope = ModelScope::All;

impl Caller {
    /// A caller of a gateway without keys.
    pub fn anyone() -> Caller {
        Caller::default()
    }

    /// The holder of the key `entry`.
    pub fn holder(entry: Arc<KeyEntry>) -> Caller {
        Caller { key: Some(entry), headers: None }
    }

    /// The caller's key entry, if the gateway has keys.
    pub fn entry(&self) -> Option<&KeyEntry> {
        self.key.as_deref()
    }

    /// Whether the caller's requests may go to an outside provider: its key says
    /// `overflow=yes` (a gateway without keys never overflows).
    pub fn may_overflow(&self) -> bool {
        self.key.as_ref().is_some_and(|k| k.overflow)
    }

    /// The models the caller may use.
    pub fn models(&self) -> &ModelScope {
        self.key.as_ref().map_or(&EVERY_MODEL, |k| &k.models)
    }

    /// Admits an inference request under the key's limits (`estimate` gives its tokens, asked
    /// only when a limit counts tokens): the guard to hold until its response ends (`None` for
    /// a key without limits), or the refusal. Either way, the response's rate headers are
    /// what [`Caller::stamp`] then writes.
    pub fn admit(&mut self, estimate: impl FnOnce() -> u64, now: Now) -> Result<Option<KeyGuard>, Box<Refusal>> {
        let Some(entry) = self.key.as_ref().filter(|k| !k.limits.is_unlimited()) else { return Ok(None) };
        let cost = if entry.limits.counts_tokens() { estimate() } else { 0 };
        match entry.counters.admit(&entry.name, &entry.limits, cost, now) {
            Ok(admission) => {
                self.headers = Some(admission.headers);
                Ok(Some(admission.guard))
            }
            Err(refusal) => {
                self.headers = Some(refusal.headers);
                Err(refusal)
            }
        }
    }

    /// Adds the `x-ratelimit-*` headers of the key's rate limits, if it has any: as of its
    /// admission for an inference request, as of now for anything else.
    pub fn stamp(&self, headers: &mut HeaderMap) {
        let Some(entry) = self.key.as_ref().filter(|k| k.limits.has_rates()) else { return };
        let rates = self.headers.unwrap_or_else(|| entry.counters.headers(&entry.limits, Instant::now()));
        rates.write(headers);
    }
}

/// Who may call the API.
#[derive(Clone)]
pub enum Access {
    /// Anyone (`--no-auth`: loopback demos and tests only).
    Open,
    /// Holders of a key in the file.
    Keys(Arc<SnapshotCell<KeySet>>),
}

impl Access {
    /// Checks an `Authorization` header value (`Bearer <key>`); also accepts an `api-key`
    /// header value as Azure-style clients send. Says who is calling, or why not.
    pub fn check(&self, authorization: Option<&[u8]>, api_key: Option<&[u8]>) -> Result<Caller, &'static str> {
        let keys = match self {
            Access::Open => return Ok(Caller::anyone()),
            Access::Keys(keys) => keys.load(),
        };
        let presented = match (authorization, api_key) {
            (Some(h), _) => {
                let h = std::str::from_utf8(h).map_err(|_| "the Authorization header is not valid text")?;
                let (scheme, key) = h.trim().split_once(' ').ok_or("expected 'Authorization: Bearer <key>'")?;
                if !scheme.eq_ignore_ascii_case("bearer") {
                    return Err("expected 'Authorization: Bearer <key>'");
                }
                key.trim().to_string()
            }
            (None, Some(k)) => String::from_utf8_lossy(k).trim().to_string(),
            (None, None) => {
                return Err("no API key: send 'Authorization: Bearer <key>' (the OpenAI SDKs do this with api_key=...)")
            }
        };
        match keys.entry(&presented) {
            Some(entry) => Ok(Caller::holder(entry.clone())),
            None => Err("the API key is not valid for this gateway"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::auth::hash::{generate_key, key_line};
    use crate::auth::key_set::KeyFileError;

    #[test]
    fn keys_are_checked_by_hash_and_bad_lines_are_named() {
        let path = Path::new("keys");
        let text = format!("# team keys\n{} alice\n\n{}\n", key_line("k1"), key_line("k2"));
        let set = KeySet::parse(path, &text).expect("valid");
        assert!(set.accepts("k1") && set.accepts("k2") && !set.accepts("k3"));
        let access = Access::Keys(Arc::new(SnapshotCell::new(set)));
        assert!(access.check(Some(b"Bearer k1"), None).is_ok());
        assert!(access.check(Some(b"bearer  k2 "), None).is_ok());
        assert!(access.check(Some(b"Bearer k3"), None).is_err());
        assert!(access.check(None, Some(b"k1")).is_ok());
        assert!(access.check(None, None).is_err());
        assert!(access.check(Some(b"Basic k1"), None).is_err());
        let err = KeySet::parse(path, "sha256:xyz\n").unwrap_err().to_string();
        assert!(err.contains("keys:1") && err.contains("hash-key"), "{err}");
        assert!(matches!(KeySet::parse(path, "# none\n"), Err(KeyFileError::Empty(_))));
        assert!(generate_key().starts_with("tela-"));
    }

    #[test]
    fn callers_see_their_models_and_get_their_headers() {
        let text = format!("{} models=a rpm=10\n{} plain\n", key_line("limited"), key_line("plain"));
        let set = KeySet::parse(Path::new("keys"), &text).expect("valid");
        let mut limited = Caller::holder(set.entry("limited").expect("limited").clone());
        assert!(limited.models().allows("a") && !limited.models().allows("b"));
        assert!(Caller::anyone().models().allows("b"));
        let mut headers = HeaderMap::new();
        limited.stamp(&mut headers);
        assert_eq!(headers["x-ratelimit-remaining-requests"], "10", "before any request: as of now");
        let guard = limited.admit(|| unreachable!("no token limit, no estimate"), Now::current()).expect("admitted");
        assert!(guard.is_some());
        let mut headers = HeaderMap::new();
        limited.stamp(&mut headers);
        assert_eq!(headers["x-ratelimit-limit-requests"], "10");
        assert_eq!(headers["x-ratelimit-remaining-requests"], "9");
        assert_eq!(headers["x-ratelimit-reset-requests"], "6s");
        assert!(headers.get("x-ratelimit-limit-tokens").is_none());
        let mut plain = Caller::holder(set.entry("plain").expect("plain").clone());
        assert!(plain.admit(|| 0, Now::current()).expect("no limits").is_none());
        let mut headers = HeaderMap::new();
        plain.stamp(&mut headers);
        assert!(headers.is_empty(), "a key without limits gets no rate headers");
    }
}
