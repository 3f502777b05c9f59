//! Admission to a federation: proving knowledge of the join secret, bound to one TLS session.
//!
//! TLS tells each side *who* the peer is (its key, hence its [`NodeId`]); admission decides
//! whether that peer belongs to this federation. Right after the handshake, on the control
//! stream (the `control` module):
//!
//! 1. the dialler sends `Hello { version, proof, membership }`;
//! 2. the acceptor checks the version, the proof and the membership protocol's name and
//!    answers `Welcome { version, proof, membership }`, or `Refuse(reason)` and closes the
//!    connection, logging the reason;
//! 3. the dialler checks the acceptor's proof and membership protocol in turn, so a node never
//!    serves an impostor gateway that merely accepted its connection.
//!
//! Members of one federation must run the same membership protocol
//! ([`crate::EndpointConfig::membership`]): a push-pull member ignores a Swim member's probes,
//! so the Swim members declare it dead, it refutes, and the two flap for as long as they are
//! connected. Naming the protocol at admission turns that into a refusal that says what to fix.
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

/// The version of the admission exchange and control-stream frames spoken by this build
/// (2: `Hello` and `Welcome` name the membership protocol).
pub const PROTOCOL_VERSION: u16 = 2;

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
/// The first four are sent to the dialler (who sees them in
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
    /// The peer runs another membership protocol than this side.
    MembershipMismatch {
        /// This side's membership protocol.
        ours: String,
        /// The other side's.
        theirs: String,
    },
    /// The peer broke the admission protocol.
    ProtocolViolation(String),
    /// The TLS handshake failed (wrong ALPN, bad certificate, not TLS at all...).
    Handshake(String),
    /// The peer did not finish the handshake and admission in time.
    TimedOut,
}

