//! Event writes: the stand-in's only writes, `POST /apis/events.k8s.io/v1/namespaces/<ns>/events`
//! (create) and `PATCH .../events/<name>` (a JSON merge patch, RFC 7386, as kube-runtime's event
//! recorder sends; a strategic merge patch is applied the same way, which is what it does to an
//! Event's scalar fields and `series`). Events are stored as objects of
//! [`ApiServer::EVENTS`] (registered on the first write), so they are listed and watched like
//! any other; [`ApiServer::events`] reads them back for a test.
//!
//! A create is checked as the API server checks an events.k8s.io/v1 Event
//! (k8s.io/kubernetes `pkg/apis/core/validation/events.go`, `ValidateEventCreate`):
//! `eventTime`, `reportingController`, `reportingInstance`, `action` and `reason` are
//! required, the last four at most 128 characters, `note` at most 1 kB, `type` `Normal` or
//! `Warning`, and an Event about a cluster-scoped object lives in `default`; a failure is
//! `422 Invalid` naming the field. [`ApiServer::fail_event_writes`] makes every write fail with
//! a status instead (a server error, say), after RBAC has allowed it.

use std::sync::Mutex;

use bytes::Bytes;
use http_body_util::BodyExt as _;
use serde_json::{json, Value};

use super::reply::{full, ok, respond, status, status_json};
use super::request::RequestInfo;
use super::{lock, ApiServer, Body, LoggedRequest, ResourceType};

/// Largest request body read, in bytes (the API server's limit is 3 MiB; an Event is < 2 kB).
pub const MAX_BODY: usize = 1024 * 1024;

/// The events.k8s.io state of one stand-in: a forced failure of writes.
#[derive(Debug, Default)]
pub(super) struct EventWrites {
    fail: Mutex<Option<u16>>,
}

/// The whole body of a request, at most [`MAX_BODY`] bytes (longer or unreadable: empty, which
/// the writes refuse as undecodable).
pub(super) async fn read_body<B>(body: B) -> Bytes
where
    B: http_body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    http_body_util::Limited::new(body, MAX_BODY).collect().await.map(http_body_util::Collected::to_bytes).unwrap_or_default()
}

