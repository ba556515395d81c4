//! One HTTP connection of the metrics server, and the table of open connections the accept loop
//! evicts from.
//!
//! Each connection is one task: hyper's HTTP/1 state machine over the socket, raced against a
//! watchdog that closes the connection when its current phase outlives its limit:
//!
//! ```text
//!  accept ──► Head ──(request head parsed)──► Busy ──(response produced)──► Idle
//!               ▲                                                             │
//!               └──────────────(first byte of the next request)───────────────┘
//!  Head: header_read_timeout from accept / from that first byte   (slowloris)
//!  Busy: request_timeout, enforced around the handler (503)
//!  Idle: idle_timeout from the response; it also bounds a client that reads the response slowly
//! ```
//!
//! hyper's own `header_read_timeout` is switched off: in hyper 1.12 it is re-armed as soon as a
//! kept-alive connection goes idle (`proto/h1/conn.rs`, `State::idle` sets `notify_read` so
//! `poll_read_head` starts the timer at once), so it would close idle connections after the
//! header timeout and there would be no separate idle timeout.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, Response, StatusCode};
use axum::response::IntoResponse;
use axum::Router;
use futures::future::BoxFuture;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::task::{AbortHandle, JoinError, JoinSet};
use tokio::time::Instant;
use tower::ServiceExt;

use super::{HttpLimits, HttpStats};

/// Largest request head (request line and headers) a connection buffers, in bytes; a larger one
/// is answered 431 and the connection closed. Prometheus and kubelet send well under 1 KiB, and
/// 256 connections × 16 KiB bound what slow clients can make the agent hold.
pub(super) const MAX_BUF_SIZE: usize = 16 * 1024;

/// Where a connection is in its request cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    /// Waiting for (the rest of) a request head: since accept, or since the first byte of the
    /// next request on a kept-alive connection.
    Head,
    /// A handler is working on a request.
    Busy,
    /// Kept alive between requests, since the last response was produced.
    Idle,
}

/// The part of a connection's state the IO wrapper, the request service, the watchdog and the
/// accept loop share.
#[derive(Debug)]
pub(super) struct ConnState {
    /// The phase and when it began.
    phase: Mutex<(Phase, Instant)>,
    /// Requests answered on this connection.
    served: AtomicU64,
    /// Woken when the phase changes to one with a different deadline.
    changed: Notify,
}

impl ConnState {
    /// A connection accepted at `now`: it has `header_read_timeout` to send its first head.
    pub(super) fn new(now: Instant) -> Self {
        Self { phase: Mutex::new((Phase::Head, now)), served: AtomicU64::new(0), changed: Notify::new() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Phase, Instant)> {
        self.phase.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Bytes arrived: on an idle connection they are the start of the next request head.
    fn on_bytes_read(&self) {
        let mut phase = self.lock();
        if phase.0 == Phase::Idle {
            *phase = (Phase::Head, Instant::now());
            drop(phase);
            self.changed.notify_one();
        }
    }

    fn begin_request(&self) {
        *self.lock() = (Phase::Busy, Instant::now());
    }

    fn end_request(&self) {
        *self.lock() = (Phase::Idle, Instant::now());
        self.served.fetch_add(1, Ordering::Relaxed);
        self.changed.notify_one();
    }

    /// When the watchdog closes the connection, and for which phase; `None` while busy (the
    /// request timeout answers for that phase).
    fn deadline(&self, limits: &HttpLimits) -> Option<(Instant, Phase)> {
        let (phase, since) = *self.lock();
        match phase {
            Phase::Head => Some((since + limits.header_read_timeout, phase)),
            Phase::Idle => Some((since + limits.idle_timeout, phase)),
            Phase::Busy => None,
        }
    }

    /// What eviction looks at.
    fn activity(&self) -> Activity {
        Activity { busy: self.lock().0 == Phase::Busy, served: self.served.load(Ordering::Relaxed) }
    }
}

/// A connection as the eviction policy sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Activity {
    /// A handler is working on one of its requests.
    pub busy: bool,
    /// Requests answered on it so far.
    pub served: u64,
}

/// Which connection to close for a new one, from `(accept sequence number, activity)` in accept
/// order (oldest first): the oldest that is not in a request and has never completed one
/// (a slowloris or silent client), else the oldest not in a request (a kept-alive client between
/// requests), else the oldest (its request is cut short).
pub(super) fn choose_victim(conns: impl IntoIterator<Item = (u64, Activity)>) -> Option<u64> {
    let (mut between_requests, mut oldest) = (None, None);
    for (seq, activity) in conns {
        if !activity.busy && activity.served == 0 {
            return Some(seq);
        }
        if !activity.busy {
            between_requests = between_requests.or(Some(seq));
        }
        oldest = oldest.or(Some(seq));
    }
    between_requests.or(oldest)
}

/// The socket, reporting to [`ConnState`] when request bytes arrive.
struct Tracked {
    stream: TcpStream,
    state: Arc<ConnState>,
}

impl AsyncRead for Tracked {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let result = Pin::new(&mut this.stream).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.state.on_bytes_read();
        }
        result
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// The router behind the per-request time limit, marking the connection busy while it works.
#[derive(Clone)]
struct RequestService {
    router: Router,
    state: Arc<ConnState>,
    request_timeout: Duration,
    stats: Arc<HttpStats>,
}

/// Marks the request finished however its future ends (answered, timed out, dropped).
struct RequestGuard(Arc<ConnState>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.end_request();
    }
}

