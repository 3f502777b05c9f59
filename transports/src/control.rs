//! The control stream's frames.
//!
//! Every connection starts with one control stream opened by the dialler. On it both sides run
//! the admission exchange ([`crate::admission`]): `Hello` from the dialler, then `Welcome` or
//! `Refuse` from the acceptor. Over QUIC that is all it carries. Over the multiplexed TCP
//! transport (and the in-memory pair) it then stays open for the life of the connection and
//! carries what QUIC provides natively: datagrams, keep-alive pings and the close reason.
//!
//! A frame is `[kind: u8][length: u16 big-endian][payload]` with the payload at most
//! [`MAX_PAYLOAD`] bytes. Decoding checks every length and never panics.

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest payload of one control frame; comfortably above `MAX_DATAGRAM`.
pub(crate) const MAX_PAYLOAD: usize = 4096;

/// Bytes after the proof that a `Hello` or `Welcome` may carry and that are ignored: version 2
/// sent the membership protocol's name there (at most 64 bytes). Decoding such a frame lets the
/// version check, not a length error, tell both sides what is wrong.
const MAX_OLD_TAIL: usize = 64;

const HELLO: u8 = 1;
const WELCOME: u8 = 2;
const REFUSE: u8 = 3;
const DATAGRAM: u8 = 4;
const CLOSE: u8 = 5;
const PING: u8 = 6;

/// One control frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Frame {
    /// Dialler → acceptor: its protocol version and admission proof.
    Hello { version: u16, proof: [u8; 32] },
    /// Acceptor → dialler: admitted; its own version and proof.
    Welcome { version: u16, proof: [u8; 32] },
    /// Acceptor → dialler: not admitted; an encoded [`crate::admission::RefusalReason`].
    Refuse(Bytes),
    /// An unreliable message (TCP and memory transports only).
    Datagram(Bytes),
    /// The sender is closing the connection, for this reason (TCP and memory only).
    Close(String),
    /// Keep-alive (TCP and memory only).
    Ping,
}

/// What went wrong reading a frame.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FrameError {
    #[error("the stream ended")]
    Eof,
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("malformed control frame: {0}")]
    Malformed(String),
}

impl Frame {
    fn encode(&self) -> (u8, Vec<u8>) {
        match self {
            Frame::Hello { version, proof } | Frame::Welcome { version, proof } => {
                let mut p = Vec::with_capacity(34);
                p.extend_from_slice(&version.to_be_bytes());
                p.extend_from_slice(proof);
                let kind = if matches!(self, Frame::Hello { .. }) { HELLO } else { WELCOME };
                (kind, p)
            }
            Frame::Refuse(b) => (REFUSE, b.to_vec()),
            Frame::Datagram(b) => (DATAGRAM, b.to_vec()),
            Frame::Close(reason) => (CLOSE, truncate_utf8(reason, MAX_PAYLOAD).as_bytes().to_vec()),
            Frame::Ping => (PING, Vec::new()),
        }
    }

    fn decode(kind: u8, payload: Vec<u8>) -> Result<Frame, FrameError> {
        let versioned = |p: &[u8]| -> Result<(u16, [u8; 32]), FrameError> {
            if !(34..=34 + MAX_OLD_TAIL).contains(&p.len()) {
                return Err(FrameError::Malformed(format!(
                    "handshake frame of {} bytes, expected 34 to {}",
                    p.len(),
                    34 + MAX_OLD_TAIL
                )));
            }
            let version = u16::from_be_bytes([p[0], p[1]]);
            let mut proof = [0u8; 32];
            proof.copy_from_slice(&p[2..34]);
            Ok((version, proof))
        };
        Ok(match kind {
            HELLO => {
                let (version, proof) = versioned(&payload)?;
                Frame::Hello { version, proof }
            }
            WELCOME => {
                let (version, proof) = versioned(&payload)?;
                Frame::Welcome { version, proof }
            }
            REFUSE => Frame::Refuse(Bytes::from(payload)),
            DATAGRAM => Frame::Datagram(Bytes::from(payload)),
            CLOSE => Frame::Close(String::from_utf8_lossy(&payload).into_owned()),
            PING => Frame::Ping,
            other => return Err(FrameError::Malformed(format!("unknown frame kind {other}"))),
        })
    }
}

