//! TLS for the gateway's outgoing HTTPS: `tela status --gateway https://…` and the outside
//! providers of [`crate::overflow`]. Trusts the system's certificate store and, when given, one
//! more CA (PEM) — the configuration the REST batch backends use too
//! ([`tela_batch::client_tls`]).

use std::path::Path;
use std::sync::Arc;

/// A TLS client trusting the system's roots and `ca_cert`.
pub fn connector(ca_cert: Option<&Path>) -> anyhow::Result<tokio_rustls::TlsConnector> {
    let config = tela_batch::client_tls::client_config(ca_cert)?;
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}
