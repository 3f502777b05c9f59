//! Admission to a federation: proving knowledge of the join secret, bound to one TLS session.
//!
//! TLS tells each side *who* the peer is (its key, hence its [`NodeId`]); admission decides
//! whether that peer belongs to this federation. Right after the handshake, on the control
//! stream (the `control` module):
//!
//! 1. the dialler sends `Hello { version, proof }`;
//! 2. the acceptor checks the version and the proof and answers `Welcome { version, proof }`,
//!    or `Refuse(reason)` and closes the connection, logging the reason;
//! 3. the dialler checks the acceptor's version and proof in turn, so a node never serves an
//!    impostor gateway that merely accepted its connection.
//!
//! The version is checked first, so that a member of another release is refused with both
//! versions named on both sides (this side's log and the refused side's error) rather than
//! with whatever else differs between releases.
//!
//! `proof = HMAC-SHA256(join_secret, LABEL ‖ exporter ‖ role ‖ own NodeId)` where `exporter`
//! is 32 bytes of TLS exporter keying material of this very session. Binding to the exporter
//! means a proof recorded on one connection is worthless on any other; the role byte and the
//! prover's own id mean a proof cannot be reflected back. Proofs are compared in constant time
//! (`hmac`'s `verify_slice`). The secret itself never crosses the wire.

use crate::control::{read_frame, write_frame, Frame, FrameError};
use bytes::Bytes;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::fmt;
use tela_core::NodeId;
use tokio::io::{AsyncRead, AsyncWrite};

/// The version of the admission exchange, control-stream frames and connection datagrams
/// spoken by this build (5: core's wire version 4, whose suspicions carry their age, which a
/// build of 4 would refuse datagram by datagram; 4: nodes send engine load reports as tagged
/// datagrams, which a build of 3 would refuse one by one; 3: `Hello` and `Welcome` no longer
/// name a membership protocol, SWIM being the only one; 2 named it).
pub const PROTOCOL_VERSION: u16 = 5;

/// The TLS exporter label of the admission proof.
pub(crate) const EXPORTER_LABEL: &[u8] = b"EXPORTER-tela-admission";

const PROOF_LABEL: &[u8] = b"tela admission v1";

/// The cluster's shared join secret. `Debug` never prints it.
#[derive(Clone)]
pub struct JoinSecret(Vec<u8>);

/// A join secret was rejected before use.
#[derive(Debug, thiserror::Error)]
pub enum JoinSecretError {
    /// The secret was empty, which would admit anyone who guessed that.
    #[error("the join secret is empty — set --join-secret / TELA_JOIN_SECRET to the federation's secret")]
    Empty,
}

impl JoinSecret {
    /// Wraps the secret's bytes; it must not be empty.
    pub fn new(secret: impl Into<Vec<u8>>) -> Result<JoinSecret, JoinSecretError> {
        let secret = secret.into();
        if secret.is_empty() {
            return Err(JoinSecretError::Empty);
        }
        Ok(JoinSecret(secret))
    }

    fn mac(&self) -> Hmac<Sha256> {
        // HMAC accepts keys of any length; this cannot fail.
        <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes any key length")
    }
}

impl fmt::Debug for JoinSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JoinSecret(<redacted>)")
    }
}

/// Why an acceptor did not admit a peer.
///
/// The first three are sent to the dialler (who sees them in
/// [`crate::ConnectError::Refused`]); the others are only local observations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RefusalReason {
    /// The peer's proof did not match: it does not know this federation's join secret.
    JoinSecretMismatch,
    /// The peer speaks another protocol version.
    VersionMismatch {
        /// The refusing side's version.
        ours: u16,
        /// The other side's version, when known.
        theirs: Option<u16>,
    },
    /// The peer broke the admission protocol.
    ProtocolViolation(String),
    /// The TLS handshake failed (wrong ALPN, bad certificate, not TLS at all...).
    Handshake(String),
    /// The peer did not finish the handshake and admission in time.
    TimedOut,
}

impl RefusalReason {
    /// Whether asking again cannot help: the secret or the version would have to change first. Handshake failures, protocol violations and time-outs may be
    /// a flaky network or an overloaded gateway, and are worth retrying.
    pub fn is_permanent(&self) -> bool {
        matches!(self, RefusalReason::JoinSecretMismatch | RefusalReason::VersionMismatch { .. })
    }

