//! API groups added and removed while clients run, as installing and deleting CRDs does:
//! [`ApiServer::register`] adds a type (discovery lists it from then on), and
//! [`ApiServer::remove_group`] removes every type of a group version.

use super::{lock, ApiServer, StoreError};

impl ApiServer {
    /// Stop serving every resource type of `api_version` (`operator.tigera.io/v1`), as the
    /// API server does when their CRDs are deleted: each object is deleted first (watches see
    /// `DELETED`, one version each: the CRD's `customresourcecleanup` finalizer,
    /// apiextensions-apiserver `pkg/controller/finalizer/crd_finalizer.go`), then the open
    /// watches end and the group leaves discovery (`/apis`, `/apis/<group>/<version>`): its
    /// requests answer `404 NotFound`. Returns the versions of the deletions, in order.
    /// [`ApiServer::register`] serves a type of it again, empty.
    ///
    /// Errors: [`StoreError::UnknownResource`] when no type of `api_version` is served.
    pub fn remove_group(&self, api_version: &str) -> Result<Vec<u64>, StoreError> {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let mut store = lock(&self.inner.store);
        let served: Vec<usize> = (0..store.collections.len())
            .filter(|&i| store.collections[i].served && store.collections[i].rt.group == group && store.collections[i].rt.version == version)
            .collect();
        if served.is_empty() {
            return Err(StoreError::UnknownResource(api_version.to_owned()));
        }
        let mut versions = Vec::new();
        for i in served {
            versions.extend(store.unserve(i)?);
        }
        Ok(versions)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::ResourceType;
    use super::*;

    /// Added at run time: listed by discovery and served; removed: its objects deleted
    /// (`DELETED` to its watch, which then ends), gone from discovery, 404; added again: empty.
    #[tokio::test]
    async fn a_group_added_and_removed_at_run_time() {
        let api = ApiServer::new();
        let nodes = ResourceType::new("v1", "Node", "nodes", false);
        api.register(&nodes);
        let installations = ResourceType::new("operator.tigera.io/v1", "Installation", "installations", false);
        let get = |path: &str| api.handle(&http::Method::GET, &path.parse().unwrap(), &http::HeaderMap::new(), &[]).status().as_u16();
        assert_eq!(get("/apis/operator.tigera.io/v1"), 404);

        api.register(&installations);
        let rv = api.create(&installations, json!({"metadata": {"name": "default"}, "spec": {}})).unwrap();
        assert_eq!((get("/apis/operator.tigera.io/v1"), get("/apis/operator.tigera.io/v1/installations")), (200, 200));
        let watch = api.handle(
            &http::Method::GET,
            &format!("/apis/operator.tigera.io/v1/installations?watch=true&resourceVersion={rv}").parse().unwrap(),
            &http::HeaderMap::new(),
            &[],
        );
        assert_eq!(api.watches(), 1);

        assert_eq!(api.remove_group("operator.tigera.io/v1"), Ok(vec![rv + 1]));
        let body = http_body_util::BodyExt::collect(watch.into_body()).await.unwrap().to_bytes();
        let text = String::from_utf8(body.to_vec()).unwrap();
        let event: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!((event["type"].as_str(), event["object"]["metadata"]["resourceVersion"].as_str()), (Some("DELETED"), Some(&*(rv + 1).to_string())));
        assert_eq!(api.watches(), 0);
        assert_eq!((get("/apis/operator.tigera.io/v1"), get("/apis/operator.tigera.io/v1/installations"), get("/apis/operator.tigera.io")), (404, 404, 404));
        assert_eq!((get("/api/v1/nodes"), get("/api/v1")), (200, 200));
        assert_eq!(api.remove_group("operator.tigera.io/v1"), Err(StoreError::UnknownResource("operator.tigera.io/v1".to_owned())));

        api.register(&installations);
        assert_eq!(get("/apis/operator.tigera.io/v1/installations"), 200);
        let list = api.handle(&http::Method::GET, &"/apis/operator.tigera.io/v1/installations".parse().unwrap(), &http::HeaderMap::new(), &[]);
        let body = http_body_util::BodyExt::collect(list.into_body()).await.unwrap().to_bytes();
        let list: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(list["items"], json!([]));
    }
}
