//! HTTPS: the gateway terminates TLS with a configured certificate and key, for HTTP/1.1 and
//! HTTP/2 (ALPN).

use crate::common;

use std::sync::Arc;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::{CertificateDer, ServerName};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_reach_the_api_over_tls() {
    within(60, async {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("certificate");
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert_path, key_path) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
        std::fs::write(&cert_path, cert.cert.pem()).expect("write cert");
        std::fs::write(&key_path, cert.key_pair.serialize_pem()).expect("write key");
        let fed = Fed::start(Options {
            engines: vec![engine(&[MODEL])],
            tls: Some((cert_path.clone(), key_path)),
            ..Options::default()
        })
        .await;
        assert!(fed.base().starts_with("https://"));

        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from(cert.cert.der().to_vec())).expect("trust the test certificate");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        for alpn in [b"http/1.1".to_vec(), b"h2".to_vec()] {
            let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .expect("versions")
                .with_root_certificates(roots.clone())
                .with_no_client_auth();
            config.alpn_protocols = vec![alpn.clone()];
            let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
            let tcp = tokio::net::TcpStream::connect(fed.gateway.local_addr()).await.expect("connect");
            let tls =
                connector.connect(ServerName::try_from("localhost").expect("name"), tcp).await.expect("TLS handshake");
            let req = hyper::Request::get(format!("https://localhost:{}/v1/models", fed.gateway.local_addr().port()))
                .header("authorization", format!("Bearer {KEY}"))
                .body(Empty::<Bytes>::new())
                .expect("request");
            let response = if alpn == b"h2" {
                let (mut sender, conn) =
                    hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls)).await.expect("h2");
                tokio::spawn(conn);
                sender.send_request(req).await.expect("response")
            } else {
                let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.expect("h1");
                tokio::spawn(conn);
                sender.send_request(req).await.expect("response")
            };
            assert_eq!(response.status(), 200);
            let body = response.into_body().collect().await.expect("body").to_bytes();
            let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
            assert_eq!(v["data"][0]["id"], MODEL);
        }

        // `tela status` reads an https:// gateway, trusting the given CA.
        let url = format!("https://localhost:{}", fed.gateway.local_addr().port());
        let out = std::process::Command::new(tela())
            .args(["status", "--gateway", &url, "--api-key", KEY, "--ca-cert"])
            .arg(&cert_path)
            .output()
            .expect("run tela status");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).contains("SERVE"));
    })
    .await;
}
