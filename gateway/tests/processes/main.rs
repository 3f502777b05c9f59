//! Tela's process tests: real `tela` gateways, nodes and anchors, engine simulators, the
//! official OpenAI SDK, llama.cpp, Chromium and a local Slurm, all on loopback.
//!
//! They are one test binary (each file below is a module) so that the suite links once: one
//! binary of this size per file cost minutes of linking and gigabytes of disk. Run one file's
//! tests with `cargo test -p tela-gateway --test processes <module>::`, e.g.
//! `cargo test -p tela-gateway --test processes slurm_sbatch::`.
//!
//! Helpers: `common` (an in-process gateway with `tela node` children and engine simulators),
//! `procs` (`tela` child processes, an embedded anchor, bounded waits), `login_host` (an `sshd`
//! of the test's own, `tela relay`, network namespaces) and `slurm_env` (the local
//! Slurm of `.ci/slurm/start.sh` and the scenario each batch backend runs against it).

mod common;
mod login_host;
mod procs;
mod slurm_env;

mod admission_refusals_say_why;
mod api_forwards_openai_requests;
mod batch_api_survives_restarts;
mod batch_backlog_spins_short_jobs_within_key_budgets;
mod batch_tokens_are_limited_apart_from_interactive_ones;
mod budgets_hold_across_gateways;
mod busy_engines_stay_up_while_streams_flow;
mod conversations_stay_on_one_node;
mod conversations_take_a_free_slot;
mod dashboard_renders_in_chromium;
mod demo_runs_a_federation_and_stops_cleanly;
mod draining_nodes_finish_streams_and_get_no_new_requests;
mod engine_death_turns_node_down;
mod engine_sim;
mod engines_report_their_load;
mod errors_have_the_openai_shape;
mod every_openai_route_is_forwarded;
mod failures_before_the_first_byte_are_retried;
mod federation_detects_a_killed_node;
mod federation_forms_over_quic;
mod federation_forms_over_tcp_fallback;
mod gateway_memory_stays_small;
mod gateways_survive_each_other;
mod in_flight_counts_end_on_every_path;
mod keys_have_limits_with_openai_rate_headers;
mod killed_nodes_are_avoided_at_once;
mod leaving_nodes_hand_their_conversations_over;
mod nodes_behind_a_login_host_in_network_namespaces;
mod nodes_reach_the_gateway_through_ssh_or_a_relay;
mod openai_sdk_end_to_end;
mod overflow_goes_to_an_outside_provider;
mod polite_keys_are_served_while_another_floods;
mod real_engine_llama_cpp;
mod sigusr1_drains_open_streams;
mod slurm_rest;
mod slurm_sbatch;
mod spinning_goes_where_the_queue_starts_soonest;
mod spinning_on_local_slurm;
mod spinning_replays_a_trace_like_the_simulator;
mod spinning_starts_nodes_on_demand;
mod spinning_through_firecrest;
mod status_metrics_and_the_terminal_table;
mod streams_are_not_buffered;
mod streams_broken_after_the_first_byte_end_with_an_error_event;
mod tls_terminates_https;
mod usage_ledger_records_what_engines_report;
mod walltime_from_slurm_drains_before_the_end;
