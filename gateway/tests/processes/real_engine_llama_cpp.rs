//! A real engine behind `tela node`: llama-cpp-python's OpenAI server with SmolLM2-135M
//! (installed by `.ci/setup-engine.sh`, which prints the two variables this test reads:
//! `TELA_LLAMA_PYTHON` and `TELA_LLAMA_MODEL`). The node launches it, finds it ready through
//! `/v1/models` (it has no `/health`), announces its model name and reaches SERVE; requests
//! tunnelled to it are answered, streamed ones chunk by chunk; SIGTERM drains, stops the
//! engine and exits 0.
//!
//! Built without the variables the test shows as ignored, with the reason; with `CI=true` it
//! always runs, so CI cannot pass without having run the engine.

use crate::procs;

use nix::sys::signal::Signal;
use procs::*;
use std::time::{Duration, Instant};

#[cfg_attr(not(tela_llama), ignore = "needs llama.cpp: run .ci/test, or export what .ci/setup-engine.sh prints")]
#[test]
fn llama_cpp_server_is_discovered_with_its_model_and_serves_through_the_tunnel() {
    let (Some(python), Some(model)) = (std::env::var_os("TELA_LLAMA_PYTHON"), std::env::var_os("TELA_LLAMA_MODEL"))
    else {
        panic!("TELA_LLAMA_PYTHON / TELA_LLAMA_MODEL are not set; run .ci/setup-engine.sh and export what it prints");
    };
    let (python, model) = (python.to_string_lossy().into_owned(), model.to_string_lossy().into_owned());
    run_test(Duration::from_secs(180), async {
        let dir = tempfile::tempdir().expect("tempdir");
        let anchor = anchor().await;
        let port = free_port();
        let engine_cmd = format!(
            "exec '{python}' -m llama_cpp.server --model '{model}' --model_alias smollm2 --host 127.0.0.1 \
             --port {port} --n_ctx 2048 --verbose false --interrupt_requests false"
        );
        let backend = format!("http://127.0.0.1:{port}");
        let files = NodeFiles::new(dir.path(), "node");
        let id = files.node_id();
        let started = Instant::now();
        let mut node = node(
            "node",
            &files,
            &anchor.local_addr().to_string(),
            SECRET,
            &["--engine-cmd", &engine_cmd, "--backend-url", &backend, "--engine-stop-grace", "10s"],
        );
        until(&anchor, "the llama.cpp node is routable", Duration::from_secs(120), |s| routable(s, &id)).await;
        eprintln!("llama.cpp node routable at the anchor {:?} after start", started.elapsed());
        let snap = anchor.runtime().snapshot();
        assert_eq!(snap.replica().serving("smollm2").to_vec(), [id], "discovered with the model alias");
        // The node's log is read by another thread: the line may trail the gossip that made it routable.
        node.wait_line("serving smollm2", Duration::from_secs(10));

        // A whole answer...
        let (_send, mut recv) = open_chat(&anchor, &id, "smollm2", 8, false).await;
        let answer = read_response(&mut recv).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        let json: serde_json::Value = serde_json::from_str(&answer.body).expect("JSON answer");
        assert!(json["choices"][0]["message"]["content"].is_string(), "{json}");
        // ...and a streamed one, in OpenAI's SSE framing.
        let (_send, mut recv) = open_chat(&anchor, &id, "smollm2", 8, true).await;
        let streamed = read_response(&mut recv).await;
        assert_eq!(streamed.status, 200, "{}", streamed.body);
        assert!(streamed.body.starts_with("data: {"), "{}", streamed.body);
        assert!(streamed.body.trim_end().ends_with("data: [DONE]"), "{}", streamed.body);

        let launched = node.wait_line("launched the engine (pid ", Duration::from_secs(1));
        let pid: i32 = launched
            .split("(pid ")
            .nth(1)
            .and_then(|s| s.split(')').next())
            .and_then(|s| s.parse().ok())
            .expect("the engine's pid");
        node.signal(Signal::SIGTERM);
        assert_eq!(node.wait_exit(Duration::from_secs(30)), Some(0), "exit status after SIGTERM");
        let gone = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err();
        assert!(gone, "the engine (pid {pid}) was stopped with the node");
    });
}
