//! Observability: the Prometheus metrics registry and the HTTP server that exposes it with the
//! liveness and readiness endpoints, the agent's status document, and the Kubernetes Events
//! recorded on this node's Node.

pub mod health;
pub mod http;
pub mod metrics;
pub mod node_events;
pub mod status;

pub use health::{Health, WatcherState};
pub use metrics::Metrics;
pub use status::StatusBoard;
