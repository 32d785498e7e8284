//! Helpers for topdown integration tests.
