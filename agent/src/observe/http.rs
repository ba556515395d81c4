//! The HTTP server: `/metrics` (OpenMetrics text), `/healthz`, `/readyz`, and the status
//! document at [`STATUS_PATH`] (JSON, [`StatusDocument`](super::status::StatusDocument)).
//!
//! [`router`] is the service; [`HttpServer`] serves it over hyper's HTTP/1 with the limits of
//! [`HttpLimits`], so that slow, idle or too many clients cannot take the endpoints down
//!: every connection phase has a timeout, the number of connections is capped (a new
//! client evicts the oldest one instead of waiting), and accept errors (out of file descriptors)
//! are logged (rate-limited) and retried after a pause. The per-connection part is in
//! `http/conn.rs`.

mod conn;

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use prometheus_client::registry::Registry;

use super::status::{unix_now, STATUS_PATH};
use super::{Health, StatusBoard};

/// `/healthz` fails when the main loop has not made progress for this long.
pub const LIVENESS_MAX_AGE: Duration = Duration::from_mins(1);

struct Shared {
    registry: Registry,
    health: Arc<Health>,
    status: Arc<StatusBoard>,
}

/// Build the router (exposed for tests).
pub fn router(registry: Registry, health: Arc<Health>, status: Arc<StatusBoard>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route(STATUS_PATH, get(status_document))
        .with_state(Arc::new(Shared { registry, health, status }))
}

async fn metrics(State(s): State<Arc<Shared>>) -> impl IntoResponse {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &s.registry) {
        Ok(()) => (StatusCode::OK, [(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], body),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, [(header::CONTENT_TYPE, "text/plain")], e.to_string()),
    }
}

async fn status_document(State(s): State<Arc<Shared>>) -> impl IntoResponse {
    let doc = s.status.document(&s.health, unix_now());
    match serde_json::to_string(&doc) {
        Ok(body) => (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], body),
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

/// Limits of the HTTP server. The defaults suit Prometheus scrapes and kubelet probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// A client must send a whole request head (request line and headers) within this long of
    /// connecting, or of the first byte of its next request on a kept-alive connection; else
    /// the connection is closed. A client sending one byte at a time does not extend it.
    /// Default 5 s.
    pub header_read_timeout: Duration,
    /// A kept-alive connection with no request in progress is closed this long after its last
    /// response was produced (which also bounds a client that reads that response slowly).
    /// Default 30 s.
    pub idle_timeout: Duration,
    /// Most connections held open at once (0 counts as 1). A client connecting at the cap is
    /// still served: the oldest connection that has never completed a request is closed for it
    /// (slow and silent clients), else the oldest between requests, else the oldest. Default 256.
    pub max_connections: usize,
    /// A handler that has not answered within this long is answered `503 Service Unavailable`
    /// with body `request timed out after <ms> ms`. Default 10 s (Prometheus' scrape timeout).
    pub request_timeout: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(30),
            max_connections: 256,
            request_timeout: Duration::from_secs(10),
        }
    }
}

/// Errors of the HTTP server.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The listening address cannot be bound (in use, no permission, not a local address).
    #[error("bind {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
}

/// Counters of one [`HttpServer`] since it started; read them with [`HttpStats::snapshot`].
#[derive(Debug, Default)]
pub struct HttpStats {
    accepted: AtomicU64,
    open: AtomicU64,
    peak_open: AtomicU64,
    evicted: AtomicU64,
    header_timeouts: AtomicU64,
    idle_timeouts: AtomicU64,
    request_timeouts: AtomicU64,
    accept_errors: AtomicU64,
}

/// A snapshot of [`HttpStats`]. Counts are connections, requests or failed `accept(2)` calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HttpCounts {
    /// Connections accepted.
    pub accepted: u64,
    /// Connections whose task has not ended yet (each may hold its socket).
    pub open: u64,
    /// Most connections open at once; never above [`HttpLimits::max_connections`].
    pub peak_open: u64,
    /// Connections closed to make room for a new one at the cap.
    pub evicted: u64,
    /// Connections closed because a request head did not arrive within the header timeout.
    pub header_timeouts: u64,
    /// Kept-alive connections closed after the idle timeout.
    pub idle_timeouts: u64,
    /// Requests answered 503 after the request timeout.
    pub request_timeouts: u64,
    /// Failed `accept` calls (clients gone before the accept, `EMFILE`, `ENFILE`, ...).
    pub accept_errors: u64,
}

