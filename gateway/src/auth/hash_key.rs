//! `tela gateway hash-key`: the key-file line for a key, with the options that name it and set
//! its limits, checked to parse as the gateway will parse it.

use super::entry::{entry_line, EntryError, KeyEntry};
use super::hash::generate_key;

/// Print the key-file line for an API key read from stdin, or make a new key with --generate
/// (the key goes to stderr, for you to hand out; only its hash goes to stdout, so
/// `tela gateway hash-key --generate >> keys` stores no key).
///
/// The options name the key and set its limits; each becomes a `field=value` of the line.
/// Without them the line is the bare hash, which any gateway accepts.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct HashKeyArgs {
    /// Make a new random key instead of reading one from stdin.
    #[arg(long)]
    pub generate: bool,

    /// What logs, metrics and errors call the key [default: the hash's first digits].
    #[arg(long, value_name = "TEXT")]
    pub name: Option<String>,

    /// Who holds the key.
    #[arg(long, value_name = "TEXT")]
    pub owner: Option<String>,

    /// The Slurm account or project the key's use is charged to.
    #[arg(long, value_name = "TEXT")]
    pub account: Option<String>,

    /// The models the key may use, separated by commas, or * for all [default: *].
    #[arg(long, value_name = "M1,M2|*")]
    pub models: Option<String>,

    /// Requests per minute [default: no limit].
    #[arg(long, value_name = "N")]
    pub rpm: Option<String>,

    /// Tokens per minute, estimated from the prompt and max_tokens [default: no limit].
    #[arg(long, value_name = "N")]
    pub tpm: Option<String>,

    /// Requests in flight at once [default: no limit].
    #[arg(long, value_name = "N")]
    pub concurrent: Option<String>,

    /// Tokens per UTC calendar day, week (from Monday) or month [default: no budget].
    #[arg(long, value_name = "N/day|week|month")]
    pub budget_tokens: Option<String>,

    /// Tokens per minute of the key's batches, which the gateway paces to it; batches never
    /// use --tpm or --rpm [default: no limit].
    #[arg(long, value_name = "N")]
    pub batch_tpm: Option<String>,

    /// Batch tokens per UTC calendar day, week or month; batch tokens count toward
    /// --budget-tokens as well [default: no batch budget].
    #[arg(long, value_name = "N/day|week|month")]
    pub batch_budget_tokens: Option<String>,

    /// GPU-hours per UTC calendar day, week or month of the jobs the spinner starts for the
    /// key's batch backlog; once spent, its backlog starts no more jobs [default: no budget].
    #[arg(long, value_name = "N/day|week|month")]
    pub batch_gpu_hours: Option<String>,

    /// When the federation cannot take a request (no node serves the model, or every one is
    /// saturated), it may go to an outside provider of the gateway's `[[overflow]]` sections,
    /// charged to this key [default: never].
    #[arg(long)]
    pub overflow: bool,
}