    /// What the refused side should do about it.
    pub fn hint(&self) -> &'static str {
        match self {
            RefusalReason::JoinSecretMismatch => "check --join-secret / TELA_JOIN_SECRET",
            RefusalReason::VersionMismatch { .. } => "run the same Tela release on both sides",
            RefusalReason::ProtocolViolation(_) | RefusalReason::Handshake(_) => {
                "check that the address is a Tela gateway or anchor"
            }
            RefusalReason::TimedOut => "check the network path and the gateway's load",
        }
    }

    /// The wire form sent in a `Refuse` frame and a QUIC close reason.
    pub(crate) fn encode(&self) -> Bytes {
        let mut out = Vec::new();
        match self {
            RefusalReason::JoinSecretMismatch => out.push(1),
            RefusalReason::VersionMismatch { ours, .. } => {
                out.push(2);
                out.extend_from_slice(&ours.to_be_bytes());
            }
            RefusalReason::ProtocolViolation(s) => {
                out.push(3);
                out.extend_from_slice(&s.as_bytes()[..s.len().min(512)]);
            }
            RefusalReason::Handshake(_) | RefusalReason::TimedOut => {
                out.push(3);
                out.extend_from_slice(self.to_string().as_bytes());
            }
        }
        Bytes::from(out)
    }

    /// Decodes a refusal received from the acceptor, seen from the receiver's side (`ours` is
    /// the receiver's own version). Tag 4 (a membership protocol mismatch, sent only by
    /// version 2 members to version 2 diallers) cannot reach this release and reads as
    /// unintelligible.
    pub(crate) fn decode(bytes: &[u8]) -> RefusalReason {
        match bytes {
            [1, ..] => RefusalReason::JoinSecretMismatch,
            [2, a, b, ..] => {
                RefusalReason::VersionMismatch { ours: PROTOCOL_VERSION, theirs: Some(u16::from_be_bytes([*a, *b])) }
            }
            [3, rest @ ..] => RefusalReason::ProtocolViolation(String::from_utf8_lossy(rest).into_owned()),
            _ => RefusalReason::ProtocolViolation(format!("unintelligible refusal ({} bytes)", bytes.len())),
        }
    }
}

impl fmt::Display for RefusalReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RefusalReason::JoinSecretMismatch => f.write_str("join secret mismatch"),
            RefusalReason::VersionMismatch { ours, theirs: Some(theirs) } => {
                write!(f, "protocol version mismatch (this side speaks {ours}, the other {theirs})")
            }
            RefusalReason::VersionMismatch { ours, theirs: None } => {
                write!(f, "protocol version mismatch (this side speaks {ours}, the other side another)")
            }
            RefusalReason::ProtocolViolation(s) => write!(f, "protocol violation: {s}"),
            RefusalReason::Handshake(s) => write!(f, "TLS handshake failed: {s}"),
            RefusalReason::TimedOut => f.write_str("handshake and admission timed out"),
        }
    }
}

/// Which side of the admission exchange a proof is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Dialler = 1,
    Acceptor = 2,
}

/// Everything a proof is bound to on one connection.
pub(crate) struct Binding<'a> {
    pub secret: &'a JoinSecret,
    /// TLS exporter keying material of this session ([`EXPORTER_LABEL`], empty context).
    pub exporter: [u8; 32],
    pub own: NodeId,
    pub peer: NodeId,
}

impl Binding<'_> {
    fn proof(&self, role: Role, prover: NodeId) -> Hmac<Sha256> {
        let mut mac = self.secret.mac();
        mac.update(PROOF_LABEL);
        mac.update(&self.exporter);
        mac.update(&[role as u8]);
        mac.update(&prover.0);
        mac
    }

    fn own_proof(&self, role: Role) -> [u8; 32] {
        self.proof(role, self.own).finalize().into_bytes().into()
    }

    fn peer_proof_valid(&self, role: Role, proof: &[u8; 32]) -> bool {
        self.proof(role, self.peer).verify_slice(proof).is_ok()
    }
}

