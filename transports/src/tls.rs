//! TLS 1.3 with mutual authentication by key: the rustls configurations both transports use.
//!
//! There is no certificate authority. Every node presents the self-signed certificate of its
//! [`Identity`]; the custom verifiers here accept any well-formed Ed25519 certificate, check
//! the handshake signature against its key (so the peer provably holds the private key) and
//! leave the decision "is this peer one of us" to the join-secret admission that follows
//! ([`crate::admission`]). The peer's [`NodeId`] is derived from the certificate's public key
//! with [`node_id_from_public_key`].
//!
//! Only TLS 1.3 and only Ed25519 signatures are offered or accepted; the ALPN protocol
//! [`ALPN`] pins the Tela transport version, so a peer speaking another version fails the
//! handshake with `no_application_protocol`, which the dialler reports as a version mismatch.

use crate::identity::{node_id_from_public_key, Identity};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use std::sync::Arc;
use tela_core::NodeId;
use x509_parser::error::X509Error;

/// The ALPN protocol id of this transport version. Peers must agree on it exactly.
pub const ALPN: &[u8] = b"tela/1";

/// The server name the dialler puts in its ClientHello. Identity is checked by key, so the
/// name carries no meaning; it only has to be a syntactically valid DNS name.
pub(crate) const SERVER_NAME: &str = "tela.invalid";

/// The Ed25519 algorithm OID, 1.3.101.112, as it appears in a SubjectPublicKeyInfo.
const ED25519_OID: &str = "1.3.101.112";

pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The rustls server configuration: TLS 1.3, a client certificate required, our identity.
pub(crate) fn server_config(identity: &Identity, alpn: &[u8]) -> Result<rustls::ServerConfig, rustls::Error> {
    let provider = provider();
    let mut config = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(Arc::new(PeerKeyVerifier { provider }))
        .with_single_cert(vec![identity.certificate().clone()], identity.private_key())?;
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(config)
}

/// The rustls client configuration: TLS 1.3, our identity as client certificate.
pub(crate) fn client_config(identity: &Identity, alpn: &[u8]) -> Result<rustls::ClientConfig, rustls::Error> {
    let provider = provider();
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(PeerKeyVerifier { provider }))
        .with_client_auth_cert(vec![identity.certificate().clone()], identity.private_key())?;
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(config)
}

pub(crate) fn server_name() -> ServerName<'static> {
    ServerName::try_from(SERVER_NAME).expect("SERVER_NAME is a valid DNS name")
}

/// Why a peer's certificate chain names no acceptable key. Nothing is changed: the
/// handshake or admission that asked fails.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PeerCertError {
    /// The peer sent no certificate at all.
    #[error("the peer presented no certificate")]
    Missing,
    /// The certificate is not valid X.509.
    #[error("the peer certificate does not parse: {0}")]
    Unparsable(#[source] x509_parser::nom::Err<X509Error>),
    /// The certificate holds a key of another algorithm.
    #[error("the peer certificate holds a {algorithm} key, not Ed25519")]
    NotEd25519 {
        /// The key's algorithm OID.
        algorithm: String,
    },
    /// The Ed25519 key has the wrong length.
    #[error("the peer's Ed25519 key is {len} bytes, not 32")]
    KeyLength {
        /// Its length in bytes.
        len: usize,
    },
}

/// Why the facts admission needs (the peer's id, the exporter secret) could not be read from
/// an established TLS session. Nothing is changed; the caller refuses or abandons the
/// connection.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SessionFactsError {
    /// The peer's certificate is unacceptable.
    #[error(transparent)]
    PeerCert(#[from] PeerCertError),
    /// rustls would not export keying material.
    #[error("TLS exporter unavailable: {0}")]
    Exporter(#[source] rustls::Error),
    /// quinn would not export keying material (it says no more than that).
    #[error("TLS exporter unavailable")]
    QuicExporter,
}

/// The [`NodeId`] of the peer that presented `chain`, or why the chain is unacceptable.
pub(crate) fn peer_node_id(chain: &[CertificateDer<'_>]) -> Result<NodeId, PeerCertError> {
    let cert = chain.first().ok_or(PeerCertError::Missing)?;
    Ok(node_id_from_public_key(&ed25519_public_key(cert)?))
}

/// The raw Ed25519 public key of a certificate.
fn ed25519_public_key(cert: &CertificateDer<'_>) -> Result<Vec<u8>, PeerCertError> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).map_err(PeerCertError::Unparsable)?;
    let spki = parsed.public_key();
    let algorithm = spki.algorithm.algorithm.to_id_string();
    if algorithm != ED25519_OID {
        return Err(PeerCertError::NotEd25519 { algorithm });
    }
    let key = spki.subject_public_key.data.to_vec();
    if key.len() != 32 {
        return Err(PeerCertError::KeyLength { len: key.len() });
    }
    Ok(key)
}

/// Accepts any self-signed Ed25519 certificate whose key signs the handshake; used on both
/// sides (as the server's client verifier and the client's server verifier).
#[derive(Debug)]
struct PeerKeyVerifier {
    provider: Arc<CryptoProvider>,
}

impl PeerKeyVerifier {
    fn check(&self, end_entity: &CertificateDer<'_>) -> Result<(), rustls::Error> {
        ed25519_public_key(end_entity).map(|_| ()).map_err(|e| rustls::Error::General(e.to_string()))
    }

    fn tls13(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        if dss.scheme != SignatureScheme::ED25519 {
            return Err(rustls::Error::PeerIncompatible(rustls::PeerIncompatible::NoSignatureSchemesInCommon));
        }
        verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }
}

impl ServerCertVerifier for PeerKeyVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.check(end_entity).map(|()| ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        // Only TLS 1.3 is ever negotiated (see `with_protocol_versions`).
        Err(rustls::Error::PeerIncompatible(rustls::PeerIncompatible::Tls13RequiredForQuic))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        vec![SignatureScheme::ED25519]
    }
}

impl ClientCertVerifier for PeerKeyVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.check(end_entity).map(|()| ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::PeerIncompatible(rustls::PeerIncompatible::Tls13RequiredForQuic))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        vec![SignatureScheme::ED25519]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peer_id_comes_from_the_certificate_key() {
        let id = Identity::generate().expect("generate");
        let from_cert = peer_node_id(&[id.certificate().clone()]).expect("parses");
        assert_eq!(from_cert, id.node_id());
    }

    #[test]
    fn garbage_certificates_are_rejected_not_panicked_on() {
        let junk = CertificateDer::from(vec![0x30, 0x03, 0x01, 0x01, 0xff]);
        assert!(peer_node_id(&[junk]).is_err());
        assert!(peer_node_id(&[]).is_err());
    }

    #[test]
    fn configs_build() {
        let id = Identity::generate().expect("generate");
        server_config(&id, ALPN).expect("server config");
        client_config(&id, ALPN).expect("client config");
    }
}
