//! The cluster: several brokers on one shared directory, one writer per
//! partition, no followers.
//!
//! * [`membership`] — each broker's liveness record and self-enforced lease.
//! * [`controller`] — the election (O_EXCL per controller epoch) and, while
//!   elected, the owner of the assignment file.
//! * [`plan`] — the controller's decision as a pure function.
//! * [`balance`] — placement within both caps, moving as little as it can.
//! * [`watcher`] — each broker applies the newest assignment: starts and
//!   stops partition leaders, feeds the metadata cache.
//! * [`records`] — the files they exchange.
//!
//! ARCHITECTURE.md ("Cluster") explains why the leases are safe without
//! comparing clocks, and the takeover procedure.

pub mod balance;
pub mod controller;
pub mod election;
pub mod history;
pub mod lease;
pub mod membership;
pub mod plan;
pub mod records;
pub mod watcher;

#[cfg(test)]
mod logic_tests;
#[cfg(test)]
mod tests;