/// How admission failed, seen from the dialler.
#[derive(Debug)]
pub(crate) enum DialOutcome {
    /// The acceptor refused us.
    Refused(RefusalReason),
    /// The acceptor's proof was wrong.
    PeerNotAdmitted,
    /// The stream broke or carried nonsense (the caller looks at the connection's close
    /// reason, which may say more, e.g. a QUIC close carrying a refusal).
    Broken(String),
}

/// The dialler's half of the exchange.
pub(crate) async fn dial<S, R>(send: &mut S, recv: &mut R, b: &Binding<'_>) -> Result<(), DialOutcome>
where
    S: AsyncWrite + Unpin,
    R: AsyncRead + Unpin,
{
    let hello = Frame::Hello { version: PROTOCOL_VERSION, proof: b.own_proof(Role::Dialler) };
    write_frame(send, &hello).await.map_err(|e| DialOutcome::Broken(e.to_string()))?;
    match read_frame(recv).await {
        Ok(Frame::Welcome { version, proof }) => {
            if version != PROTOCOL_VERSION {
                return Err(DialOutcome::Refused(RefusalReason::VersionMismatch {
                    ours: PROTOCOL_VERSION,
                    theirs: Some(version),
                }));
            }
            if !b.peer_proof_valid(Role::Acceptor, &proof) {
                return Err(DialOutcome::PeerNotAdmitted);
            }
            Ok(())
        }
        Ok(Frame::Refuse(reason)) => Err(DialOutcome::Refused(RefusalReason::decode(&reason))),
        Ok(other) => Err(DialOutcome::Broken(format!("expected Welcome, got {}", frame_name(&other)))),
        Err(FrameError::Eof) => Err(DialOutcome::Broken("the peer closed the control stream".into())),
        Err(e) => Err(DialOutcome::Broken(e.to_string())),
    }
}

/// The acceptor's half. On refusal the `Refuse` frame has been written (best effort) and the
/// caller closes the connection.
pub(crate) async fn accept<S, R>(send: &mut S, recv: &mut R, b: &Binding<'_>) -> Result<(), RefusalReason>
where
    S: AsyncWrite + Unpin,
    R: AsyncRead + Unpin,
{
    let verdict = match read_frame(recv).await {
        Ok(Frame::Hello { version, proof }) => {
            if version != PROTOCOL_VERSION {
                Err(RefusalReason::VersionMismatch { ours: PROTOCOL_VERSION, theirs: Some(version) })
            } else if !b.peer_proof_valid(Role::Dialler, &proof) {
                Err(RefusalReason::JoinSecretMismatch)
            } else {
                Ok(())
            }
        }
        Ok(other) => Err(RefusalReason::ProtocolViolation(format!("expected Hello, got {}", frame_name(&other)))),
        Err(e) => Err(RefusalReason::ProtocolViolation(format!("no Hello on the control stream: {e}"))),
    };
    match verdict {
        Ok(()) => {
            let welcome = Frame::Welcome { version: PROTOCOL_VERSION, proof: b.own_proof(Role::Acceptor) };
            write_frame(send, &welcome)
                .await
                .map_err(|e| RefusalReason::ProtocolViolation(format!("writing Welcome: {e}")))
        }
        Err(reason) => {
            // Best effort: the connection close that follows carries the reason as well.
            let _ = write_frame(send, &Frame::Refuse(reason.encode())).await;
            Err(reason)
        }
    }
}

fn frame_name(f: &Frame) -> &'static str {
    match f {
        Frame::Hello { .. } => "Hello",
        Frame::Welcome { .. } => "Welcome",
        Frame::Refuse(_) => "Refuse",
        Frame::Datagram(_) => "Datagram",
        Frame::Close(_) => "Close",
        Frame::Ping => "Ping",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn secret(s: &str) -> JoinSecret {
        JoinSecret::new(s).expect("non-empty")
    }

    async fn exchange(
        dialler_secret: &str,
        acceptor_secret: &str,
    ) -> (Result<(), DialOutcome>, Result<(), RefusalReason>) {
        let (a, b) = tokio::io::duplex(4096);
        let (mut ar, mut aw) = tokio::io::split(a);
        let (mut br, mut bw) = tokio::io::split(b);
        let (ds, acs) = (secret(dialler_secret), secret(acceptor_secret));
        let (d_id, a_id) = (NodeId::from_u64(1), NodeId::from_u64(2));
        let exporter = [9u8; 32];
        let db = Binding { secret: &ds, exporter, own: d_id, peer: a_id };
        let ab = Binding { secret: &acs, exporter, own: a_id, peer: d_id };
        tokio::join!(dial(&mut aw, &mut ar, &db), accept(&mut bw, &mut br, &ab))
    }

    #[tokio::test]
    async fn same_secret_admits_both_ways() {
        let (d, a) = exchange("s3cret", "s3cret").await;
        assert!(d.is_ok(), "{d:?}");
        assert!(a.is_ok(), "{a:?}");
    }

    #[tokio::test]
    async fn wrong_secret_is_refused_with_the_reason() {
        let (d, a) = exchange("wrong", "s3cret").await;
        assert_eq!(a, Err(RefusalReason::JoinSecretMismatch));
        assert!(matches!(d, Err(DialOutcome::Refused(RefusalReason::JoinSecretMismatch))), "{d:?}");
    }

    #[tokio::test]
    async fn a_newer_dialler_gets_a_version_mismatch() {
        let (a, b) = tokio::io::duplex(4096);
        let (mut ar, mut aw) = tokio::io::split(a);
        let (mut br, mut bw) = tokio::io::split(b);
        let s = secret("x");
        let bind = Binding { secret: &s, exporter: [0; 32], own: NodeId::from_u64(2), peer: NodeId::from_u64(1) };
        let hello = Frame::Hello { version: PROTOCOL_VERSION + 1, proof: [0; 32] };
        let (_, verdict) = tokio::join!(write_frame(&mut aw, &hello), accept(&mut bw, &mut br, &bind));
        assert_eq!(
            verdict,
            Err(RefusalReason::VersionMismatch { ours: PROTOCOL_VERSION, theirs: Some(PROTOCOL_VERSION + 1) })
        );
        let reply = read_frame(&mut ar).await.expect("refuse frame");
        let Frame::Refuse(r) = reply else { panic!("expected Refuse, got {reply:?}") };
        assert!(matches!(RefusalReason::decode(&r), RefusalReason::VersionMismatch { .. }));
    }

    /// A version 2 `Hello`, as the previous release sends it: the version, the proof, then the
    /// membership protocol's name.
    fn version_2_hello(proof: [u8; 32], membership: &str) -> Vec<u8> {
        let mut frame = vec![1, 0, (34 + membership.len()) as u8, 0, 2];
        frame.extend_from_slice(&proof);
        frame.extend_from_slice(membership.as_bytes());
        frame
    }

    /// Reads one raw frame: its kind and payload.
    async fn read_raw<R: AsyncRead + Unpin>(r: &mut R) -> (u8, Vec<u8>) {
        let mut header = [0u8; 3];
        r.read_exact(&mut header).await.expect("frame header");
        let mut payload = vec![0u8; usize::from(u16::from_be_bytes([header[1], header[2]]))];
        r.read_exact(&mut payload).await.expect("frame payload");
        (header[0], payload)
    }

    #[tokio::test]
    async fn a_dialler_of_the_previous_release_is_refused_with_both_versions_named() {
        let (a, b) = tokio::io::duplex(4096);
        let (mut ar, mut aw) = tokio::io::split(a);
        let (mut br, mut bw) = tokio::io::split(b);
        let s = secret("s3cret");
        let (d_id, a_id) = (NodeId::from_u64(1), NodeId::from_u64(2));
        // Even with a valid proof: the version is what differs, and what both sides are told.
        let old = Binding { secret: &s, exporter: [9; 32], own: d_id, peer: a_id };
        let hello = version_2_hello(old.own_proof(Role::Dialler), "push-pull");
        let new = Binding { secret: &s, exporter: [9; 32], own: a_id, peer: d_id };
        let (written, verdict) = tokio::join!(aw.write_all(&hello), accept(&mut bw, &mut br, &new));
        written.expect("hello written");
        // This side's log line (`Refusal`'s Display carries the reason).
        let Err(reason) = verdict else { panic!("a version 2 dialler was admitted") };
        assert_eq!(reason, RefusalReason::VersionMismatch { ours: PROTOCOL_VERSION, theirs: Some(2) });
        assert!(reason.to_string().contains(&format!("this side speaks {PROTOCOL_VERSION}, the other 2")), "{reason}");
        // The refused side's: version 2 reads a refusal as tag 2 and the refuser's version, big
        // endian, and shows "this side speaks 2, the other <ours>".
        let (kind, payload) = read_raw(&mut ar).await;
        assert_eq!(
            (kind, payload),
            (3, [&[2][..], &PROTOCOL_VERSION.to_be_bytes()].concat()),
            "a Refuse frame naming ours"
        );
    }

    #[tokio::test]
    async fn an_acceptor_of_the_previous_release_refuses_with_both_versions_named() {
        let (a, b) = tokio::io::duplex(4096);
        let (mut ar, mut aw) = tokio::io::split(a);
        let (mut br, mut bw) = tokio::io::split(b);
        let s = secret("s3cret");
        let new = Binding { secret: &s, exporter: [9; 32], own: NodeId::from_u64(1), peer: NodeId::from_u64(2) };
        let old_acceptor = async {
            let (kind, hello) = read_raw(&mut br).await;
            // Version 2 decodes a Hello of 34 to 98 bytes (version, proof, membership name)
            // and checks the version first, so it reaches the version check and logs
            // "this side speaks 2, the other <ours>".
            assert_eq!(kind, 1, "a Hello");
            assert_eq!(hello.len(), 34, "version, proof and nothing else");
            assert_eq!(u16::from_be_bytes([hello[0], hello[1]]), PROTOCOL_VERSION);
            bw.write_all(&[3, 0, 3, 2, 0, 2]).await.expect("refuse written");
        };
        let (outcome, ()) = tokio::join!(dial(&mut aw, &mut ar, &new), old_acceptor);
        let Err(DialOutcome::Refused(reason)) = outcome else { panic!("not refused: {outcome:?}") };
        assert_eq!(reason, RefusalReason::VersionMismatch { ours: PROTOCOL_VERSION, theirs: Some(2) });
        assert!(reason.is_permanent());
        let shown = format!("{reason} — {}", reason.hint());
        assert!(
            shown.contains(&format!("this side speaks {PROTOCOL_VERSION}, the other 2"))
                && shown.contains("same Tela release"),
            "{shown}"
        );
    }

    #[tokio::test]
    async fn a_proof_from_another_session_is_rejected() {
        let s = secret("same");
        let (d, a) = (NodeId::from_u64(1), NodeId::from_u64(2));
        let session1 = Binding { secret: &s, exporter: [1; 32], own: d, peer: a };
        let session2 = Binding { secret: &s, exporter: [2; 32], own: a, peer: d };
        let replayed = session1.own_proof(Role::Dialler);
        assert!(!session2.peer_proof_valid(Role::Dialler, &replayed));
        // and a proof cannot be reflected to its sender in the other role
        let reflect = Binding { secret: &s, exporter: [1; 32], own: a, peer: d };
        assert!(!reflect.peer_proof_valid(Role::Acceptor, &replayed));
    }

    #[test]
    fn refusals_decode_without_panicking() {
        for bytes in [&[][..], &[0], &[2], &[2, 1], &[3, 0xff, 0xfe], &[4], &[4, 0xff], &[200, 1, 2]] {
            let _ = RefusalReason::decode(bytes);
        }
        for reason in [
            RefusalReason::JoinSecretMismatch,
            RefusalReason::VersionMismatch { ours: PROTOCOL_VERSION, theirs: Some(PROTOCOL_VERSION) },
        ] {
            assert_eq!(RefusalReason::decode(&reason.encode()), reason);
        }
    }

    #[test]
    fn only_refusals_a_setting_must_fix_are_permanent() {
        assert!(RefusalReason::JoinSecretMismatch.is_permanent());
        assert!(RefusalReason::VersionMismatch { ours: 3, theirs: None }.is_permanent());
        assert!(!RefusalReason::ProtocolViolation("x".into()).is_permanent());
        assert!(!RefusalReason::Handshake("x".into()).is_permanent());
        assert!(!RefusalReason::TimedOut.is_permanent());
    }

    #[test]
    fn empty_secrets_are_refused_and_secrets_never_print() {
        assert!(JoinSecret::new("").is_err());
        assert_eq!(format!("{:?}", secret("hunter2")), "JoinSecret(<redacted>)");
    }
}
