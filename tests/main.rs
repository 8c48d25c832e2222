//! The integration tests, in one test binary: each file beside this one is
//! a module of it, so the test support and the generated clients are
//! compiled and linked once rather than once per file (CI's build time).
//!
//! Six files are test binaries of their own (`Cargo.toml` lists them),
//! because they must not share a process's time with other tests:
//! `faults.rs` and `postgres_restart.rs` stop and start PostgreSQL;
//! `soak.rs` loads three replicas for seconds on end; `hostile_soak.rs`
//! compares latencies measured in two runs; `browser.rs` drives one
//! Chromium; `doc_blocks.rs` runs the docs' commands on their fixed
//! ports. Cargo runs test binaries one at a time. `tests/structure.rs`
//! checks that every file here is one or the other.
//!
//! One file's tests: `cargo test --test integration flows::`.

mod store_conformance;
mod support;

mod auth;
mod auth_rpc;
mod bench_agent;
mod bindings;
mod card_signing;
mod cards;
mod cli;
mod concurrency;
mod conformance_agent;
mod connections;
mod console;
mod content_types;
mod discovery;
mod durability;
mod errors;
mod first_hour;
mod flows;
mod full_disk;
mod fuzz;
mod hostile;
mod http_json;
mod inline_runs;
mod jsonrpc;
mod metrics;
mod mtls;
mod operations;
mod ownership;
mod postgres_tls;
mod push_configs;
mod push_delivery;
mod quarantine;
mod replicas;
mod runtime;
mod runtime_faults;
mod sdk_clients;
mod store_memory;
mod store_postgres;
mod store_sqlite;
mod structure;
mod subscriptions;
mod task_size;
mod telemetry;
mod tls;
mod transitions;
mod v0_3;
