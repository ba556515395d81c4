//! The watch requests of the stand-in ([`ApiServer`]'s `watch`): from a version, or the current
//! state first (unset or `0`, and streaming lists), with bookmarks and the refusals the API
//! server makes (module docs of `standin`).

use super::*;

impl ApiServer {
    pub(super) fn watch(&self, store: &mut Store, i: usize, info: &RequestInfo, query: &Query) -> http::Response<Body> {
        let rv = query.get("resourceVersion");
        let rvm = query.get("resourceVersionMatch");
        let initial = query.flag("sendInitialEvents");
        let bookmarks = query.flag("allowWatchBookmarks");
        if initial && self.inner.no_watch_list.load(Ordering::Relaxed) {
            return invalid("sendInitialEvents", "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled");
        }
        if initial {
            if rvm != Some("NotOlderThan") {
                return invalid("resourceVersionMatch", "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan");
            }
            if !bookmarks {
                return invalid("allowWatchBookmarks", "allowWatchBookmarks must be true if sendInitialEvents = true");
            }
        } else if rvm.is_some() {
            return invalid("resourceVersionMatch", "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided");
        }
        let selector = match FieldSelector::parse(query.get("fieldSelector").unwrap_or_default()) {
            Ok(s) => s,
            Err(e) => return status(400, "BadRequest", &e, None),
        };
        if query.get("labelSelector").is_some() {
            return status(400, "BadRequest", "the stand-in serves no label selectors", None);
        }
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let sent = self.inner.sent.clone();
        let id = store.next_watch;
        store.next_watch += 1;
        let watcher = Watcher { id, collection: i, namespace: info.namespace.clone(), selector, bookmarks, tx, sent };
        let rt = store.collections[i].rt.clone();
        let start = match rv.map(str::parse::<u64>) {
            None | Some(Ok(0)) => None,
            Some(Ok(v)) => Some(v),
            Some(Err(_)) => return invalid("resourceVersion", "resourceVersion must be a number"),
        };
        let mut frames = Vec::new();
        let mut open = true;
        if let (Some(v), false) = (start, initial) {
            if v > store.rv {
                frames.push(error_event(504, "Timeout", &format!("Too large resource version: {v}, current: {}", store.rv)));
                open = false;
            } else if let Some(changes) = store.changes_since(i, v, &watcher) {
                frames = changes;
            } else {
                frames.push(error_event(410, "Expired", &format!("too old resource version: {v} ({})", store.compacted)));
                open = false;
            }
        } else {
            // Unset or 0 (concepts, "Semantics for watch"): the current state as ADDED events;
            // sendInitialEvents with a version is NotOlderThan it: the current state too.
            for (key, s) in &store.collections[i].objects {
                if watcher.selects(key) {
                    frames.extend([EventType::Added.prefix(), s.body.clone(), Bytes::from_static(b"}\n")]);
                }
            }
            if initial {
                frames.push(bookmark(&rt, store.rv, true));
            }
        }
        watcher.send(&frames);
        if open {
            store.watchers.push(watcher);
            // Ended by a task on the caller's runtime (none: the watch has no timeout).
            let runtime = tokio::runtime::Handle::try_current().ok();
            if let (Some(timeout), Some(runtime)) = (query.get("timeoutSeconds").and_then(|t| t.parse::<u64>().ok()), runtime) {
                let api = self.clone();
                runtime.spawn(async move {
                    tokio::time::sleep(Duration::from_secs(timeout)).await;
                    lock(&api.inner.store).watchers.retain(|w| w.id != id);
                });
            }
        }
        let handed_out = self.inner.handed_out.clone();
        let handed_out_bytes = self.inner.handed_out_bytes.clone();
        let body = rx.map(move |b| {
            handed_out.fetch_add(1, Ordering::Relaxed);
            handed_out_bytes.fetch_add(b.len() as u64, Ordering::Relaxed);
            Ok::<_, Infallible>(http_body::Frame::data(b))
        });
        let mut r = ok(BodyExt::boxed(http_body_util::StreamBody::new(body)));
        r.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
        r
    }
}