/// Writes one frame and flushes it.
pub(crate) async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, frame: &Frame) -> std::io::Result<()> {
    let (kind, payload) = frame.encode();
    let len = u16::try_from(payload.len()).ok().filter(|&l| usize::from(l) <= MAX_PAYLOAD).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("control frame payload of {} bytes", payload.len()),
        )
    })?;
    let mut buf = Vec::with_capacity(3 + payload.len());
    buf.push(kind);
    buf.extend_from_slice(&len.to_be_bytes());
    buf.extend_from_slice(&payload);
    w.write_all(&buf).await?;
    w.flush().await
}

/// Reads one frame. A clean end of stream before the first byte is [`FrameError::Eof`].
pub(crate) async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> Result<Frame, FrameError> {
    let mut header = [0u8; 3];
    let first = r.read(&mut header[..1]).await?;
    if first == 0 {
        return Err(FrameError::Eof);
    }
    r.read_exact(&mut header[1..]).await?;
    let len = usize::from(u16::from_be_bytes([header[1], header[2]]));
    if len > MAX_PAYLOAD {
        return Err(FrameError::Malformed(format!("frame payload of {len} bytes exceeds {MAX_PAYLOAD}")));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await?;
    Frame::decode(header[0], payload)
}

fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn round_trip(frame: Frame) -> Frame {
        let mut buf = Vec::new();
        write_frame(&mut buf, &frame).await.expect("write");
        read_frame(&mut buf.as_slice()).await.expect("read")
    }

    #[tokio::test]
    async fn frames_round_trip() {
        for f in [
            Frame::Hello { version: 3, proof: [7; 32] },
            Frame::Welcome { version: 9, proof: [1; 32] },
            Frame::Refuse(Bytes::from_static(b"\x01")),
            Frame::Datagram(Bytes::from(vec![3u8; 1100])),
            Frame::Close("bye".into()),
            Frame::Ping,
        ] {
            assert_eq!(round_trip(f.clone()).await, f);
        }
    }

    #[tokio::test]
    async fn hellos_of_earlier_versions_decode_so_their_version_can_be_refused() {
        // Version 1: the version and the proof. Version 2: then the membership protocol's name.
        for tail in [&b""[..], b"push-pull", b"swim"] {
            let mut frame = vec![HELLO, 0, 34 + tail.len() as u8, 0, 2];
            frame.extend_from_slice(&[5; 32]);
            frame.extend_from_slice(tail);
            let decoded = read_frame(&mut frame.as_slice()).await.expect("decodes");
            assert_eq!(decoded, Frame::Hello { version: 2, proof: [5; 32] });
        }
    }

    #[tokio::test]
    async fn malformed_frames_are_errors() {
        let mut long_hello = vec![HELLO, 0, 34 + MAX_OLD_TAIL as u8 + 1];
        long_hello.resize(3 + 34 + MAX_OLD_TAIL + 1, b'a');
        let cases: [&[u8]; 6] = [
            &[HELLO, 0, 3, 1, 2, 3], // short hello
            &long_hello,             // more after the proof than any release sent
            &[99, 0, 0],             // unknown kind
            &[DATAGRAM, 0xff, 0xff], // over the payload bound
            &[DATAGRAM, 0, 5, 1, 2], // truncated payload
            &[PING, 0],              // truncated header
        ];
        for bytes in cases {
            let mut r = bytes;
            assert!(read_frame(&mut r).await.is_err(), "{bytes:?}");
        }
        let mut empty: &[u8] = &[];
        assert!(matches!(read_frame(&mut empty).await, Err(FrameError::Eof)));
    }

    #[test]
    fn long_close_reasons_are_cut_on_a_char_boundary() {
        let s = "é".repeat(MAX_PAYLOAD);
        let cut = truncate_utf8(&s, MAX_PAYLOAD);
        assert!(cut.len() <= MAX_PAYLOAD);
        assert!(s.starts_with(cut));
    }
}
