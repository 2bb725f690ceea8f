//! Transaction APIs, one module per API. The partition side (WriteTxnMarkers,
//! DescribeProducers) asks each partition's leader actor; the coordinator
//! side (AddPartitionsToTxn, EndTxn, ...) lives with the transaction
//! coordinator.

pub mod describe_producers;
pub mod write_txn_markers;
