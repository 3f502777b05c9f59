//! Framing of one tunnelled HTTP request on one stream, shared by the gateway (which opens a
//! stream per client request) and the node (which forwards it to its engine).
//!
//! ```text
//! opener → acceptor:  [u32 length][postcard RequestHead]  request body bytes ...  FIN
//! acceptor → opener:  [u32 0] [u32 length][postcard ResponseHead] response body bytes ... FIN
//! ```
//!
//! The acceptor answers a request head promptly with an *accepted* marker (a zero length, which
//! no head has) — alone if the response head is not ready within a few milliseconds, else in
//! the same write as the head ([`write_response_start`], which can carry the first body bytes
//! too). The opener can thus tell a live peer that is still working from one that is gone — a
//! killed process behind QUIC sends no reset — within a round trip: see [`read_accepted`].
//! [`read_response_head`] skips the marker, so a reader that does not care need not read it
//! separately.
//!
//! Lengths are big-endian and at most [`MAX_HEAD`]; a larger or malformed head is a
//! [`TunnelError`], never a panic. Bodies are raw bytes passed through unchanged and ended by
//! finishing the send side — no chunk framing, no buffering: [`forward_body`] writes each
//! chunk as soon as it is read, which is what keeps server-sent events flowing token by token.
//!
//! ```
//! # async fn demo(conn: tela_transports::Connection) -> Result<(), Box<dyn std::error::Error>> {
//! use tela_transports::tunnel::{read_response_head, write_request_head, RequestHead};
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! let (mut send, mut recv) = conn.open_stream().await?;
//! let head = RequestHead {
//!     method: "POST".into(),
//!     path_and_query: "/v1/chat/completions".into(),
//!     headers: vec![("content-type".into(), b"application/json".to_vec())],
//! };
//! write_request_head(&mut send, &head).await?;
//! send.write_all(br#"{"model":"m","messages":[]}"#).await?;
//! send.shutdown().await?;
//! let response = read_response_head(&mut recv).await?;
//! let mut body = Vec::new();
//! recv.read_to_end(&mut body).await?;
//! # let _ = response; Ok(()) }
//! ```

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The largest encoded request or response head.
pub const MAX_HEAD: usize = 64 * 1024;

/// An HTTP request's head, as the gateway received it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestHead {
    /// The method, e.g. `POST`.
    pub method: String,
    /// The path and query, e.g. `/v1/completions?x=1`.
    pub path_and_query: String,
    /// Header names and raw values, in order; names may repeat.
    pub headers: Vec<(String, Vec<u8>)>,
}

/// An HTTP response's head, as the engine sent it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResponseHead {
    /// The status code, 100–999.
    pub status: u16,
    /// Header names and raw values, in order; names may repeat.
    pub headers: Vec<(String, Vec<u8>)>,
}