impl HashKeyArgs {
    /// The fields the options set, in the key file's order.
    fn fields(&self) -> Vec<(&'static str, String)> {
        let options = [
            ("name", &self.name),
            ("owner", &self.owner),
            ("account", &self.account),
            ("models", &self.models),
            ("rpm", &self.rpm),
            ("tpm", &self.tpm),
            ("concurrent", &self.concurrent),
            ("budget_tokens", &self.budget_tokens),
            ("batch_tpm", &self.batch_tpm),
            ("batch_budget_tokens", &self.batch_budget_tokens),
            ("batch_gpu_hours", &self.batch_gpu_hours),
        ];
        let mut fields: Vec<(&'static str, String)> =
            options.into_iter().filter_map(|(field, value)| Some((field, value.clone()?))).collect();
        if self.overflow {
            fields.push(("overflow", "yes".to_string()));
        }
        fields
    }

    /// The line for `key`, checked to parse as the gateway will parse it.
    pub fn line(&self, key: &str) -> anyhow::Result<String> {
        let line = entry_line(key, &self.fields());
        match KeyEntry::parse(&line, 1) {
            Ok(_) => Ok(line),
            Err(EntryError::BadValue { field, value, problem }) => {
                anyhow::bail!("--{} '{value}': {problem}", field.replace('_', "-"))
            }
            Err(e) => anyhow::bail!("the options do not make a valid key-file line: {e}"),
        }
    }

    /// Prints the line to append to the key file.
    pub fn run(self) -> anyhow::Result<()> {
        // Checked before a key is made or read, so that a refused line hands out no key.
        self.line("check")?;
        let key = if self.generate {
            let key = generate_key();
            eprintln!("new API key (hand it to the client; only its hash is printed below): {key}");
            key
        } else {
            let mut line = String::new();
            std::io::stdin().read_line(&mut line)?;
            let key = line.trim().to_string();
            anyhow::ensure!(!key.is_empty(), "no key on stdin; pipe one in, or pass --generate to make one");
            key
        };
        println!("{}", self.line(&key)?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::auth::hash::key_line;
    use crate::auth::key_set::KeySet;
    use crate::limits::{Budget, GpuHours, Period};

    #[test]
    fn hash_key_writes_lines_the_gateway_reads() {
        let args = HashKeyArgs {
            name: Some("lab a".into()),
            owner: Some("#1 \"fan\"".into()),
            models: Some("llama,qwen".into()),
            rpm: Some("60".into()),
            budget_tokens: Some("1000/week".into()),
            ..HashKeyArgs::default()
        };
        let line = args.line("secret").expect("valid options");
        assert!(line.starts_with(&key_line("secret")), "{line}");
        assert!(line.contains(" name=\"lab a\" ") && line.contains(" rpm=60 "), "{line}");
        let (_, entry) = KeyEntry::parse(&line, 1).expect("it parses");
        assert_eq!((entry.name.as_str(), entry.owner.as_deref()), ("lab a", Some("#1 \"fan\"")));
        assert_eq!(entry.limits.budget, Some(Budget { tokens: 1000, period: Period::Week }));
        assert!(!entry.overflow, "no overflow unless asked");
        let overflowing = HashKeyArgs { overflow: true, ..HashKeyArgs::default() }.line("secret").expect("valid");
        assert!(overflowing.ends_with(" overflow=yes"), "{overflowing}");
        assert!(KeyEntry::parse(&overflowing, 1).expect("it parses").1.overflow);
        let batch = HashKeyArgs {
            batch_tpm: Some("500".into()),
            batch_budget_tokens: Some("9000/day".into()),
            ..HashKeyArgs::default()
        };
        let line = batch.line("secret").expect("valid batch options");
        assert!(line.ends_with(" batch_tpm=500 batch_budget_tokens=9000/day"), "{line}");
        let limits = KeyEntry::parse(&line, 1).expect("it parses").1.limits;
        assert_eq!(limits.batch_tokens_per_minute, Some(500));
        assert_eq!(limits.batch_budget, Some(Budget { tokens: 9000, period: Period::Day }));
        let gpu = HashKeyArgs { batch_gpu_hours: Some("12/week".into()), ..HashKeyArgs::default() };
        let gpu_line = gpu.line("secret").expect("valid GPU-hour budget");
        assert!(gpu_line.ends_with(" batch_gpu_hours=12/week"), "{gpu_line}");
        let limits = KeyEntry::parse(&gpu_line, 1).expect("it parses").1.limits;
        assert_eq!(limits.batch_gpu_hours, Some(GpuHours { hours: 12, period: Period::Week }));
        let bad = HashKeyArgs { batch_gpu_hours: Some("12".into()), ..HashKeyArgs::default() };
        let err = bad.line("secret").expect_err("no period").to_string();
        assert!(err.starts_with("--batch-gpu-hours '12': expected"), "{err}");
        let set = KeySet::parse(
            Path::new("keys"),
            &format!(
                "{line}
{}
",
                key_line("other")
            ),
        )
        .expect("valid");
        let prefix = &key_line("secret")["sha256:".len()..][..12];
        assert_eq!(set.entry_by_hash_prefix(prefix).map(|e| e.line), Some(1), "the batch store's 12 digits find it");
        assert!(set.entry_by_hash_prefix("").is_none());
        let bad = HashKeyArgs { budget_tokens: Some("1000".into()), ..HashKeyArgs::default() };
        let err = bad.line("secret").expect_err("no period").to_string();
        assert!(err.starts_with("--budget-tokens '1000': expected"), "{err}");
        let bare = HashKeyArgs::default().line("secret").expect("no options");
        assert_eq!(bare, key_line("secret"), "no options, the bare hash as before");
    }
}
