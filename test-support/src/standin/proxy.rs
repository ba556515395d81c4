//! The pod proxy: `GET /api/v1/namespaces/<ns>/pods/<name>[:<port>]/proxy/<path>`, what
//! `kubectl get --raw` and `routewarden status` use to reach a pod's HTTP server through the
//! API server (k8s.io/kubernetes `pkg/registry/core/pod/rest/subresources.go` `ProxyREST`,
//! `pkg/registry/core/pod/strategy.go` `ResourceLocation`).
//!
//! As the API server does: the pod must exist (else `404 NotFound`, `pods "<name>" not
//! found`); the address is the pod's `status.podIP` and the port the one named in the path,
//! else the first container port of its spec, else 80; the request goes out as a plain HTTP
//! GET of `/<path>` with the query, and the pod's answer (status, `Content-Type`, body) comes
//! back as is. A pod that cannot be reached (refused, timed out, no IP, a broken answer) is
//! `503 ServiceUnavailable` with the message `error trying to reach service: <error>`, worded
//! as Go words its dial errors (`dial tcp 10.0.0.11:9695: connect: connection refused`;
//! k8s.io/apimachinery `pkg/util/proxy/transport.go` `RoundTrip`: `NewServiceUnavailable`).
//! RBAC is the API server's: verb `get` on `pods/proxy`, with the name as it is in the path
//! (`<name>:<port>`), checked before anything else.
//!
//! The stand-in is not on the pods' network: a test says from which network namespace each
//! pod is reached ([`ApiServer::reach_pod_from`](super::ApiServer::reach_pod_from)); the
//! connection is made by a thread that entered that namespace (a socket stays in the
//! namespace it was created in), and its result handed back to the server's task.

use std::io::{Read as _, Write as _};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;

use super::reply::{full, ok, status};
use super::request::RequestInfo;
use super::Body;

/// How long a connection to a pod may take (Go's dialer in the API server's proxy transport
/// waits 30 s; tests want a refusal or a timeout sooner).
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the pod may take to answer once connected.
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest answer relayed (a pod's status page is a few KiB).
const MAX_ANSWER: u64 = 16 * 1024 * 1024;

/// A pod proxy request, read from its path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ProxyRequest {
    pub namespace: String,
    pub pod: String,
    /// The port in the path (`<name>:<port>`), if any.
    pub port: Option<String>,
    /// The path at the pod, with its leading `/`.
    pub path: String,
}

impl ProxyRequest {
    /// The proxy request `info` is, if it is one (`pods/proxy` in the core group, in a
    /// namespace, with a name).
    pub fn of(info: &RequestInfo) -> Option<ProxyRequest> {
        if !(info.resource_request && info.api_group.is_empty() && info.resource == "pods" && info.subresource.as_deref() == Some("proxy")) {
            return None;
        }
        let namespace = info.namespace.clone()?;
        let name = info.name.clone()?;
        let prefix = format!("/api/{}/namespaces/{namespace}/pods/{name}/proxy", info.api_version);
        let rest = info.path.strip_prefix(&prefix)?;
        let (pod, port) = match name.split_once(':') {
            Some((pod, port)) => (pod.to_owned(), Some(port.to_owned())),
            None => (name, None),
        };
        Some(ProxyRequest { namespace, pod, port, path: if rest.is_empty() { "/".to_owned() } else { rest.to_owned() } })
    }
}

/// Where to connect for `request`, from the stored pod (JSON): its IP and port.
///
/// Errors: why the pod cannot be reached (no IP, a port that is not a number), for
/// [`unavailable`].
pub(super) fn target(request: &ProxyRequest, pod: &Value) -> Result<SocketAddr, String> {
    let ip = pod["status"]["podIP"].as_str().unwrap_or_default();
    let Ok(ip) = ip.parse::<IpAddr>() else {
        return Err(format!("pod {}/{} has no IP address", request.namespace, request.pod));
    };
    let first_port = || pod["spec"]["containers"].as_array()?.iter().find_map(|c| c["ports"].as_array()?.first()?["containerPort"].as_u64());
    let port = match &request.port {
        Some(p) => p.parse::<u16>().map_err(|_| format!("dial tcp: lookup port {p:?}: invalid port"))?,
        None => first_port().and_then(|p| u16::try_from(p).ok()).unwrap_or(80),
    };
    Ok(SocketAddr::new(ip, port))
}