/// A head could not be written or read. Reading errors leave the stream unusable.
#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    /// The stream ended before a head arrived (the peer gave up or was cut off).
    #[error("the stream ended before the head arrived")]
    Closed,
    /// The head is larger than [`MAX_HEAD`].
    #[error("head of {len} bytes exceeds the {max}-byte limit")]
    HeadTooLarge {
        /// Its size.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The head's bytes do not decode.
    #[error("malformed head: {0}")]
    Malformed(String),
    /// The stream failed.
    #[error("stream error: {0}")]
    Io(#[from] std::io::Error),
}

/// Writes a request head. Follow it with the body bytes, then finish the stream.
pub async fn write_request_head<W: AsyncWrite + Unpin>(w: &mut W, head: &RequestHead) -> Result<(), TunnelError> {
    write_head(w, head).await
}

/// Reads a request head; the body follows on the same stream.
pub async fn read_request_head<R: AsyncRead + Unpin>(r: &mut R) -> Result<RequestHead, TunnelError> {
    let head: RequestHead = read_head(r).await?;
    if head.method.is_empty() {
        return Err(TunnelError::Malformed("empty method".into()));
    }
    Ok(head)
}

/// Writes a response head. Follow it with the body bytes, then finish the stream.
pub async fn write_response_head<W: AsyncWrite + Unpin>(w: &mut W, head: &ResponseHead) -> Result<(), TunnelError> {
    write_head(w, head).await
}

/// Tells the opener that its request head arrived and is being handled; write it as soon as
/// the head has been read, before anything slow.
pub async fn write_accepted<W: AsyncWrite + Unpin>(w: &mut W) -> Result<(), TunnelError> {
    w.write_all(&ACCEPTED).await?;
    w.flush().await?;
    Ok(())
}

/// Writes the accepted marker and a response head in one write (one frame or packet): for an
/// acceptor whose answer is ready before it had to send the marker alone.
pub async fn write_accepted_response_head<W: AsyncWrite + Unpin>(
    w: &mut W,
    head: &ResponseHead,
) -> Result<(), TunnelError> {
    write_response_start(w, true, head, &[]).await
}

/// Writes a response head — after the accepted marker when `with_marker` — followed by the
/// first body bytes, in one write: a short answer then crosses the tunnel as one frame or
/// packet instead of one per part, and the opener wakes once for it.
pub async fn write_response_start<W: AsyncWrite + Unpin>(
    w: &mut W,
    with_marker: bool,
    head: &ResponseHead,
    body: &[u8],
) -> Result<(), TunnelError> {
    let encoded = encode_head(head)?;
    let mut bytes = Vec::with_capacity(ACCEPTED.len() + encoded.len() + body.len());
    if with_marker {
        bytes.extend_from_slice(&ACCEPTED);
    }
    bytes.extend_from_slice(&encoded);
    bytes.extend_from_slice(body);
    w.write_all(&bytes).await?;
    w.flush().await?;
    Ok(())
}

/// Waits for the acceptor's accepted marker (see the module docs). A peer that answers with a
/// response head straight away is refused as [`TunnelError::Malformed`]: every acceptor sends
/// the marker first.
pub async fn read_accepted<R: AsyncRead + Unpin>(r: &mut R) -> Result<(), TunnelError> {
    match read_len(r).await? {
        0 => Ok(()),
        len => Err(TunnelError::Malformed(format!("a head of {len} bytes came before the accepted marker"))),
    }
}

/// Reads a response head, skipping the accepted marker if it was not read already; the body
/// follows on the same stream.
pub async fn read_response_head<R: AsyncRead + Unpin>(r: &mut R) -> Result<ResponseHead, TunnelError> {
    let mut len = read_len(r).await?;
    if len == 0 {
        len = read_len(r).await?;
    }
    let head: ResponseHead = read_body(r, len).await?;
    if !(100..=999).contains(&head.status) {
        return Err(TunnelError::Malformed(format!("status {} is not a valid HTTP status", head.status)));
    }
    Ok(head)
}

/// Copies a body from `from` to `to`, writing and flushing each chunk as soon as it is
/// read, then finishes `to`. Returns the number of bytes copied.
pub async fn forward_body<R, W>(from: &mut R, to: &mut W) -> std::io::Result<u64>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 16 * 1024];
    let mut total = 0u64;
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        to.write_all(&buf[..n]).await?;
        to.flush().await?;
        total += n as u64;
    }
    to.shutdown().await?;
    Ok(total)
}

