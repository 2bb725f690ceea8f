//! Helpers for end-to-end tests that run the real `kaas` binary.
