//! A batch's results: the lines of its output and error files, and [`finalize`], which writes
//! those files from the finished lines and ends the batch.

use rusqlite::{params, Connection};

use super::batches::{BatchRow, Status};
use super::files::{insert_file, FileMeta};

/// Ends batch `seq` as `status` (completed, expired or cancelled) at `now`: lines still pending
/// go to the error file with `code`, the output and error files are written (an error file only
/// when some line failed), and the batch names them — all in one transaction; the lines then
/// keep their state but not their results, which are in the files. `files_expire_at` is the
/// files' expiry.
pub fn finalize(
    conn: &mut Connection,
    batch: &BatchRow,
    status: Status,
    now: i64,
    files_expire_at: Option<i64>,
) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
    let code = match status {
        Status::Expired => {
            Some(("batch_expired", "this request was not run before the batch's completion window ended"))
        }
        Status::Cancelled => Some(("batch_cancelled", "this request was not run: the batch was cancelled")),
        _ => None,
    };
    if let Some((code, message)) = code {
        let unrun: Vec<(i64, Option<String>)> = {
            let mut s =
                tx.prepare("SELECT line, custom_id FROM batch_requests WHERE batch_seq = ?1 AND state = 'pending'")?;
            let rows = s.query_map([batch.seq], |r| Ok((r.get(0)?, r.get(1)?)))?;
            rows.collect::<Result<_, _>>()?
        };
        for (line, custom_id) in unrun {
            let result = error_line(custom_id.as_deref(), code, message, Some(line));
            tx.execute(
                "UPDATE batch_requests SET state = 'error', result = ?1, body = NULL WHERE batch_seq = ?2 AND line = ?3",
                params![result, batch.seq, line],
            )?;
        }
    }
    let file_of = |state: &str, suffix: &str| -> rusqlite::Result<Option<String>> {
        let mut content = Vec::new();
        {
            let mut s = tx.prepare(
                "SELECT COALESCE(result, '') FROM batch_requests WHERE batch_seq = ?1 AND state = ?2 ORDER BY line",
            )?;
            let mut rows = s.query(params![batch.seq, state])?;
            while let Some(r) = rows.next()? {
                let line: String = r.get(0)?;
                content.extend_from_slice(line.as_bytes());
                content.push(b'\n');
            }
        }
        if content.is_empty() {
            return Ok(None);
        }
        let meta = FileMeta {
            id: crate::batch::new_id("file-"),
            owner: batch.owner.clone(),
            purpose: "batch_output".into(),
            filename: format!("{}_{suffix}.jsonl", batch.id),
            bytes: i64::try_from(content.len()).unwrap_or(i64::MAX),
            created_at: now,
            expires_at: files_expire_at,
        };
        insert_file(&tx, &meta, &content)?;
        Ok(Some(meta.id))
    };
    let output = file_of("ok", "output")?;
    let errors = file_of("error", "error")?;
    // The files now hold the results: the lines keep only what the counts need.
    tx.execute("UPDATE batch_requests SET result = NULL WHERE batch_seq = ?1", [batch.seq])?;
    let time_column = match status {
        Status::Expired => "expired_at",
        Status::Cancelled => "cancelled_at",
        _ => "completed_at",
    };
    tx.execute(
        &format!(
            "UPDATE batches SET status = ?1, output_file_id = ?2, error_file_id = ?3,
                 finalizing_at = COALESCE(finalizing_at, ?4), {time_column} = ?4 WHERE seq = ?5"
        ),
        params![status.as_str(), output, errors, now, batch.seq],
    )?;
    tx.commit()
}

/// A line of the error file for a request that was not answered: OpenAI's shape, with
/// `custom_id` kept (null when the line had none) and, as a hint, the input line number.
pub fn error_line(custom_id: Option<&str>, code: &str, message: &str, line: Option<i64>) -> String {
    serde_json::json!({
        "id": crate::batch::new_id("batch_req_"),
        "custom_id": custom_id,
        "response": null,
        "error": {"code": code, "message": message, "line": line},
    })
    .to_string()
}

