//! The stand-in's answers as bytes: watch events (`BOOKMARK`, `ERROR`), bodies sent in frames
//! of [`FRAME`] bytes, and `Status` objects worded as the API server words them.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::{json, Value};

use super::{Body, ListBody, ResourceType, FRAME, INITIAL_EVENTS_END};

/// The JSON of a `BOOKMARK` event of `rt` at `rv` (the object carries only its type and
/// version), annotated as the end of the initial events when `end`.
pub(super) fn bookmark(rt: &ResourceType, rv: u64, end: bool) -> Bytes {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if end {
        metadata["annotations"] = json!({INITIAL_EVENTS_END: "true"});
    }
    let line = json!({"type": "BOOKMARK", "object": {"kind": rt.kind, "apiVersion": rt.api_version(), "metadata": metadata}}).to_string();
    Bytes::from(line + "\n")
}

pub(super) fn error_event(code: u16, reason: &str, message: &str) -> Bytes {
    let line = json!({"type": "ERROR", "object": status_json(code, reason, message, None)}).to_string();
    Bytes::from(line + "\n")
}

/// `list`'s body in frames of at most [`FRAME`] bytes (shared, not copied).
pub(super) fn framed(list: &ListBody) -> Body {
    let body = &list.body;
    stream_body((0..body.len()).step_by(FRAME).map(|start| body.slice(start..(start + FRAME).min(body.len()))).collect())
}

/// A body of `frames`, each one frame; its size hint is exact.
pub(super) fn stream_body(frames: Vec<Bytes>) -> Body {
    struct Frames {
        frames: std::collections::VecDeque<Bytes>,
        left: u64,
    }
    impl http_body::Body for Frames {
        type Data = Bytes;
        type Error = Infallible;
        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
            let next = self.frames.pop_front();
            if let Some(b) = &next {
                self.left -= b.len() as u64;
            }
            std::task::Poll::Ready(next.map(|b| Ok(http_body::Frame::data(b))))
        }
        fn is_end_stream(&self) -> bool {
            self.frames.is_empty()
        }
        fn size_hint(&self) -> http_body::SizeHint {
            http_body::SizeHint::with_exact(self.left)
        }
    }
    let left = frames.iter().map(|b| b.len() as u64).sum();
    BodyExt::boxed(Frames { frames: frames.into(), left })
}

pub(super) fn full(b: Bytes) -> Body {
    stream_body(vec![b])
}

pub(super) fn ok(body: Body) -> http::Response<Body> {
    let mut r = http::Response::new(body);
    r.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    r
}

pub(super) fn status_json(code: u16, reason: &str, message: &str, details: Option<Value>) -> Value {
    let mut v = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code});
    if let Some(d) = details {
        v["details"] = d;
    }
    v
}

pub(super) fn respond(code: u16, body: &Value) -> http::Response<Body> {
    let mut r = ok(full(Bytes::from(body.to_string())));
    *r.status_mut() = http::StatusCode::from_u16(code).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    r
}

/// A `Status` answer.
pub(super) fn status(code: u16, reason: &str, message: &str, details: Option<Value>) -> http::Response<Body> {
    respond(code, &status_json(code, reason, message, details))
}

pub(super) fn not_found() -> http::Response<Body> {
    status(404, "NotFound", "the server could not find the requested resource", None)
}

/// `422 Invalid` for a list or watch option, as the API server words it.
pub(super) fn invalid(field: &str, message: &str) -> http::Response<Body> {
    let body = status_json(
        422,
        "Invalid",
        &format!("ListOptions.meta.k8s.io \"\" is invalid: {field}: Forbidden: {message}"),
        Some(
            json!({"group": "meta.k8s.io", "kind": "ListOptions", "causes": [{"reason": "FieldValueForbidden", "message": format!("Forbidden: {message}"), "field": field}]}),
        ),
    );
    respond(422, &body)
}