/// Encodes a head with its length prefix.
pub fn encode_head<T: Serialize>(head: &T) -> Result<Vec<u8>, TunnelError> {
    let body = postcard::to_allocvec(head).map_err(|e| TunnelError::Malformed(e.to_string()))?;
    if body.len() > MAX_HEAD {
        return Err(TunnelError::HeadTooLarge { len: body.len(), max: MAX_HEAD });
    }
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Decodes a head's bytes (without the length prefix); trailing bytes are an error.
pub fn decode_head<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, TunnelError> {
    let (head, rest) = postcard::take_from_bytes(bytes).map_err(|e| TunnelError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(TunnelError::Malformed(format!("{} bytes after the head", rest.len())));
    }
    Ok(head)
}

async fn write_head<W: AsyncWrite + Unpin, T: Serialize>(w: &mut W, head: &T) -> Result<(), TunnelError> {
    let bytes = encode_head(head)?;
    w.write_all(&bytes).await?;
    w.flush().await?;
    Ok(())
}

/// The accepted marker: a zero length prefix.
const ACCEPTED: [u8; 4] = [0; 4];

async fn read_head<R: AsyncRead + Unpin, T: DeserializeOwned>(r: &mut R) -> Result<T, TunnelError> {
    let len = read_len(r).await?;
    read_body(r, len).await
}

async fn read_len<R: AsyncRead + Unpin>(r: &mut R) -> Result<usize, TunnelError> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < len.len() {
        let n = r.read(&mut len[got..]).await?;
        if n == 0 {
            return Err(if got == 0 {
                TunnelError::Closed
            } else {
                TunnelError::Malformed("the length prefix was cut short".into())
            });
        }
        got += n;
    }
    Ok(u32::from_be_bytes(len) as usize)
}

