//! Tests of the consumer-protocol state machine.
