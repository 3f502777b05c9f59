//! Runs every file of the seed corpus in `corpus/<target>/` through its target function, so the
//! seeds (and anything added to them) are checked by a plain `cargo test` on stable Rust.

use std::path::Path;

fn run_corpus(target: &str, check: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus").join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|entry| entry.expect("a corpus directory entry").path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} holds no seed", dir.display());
    for path in files {
        let data = std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        eprintln!("{target}: {}", path.display());
        check(&data);
    }
}

#[test]
fn wire_decode_corpus() {
    run_corpus("wire_decode", tela_fuzz::wire_decode);
}

#[test]
fn merge_laws_corpus() {
    run_corpus("merge_laws", tela_fuzz::merge_laws);
}

#[test]
fn node_facade_corpus() {
    run_corpus("node_facade", tela_fuzz::node_facade);
}
