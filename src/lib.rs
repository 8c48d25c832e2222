//! a2a-lifecycle: an A2A protocol v1.0 gRPC server built around a correct,
//! durable task lifecycle.
//!
//! Data flows one way: a request is validated by [`service`], the selected
//! [`agent`] executor emits events, the [`lifecycle`] core applies them to the
//! task, the [`store`] persists the result and [`runtime`] broadcasts it to the
//! task's subscribers.

pub mod agent;
pub mod auth;
pub mod bindings;
pub mod connections;
pub mod console;
pub mod content;
pub mod discovery;
pub mod error;
pub mod json;
pub mod lifecycle;
pub mod metrics;
pub mod operations;
pub mod os;
pub mod proto;
pub mod push;
pub mod runtime;
pub mod server;
pub mod service;
pub mod store;
pub mod telemetry;
pub mod wkt;

/// README's Rust examples, compiled and run as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeExamples;
