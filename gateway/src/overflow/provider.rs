//! The `[[overflow]]` sections of `gateway.toml`, checked: a provider's name, base URL, API
//! key (read once, from an environment variable or a file, and shown to no one) and models.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderValue;
use http::Uri;
use serde::Deserialize;

use crate::spin::config::{ConfigError, Dur};

/// The default of `timeout`: the longest the provider may take to start its answer.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// One `[[overflow]]` section as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverflowSection {
    /// What logs, `/status`, the ledger and `x-tela-node` call the provider.
    pub name: String,
    /// The provider's OpenAI base URL, `http(s)://host[:port][/path]`, usually ending in `/v1`.
    pub base_url: String,
    /// The environment variable holding its API key.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// The file holding its API key (first line).
    #[serde(default)]
    pub api_key_file: Option<PathBuf>,
    /// The models it may take.
    pub models: Vec<String>,
    /// How long a request that may overflow waits for a slot on a saturated model first
    /// (default `0s`).
    #[serde(default)]
    pub after_wait: Option<Dur>,
    /// The longest the provider may take to start its answer (default 60 s).
    #[serde(default)]
    pub timeout: Option<Dur>,
    /// Also trust this CA certificate (PEM) for an `https://` provider.
    #[serde(default)]
    pub ca_cert: Option<PathBuf>,
}

/// A provider's API key: shown to no one.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(Arc<str>);

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

impl ApiKey {
    /// `Bearer <key>`, marked sensitive (hyper's HTTP/2 encoder never indexes it).
    pub(super) fn bearer(&self) -> Option<HeaderValue> {
        let mut value = HeaderValue::from_str(&format!("Bearer {}", self.0)).ok()?;
        value.set_sensitive(true);
        Some(value)
    }
}

/// A provider, checked, with its key read.
#[derive(Clone, Debug)]
pub struct Provider {
    /// Its name.
    pub name: String,
    /// Its base URL, without a trailing `/`.
    pub base_url: String,
    pub(super) https: bool,
    pub(super) host: String,
    pub(super) port: u16,
    /// The base URL's path, without a trailing `/` (`/v1`).
    pub(super) base_path: String,
    pub(super) key: Option<ApiKey>,
    /// The models it may take.
    pub models: BTreeSet<String>,
    /// How long a request waits on a saturated model before it overflows.
    pub after_wait: Duration,
    /// The longest the provider may take to start its answer.
    pub timeout: Duration,
    /// An extra CA to trust.
    pub ca_cert: Option<PathBuf>,
}

impl Provider {
    /// Checks `section` (the `index`th) and reads its key, from the environment through
    /// `env`.
    pub fn resolve(
        section: &OverflowSection,
        index: usize,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Provider, ConfigError> {
        let at =
            if section.name.is_empty() { format!("overflow[{index}]") } else { format!("overflow[{}]", section.name) };
        let invalid = |field: &str, reason: String| ConfigError::Invalid { key: format!("{at}.{field}"), reason };
        if section.name.is_empty()
            || !section.name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(invalid("name", "give a name of letters, digits, '-', '_' or '.'".into()));
        }
        let base_url = section.base_url.trim().trim_end_matches('/').to_string();
        let uri: Uri = base_url.parse().map_err(|e| invalid("base_url", format!("'{base_url}' is not a URL: {e}")))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(invalid("base_url", format!("'{base_url}': use an http:// or https:// URL"))),
        };
        let authority = uri.authority().ok_or_else(|| invalid("base_url", format!("'{base_url}' has no host")))?;
        if authority.as_str().contains('@') {
            return Err(invalid(
                "base_url",
                "no credentials in the URL: put the key in api_key_env or api_key_file".into(),
            ));
        }
        if uri.query().is_some() {
            return Err(invalid("base_url", format!("'{base_url}': no query string in the base URL")));
        }
        let host = authority.host().trim_start_matches('[').trim_end_matches(']').to_string();
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        let base_path = uri.path().trim_end_matches('/').to_string();
        let key = match (&section.api_key_env, &section.api_key_file) {
            (Some(_), Some(_)) => {
                return Err(invalid("api_key_env", "give api_key_env or api_key_file, not both".into()));
            }
            (Some(var), None) => {
                let key = env(var).map(|k| k.trim().to_string()).filter(|k| !k.is_empty()).ok_or_else(|| {
                    invalid("api_key_env", format!("the environment variable {var} is not set or empty"))
                })?;
                Some(key)
            }
            (None, Some(path)) => Some(read_key(path).map_err(|e| invalid("api_key_file", e.to_string()))?),
            // A provider without keys: another gateway with --no-auth, a local engine.
            (None, None) => None,
        };
        let key = key.map(|k| ApiKey(k.into()));
        if key.as_ref().is_some_and(|k| k.bearer().is_none()) {
            // Not echoed: it is the secret.
            return Err(invalid("api_key_env", "the key holds characters an HTTP header cannot carry".into()));
        }
        if section.models.is_empty() || section.models.iter().any(|m| m.trim().is_empty()) {
            return Err(invalid("models", "list the models the provider may take, e.g. [\"gpt-4o-mini\"]".into()));
        }
        let timeout = section.timeout.map_or(DEFAULT_TIMEOUT, |d| d.0);
        if timeout.is_zero() {
            return Err(invalid("timeout", "must be longer than zero".into()));
        }
        Ok(Provider {
            name: section.name.clone(),
            base_url,
            https,
            host,
            port,
            base_path,
            key,
            models: section.models.iter().map(|m| m.trim().to_string()).collect(),
            after_wait: section.after_wait.map_or(Duration::ZERO, |d| d.0),
            timeout,
            ca_cert: section.ca_cert.clone(),
        })
    }

    /// Checks every section; names must differ.
    pub fn resolve_all(sections: &[OverflowSection]) -> Result<Vec<Provider>, ConfigError> {
        let env = |var: &str| std::env::var(var).ok();
        let mut providers: Vec<Provider> = Vec::with_capacity(sections.len());
        for (i, section) in sections.iter().enumerate() {
            let provider = Provider::resolve(section, i, &env)?;
            if providers.iter().any(|p| p.name == provider.name) {
                return Err(ConfigError::Invalid {
                    key: format!("overflow[{}].name", provider.name),
                    reason: "two [[overflow]] sections have this name; give each its own".into(),
                });
            }
            providers.push(provider);
        }
        Ok(providers)
    }

    /// What `--check-config` prints about it.
    pub fn describe(&self) -> String {
        let models: Vec<&str> = self.models.iter().map(String::as_str).collect();
        format!(
            "overflow '{}': {} for {} (after {} on a saturated model; key {})",
            self.name,
            self.base_url,
            models.join(", "),
            humantime::format_duration(self.after_wait),
            if self.key.is_some() { "set" } else { "none" }
        )
    }
}

