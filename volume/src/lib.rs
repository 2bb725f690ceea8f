//! Everything kaas knows about the shared volume, with no actix and no tokio
//! in it, so that the broker and the Kubernetes operator share one copy:
//!
//! * [`fs`] — the filesystem seam (the only way kaas touches the volume), its
//!   fault-injecting twin, and the read-only view handed to code that must
//!   not write;
//! * [`cluster_id`] — the cluster id, created once;
//! * [`binding`] — the data directory bound to one cluster (its stamp);
//! * [`cluster_move`] — moving a stopped cluster's state to another
//!   cluster directory;
//! * [`layout`] — every name on the volume and its parser;
//! * [`identity`] — the one exclusive-create-with-identity primitive (leader
//!   claims, controller epochs, producer-id blocks, the cluster id);
//! * [`topic_dir`] — topic-directory operations (create, stamp, rename-aside
//!   delete, re-driven removal);
//! * [`topic_config`] — the topic configs kaas implements (validation,
//!   types, documentation) and the per-topic config file;
//! * [`topic_notice`] — topic change notices to the controller;
//! * [`versioned`] — a document any broker may change, as a chain of
//!   exclusively created versions (a compare-and-set on the version);
//! * [`substrate`] — the checker that refuses a mount breaking the contract.

pub mod binding;
pub mod cluster_id;
pub mod cluster_move;
pub mod fs;
pub mod identity;
pub mod layout;
pub mod quotas;
pub mod substrate;
pub mod topic_config;
pub mod topic_dir;
pub mod topic_notice;
pub mod versioned;
