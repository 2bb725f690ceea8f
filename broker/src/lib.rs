//! The kaas broker as a library: configuration, start-up, connections and
//! request handling. The `kaas` binary (`main.rs`) only parses arguments
//! and calls in here, so tests and tools can drive the same code.
//!
//! Architecture invariant: only [`api`] maps errors to Kafka error codes;
//! connections and handlers hold no filesystem handle.

pub mod api;
pub mod config;
pub mod conn;
pub mod dev;
pub mod fd_budget;
pub mod fetch_session;
pub mod http;
pub mod inspect;
pub mod limits;
pub mod move_cmd;
pub mod peer;
pub mod quota;
pub mod reserve;
pub mod server;
pub mod state;
pub mod substrate_cmd;
pub mod txn_markers;