/// Why `api_key_file` gave no key. Nothing is changed; the configuration is refused.
#[derive(Debug, thiserror::Error)]
enum KeyFileError {
    /// The file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The file's first line is blank.
    #[error("{} holds no key on its first line", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

fn read_key(path: &Path) -> Result<String, KeyFileError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| KeyFileError::Read { path: path.to_path_buf(), source })?;
    let key = text.lines().next().unwrap_or_default().trim().to_string();
    if key.is_empty() {
        return Err(KeyFileError::Empty { path: path.to_path_buf() });
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn section(text: &str) -> OverflowSection {
        toml::from_str(text).expect("a section")
    }

    fn env(var: &str) -> Option<String> {
        (var == "PROVIDER_KEY").then(|| "sk-secret-123".to_string())
    }

    #[test]
    fn sections_are_checked_and_keys_never_shown() {
        let s = section(
            "name = \"cloud\"\nbase_url = \"https://api.example.com/v1/\"\napi_key_env = \"PROVIDER_KEY\"\n\
             models = [\"gpt-x\"]\nafter_wait = \"2s\"\n",
        );
        let p = Provider::resolve(&s, 0, &env).expect("valid");
        assert_eq!((p.host.as_str(), p.port, p.base_path.as_str(), p.https), ("api.example.com", 443, "/v1", true));
        assert_eq!(p.after_wait, Duration::from_secs(2));
        assert_eq!(p.timeout, DEFAULT_TIMEOUT);
        let shown = format!("{p:?} {}", p.describe());
        assert!(!shown.contains("sk-secret-123") && shown.contains("<redacted>"), "{shown}");
        let cases: &[(&str, &str)] = &[
            ("name = \"a b\"\nbase_url = \"http://h/v1\"\nmodels = [\"m\"]", "overflow[a b].name"),
            ("name = \"a\"\nbase_url = \"ftp://h/v1\"\nmodels = [\"m\"]", "http:// or https://"),
            ("name = \"a\"\nbase_url = \"http://u:p@h/v1\"\nmodels = [\"m\"]", "no credentials in the URL"),
            ("name = \"a\"\nbase_url = \"http://h/v1\"\nmodels = []", "overflow[a].models"),
            ("name = \"a\"\nbase_url = \"http://h/v1\"\nmodels = [\"m\"]\napi_key_env = \"UNSET_VAR_X\"", "UNSET_VAR_X is not set"),
            (
                "name = \"a\"\nbase_url = \"http://h/v1\"\nmodels = [\"m\"]\napi_key_env = \"PROVIDER_KEY\"\napi_key_file = \"/k\"",
                "not both",
            ),
            ("name = \"a\"\nbase_url = \"http://h/v1\"\nmodels = [\"m\"]\napi_key_file = \"/nonexistent/key\"", "cannot read"),
        ];
        for (text, expected) in cases {
            let err = Provider::resolve(&section(text), 0, &env).expect_err(text).to_string();
            assert!(err.contains(expected), "{text}: {err}");
        }
        let plain = Provider::resolve(
            &section("name = \"t\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodels = [\"m\"]"),
            0,
            &env,
        )
        .expect("no key is allowed");
        assert_eq!((plain.port, plain.https, plain.key.is_none()), (9, false, true));
        let keyless = section("name = \"t\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodels = [\"m\"]");
        let twice = [keyless.clone(), keyless];
        let err = Provider::resolve_all(&twice).expect_err("the same name twice").to_string();
        assert!(err.contains("two [[overflow]] sections"), "{err}");
    }
}
