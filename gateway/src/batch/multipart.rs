//! Just enough of `multipart/form-data` (RFC 7578) to read an upload to `POST /v1/files`: the
//! body is already in memory and size-checked, so parts are slices of it. What the OpenAI SDKs
//! send — a `purpose` field and a `file` part with a filename — and what `curl -F` sends both
//! parse; anything malformed is a [`MultipartError`], never a panic.

/// One part of a form.
#[derive(Debug, PartialEq, Eq)]
pub struct Part<'a> {
    /// Its `name` in `Content-Disposition`.
    pub name: String,
    /// Its `filename`, for a file.
    pub filename: Option<String>,
    /// Its content.
    pub data: &'a [u8],
}

/// The body is not a form this parser reads.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum MultipartError {
    /// No `boundary=` in the content type.
    #[error("the request is not multipart/form-data with a boundary: send the file as a multipart form (the OpenAI SDKs and curl -F do)")]
    NoBoundary,
    /// The body does not follow the form's framing.
    #[error("the multipart body is malformed: {0}")]
    Malformed(&'static str),
}

/// The boundary of a `multipart/form-data` content type.
pub fn boundary(content_type: &str) -> Result<String, MultipartError> {
    let mut params = content_type.split(';');
    let kind = params.next().unwrap_or("").trim();
    if !kind.eq_ignore_ascii_case("multipart/form-data") {
        return Err(MultipartError::NoBoundary);
    }
    params
        .filter_map(|p| p.trim().split_once('='))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("boundary"))
        .map(|(_, v)| v.trim().trim_matches('"').to_string())
        .filter(|b| !b.is_empty() && b.len() <= 200)
        .ok_or(MultipartError::NoBoundary)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    let (&first, rest) = needle.split_first()?;
    let mut from = 0;
    while from + needle.len() <= haystack.len() {
        let at = from + haystack[from..=haystack.len() - needle.len()].iter().position(|&b| b == first)?;
        if haystack[at + 1..at + needle.len()] == *rest {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

/// The parts of `body`, a form delimited by `boundary`.
pub fn parse<'a>(body: &'a [u8], boundary: &str) -> Result<Vec<Part<'a>>, MultipartError> {
    let delimiter = format!("--{boundary}");
    let delimiter = delimiter.as_bytes();
    let start = find(body, delimiter).ok_or(MultipartError::Malformed("no opening boundary"))?;
    let mut rest = &body[start + delimiter.len()..];
    let mut parts = Vec::new();
    // Between parts the delimiter is preceded by CRLF, which belongs to the framing.
    let next_delimiter = [b"\r\n".as_slice(), delimiter].concat();
    loop {
        if rest.starts_with(b"--") {
            return Ok(parts);
        }
        rest = rest
            .strip_prefix(b"\r\n")
            .or_else(|| rest.strip_prefix(b"\n"))
            .ok_or(MultipartError::Malformed("no line break after a boundary"))?;
        let (head_end, body_start) = match find(rest, b"\r\n\r\n") {
            Some(i) => (i, i + 4),
            None => find(rest, b"\n\n")
                .map(|i| (i, i + 2))
                .ok_or(MultipartError::Malformed("a part has no end of headers"))?,
        };
        let head = std::str::from_utf8(&rest[..head_end])
            .map_err(|_| MultipartError::Malformed("part headers are not UTF-8"))?;
        let content = &rest[body_start..];
        let end =
            find(content, &next_delimiter).ok_or(MultipartError::Malformed("a part is not closed by the boundary"))?;
        let (mut name, mut filename) = (None, None);
        for line in head.lines() {
            let Some((key, value)) = line.split_once(':') else { continue };
            if !key.trim().eq_ignore_ascii_case("content-disposition") {
                continue;
            }
            for param in value.split(';').skip(1) {
                let Some((k, v)) = param.trim().split_once('=') else { continue };
                let v = v.trim().trim_matches('"').to_string();
                match k.trim().to_ascii_lowercase().as_str() {
                    "name" => name = Some(v),
                    "filename" => filename = Some(v),
                    _ => {}
                }
            }
        }
        let name = name.ok_or(MultipartError::Malformed("a part has no name"))?;
        parts.push(Part { name, filename, data: &content[..end] });
        rest = &content[end + next_delimiter.len()..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_the_sdks_send() {
        let ct = "multipart/form-data; boundary=\"abc123\"";
        let b = boundary(ct).expect("boundary");
        assert_eq!(b, "abc123");
        let body = b"--abc123\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--abc123\r\n\
Content-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\nContent-Type: application/octet-stream\r\n\r\n\
{\"a\":1}\n{\"b\":2}\n\r\n--abc123--\r\n";
        let parts = parse(body, &b).expect("parses");
        assert_eq!(parts.len(), 2);
        assert_eq!((parts[0].name.as_str(), parts[0].data), ("purpose", b"batch".as_slice()));
        assert_eq!(parts[1].filename.as_deref(), Some("in.jsonl"));
        assert_eq!(parts[1].data, b"{\"a\":1}\n{\"b\":2}\n");
    }

    #[test]
    fn malformed_forms_are_errors() {
        assert_eq!(boundary("application/json"), Err(MultipartError::NoBoundary));
        assert_eq!(boundary("multipart/form-data"), Err(MultipartError::NoBoundary));
        assert!(parse(b"nothing here", "x").is_err());
        assert!(parse(b"--x\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nunclosed", "x").is_err());
        assert!(parse(b"--x\r\nno headers end", "x").is_err());
        assert_eq!(parse(b"--x--\r\n", "x"), Ok(vec![]));
    }
}