impl hyper::service::Service<Request<Incoming>> for RequestService {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response<Body>, Infallible>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        self.state.begin_request();
        let guard = RequestGuard(self.state.clone());
        let router = self.router.clone();
        let limit = self.request_timeout;
        let stats = self.stats.clone();
        Box::pin(async move {
            let _guard = guard;
            match tokio::time::timeout(limit, router.oneshot(request)).await {
                Ok(answered) => answered,
                Err(_elapsed) => {
                    stats.request_timeouts.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(limit_ms = limit.as_millis(), "HTTP request timed out");
                    Ok((StatusCode::SERVICE_UNAVAILABLE, [(header::CONTENT_TYPE, "text/plain")], format!("request timed out after {} ms\n", limit.as_millis()))
                        .into_response())
                }
            }
        })
    }
}

/// Serve one connection until the client closes it, it errs, or the watchdog closes it.
/// Returns `seq` so the accept loop knows which entry of its table ended.
pub(super) async fn serve(stream: TcpStream, seq: u64, shared: Arc<ConnState>, router: Router, limits: HttpLimits, stats: Arc<HttpStats>) -> u64 {
    let io = TokioIo::new(Tracked { stream, state: shared.clone() });
    let service = RequestService { router, state: shared.clone(), request_timeout: limits.request_timeout, stats: stats.clone() };
    let mut builder = http1::Builder::new();
    builder.header_read_timeout(None).max_buf_size(MAX_BUF_SIZE);
    let mut conn = pin!(builder.serve_connection(io, service));
    loop {
        let deadline = shared.deadline(&limits);
        let woke_at_deadline = tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "HTTP connection ended with an error");
                }
                return seq;
            }
            () = async {
                match deadline {
                    Some((at, _)) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => true,
            () = shared.changed.notified() => false,
        };
        if !woke_at_deadline {
            continue;
        }
        // The phase may have moved on since the sleep began; only its current deadline counts.
        if let Some((at, phase)) = shared.deadline(&limits) {
            if at <= Instant::now() {
                let counter = if phase == Phase::Head { &stats.header_timeouts } else { &stats.idle_timeouts };
                counter.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(?phase, "closing an HTTP connection that outlived its phase's limit");
                return seq;
            }
        }
    }
}

struct Entry {
    abort: AbortHandle,
    state: Arc<ConnState>,
}

/// The open connections: their tasks, and their states in accept order.
pub(super) struct Connections {
    tasks: JoinSet<u64>,
    /// By accept sequence number, so the first entry is the oldest. An evicted connection
    /// leaves this table at once and `tasks` once its task has ended.
    table: BTreeMap<u64, Entry>,
    next_seq: u64,
}

