//! Observability: the Prometheus metrics registry and the HTTP server that exposes it with the
//! liveness and readiness endpoints and the agent's status document.

pub mod health;
pub mod http;
pub mod metrics;
pub mod status;

pub use health::{Health, WatcherState};
pub use metrics::Metrics;
pub use status::StatusBoard;
