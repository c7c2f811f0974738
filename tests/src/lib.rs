//! Integration tests live in tests/it.
