//! Desired-route computation (filled in by the ownership issue).
