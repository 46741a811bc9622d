//! Placeholder; filled in by the foundation issue.
//!
//! `wire`: rendezvous socket and wire protocol (layer 3; see `docs/protocol.md`).

pub mod wire;
