//! Placeholder; filled in by the foundation issue.