impl Connections {
    pub(super) fn new() -> Self {
        Self { tasks: JoinSet::new(), table: BTreeMap::new(), next_seq: 0 }
    }

    /// Connection tasks that have not been reaped yet: each may still hold its socket.
    pub(super) fn len(&self) -> usize {
        self.tasks.len()
    }

    pub(super) fn spawn(&mut self, stream: TcpStream, router: Router, limits: HttpLimits, stats: &Arc<HttpStats>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let shared = Arc::new(ConnState::new(Instant::now()));
        let abort = self.tasks.spawn(serve(stream, seq, shared.clone(), router, limits, stats.clone()));
        self.table.insert(seq, Entry { abort, state: shared });
    }

    /// Close the connection [`choose_victim`] picks; `false` when there is none.
    pub(super) fn evict(&mut self) -> bool {
        let victim = choose_victim(self.table.iter().map(|(seq, e)| (*seq, e.state.activity())));
        match victim.and_then(|seq| self.table.remove(&seq)) {
            Some(entry) => {
                entry.abort.abort();
                true
            }
            None => false,
        }
    }

    /// Wait until one connection task ends and forget it. Pending forever when there are none
    /// (for `select!`).
    pub(super) async fn reap_one(&mut self) {
        match self.tasks.join_next().await {
            Some(done) => self.forget(done),
            None => std::future::pending().await,
        }
    }

    fn forget(&mut self, done: Result<u64, JoinError>) {
        match done {
            Ok(seq) => {
                self.table.remove(&seq);
            }
            // Evicted: already out of the table.
            Err(e) if e.is_cancelled() => {}
            Err(e) => {
                tracing::error!(error = %e, "an HTTP connection task panicked");
                let id = e.id();
                self.table.retain(|_, entry| entry.abort.id() != id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FRESH: Activity = Activity { busy: false, served: 0 };
    const KEPT_ALIVE: Activity = Activity { busy: false, served: 3 };
    const BUSY: Activity = Activity { busy: true, served: 0 };

    fn pick(conns: &[(u64, Activity)]) -> Option<u64> {
        choose_victim(conns.iter().copied())
    }

    #[test]
    fn eviction_prefers_the_oldest_client_that_never_completed_a_request() {
        assert_eq!(pick(&[(1, KEPT_ALIVE), (2, BUSY), (3, FRESH), (4, FRESH)]), Some(3));
        // No such client: the oldest one between requests, then the oldest.
        assert_eq!(pick(&[(1, BUSY), (2, KEPT_ALIVE), (5, KEPT_ALIVE)]), Some(2));
        assert_eq!(pick(&[(7, BUSY), (9, BUSY)]), Some(7));
        assert_eq!(pick(&[]), None);
    }

    #[tokio::test]
    async fn phases_give_the_deadlines_of_their_limits() {
        let limits = HttpLimits {
            header_read_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(30),
            max_connections: 4,
            request_timeout: Duration::from_secs(10),
        };
        let t0 = Instant::now();
        let s = ConnState::new(t0);
        assert_eq!(s.deadline(&limits), Some((t0 + Duration::from_secs(5), Phase::Head)));
        // Bytes while reading a head do not extend its deadline (a byte every second must not
        // keep a slowloris alive).
        s.on_bytes_read();
        assert_eq!(s.deadline(&limits), Some((t0 + Duration::from_secs(5), Phase::Head)));
        s.begin_request();
        assert_eq!(s.deadline(&limits), None);
        assert_eq!(s.activity(), Activity { busy: true, served: 0 });
        s.end_request();
        let (at, phase) = s.deadline(&limits).unwrap();
        assert_eq!(phase, Phase::Idle);
        assert!(at >= t0 + Duration::from_secs(30));
        assert_eq!(s.activity(), Activity { busy: false, served: 1 });
        s.on_bytes_read();
        let (at, phase) = s.deadline(&limits).unwrap();
        assert_eq!(phase, Phase::Head);
        assert!(at >= t0 + Duration::from_secs(5) && at < t0 + Duration::from_secs(30));
    }
}
