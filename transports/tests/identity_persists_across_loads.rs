//! A node's identity key is created once (mode 0600) and reused: the same file always gives
//! the same NodeId, another file another one, and peers see that id.

mod common;

use common::{admitted, within, SECRET};
use tela_transports::{node_id_from_public_key, Endpoint, EndpointConfig, Identity, JoinSecret, TransportMode};

#[test]
fn the_same_key_file_gives_the_same_id_and_another_file_another() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("nested").join("identity.key");
    let first = Identity::load_or_create(&path).expect("create");
    assert!(path.exists());
    let again = Identity::load_or_create(&path).expect("reload");
    assert_eq!(first.node_id(), again.node_id());
    assert_eq!(first.public_key(), again.public_key());
    assert_eq!(first.node_id(), node_id_from_public_key(first.public_key()));

    let other = Identity::load_or_create(&dir.path().join("other.key")).expect("create other");
    assert_ne!(first.node_id(), other.node_id());

    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the key must be private to its owner");
        let parent = std::fs::metadata(path.parent().expect("parent")).expect("stat dir").permissions().mode() & 0o777;
        assert_eq!(parent, 0o700);
    }
    // No temporary files are left behind.
    let leftovers: Vec<_> = std::fs::read_dir(path.parent().expect("parent"))
        .expect("list")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(leftovers, vec![std::ffi::OsString::from("identity.key")]);
}

#[test]
fn the_default_key_lives_in_the_config_directory() {
    let path = Identity::default_path().expect("a config directory exists here");
    assert!(path.ends_with("tela/identity.key"), "{}", path.display());
}

#[tokio::test]
async fn peers_see_the_persisted_id() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("identity.key");
    let node_id = Identity::load_or_create(&path).expect("create").node_id();

    let gateway = common::listener();
    let addr = gateway.local_addr().expect("listening");
    let reloaded = Identity::load_or_create(&path).expect("reload");
    let node =
        Endpoint::dialer(EndpointConfig::new(reloaded, JoinSecret::new(SECRET).expect("secret"))).expect("dialer");
    let (dialled, accepted) =
        within("connect", async { tokio::join!(node.connect(addr, TransportMode::Tcp), admitted(&gateway)) }).await;
    dialled.expect("admitted");
    assert_eq!(accepted.peer_id(), node_id);
}