/// A line of the output (2xx) or error file for a request a node answered.
pub fn response_line(custom_id: &str, status_code: u16, request_id: &str, body: &serde_json::Value) -> String {
    serde_json::json!({
        "id": crate::batch::new_id("batch_req_"),
        "custom_id": custom_id,
        "response": {"status_code": status_code, "request_id": request_id, "body": body},
        "error": null,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::store::batches::tests::sample;
    use crate::batch::store::batches::{batch_by_seq, insert_batch, set_status};
    use crate::batch::store::files::file_content;
    use crate::batch::store::requests::{counts, finish_line, pending, Counts, Line, Work};

    #[test]
    fn lines_finish_once_and_files_hold_each_line_once_in_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut conn = crate::db::open(&dir.path().join("gateway.db")).expect("opens");
        let lines = vec![
            Line { line: 1, custom_id: Some("a".into()), model: Some("m".into()), work: Work::Send(b"{}".to_vec()) },
            Line {
                line: 2,
                custom_id: None,
                model: None,
                work: Work::Refused(error_line(None, "invalid_json", "bad", Some(2))),
            },
            Line { line: 3, custom_id: Some("c".into()), model: Some("m".into()), work: Work::Send(b"{}".to_vec()) },
        ];
        let seq = insert_batch(&mut conn, &sample("batch_1"), &lines).expect("insert");
        assert!(set_status(&conn, seq, &[Status::Validating], Status::InProgress, 101).expect("status"));
        assert!(!set_status(&conn, seq, &[Status::Validating], Status::InProgress, 101).expect("status"), "once");
        let todo = pending(&conn, seq, 0, 10).expect("pending");
        assert_eq!(todo.iter().map(|p| p.custom_id.as_str()).collect::<Vec<_>>(), ["a", "c"]);
        let body = serde_json::json!({"ok": true});
        let row =
            crate::ledger::Row { model: "m".into(), endpoint: "/v1/chat/completions".into(), ..Default::default() };
        assert!(finish_line(&mut conn, seq, 3, true, &response_line("c", 200, "r", &body), Some(&row), "batch_1")
            .expect("finish"));
        assert!(
            !finish_line(&mut conn, seq, 3, true, &response_line("c", 200, "r", &body), Some(&row), "batch_1")
                .expect("finish"),
            "a finished line is not finished twice"
        );
        assert_eq!(counts(&conn, seq).expect("counts"), Counts { total: 3, completed: 1, failed: 1 });
        let batch = batch_by_seq(&conn, seq).expect("read").expect("there");
        finalize(&mut conn, &batch, Status::Cancelled, 200, None).expect("finalize");
        let batch = batch_by_seq(&conn, seq).expect("read").expect("there");
        assert_eq!((batch.status(), batch.cancelled_at), (Status::Cancelled, Some(200)));
        let output = file_content(&conn, "o", batch.output_file_id.as_deref().expect("output"), 0).expect("read");
        let errors = file_content(&conn, "o", batch.error_file_id.as_deref().expect("errors"), 0).expect("read");
        let text = String::from_utf8(output.expect("output")).expect("utf-8");
        assert_eq!(text.lines().count(), 1, "{text}");
        let errors = String::from_utf8(errors.expect("errors")).expect("utf-8");
        let codes: Vec<String> = errors
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json")["error"]["code"].to_string())
            .collect();
        assert_eq!(codes, ["\"batch_cancelled\"", "\"invalid_json\""], "in input order");
        assert!(file_content(&conn, "someone else", batch.output_file_id.as_deref().expect("id"), 0)
            .expect("read")
            .is_none());
        let batch_rows: i64 = conn
            .query_row("SELECT COUNT(*) FROM requests WHERE batch_id = 'batch_1'", [], |r| r.get(0))
            .expect("count");
        assert_eq!(batch_rows, 1, "one ledger row, written with the result");
    }
}
