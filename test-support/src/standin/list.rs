//! Lists and their pages (concepts, "Semantics for get and list" and "Retrieving large results
//! sets in chunks"; see the module docs), with continue tokens shaped as the etcd3 storage's.

use base64::Engine as _;
use bytes::Bytes;
use serde_json::json;

use super::labels::LabelSelector;
use super::reply::{framed, invalid, ok, respond, status, status_json, stream_body};
use super::request::{FieldSelector, Query, RequestInfo};
use super::store::{self, Key, ListBody, ResourceType, Store};
use super::Body;

/// A continue token: the list's version and the key after which the next page starts (the
/// shape of the etcd3 storage's token: base64 of `{"v":"meta.k8s.io/v1","rv":..,"start":..}`).
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct Continue {
    v: String,
    rv: u64,
    start: Key,
}

impl Continue {
    pub(super) fn encode(rv: u64, start: &Key) -> String {
        let json = serde_json::to_vec(&Continue { v: "meta.k8s.io/v1".into(), rv, start: start.clone() }).unwrap_or_default();
        base64::engine::general_purpose::URL_SAFE.encode(json)
    }

    pub(super) fn decode(token: &str) -> Option<Continue> {
        let bytes = base64::engine::general_purpose::URL_SAFE.decode(token).ok()?;
        serde_json::from_slice::<Continue>(&bytes).ok().filter(|c| c.v == "meta.k8s.io/v1")
    }
}

/// The list answer (concepts, "Semantics for get and list" and "Retrieving large results sets
/// in chunks"; see the crate docs).
pub(super) fn list(store: &mut Store, i: usize, info: &RequestInfo, query: &Query) -> http::Response<Body> {
    let rv = query.get("resourceVersion");
    let rvm = query.get("resourceVersionMatch");
    let cont = query.get("continue");
    if query.flag("sendInitialEvents") {
        return invalid("sendInitialEvents", "sendInitialEvents is forbidden for list");
    }
    match (rvm, rv, cont) {
        (Some(_), None, _) => return invalid("resourceVersionMatch", "resourceVersionMatch is forbidden unless resourceVersion is provided"),
        (Some(_), _, Some(_)) => return invalid("resourceVersionMatch", "resourceVersionMatch is forbidden when continue is provided"),
        (Some("Exact"), Some("0"), _) => return invalid("resourceVersionMatch", "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\""),
        (Some(m), ..) if m != "Exact" && m != "NotOlderThan" => return invalid("resourceVersionMatch", &format!("Unsupported value: \"{m}\"")),
        (None, Some(v), Some(_)) if v != "0" => return status(400, "BadRequest", "specifying resource version is not allowed when using continue", None),
        _ => {}
    }
    let limit = match query.get("limit").map(str::parse::<usize>) {
        None | Some(Ok(0)) => None,
        Some(Ok(n)) => Some(n),
        Some(Err(_)) => return invalid("limit", "limit must be a number"),
    };
    let selector = match FieldSelector::parse(query.get("fieldSelector").unwrap_or_default()) {
        Ok(s) => s,
        Err(e) => return status(400, "BadRequest", &e, None),
    };
    let labels = match LabelSelector::parse(query.get("labelSelector").unwrap_or_default()) {
        Ok(l) => l,
        Err(e) => return status(400, "BadRequest", &e, None),
    };
    let selector = Selection { fields: selector, labels };
    let rt = store.collections[i].rt.clone();
    let current = store.rv;
    let version = match rv.map(str::parse::<u64>) {
        None => None,
        Some(Ok(v)) => Some(v),
        Some(Err(_)) => return invalid("resourceVersion", "resourceVersion must be a number"),
    };
    // Where the page starts and the version it is read at.
    let (at, after) = if let Some(token) = cont {
        let Some(c) = Continue::decode(token) else { return status(400, "BadRequest", "continue key is not valid", None) };
        if c.rv < store.compacted {
            // The 410 carries a token for an inconsistent continuation at the current version.
            let mut body = status_json(410, "Expired", "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.", None);
            body["metadata"] = json!({"continue": Continue::encode(current, &c.start)});
            return respond(410, &body);
        }
        (c.rv, Some(c.start))
    } else {
        match (version, rvm) {
            // Any: from the watch cache, whole, whatever `limit` says.
            (Some(0), _) => {
                if selector.is_empty() && info.namespace.is_none() {
                    return ok(framed(&store.whole(i)));
                }
                return page(store, i, &rt, current, None, None, &selector, info.namespace.as_deref());
            }
            (Some(v), _) if v > current => {
                let mut body = status_json(504, "Timeout", &format!("Too large resource version: {v}, current: {current}"), None);
                body["details"] = json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1});
                return respond(504, &body);
            }
            // Exact (or the legacy rule: a version with a limit and no match).
            (Some(v), Some("Exact") | None) if rvm.is_some() || limit.is_some() => {
                if v < store.compacted {
                    return respond(410, &status_json(410, "Expired", "The resourceVersion for the provided list is too old.", None));
                }
                (v, None)
            }
            // Most Recent (no version), or Not older than a version: the current state is.
            _ => (current, None),
        }
    };
    if at == current && after.is_none() && limit.is_none() && selector.is_empty() && info.namespace.is_none() {
        return ok(framed(&store.whole(i)));
    }
    page(store, i, &rt, at, after.as_ref(), limit, &selector, info.namespace.as_deref())
}

/// What a list selects: its field selector and its label selector.
pub(super) struct Selection {
    pub fields: FieldSelector,
    pub labels: LabelSelector,
}

impl Selection {
    fn is_empty(&self) -> bool {
        self.fields.is_empty() && self.labels.is_empty()
    }
}

/// One page of collection `i` at version `at`: the objects after `after` that the selector
/// and namespace select, at most `limit`, with a continue token when more remain.
#[expect(clippy::too_many_arguments, reason = "the page's version, start, size and selection, each a request parameter")]
pub(super) fn page(
    store: &Store,
    i: usize,
    rt: &ResourceType,
    at: u64,
    after: Option<&Key>,
    limit: Option<usize>,
    selector: &Selection,
    namespace: Option<&str>,
) -> http::Response<Body> {
    let Some(objects) = store.state_at(i, at) else {
        return respond(410, &status_json(410, "Expired", "The resourceVersion for the provided list is too old.", None));
    };
    let selected: Vec<(&Key, &store::Stored)> = objects
        .iter()
        .filter(|(k, _)| after.is_none_or(|a| *k > a))
        .filter(|(k, s)| namespace.is_none_or(|ns| ns == k.0) && selector.fields.matches(&k.0, &k.1) && selector.labels.matches(&s.body))
        .collect();
    let take = limit.unwrap_or(selected.len()).min(selected.len());
    let more = take < selected.len();
    let token = more.then(|| Continue::encode(at, selected[take - 1].0));
    let remaining = (more && selector.is_empty()).then_some(selected.len() - take);
    let mut frames = vec![Bytes::from(ListBody::header(&rt.api_version(), &rt.kind, &at.to_string(), token.as_deref().map(|t| (t, remaining))))];
    for (n, (_, s)) in selected[..take].iter().enumerate() {
        if n > 0 {
            frames.push(Bytes::from_static(b","));
        }
        frames.push(s.body.clone());
    }
    frames.push(Bytes::from_static(b"]}"));
    ok(stream_body(frames))
}
