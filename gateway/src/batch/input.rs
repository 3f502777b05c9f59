//! The checks of a batch's input file, line by line, as a batch is created.
//!
//! Each non-empty line must be a JSON object `{"custom_id", "method": "POST", "url", "body"}`
//! whose `url` is the batch's endpoint and whose `body` names a `model` the key may use and
//! the federation serves (or may spin up). A line that fails goes to the error file with a
//! code — `invalid_json`, `missing_custom_id`, `duplicate_custom_id`, `invalid_method`,
//! `invalid_url`, `invalid_body`, `model_not_found` — and the batch runs the rest. A file with
//! no request, or more than the gateway's limit, fails the whole batch at validation, as
//! OpenAI's does. Requests run without streaming: `stream` and `stream_options` are taken out
//! of each body.

use std::collections::HashSet;

use super::store::{error_line, Line, Work};

/// Why a whole batch was refused at validation: OpenAI's `errors.data` entries.
pub type Refusal = serde_json::Value;

/// Checks `content` for a batch to `endpoint` of at most `max_requests` requests;
/// `model_ok` says whether a model may be used. The lines, or why the whole batch fails.
pub fn check(
    content: &[u8],
    endpoint: &str,
    max_requests: usize,
    model_ok: impl Fn(&str) -> bool,
) -> Result<Vec<Line>, Refusal> {
    let raw: Vec<(i64, &[u8])> = content
        .split(|&b| b == b'\n')
        .enumerate()
        .map(|(i, l)| (i64::try_from(i).unwrap_or(i64::MAX).saturating_add(1), l))
        .filter(|(_, l)| !l.iter().all(u8::is_ascii_whitespace))
        .collect();
    let refuse = |code: &str, message: String| {
        Err(serde_json::json!([{"code": code, "message": message, "param": null, "line": null}]))
    };
    if raw.is_empty() {
        return refuse("empty_file", "the input file has no requests: give one JSON request per line".into());
    }
    if raw.len() > max_requests {
        return refuse(
            "too_many_requests",
            format!(
                "the input file has {} requests; this gateway takes at most {max_requests} in one batch: split it",
                raw.len()
            ),
        );
    }
    let mut seen: HashSet<String> = HashSet::new();
    let lines = raw.into_iter().map(|(n, text)| one_line(n, text, endpoint, &model_ok, &mut seen)).collect();
    Ok(lines)
}

fn one_line(n: i64, text: &[u8], endpoint: &str, model_ok: &impl Fn(&str) -> bool, seen: &mut HashSet<String>) -> Line {
    let refused = |custom_id: Option<String>, model: Option<String>, code: &str, message: String| Line {
        line: n,
        work: Work::Refused(error_line(custom_id.as_deref(), code, &message, Some(n))),
        custom_id,
        model,
    };
    let value: serde_json::Value = match serde_json::from_slice(text) {
        Ok(v) => v,
        Err(e) => return refused(None, None, "invalid_json", format!("line {n} is not valid JSON: {e}")),
    };
    let Some(object) = value.as_object() else {
        return refused(None, None, "invalid_json", format!("line {n} is not a JSON object"));
    };
    let Some(custom_id) = object.get("custom_id").and_then(|c| c.as_str()).map(str::to_string) else {
        return refused(None, None, "missing_custom_id", format!("line {n} has no string 'custom_id'"));
    };
    if !seen.insert(custom_id.clone()) {
        let message = format!("line {n} repeats the custom_id '{custom_id}' of an earlier line; each must be unique");
        return refused(Some(custom_id), None, "duplicate_custom_id", message);
    }
    let method = object.get("method").and_then(|m| m.as_str()).unwrap_or("POST");
    if !method.eq_ignore_ascii_case("POST") {
        let message = format!("line {n} has method '{method}'; batch requests use POST");
        return refused(Some(custom_id), None, "invalid_method", message);
    }
    let url = object.get("url").and_then(|u| u.as_str()).unwrap_or("");
    if url != endpoint {
        let message = format!("line {n} has url '{url}', but this batch's endpoint is '{endpoint}'");
        return refused(Some(custom_id), None, "invalid_url", message);
    }
    let Some(mut body) = object.get("body").and_then(|b| b.as_object()).cloned() else {
        return refused(Some(custom_id), None, "invalid_body", format!("line {n} has no JSON object 'body'"));
    };
    let Some(model) = body.get("model").and_then(|m| m.as_str()).filter(|m| !m.is_empty()).map(str::to_string) else {
        return refused(Some(custom_id), None, "invalid_body", format!("line {n}'s body has no 'model'"));
    };
    if !model_ok(&model) {
        let message = format!("line {n} asks for the model '{model}', which does not exist or this key may not use");
        return refused(Some(custom_id), Some(model), "model_not_found", message);
    }
    body.remove("stream");
    body.remove("stream_options");
    let bytes = serde_json::Value::Object(body).to_string().into_bytes();
    Line { line: n, custom_id: Some(custom_id), model: Some(model), work: Work::Send(bytes) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(line: &Line) -> Option<String> {
        match &line.work {
            Work::Send(_) => None,
            Work::Refused(r) => {
                let v: serde_json::Value = serde_json::from_str(r).expect("json");
                v["error"]["code"].as_str().map(str::to_string)
            }
        }
    }

    #[test]
    fn each_bad_line_is_refused_with_its_own_code_and_the_rest_run() {
        let ep = "/v1/chat/completions";
        let ok = |id: &str, model: &str| {
            format!(r#"{{"custom_id":"{id}","method":"POST","url":"{ep}","body":{{"model":"{model}","stream":true}}}}"#)
        };
        let text = [
            ok("a", "m"),
            "not json".into(),
            "".into(),
            r#"{"method":"POST","url":"/v1/chat/completions","body":{"model":"m"}}"#.into(),
            ok("a", "m"),
            ok("b", "nope"),
            r#"{"custom_id":"c","url":"/v1/embeddings","body":{"model":"m"}}"#.into(),
            r#"{"custom_id":"d","url":"/v1/chat/completions","body":{}}"#.into(),
            ok("e", "m"),
        ]
        .join("\n");
        let lines = check(text.as_bytes(), ep, 100, |m| m == "m").expect("checked");
        let codes: Vec<Option<String>> = lines.iter().map(code).collect();
        let want = [
            None,
            Some("invalid_json"),
            Some("missing_custom_id"),
            Some("duplicate_custom_id"),
            Some("model_not_found"),
            Some("invalid_url"),
            Some("invalid_body"),
            None,
        ];
        assert_eq!(codes, want.map(|c| c.map(str::to_string)));
        assert_eq!(lines.iter().map(|l| l.line).collect::<Vec<_>>(), [1, 2, 4, 5, 6, 7, 8, 9], "blank lines skipped");
        let Work::Send(body) = &lines[0].work else { panic!("sent") };
        assert!(!String::from_utf8_lossy(body).contains("stream"), "batch requests do not stream");
    }

    #[test]
    fn empty_and_oversized_files_fail_the_batch() {
        let e = check(b"\n \n", "/v1/embeddings", 10, |_| true).expect_err("empty");
        assert_eq!(e[0]["code"], "empty_file");
        let e = check(b"{}\n{}\n{}\n", "/v1/embeddings", 2, |_| true).expect_err("too many");
        assert_eq!(e[0]["code"], "too_many_requests");
    }
}
