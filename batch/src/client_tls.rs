//! TLS for Tela's outgoing HTTPS: the REST batch backends ([`crate::slurmrest`],
//! [`crate::firecrest`] and its token endpoint), and the gateway's `tela status
//! --gateway https://…` and overflow providers. One client configuration for all of them:
//! the system's certificate store (`rustls-native-certs`) plus, when given, the CAs of one more
//! PEM file, for sites that sign their services with their own CA.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

/// Why no TLS client configuration could be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientTlsError {
    /// The extra CA file could not be read or parsed.
    #[error("cannot read the CA certificate file {}: {detail}", path.display())]
    CaFile {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// The extra CA file holds a certificate rustls refuses as a root.
    #[error("the CA certificate file {} holds an unusable certificate: {detail}", path.display())]
    BadCertificate {
        /// The file.
        path: PathBuf,
        /// rustls' words.
        detail: String,
    },
    /// Neither the system nor the configuration gave a single trusted certificate.
    #[error("no trusted certificates: the system store is empty; give the server's CA certificate (PEM)")]
    NoRoots,
    /// rustls refused the configuration.
    #[error("TLS setup: {0}")]
    Setup(#[from] rustls::Error),
}

/// A TLS client configuration trusting the system's roots and the certificates in `ca_cert`
/// (PEM); no ALPN is set, so callers pick their HTTP version.
pub fn client_config(ca_cert: Option<&Path>) -> Result<rustls::ClientConfig, ClientTlsError> {
    let mut roots = rustls::RootCertStore::empty();
    // Unreadable system certificates are skipped: the extra CA may be all a site needs.
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    if let Some(path) = ca_cert {
        let ca_file = |detail: String| ClientTlsError::CaFile { path: path.to_path_buf(), detail };
        let mut found = 0;
        for cert in CertificateDer::pem_file_iter(path).map_err(|e| ca_file(e.to_string()))? {
            let cert = cert.map_err(|e| ca_file(e.to_string()))?;
            roots
                .add(cert)
                .map_err(|e| ClientTlsError::BadCertificate { path: path.to_path_buf(), detail: e.to_string() })?;
            found += 1;
        }
        if found == 0 {
            return Err(ca_file("no PEM certificate (-----BEGIN CERTIFICATE-----) in it".into()));
        }
    }
    if roots.is_empty() {
        return Err(ClientTlsError::NoRoots);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_extra_ca_is_read_and_a_bad_file_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("certificate");
        let good = dir.path().join("ca.pem");
        std::fs::write(&good, cert.cert.pem()).expect("write");
        client_config(Some(&good)).expect("a PEM CA is accepted");

        let empty = dir.path().join("key.pem");
        std::fs::write(&empty, cert.key_pair.serialize_pem()).expect("write");
        let err = client_config(Some(&empty)).unwrap_err().to_string();
        assert!(err.contains("key.pem") && err.contains("no PEM certificate"), "{err}");

        let missing = dir.path().join("missing.pem");
        let err = client_config(Some(&missing)).unwrap_err().to_string();
        assert!(err.contains("missing.pem"), "{err}");
    }
}
