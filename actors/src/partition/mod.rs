//! One partition: its on-disk log ([`log`]), indexes ([`index`]), manifest
//! ([`manifest`]), idempotent-producer state ([`producers`]), transaction
//! markers and the aborted-transaction index ([`txn_index`]), the read path ([`reader`]), the commit gate ([`commit`]:
//! the leader's logic without actix) and the actor that owns the files
//! ([`leader`]).

pub mod claim;
pub mod commit;
pub mod files;
pub mod index;
pub mod leader;
pub mod log;
pub mod manifest;
pub mod messages;
pub mod producers;
pub mod reader;
pub mod txn_index;

#[cfg(test)]
pub(crate) mod tests;