impl RefusalReason {
    /// Whether asking again cannot help: the secret, the version or the membership protocol
    /// would have to change first. Handshake failures, protocol violations and time-outs may be
    /// a flaky network or an overloaded gateway, and are worth retrying.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            RefusalReason::JoinSecretMismatch
                | RefusalReason::VersionMismatch { .. }
                | RefusalReason::MembershipMismatch { .. }
        )
    }

    /// What the refused side should do about it.
    pub fn hint(&self) -> &'static str {
        match self {
            RefusalReason::JoinSecretMismatch => "check --join-secret / TELA_JOIN_SECRET",
            RefusalReason::VersionMismatch { .. } => "run the same Tela release on both sides",
            RefusalReason::MembershipMismatch { .. } => {
                "use the same --membership (TELA_MEMBERSHIP) on every member of a federation"
            }
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
            RefusalReason::MembershipMismatch { ours, .. } => {
                out.push(4);
                out.extend_from_slice(&ours.as_bytes()[..ours.len().min(crate::control::MAX_MEMBERSHIP)]);
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
    /// the receiver's own version or `membership`).
    pub(crate) fn decode(bytes: &[u8], membership: &str) -> RefusalReason {
        match bytes {
            [1, ..] => RefusalReason::JoinSecretMismatch,
            [2, a, b, ..] => {
                RefusalReason::VersionMismatch { ours: PROTOCOL_VERSION, theirs: Some(u16::from_be_bytes([*a, *b])) }
            }
            [4, theirs @ ..] => RefusalReason::MembershipMismatch {
                ours: membership.to_string(),
                theirs: String::from_utf8_lossy(theirs).into_owned(),
            },
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
            RefusalReason::MembershipMismatch { ours, theirs } => {
                write!(f, "membership protocol mismatch (this side runs {}, the other {})", named(ours), named(theirs))
            }
            RefusalReason::ProtocolViolation(s) => write!(f, "protocol violation: {s}"),
            RefusalReason::Handshake(s) => write!(f, "TLS handshake failed: {s}"),
            RefusalReason::TimedOut => f.write_str("handshake and admission timed out"),
        }
    }
}

/// A membership protocol's name as shown in a refusal.
fn named(membership: &str) -> &str {
    if membership.is_empty() {
        "none named"
    } else {
        membership
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
    /// This side's membership protocol ([`crate::EndpointConfig::membership`]).
    pub membership: &'a str,
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
    let hello =
        Frame::Hello { version: PROTOCOL_VERSION, proof: b.own_proof(Role::Dialler), membership: b.membership.into() };
    write_frame(send, &hello).await.map_err(|e| DialOutcome::Broken(e.to_string()))?;
    match read_frame(recv).await {
        Ok(Frame::Welcome { version, proof, membership }) => {
            if version != PROTOCOL_VERSION {
                return Err(DialOutcome::Refused(RefusalReason::VersionMismatch {
                    ours: PROTOCOL_VERSION,
                    theirs: Some(version),
                }));
            }
            if !b.peer_proof_valid(Role::Acceptor, &proof) {
                return Err(DialOutcome::PeerNotAdmitted);
            }
            if membership != b.membership {
                // An acceptor of this version refuses a mismatch itself; this one did not.
                return Err(DialOutcome::Refused(RefusalReason::MembershipMismatch {
                    ours: b.membership.into(),
                    theirs: membership,
                }));
            }
            Ok(())
        }
        Ok(Frame::Refuse(reason)) => Err(DialOutcome::Refused(RefusalReason::decode(&reason, b.membership))),
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
        Ok(Frame::Hello { version, proof, membership }) => {
            if version != PROTOCOL_VERSION {
                Err(RefusalReason::VersionMismatch { ours: PROTOCOL_VERSION, theirs: Some(version) })
            } else if !b.peer_proof_valid(Role::Dialler, &proof) {
                Err(RefusalReason::JoinSecretMismatch)
            } else if membership != b.membership {
                // Told only to a peer that proved it knows the secret.
                Err(RefusalReason::MembershipMismatch { ours: b.membership.into(), theirs: membership })
            } else {
                Ok(())
            }
        }
        Ok(other) => Err(RefusalReason::ProtocolViolation(format!("expected Hello, got {}", frame_name(&other)))),
        Err(e) => Err(RefusalReason::ProtocolViolation(format!("no Hello on the control stream: {e}"))),
    };
    match verdict {
        Ok(()) => {
            let welcome = Frame::Welcome {
                version: PROTOCOL_VERSION,
                proof: b.own_proof(Role::Acceptor),
                membership: b.membership.into(),
            };
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

    fn secret(s: &str) -> JoinSecret {
        JoinSecret::new(s).expect("non-empty")
    }

    async fn exchange(
        dialler_secret: &str,
        acceptor_secret: &str,
    ) -> (Result<(), DialOutcome>, Result<(), RefusalReason>) {
        exchange_with(dialler_secret, acceptor_secret, "swim", "swim").await
    }

    async fn exchange_with(
        dialler_secret: &str,
        acceptor_secret: &str,
        dialler_membership: &str,
        acceptor_membership: &str,
    ) -> (Result<(), DialOutcome>, Result<(), RefusalReason>) {
        let (a, b) = tokio::io::duplex(4096);
        let (mut ar, mut aw) = tokio::io::split(a);
        let (mut br, mut bw) = tokio::io::split(b);
        let (ds, acs) = (secret(dialler_secret), secret(acceptor_secret));
        let (d_id, a_id) = (NodeId::from_u64(1), NodeId::from_u64(2));
        let exporter = [9u8; 32];
        let db = Binding { secret: &ds, exporter, own: d_id, peer: a_id, membership: dialler_membership };
        let ab = Binding { secret: &acs, exporter, own: a_id, peer: d_id, membership: acceptor_membership };
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
        let bind = Binding {
            secret: &s,
            exporter: [0; 32],
            own: NodeId::from_u64(2),
            peer: NodeId::from_u64(1),
            membership: "swim",
        };
        let hello = Frame::Hello { version: PROTOCOL_VERSION + 1, proof: [0; 32], membership: "swim".into() };
        let (_, verdict) = tokio::join!(write_frame(&mut aw, &hello), accept(&mut bw, &mut br, &bind));
        assert_eq!(
            verdict,
            Err(RefusalReason::VersionMismatch { ours: PROTOCOL_VERSION, theirs: Some(PROTOCOL_VERSION + 1) })
        );
        let reply = read_frame(&mut ar).await.expect("refuse frame");
        let Frame::Refuse(r) = reply else { panic!("expected Refuse, got {reply:?}") };
        assert!(matches!(RefusalReason::decode(&r, "swim"), RefusalReason::VersionMismatch { .. }));
    }

    #[tokio::test]
    async fn another_membership_protocol_is_refused_with_both_names() {
        let (d, a) = exchange_with("s3cret", "s3cret", "push-pull", "swim").await;
        let theirs = RefusalReason::MembershipMismatch { ours: "swim".into(), theirs: "push-pull".into() };
        assert_eq!(a, Err(theirs));
        let Err(DialOutcome::Refused(reason)) = d else { panic!("the dialler was not refused: {d:?}") };
        assert_eq!(reason, RefusalReason::MembershipMismatch { ours: "push-pull".into(), theirs: "swim".into() });
        let shown = format!("{reason} — {}", reason.hint());
        assert!(shown.contains("this side runs push-pull, the other swim"), "{shown}");
        assert!(shown.contains("--membership"), "{shown}");
    }

    #[tokio::test]
    async fn the_membership_protocol_is_told_only_to_who_knows_the_secret() {
        let (d, a) = exchange_with("wrong", "s3cret", "push-pull", "swim").await;
        assert_eq!(a, Err(RefusalReason::JoinSecretMismatch));
        assert!(matches!(d, Err(DialOutcome::Refused(RefusalReason::JoinSecretMismatch))), "{d:?}");
    }

    #[tokio::test]
    async fn a_proof_from_another_session_is_rejected() {
        let s = secret("same");
        let (d, a) = (NodeId::from_u64(1), NodeId::from_u64(2));
        let session1 = Binding { secret: &s, exporter: [1; 32], own: d, peer: a, membership: "" };
        let session2 = Binding { secret: &s, exporter: [2; 32], own: a, peer: d, membership: "" };
        let replayed = session1.own_proof(Role::Dialler);
        assert!(!session2.peer_proof_valid(Role::Dialler, &replayed));
        // and a proof cannot be reflected to its sender in the other role
        let reflect = Binding { secret: &s, exporter: [1; 32], own: a, peer: d, membership: "" };
        assert!(!reflect.peer_proof_valid(Role::Acceptor, &replayed));
    }

    #[test]
    fn refusals_decode_without_panicking() {
        for bytes in [&[][..], &[0], &[2], &[2, 1], &[3, 0xff, 0xfe], &[4], &[4, 0xff], &[200, 1, 2]] {
            let _ = RefusalReason::decode(bytes, "swim");
        }
        assert_eq!(
            RefusalReason::decode(&RefusalReason::JoinSecretMismatch.encode(), "swim"),
            RefusalReason::JoinSecretMismatch
        );
        let mismatch = RefusalReason::MembershipMismatch { ours: "push-pull".into(), theirs: "swim".into() };
        assert_eq!(
            RefusalReason::decode(&mismatch.encode(), "swim"),
            RefusalReason::MembershipMismatch { ours: "swim".into(), theirs: "push-pull".into() },
            "seen from the receiver's side"
        );
    }

    #[test]
    fn empty_secrets_are_refused_and_secrets_never_print() {
        assert!(JoinSecret::new("").is_err());
        assert_eq!(format!("{:?}", secret("hunter2")), "JoinSecret(<redacted>)");
    }
}