async fn read_body<R: AsyncRead + Unpin, T: DeserializeOwned>(r: &mut R, len: usize) -> Result<T, TunnelError> {
    if len > MAX_HEAD {
        return Err(TunnelError::HeadTooLarge { len, max: MAX_HEAD });
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await.map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => {
            TunnelError::Malformed(format!("the head was cut short (announced {len} bytes)"))
        }
        _ => TunnelError::Io(e),
    })?;
    decode_head(&body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> RequestHead {
        RequestHead {
            method: "POST".into(),
            path_and_query: "/v1/chat/completions?stream=true".into(),
            headers: vec![("content-type".into(), b"application/json".to_vec()), ("x-bin".into(), vec![0, 255, 10])],
        }
    }

    #[tokio::test]
    async fn heads_round_trip_and_leave_the_body_in_place() {
        let mut wire = Vec::new();
        write_request_head(&mut wire, &request()).await.expect("write");
        wire.extend_from_slice(b"BODY");
        let mut r = wire.as_slice();
        assert_eq!(read_request_head(&mut r).await.expect("read"), request());
        assert_eq!(r, b"BODY");

        let resp = ResponseHead { status: 200, headers: vec![("content-type".into(), b"text/event-stream".to_vec())] };
        let mut wire = Vec::new();
        write_response_head(&mut wire, &resp).await.expect("write");
        assert_eq!(read_response_head(&mut wire.as_slice()).await.expect("read"), resp);
    }

    #[tokio::test]
    async fn the_accepted_marker_comes_first_and_response_readers_skip_it() {
        let resp = ResponseHead { status: 503, headers: vec![] };
        let mut wire = Vec::new();
        write_accepted(&mut wire).await.expect("write");
        write_response_head(&mut wire, &resp).await.expect("write");
        wire.extend_from_slice(b"BODY");

        let mut r = wire.as_slice();
        read_accepted(&mut r).await.expect("the marker");
        assert_eq!(read_response_head(&mut r).await.expect("the head"), resp);
        assert_eq!(r, b"BODY");

        let mut r = wire.as_slice();
        assert_eq!(read_response_head(&mut r).await.expect("the head, marker skipped"), resp);
        assert_eq!(r, b"BODY");

        let mut together = Vec::new();
        write_accepted_response_head(&mut together, &resp).await.expect("write");
        together.extend_from_slice(b"BODY");
        assert_eq!(together, wire, "one write, the same bytes");

        let mut start = Vec::new();
        write_response_start(&mut start, true, &resp, b"BODY").await.expect("write");
        assert_eq!(start, wire, "marker, head and body in one write, the same bytes");
        let mut start = Vec::new();
        write_response_start(&mut start, false, &resp, b"BODY").await.expect("write");
        assert_eq!(start, wire[ACCEPTED.len()..], "without the marker when it went out before");

        let head_only = encode_head(&resp).expect("encode");
        assert!(matches!(read_accepted(&mut head_only.as_slice()).await, Err(TunnelError::Malformed(_))));
        assert!(matches!(read_accepted(&mut &[][..]).await, Err(TunnelError::Closed)));
        // Two markers are not a head.
        let twice = [ACCEPTED, ACCEPTED].concat();
        assert!(matches!(read_response_head(&mut twice.as_slice()).await, Err(TunnelError::Malformed(_))));
        // A request head is never empty.
        assert!(matches!(read_request_head(&mut &ACCEPTED[..]).await, Err(TunnelError::Malformed(_))));
    }

    #[tokio::test]
    async fn an_empty_stream_is_closed_not_malformed() {
        let mut r: &[u8] = &[];
        assert!(matches!(read_request_head(&mut r).await, Err(TunnelError::Closed)));
    }

    #[tokio::test]
    async fn oversized_heads_are_rejected_before_reading_them() {
        let mut r: &[u8] = &[0xff, 0xff, 0xff, 0xff];
        assert!(matches!(
            read_request_head(&mut r).await,
            Err(TunnelError::HeadTooLarge { len, .. }) if len == u32::MAX as usize
        ));
        let huge = RequestHead { headers: vec![("x".into(), vec![b'a'; MAX_HEAD])], ..request() };
        assert!(matches!(write_request_head(&mut Vec::new(), &huge).await, Err(TunnelError::HeadTooLarge { .. })));
    }

    #[tokio::test]
    async fn malformed_heads_are_typed_errors() {
        let good = encode_head(&request()).expect("encode");
        let mut cases: Vec<Vec<u8>> = vec![
            vec![0, 0],                         // cut in the length prefix
            vec![0, 0, 0, 10, 1, 2],            // cut in the head
            vec![0, 0, 0, 3, 0xff, 0xff, 0xff], // not postcard
        ];
        // trailing garbage inside the announced length
        let mut trailing = good.clone();
        trailing.push(0);
        let len = (trailing.len() - 4) as u32;
        trailing[..4].copy_from_slice(&len.to_be_bytes());
        cases.push(trailing);
        // every truncation of a valid head
        for cut in 4..good.len() {
            let mut t = good[..cut].to_vec();
            t[..4].copy_from_slice(&((cut - 4) as u32).to_be_bytes());
            cases.push(t);
        }
        for case in cases {
            let result = read_request_head(&mut case.as_slice()).await;
            assert!(matches!(result, Err(TunnelError::Malformed(_))), "{case:?} gave {result:?}");
        }
    }

    #[tokio::test]
    async fn invalid_statuses_and_methods_are_rejected() {
        let bad = encode_head(&ResponseHead { status: 42, headers: vec![] }).expect("encode");
        assert!(matches!(read_response_head(&mut bad.as_slice()).await, Err(TunnelError::Malformed(_))));
        let bad = encode_head(&RequestHead { method: String::new(), ..request() }).expect("encode");
        assert!(matches!(read_request_head(&mut bad.as_slice()).await, Err(TunnelError::Malformed(_))));
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for len in 0..512 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect();
            let _ = decode_head::<RequestHead>(&bytes);
            let _ = decode_head::<ResponseHead>(&bytes);
        }
    }

    #[tokio::test]
    async fn forward_body_copies_everything_and_finishes() {
        let data: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let (mut a, mut b) = tokio::io::duplex(1024);
        let writer = async {
            let n = forward_body(&mut data.as_slice(), &mut a).await.expect("forward");
            assert_eq!(n, data.len() as u64);
        };
        let reader = async {
            let mut got = Vec::new();
            b.read_to_end(&mut got).await.expect("read");
            got
        };
        let ((), got) = tokio::join!(writer, reader);
        assert_eq!(got, data);
    }
}
