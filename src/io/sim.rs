//! Simulated file system for crash and fault tests (in progress).
