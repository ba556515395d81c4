//! The HTTP server: `/metrics` (OpenMetrics text), `/healthz`, `/readyz`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use prometheus_client::registry::Registry;

use super::Health;

/// `/healthz` fails when the main loop has not made progress for this long.
pub const LIVENESS_MAX_AGE: Duration = Duration::from_mins(1);

struct Shared {
    registry: Registry,
    health: Arc<Health>,
}

/// Build the router (exposed for tests).
pub fn router(registry: Registry, health: Arc<Health>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(Arc::new(Shared { registry, health }))
}

async fn metrics(State(s): State<Arc<Shared>>) -> impl IntoResponse {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &s.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
            body,
        ),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, [(header::CONTENT_TYPE, "text/plain")], e.to_string()),
    }
}

async fn healthz(State(s): State<Arc<Shared>>) -> impl IntoResponse {
    if s.health.live(LIVENESS_MAX_AGE) {
        (StatusCode::OK, "ok\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "main loop stalled\n")
    }
}

async fn readyz(State(s): State<Arc<Shared>>) -> impl IntoResponse {
    let (ready, body) = s.health.ready();
    (if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }, body)
}

/// Bind `addr` and serve until the task is dropped.
///
/// # Errors
/// Fails when the address cannot be bound (in use, no permission).
pub async fn serve(addr: SocketAddr, registry: Registry, health: Arc<Health>) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving /metrics, /healthz, /readyz");
    axum::serve(listener, router(registry, health)).await
}
