//! TLS for the gateway's outgoing HTTPS: `tela status --gateway https://…` and the outside
//! providers of [`crate::overflow`]. Trusts the system's certificate store and, when given, one
//! more CA (PEM).

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use rustls_pki_types::pem::PemObject;

/// A TLS client trusting the system's roots and `ca_cert`.
pub fn connector(ca_cert: Option<&Path>) -> anyhow::Result<tokio_rustls::TlsConnector> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for cert in native.certs {
        let _ = roots.add(cert);
    }
    if let Some(path) = ca_cert {
        for cert in rustls_pki_types::CertificateDer::pem_file_iter(path)
            .with_context(|| format!("cannot read {}", path.display()))?
        {
            roots.add(cert.with_context(|| format!("bad certificate in {}", path.display()))?)?;
        }
    }
    anyhow::ensure!(!roots.is_empty(), "no trusted certificates: give the server's CA certificate (PEM)");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}