impl ApiServer {
    /// The resource type of Events (`events.k8s.io/v1`, namespaced).
    pub const EVENTS: (&'static str, &'static str, &'static str) = ("events.k8s.io/v1", "Event", "events");

    fn events_type() -> ResourceType {
        ResourceType::new(Self::EVENTS.0, Self::EVENTS.1, Self::EVENTS.2, true)
    }

    /// From now on answer every Event write that RBAC allows with status `code` (`None`: serve
    /// them again).
    pub fn fail_event_writes(&self, code: Option<u16>) {
        *lock(&self.inner.event_writes.fail) = code;
    }

    /// The Events stored, in namespace and name order.
    pub fn events(&self) -> Vec<Value> {
        let store = lock(&self.inner.store);
        let rt = Self::events_type();
        let Some(i) = store.find(&rt.group, &rt.version, &rt.plural) else { return Vec::new() };
        store.collections[i].objects.values().filter_map(|s| serde_json::from_slice(&s.body).ok()).collect()
    }

    /// The answer to an Event write (`create` or `patch` of `events.k8s.io` `events`); `None`
    /// for any other request.
    pub(super) fn write_event(&self, info: &RequestInfo, headers: &http::HeaderMap, body: &[u8], entry: &mut LoggedRequest) -> Option<http::Response<Body>> {
        let is_patch = match info.verb.as_str() {
            "create" if info.name.is_none() => false,
            "patch" if info.name.is_some() => true,
            _ => return None,
        };
        if !(info.resource_request && info.api_group == "events.k8s.io" && info.api_version == "v1" && info.resource == "events" && info.subresource.is_none())
        {
            return None;
        }
        entry.bytes = body.len();
        if let Some(code) = *lock(&self.inner.event_writes.fail) {
            return Some(status(code, "InternalError", &format!("the stand-in fails Event writes with {code}"), None));
        }
        let Some(namespace) = info.namespace.clone() else { return Some(status(404, "NotFound", "Events are namespaced", None)) };
        let Ok(object) = serde_json::from_slice::<Value>(body) else {
            return Some(status(400, "BadRequest", "the request body is not a JSON object", None));
        };
        let rt = Self::events_type();
        if !lock(&self.inner.store).collections.iter().any(|c| c.rt == rt) {
            self.register(&rt);
        }
        Some(if is_patch {
            self.patch_event(&rt, &namespace, info.name.as_deref().unwrap_or_default(), headers, &object)
        } else {
            self.create_event(&rt, &namespace, object)
        })
    }

    fn create_event(&self, rt: &ResourceType, namespace: &str, mut object: Value) -> http::Response<Body> {
        match object["metadata"]["namespace"].as_str() {
            None => object["metadata"]["namespace"] = json!(namespace),
            Some(ns) if ns == namespace => {}
            Some(ns) => {
                return status(
                    400,
                    "BadRequest",
                    &format!("the namespace of the provided object ({ns}) does not match the namespace sent on the request ({namespace})"),
                    None,
                )
            }
        }
        let name = object["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        if let Some((field, why)) = invalid_event(&object) {
            return invalid_object(&name, &field, &why);
        }
        let rv = self.resource_version() + 1;
        object["metadata"]["uid"] = json!(format!("00000000-0000-4000-8000-{rv:012}"));
        object["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
        match self.create(rt, object) {
            Ok(_) => {
                let mut r = stored(self, namespace, &name);
                *r.status_mut() = http::StatusCode::CREATED;
                r
            }
            Err(super::StoreError::AlreadyExists(_)) => status(
                409,
                "AlreadyExists",
                &format!("events.events.k8s.io \"{name}\" already exists"),
                Some(json!({"name": name, "group": "events.k8s.io", "kind": "events"})),
            ),
            Err(e) => status(400, "BadRequest", &e.to_string(), None),
        }
    }

    fn patch_event(&self, rt: &ResourceType, namespace: &str, name: &str, headers: &http::HeaderMap, patch: &Value) -> http::Response<Body> {
        let content_type = headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
        if !["application/merge-patch+json", "application/strategic-merge-patch+json"].contains(&content_type) {
            return status(415, "UnsupportedMediaType", &format!("the body of the request was in an unknown format - accepted media types include: application/merge-patch+json, application/strategic-merge-patch+json (got {content_type:?})"), None);
        }
        let Some(mut object) = self.events().into_iter().find(|e| e["metadata"]["namespace"] == namespace && e["metadata"]["name"] == name) else {
            return status(
                404,
                "NotFound",
                &format!("events.events.k8s.io \"{name}\" not found"),
                Some(json!({"name": name, "group": "events.k8s.io", "kind": "events"})),
            );
        };
        let (uid, created) = (object["metadata"]["uid"].clone(), object["metadata"]["creationTimestamp"].clone());
        json_patch::merge(&mut object, patch);
        // What a patch may not change: the object's identity.
        object["metadata"]["name"] = json!(name);
        object["metadata"]["namespace"] = json!(namespace);
        object["metadata"]["uid"] = uid;
        object["metadata"]["creationTimestamp"] = created;
        if let Some((field, why)) = invalid_event(&object) {
            return invalid_object(name, &field, &why);
        }
        match self.update(rt, object) {
            Ok(_) => stored(self, namespace, name),
            Err(e) => status(400, "BadRequest", &e.to_string(), None),
        }
    }
}

/// The stored Event `namespace`/`name` as a `200` answer.
fn stored(api: &ApiServer, namespace: &str, name: &str) -> http::Response<Body> {
    let object = api.events().into_iter().find(|e| e["metadata"]["namespace"] == namespace && e["metadata"]["name"] == name).unwrap_or_default();
    ok(full(Bytes::from(object.to_string())))
}

/// `422 Invalid` for Event `name`'s `field`.
fn invalid_object(name: &str, field: &str, why: &str) -> http::Response<Body> {
    let message = format!("Event.events.k8s.io \"{name}\" is invalid: {field}: {why}");
    let details = json!({"name": name, "group": "events.k8s.io", "kind": "Event", "causes": [{"reason": "FieldValueInvalid", "message": why, "field": field}]});
    respond(422, &status_json(422, "Invalid", &message, Some(details)))
}

/// The first rule of `ValidateEventCreate` (events.k8s.io/v1) that `event` breaks: (field, why).
fn invalid_event(event: &Value) -> Option<(String, String)> {
    let text = |field: &str| event[field].as_str().unwrap_or_default();
    if event["eventTime"].as_str().is_none_or(str::is_empty) {
        return Some(("eventTime".into(), "Required value".into()));
    }
    for field in ["reportingController", "reportingInstance", "action", "reason"] {
        let v = text(field);
        if v.is_empty() {
            return Some((field.into(), "Required value".into()));
        }
        if v.chars().count() > 128 {
            return Some((field.into(), "Too long: may not be more than 128 bytes".into()));
        }
    }
    if text("note").len() > 1024 {
        return Some(("note".into(), "Too long: may not be more than 1024 bytes".into()));
    }
    if !["Normal", "Warning"].contains(&text("type")) {
        return Some(("type".into(), format!("Unsupported value: {:?}: supported values: \"Normal\", \"Warning\"", text("type"))));
    }
    let regarding_ns = event["regarding"]["namespace"].as_str().unwrap_or_default();
    let ns = event["metadata"]["namespace"].as_str().unwrap_or_default();
    if regarding_ns.is_empty() && ns != "default" {
        return Some((
            "metadata.namespace".into(),
            "Invalid value: does not match regarding's namespace: an Event about a cluster-scoped object lives in \"default\"".into(),
        ));
    }
    if !regarding_ns.is_empty() && regarding_ns != ns {
        return Some(("metadata.namespace".into(), "Invalid value: does not match regarding's namespace".into()));
    }
    None
}
