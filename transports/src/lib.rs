//! Tela's transports: how nodes and gateways reach each other.
//!
//! This crate carries the protocol core's datagrams (gossip, at most
//! [`tela_core::MAX_DATAGRAM`] bytes) and reliable streams (anti-entropy, tunnelled HTTP
//! requests) between authenticated members of one federation. It decides nothing about the
//! protocol; `runtime-tokio` feeds what arrives here into [`tela_core::Node`] and sends what
//! the node emits.
//!
//! - **Identity** ([`Identity`]): a persistent Ed25519 key under the user's config directory;
//!   the [`NodeId`](tela_core::NodeId) is derived from its public key.
//! - **Authentication and admission**: TLS 1.3 with client certificates on both transports,
//!   peers identified by key ([`tls`]); then each side proves it knows the federation's
//!   [`JoinSecret`], bound to the TLS session ([`admission`]). A peer without the secret is
//!   refused with a reason both sides can act on.
//! - **One [`Connection`] type over three transports** ([`connection`]): QUIC with quinn
//!   (datagrams, streams, keep-alives), TCP+TLS multiplexed with yamux for sites that block
//!   UDP, and an in-memory pair ([`Connection::pair`]) for tests. Either side opens streams,
//!   so a gateway opens request streams toward a node that dialled it from behind NAT.
//! - **[`Endpoint`]**: listens on QUIC and TCP on one port number, dials with
//!   [`TransportMode::Auto`] (QUIC, falling back to TCP when UDP gets no answer), `Quic` or
//!   `Tcp`.
//! - **[`tunnel`]**: the framing of one HTTP request and its streamed response on a stream.
//!
//! # Driving it
//!
//! ```
//! use bytes::Bytes;
//! use tela_transports::{Accepted, Endpoint, EndpointConfig, Identity, JoinSecret, TransportMode};
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let secret = JoinSecret::new("correct horse battery staple")?;
//! // The gateway listens (QUIC and TCP on the same port number).
//! let gateway = Endpoint::listen(
//!     "127.0.0.1:0".parse()?,
//!     EndpointConfig::new(Identity::generate()?, secret.clone()),
//! )?;
//! let gateway_addr = gateway.local_addr().expect("listening");
//!
//! // A node with no inbound port dials out.
//! let node = Endpoint::dialer(EndpointConfig::new(Identity::generate()?, secret))?;
//! let to_gateway = node.connect(gateway_addr, TransportMode::Auto).await?;
//! let Some(Accepted::Admitted(to_node)) = gateway.accept().await else { panic!("refused") };
//! assert_eq!(to_node.peer_id(), node.node_id());
//!
//! // Gossip goes in datagrams...
//! to_gateway.send_datagram(Bytes::from_static(b"gossip"))?;
//! assert_eq!(to_node.read_datagram().await?, "gossip");
//!
//! // ...and the gateway opens a stream toward the node for each client request.
//! let (mut send, mut recv) = to_node.open_stream().await?;
//! send.write_all(b"GET /v1/models").await?;
//! send.shutdown().await?;
//! let (mut reply, mut request) = to_gateway.accept_stream().await?;
//! let mut got = Vec::new();
//! request.read_to_end(&mut got).await?;
//! reply.write_all(b"200 OK").await?;
//! reply.shutdown().await?;
//! let mut answer = Vec::new();
//! recv.read_to_end(&mut answer).await?;
//! assert_eq!(answer, b"200 OK");
//!
//! to_gateway.close("node draining");
//! assert_eq!(to_node.closed().await.to_string(), "closed by the peer: node draining");
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod accept;
pub mod admission;
pub mod connection;
mod control;
pub mod endpoint;
pub mod identity;
mod memory;
mod mux;
mod quic;
mod tcp;
pub mod tls;
pub mod tunnel;

pub use accept::{Accepted, Refusal, MAX_PENDING_HANDSHAKES};
pub use admission::{JoinSecret, JoinSecretError, RefusalReason, PROTOCOL_VERSION};
pub use connection::{CloseReason, Connection, ConnectionError, DatagramError, RecvStream, SendStream, Transport};
pub use endpoint::{ConnectError, Endpoint, EndpointConfig, EndpointError, TransportMode, UnknownTransportMode};
pub use identity::{node_id_from_public_key, Identity, IdentityError};
pub use tls::ALPN;
