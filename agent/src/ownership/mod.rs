//! TODO(stage): filled in by its issue.
