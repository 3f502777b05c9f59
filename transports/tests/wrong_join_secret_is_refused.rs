//! A node with the wrong join secret is refused on both transports: it gets a typed error it
//! can print, and the gateway reports and logs who it refused, from where, and why.

mod common;

use common::{admitted, dialer, listener, within, SECRET};
use std::io::Write;
use std::sync::{Arc, Mutex};
use tela_transports::{Accepted, ConnectError, RefusalReason, Transport, TransportMode};

/// Collects everything the tracing subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("log buffer")).into_owned()
    }
}

// Current-thread runtime: every task runs on this thread, under the capturing subscriber.
#[tokio::test(flavor = "current_thread")]
async fn a_wrong_join_secret_is_refused_with_a_reason_on_both_sides() {
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let gateway = listener();
    let addr = gateway.local_addr().expect("listening");
    for (mode, transport) in [(TransportMode::Quic, Transport::Quic), (TransportMode::Tcp, Transport::Tcp)] {
        let intruder = dialer("not the federation secret");
        let err = within("refused dial", intruder.connect(addr, mode))
            .await
            .expect_err("a wrong secret must not be admitted");
        assert!(
            matches!(err, ConnectError::Refused { reason: RefusalReason::JoinSecretMismatch, .. }),
            "{mode}: {err:?}"
        );
        assert_eq!(
            err.to_string(),
            "the gateway refused this node: join secret mismatch — check --join-secret / TELA_JOIN_SECRET"
        );

        let refusal = match within("refusal report", gateway.accept()).await {
            Some(Accepted::Refused(r)) => r,
            other => panic!("{mode}: expected a refusal, got {other:?}"),
        };
        assert_eq!(refusal.peer, Some(intruder.node_id()), "{mode}");
        assert_eq!(refusal.transport, transport);
        assert_eq!(refusal.reason, RefusalReason::JoinSecretMismatch);
        assert!(refusal.remote.ip().is_loopback());

        let log = logs.text();
        let line = log
            .lines()
            .find(|l| l.contains(&intruder.node_id().to_string()))
            .unwrap_or_else(|| panic!("{mode}: no log line names the refused node:\n{log}"));
        assert!(line.contains("WARN"), "{line}");
        assert!(line.contains("join secret mismatch"), "{line}");
        assert!(line.contains(&refusal.remote.to_string()), "{line}");
    }

    // The gateway still admits members afterwards.
    let member = dialer(SECRET);
    let (dialled, accepted) = tokio::join!(member.connect(addr, TransportMode::Auto), admitted(&gateway));
    assert_eq!(dialled.expect("member admitted").peer_id(), gateway.node_id());
    assert_eq!(accepted.peer_id(), member.node_id());
}
