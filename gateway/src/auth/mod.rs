//! API keys: a file of SHA-256 hashes, each with an optional name, owner, account, allowed
//! models and limits; checked on every request and reloaded when the file changes.
//!
//! # The key file
//!
//! One key per line; blank lines and lines starting with `#` are ignored:
//!
//! ```text
//! # old style: a hash and an optional label (the key's name)
//! sha256:5e8f…<64 hex digits> alice
//! # named entries: any of these fields, in any order, after the hash
//! sha256:9a1b…<64 hex digits> name=lab-a owner="Ada Lovelace" account=proj-42 models=llama-3-8b,qwen-7b rpm=60 tpm=100000 concurrent=4 budget_tokens=5000000/month
//! ```
//!
//! | field | value | default |
//! |---|---|---|
//! | `name` | what logs, metrics and errors call the key | the label, else `sha256:` and the hash's first 8 digits |
//! | `owner` | who holds it | none |
//! | `account` | the Slurm account or project its use is charged to | none |
//! | `models` | the models it may use, `m1,m2`, or `*` for all | `*` |
//! | `rpm`, `tpm` | requests, tokens per minute | no limit |
//! | `concurrent` | requests in flight at once | no limit |
//! | `budget_tokens` | `N/day`, `N/week` or `N/month` (UTC calendar periods), interactive and batch tokens together | no budget |
//! | `batch_tpm` | tokens per minute of the key's batches, paced, apart from `tpm` | no limit |
//! | `batch_budget_tokens` | like `budget_tokens`, for the key's batch tokens alone | no budget |
//! | `batch_gpu_hours` | `N/day`, `N/week` or `N/month`: GPU-hours of the jobs the spinner starts for the key's batch backlog ([`crate::spin::batch_demand`]); once spent, the key's backlog no longer starts jobs (its batches still run on nodes that serve) | no budget |
//! | `overflow` | `yes`: when the federation cannot take a request, it may go to an outside provider of the gateway's `[[overflow]]` sections ([`crate::overflow`]), charged to this key; `no` | `no` |
//!
//! The limits are enforced by [`crate::limits`]. Numbers are positive whole numbers. A value
//! with spaces is written in double quotes (`owner="Ada Lovelace"`; `\"` and `\\` inside
//! quotes stand for `"` and `\`). Bare words right after the hash are the old-style label,
//! which names the key; a bare word after a field, an unknown or repeated field, a bad number,
//! a label together with `name=`, and a hash that appears on two lines are errors. A word
//! starting with `#` begins a comment to the end of the line. `tela gateway hash-key` writes
//! such lines (it quotes what needs quoting and checks the line parses). The one old label that
//! no longer reads as before is one with an unquoted `=` or an unclosed `"`: the file is then
//! refused with the line named, and quoting the label (`"a=b"`) fixes it.
//!
//! A key not allowed a model gets, for that model, exactly the 404 a model nobody serves gets,
//! and `/v1/models` lists only its models, so model names do not leak between tenants; for the
//! same reason such a key may not read `/status` or `/metrics` (403). Keys may share a name
//! (one person's old and new key while rotating).
//!
//! The gateway never sees or stores the keys themselves, so a leaked file does not leak them.
//! Why SHA-256 and not a password hash (argon2, bcrypt): API keys are long random strings, not
//! passwords people choose, so there is nothing to brute-force and a slow hash would only add
//! milliseconds to every request. Keys made by `hash-key --generate` carry 256 random bits.
//!
//! # Reloading
//!
//! [`KeyFile::watch`] polls the file's modification time and size every
//! [`RELOAD_INTERVAL`] and swaps in the new set when they change; a file that cannot be read or
//! parsed keeps the previous set in force (and the log names the line and what is wrong with
//! it), so a half-written edit never locks everyone out or lets everyone in. A key whose hash
//! is in both the old and the new file keeps its counters
//! ([`KeyCounters`](crate::limits::KeyCounters)): editing the file does not reset anyone's
//! minute or budget, even when the edit changes that key's limits.

mod access;
mod entry;
mod hash;
mod hash_key;
mod key_file;
mod key_set;

pub use access::{Access, Caller};
pub use entry::{entry_line, EntryError, KeyEntry, ModelScope, FIELDS};
pub use hash::{generate_key, key_line};
pub use hash_key::HashKeyArgs;
pub use key_file::{KeyFile, RELOAD_INTERVAL};
pub use key_set::{KeyFileError, KeySet};