/// Forward `request` (with `query`, raw) to `addr`, connecting from the named network
/// namespace `netns` (`/run/netns/<name>`; `None`: the caller's), and answer with the pod's
/// answer or a `503`.
pub(super) async fn forward(request: ProxyRequest, query: Option<String>, addr: SocketAddr, netns: Option<String>) -> http::Response<Body> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new().name("standin-proxy".into()).spawn(move || {
        let answer = match &netns {
            Some(name) => enter(name).and_then(|()| exchange(&request, query.as_deref(), addr)),
            None => exchange(&request, query.as_deref(), addr),
        };
        let _ = tx.send(answer);
    });
    if let Err(e) = spawned {
        return unavailable(&format!("no thread to connect with: {e}"));
    }
    match rx.await {
        Ok(Ok(answer)) => answer,
        Ok(Err(message)) => unavailable(&message),
        Err(_) => unavailable("the connecting thread ended without an answer"),
    }
}

/// Enter the named network namespace on this thread.
fn enter(name: &str) -> Result<(), String> {
    let path = format!("/run/netns/{name}");
    let file = std::fs::File::open(&path).map_err(|e| format!("open {path}: {e}"))?;
    nix::sched::setns(std::os::fd::AsFd::as_fd(&file), nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| format!("setns {path}: {e}"))
}

/// One HTTP/1.0 exchange with the pod: the answer, or the error in Go's words.
fn exchange(request: &ProxyRequest, query: Option<&str>, addr: SocketAddr) -> Result<http::Response<Body>, String> {
    let mut s = TcpStream::connect_timeout(&addr, DIAL_TIMEOUT).map_err(|e| dial_error(addr, &e))?;
    s.set_read_timeout(Some(READ_TIMEOUT)).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(READ_TIMEOUT)).map_err(|e| e.to_string())?;
    let target = match query {
        Some(q) if !q.is_empty() => format!("{}?{q}", request.path),
        _ => request.path.clone(),
    };
    write!(s, "GET {target} HTTP/1.0\r\nHost: {addr}\r\nUser-Agent: kube-apiserver-standin\r\n\r\n").map_err(|e| format!("write tcp {addr}: {e}"))?;
    let mut raw = Vec::new();
    s.take(MAX_ANSWER).read_to_end(&mut raw).map_err(|e| read_error(addr, &e))?;
    parse_answer(&raw).ok_or_else(|| format!("malformed HTTP response from {addr}"))
}

/// The pod's HTTP/1.x answer as the stand-in's response.
fn parse_answer(raw: &[u8]) -> Option<http::Response<Body>> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let code: u16 = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let mut r = ok(full(Bytes::copy_from_slice(&raw[end + 4..])));
    *r.status_mut() = http::StatusCode::from_u16(code).ok()?;
    r.headers_mut().remove(http::header::CONTENT_TYPE);
    for line in lines {
        if let Some((name, value)) = line.split_once(':') {
            if name.trim().eq_ignore_ascii_case("content-type") {
                r.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_str(value.trim()).ok()?);
            }
        }
    }
    Some(r)
}

/// `dial tcp <addr>: connect: connection refused`, `dial tcp <addr>: i/o timeout`: Go's
/// `net.OpError` text for the errors a proxied pod gives.
fn dial_error(addr: SocketAddr, e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => format!("dial tcp {addr}: connect: connection refused"),
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => format!("dial tcp {addr}: i/o timeout"),
        std::io::ErrorKind::HostUnreachable => format!("dial tcp {addr}: connect: no route to host"),
        std::io::ErrorKind::NetworkUnreachable => format!("dial tcp {addr}: connect: network is unreachable"),
        _ => format!("dial tcp {addr}: {e}"),
    }
}

fn read_error(addr: SocketAddr, e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => format!("read tcp {addr}: i/o timeout"),
        std::io::ErrorKind::ConnectionReset => format!("read tcp {addr}: read: connection reset by peer"),
        _ => format!("read tcp {addr}: {e}"),
    }
}

/// The API server's `503` for a pod it cannot reach.
pub(super) fn unavailable(error: &str) -> http::Response<Body> {
    status(503, "ServiceUnavailable", &format!("error trying to reach service: {error}"), None)
}

#[cfg(test)]
mod tests;
