//! Observability: the Prometheus metrics registry and the HTTP server that exposes it with the
//! liveness and readiness endpoints.

pub mod health;
pub mod http;
pub mod metrics;

pub use health::{Health, WatcherState};
pub use metrics::Metrics;