impl HttpStats {
    /// The counters now.
    pub fn snapshot(&self) -> HttpCounts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        HttpCounts {
            accepted: get(&self.accepted),
            open: get(&self.open),
            peak_open: get(&self.peak_open),
            evicted: get(&self.evicted),
            header_timeouts: get(&self.header_timeouts),
            idle_timeouts: get(&self.idle_timeouts),
            request_timeouts: get(&self.request_timeouts),
            accept_errors: get(&self.accept_errors),
        }
    }

    fn set_open(&self, open: usize) {
        let open = u64::try_from(open).unwrap_or(u64::MAX);
        self.open.store(open, Ordering::Relaxed);
        self.peak_open.fetch_max(open, Ordering::Relaxed);
    }
}

/// First pause after a failed `accept`; it doubles on each further failure, up to
/// [`ACCEPT_BACKOFF_MAX`], and starts again after a success.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
/// Longest pause between two `accept` attempts after failures.
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_millis(500);
/// At most one warning per this long for each kind of trouble (accept errors, evictions).
const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Whether a failed `accept(2)` concerns only the client being accepted (it went away before
/// the accept: accept(2), "Linux accept() passes already-pending network errors on the new socket
/// as an error code from accept()", and says to retry at once), rather than the process or the
/// system (`EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM`, ...: pause, then retry).
fn is_per_connection(e: &io::Error) -> bool {
    use nix::errno::Errno;
    matches!(e.kind(), io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionRefused | io::ErrorKind::Interrupted)
        || matches!(
            e.raw_os_error().map(Errno::from_raw),
            Some(
                Errno::ENETDOWN
                    | Errno::EPROTO
                    | Errno::ENOPROTOOPT
                    | Errno::EHOSTDOWN
                    | Errno::ENONET
                    | Errno::EHOSTUNREACH
                    | Errno::EOPNOTSUPP
                    | Errno::ENETUNREACH
            )
        )
}

/// Lets one event through per interval and counts the ones it holds back.
#[derive(Debug)]
struct LogLimiter {
    interval: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl LogLimiter {
    const fn new(interval: Duration) -> Self {
        Self { interval, last: None, suppressed: 0 }
    }

    /// `Some(n)`: log this event now, `n` events were held back since the last one logged.
    /// `None`: stay quiet (the event is counted).
    fn check(&mut self, now: Instant) -> Option<u64> {
        if self.last.is_some_and(|last| now.saturating_duration_since(last) < self.interval) {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// The hardened server of [`router`] (or any router): hyper HTTP/1 per connection, with the
/// [`HttpLimits`].
pub struct HttpServer {
    listener: tokio::net::TcpListener,
    router: Router,
    limits: HttpLimits,
    stats: Arc<HttpStats>,
}

impl HttpServer {
    /// Serve `router` on an already bound `listener`.
    pub fn new(listener: tokio::net::TcpListener, router: Router, limits: HttpLimits) -> Self {
        Self { listener, router, limits, stats: Arc::default() }
    }

    /// Bind `addr` (TCP) for `router`.
    ///
    /// # Errors
    /// [`HttpError::Bind`] when the address cannot be bound.
    pub async fn bind(addr: SocketAddr, router: Router, limits: HttpLimits) -> Result<Self, HttpError> {
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| HttpError::Bind { addr, source })?;
        Ok(Self::new(listener, router, limits))
    }

    /// The address it listens on (with the port the kernel chose for port 0).
    ///
    /// # Errors
    /// When the socket cannot report its address (`getsockname(2)`).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Its counters, readable while it runs.
    pub fn stats(&self) -> Arc<HttpStats> {
        self.stats.clone()
    }

    /// Accept and serve connections until the future is dropped, which closes every connection.
    /// Never ends on its own: accept errors are logged (rate-limited) and retried after a pause.
    pub async fn run(self) -> Infallible {
        let HttpServer { listener, router, limits, stats } = self;
        let cap = limits.max_connections.max(1);
        let mut conns = conn::Connections::new();
        let mut backoff = ACCEPT_BACKOFF_MIN;
        let mut accept_log = LogLimiter::new(LOG_INTERVAL);
        let mut evict_log = LogLimiter::new(LOG_INTERVAL);
        loop {
            let accepted = tokio::select! {
                () = conns.reap_one() => {
                    stats.set_open(conns.len());
                    continue;
                }
                accepted = listener.accept() => accepted,
            };
            let e = match accepted {
                Ok((stream, _peer)) => {
                    backoff = ACCEPT_BACKOFF_MIN;
                    stats.accepted.fetch_add(1, Ordering::Relaxed);
                    // Make room before serving: the cap holds even for the instant of the swap.
                    while conns.len() >= cap {
                        if conns.evict() {
                            stats.evicted.fetch_add(1, Ordering::Relaxed);
                            if let Some(held_back) = evict_log.check(Instant::now()) {
                                tracing::warn!(max_connections = cap, held_back, "HTTP connection cap reached: closing the oldest connection for each new one");
                            }
                        }
                        conns.reap_one().await;
                    }
                    conns.spawn(stream, router.clone(), limits, &stats);
                    stats.set_open(conns.len());
                    continue;
                }
                Err(e) => e,
            };
            stats.accept_errors.fetch_add(1, Ordering::Relaxed);
            if is_per_connection(&e) {
                tracing::debug!(error = %e, "a client went away before its connection was accepted");
                continue;
            }
            // Out of descriptors (or memory). Closing one of our connections would not be a
            // fix: Linux allocates the descriptor before it looks at the backlog, so EMFILE does
            // not mean a client is waiting. Pause; connections that end meanwhile free theirs.
            if let Some(held_back) = accept_log.check(Instant::now()) {
                tracing::warn!(error = %e, backoff_ms = backoff.as_millis(), open = conns.len(), held_back, "accept on the HTTP listener failed; retrying");
            }
            let resume = tokio::time::Instant::now() + backoff;
            loop {
                tokio::select! {
                    () = tokio::time::sleep_until(resume) => break,
                    () = conns.reap_one() => stats.set_open(conns.len()),
                }
            }
            backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_errors_are_classified_by_errno() {
        use nix::errno::Errno;
        let os = |e: Errno| io::Error::from_raw_os_error(e as i32);
        for per_connection in [Errno::ECONNABORTED, Errno::EPROTO, Errno::ENETUNREACH, Errno::EINTR] {
            assert!(is_per_connection(&os(per_connection)), "{per_connection}");
        }
        for resources in [Errno::EMFILE, Errno::ENFILE, Errno::ENOBUFS, Errno::ENOMEM] {
            assert!(!is_per_connection(&os(resources)), "{resources}");
        }
        assert!(!is_per_connection(&io::Error::other("x")));
    }

    #[test]
    fn log_limiter_lets_one_through_per_interval_and_counts_the_rest() {
        let mut l = LogLimiter::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(l.check(t0), Some(0));
        assert_eq!(l.check(t0 + Duration::from_secs(1)), None);
        assert_eq!(l.check(t0 + Duration::from_secs(9)), None);
        assert_eq!(l.check(t0 + Duration::from_secs(10)), Some(2));
        assert_eq!(l.check(t0 + Duration::from_secs(11)), None);
        assert_eq!(l.check(t0 + Duration::from_secs(25)), Some(1));
    }

    #[test]
    fn default_limits_are_the_documented_ones() {
        let l = HttpLimits::default();
        assert_eq!(
            (l.header_read_timeout, l.idle_timeout, l.max_connections, l.request_timeout),
            (Duration::from_secs(5), Duration::from_secs(30), 256, Duration::from_secs(10))
        );
    }
}
