//! Test vectors.
