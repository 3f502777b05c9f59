//! Batch inference's tables in the gateway's database ([`crate::db`], migration 2): uploaded
//! files, batches, and one row per request line with its result. Everything here is a plain
//! synchronous function over a [`Connection`](rusqlite::Connection); callers run them off the
//! async threads.
//!
//! # Tables
//!
//! | table | what |
//! |---|---|
//! | `batch_files` | an uploaded or produced file: `id` (`file-…`), `owner` (the SHA-256 of the key that uploaded it, empty on a gateway without keys), `purpose` (`batch`, `batch_output`), `filename`, `bytes`, `created_at`, `expires_at` (Unix seconds) and the `content` itself |
//! | `batches` | a batch: `seq` (its order, for listing), `id` (`batch_…`), `owner`, the key's `key_name`, `key_hash` (12 hex digits, as in the ledger) and `account`, `endpoint`, `input_file_id`, `completion_window`, `status`, `output_file_id`, `error_file_id`, `errors` (JSON, when validation refused the whole batch), `metadata` (JSON), and the time of each status (Unix seconds) |
//! | `batch_requests` | one line of a batch's input: its `line` number, `custom_id`, `model`, the request `body` sent to a node, its `state` — `pending`, `ok` (a 2xx answer: the output file) or `error` (any other answer or a line that could not be sent: the error file) — and `result`, its line of that file (until the batch ends and the files are written) |
//!
//! The usage ledger's `requests` gains `batch_id`: the batch a row's request belonged to, NULL
//! for interactive requests.
//!
//! # Exactly once
//!
//! A line is done only when its `state` leaves `pending`, and that update, the line's ledger
//! row and nothing else share one transaction ([`finish_line`]); the update applies only to a
//! line still pending. A gateway killed while requests are in flight restarts with those lines
//! still pending and sends them again; a line whose result was written is never sent again. The
//! output and error files are built from the finished lines, one line each, in input order.
//!
//! # Layout
//!
//! One submodule per part: `schema` (the migration), `files`, `batches` (a batch's row and
//! status), `requests` (its lines, their counts and the exactly-once update) and `results` (the
//! file lines and [`finalize`]). Everything is re-exported here.

mod batches;
mod files;
mod requests;
mod results;
mod schema;

pub use batches::{active, batch, batch_by_seq, batches, insert_batch, set_status, BatchRow, Status};
pub use files::{delete_expired_files, delete_file, file, file_content, files, insert_file, FileMeta};
pub use requests::{counts, finish_line, has_pending, pending, Counts, Line, Pending, Work};
pub use results::{error_line, finalize, response_line};
pub use schema::MIGRATION;
