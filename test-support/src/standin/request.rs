//! What a request asks for, as the API server's request-info step reads it
//! (k8s.io/apiserver `pkg/endpoints/request/requestinfo.go`, `RequestInfoFactory.NewRequestInfo`):
//! the verb, the API group and version, the resource, its namespace and name, and the query
//! parameters that decide how a list or watch is served ([`Query`]).

/// The query parameters of one request, percent-decoded (`fieldSelector=metadata.name%3Dx`
/// reads as `metadata.name=x`). A parameter given twice keeps its first value, as Go's
/// `url.Values.Get` does.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Query(Vec<(String, String)>);

impl Query {
    /// Parse a raw query (`a=b&c=d`, without the `?`).
    pub fn parse(raw: Option<&str>) -> Query {
        Query(form_urlencoded::parse(raw.unwrap_or_default().as_bytes()).map(|(k, v)| (k.into_owned(), v.into_owned())).collect())
    }

    /// The value of `name`; an empty value reads as absent (Go's decoder treats `rv=` as unset).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str()).filter(|v| !v.is_empty())
    }

    /// A boolean parameter: `true` or `1` (`watch=1` is what old clients send).
    pub fn flag(&self, name: &str) -> bool {
        matches!(self.get(name), Some("true" | "1"))
    }
}

/// The request's attributes, as the authorizer sees them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestInfo {
    /// A request for a resource (`/api/v1/nodes`, `/apis/<group>/<version>/...`), not for a
    /// non-resource URL (`/version`, `/apis`, `/apis/<group>/<version>`).
    pub resource_request: bool,
    /// `get`, `list`, `watch` for a GET of a resource; the lower-case HTTP method otherwise
    /// (`get` for a GET of a non-resource URL, `post`, ...); `create`, `update`, `patch`,
    /// `delete` for the other methods on resources.
    pub verb: String,
    /// The path, without the query.
    pub path: String,
    /// `""` for the core group.
    pub api_group: String,
    pub api_version: String,
    /// The namespace in the path (`/namespaces/<ns>/...`), if any.
    pub namespace: Option<String>,
    /// The plural resource name (`nodes`).
    pub resource: String,
    pub subresource: Option<String>,
    /// The object's name: from the path, or for a list or watch from a
    /// `metadata.name=<name>` field selector (which is what lets RBAC `resourceNames` apply to
    /// list and watch).
    pub name: Option<String>,
}

impl RequestInfo {
    /// The attributes of `method path?query`.
    pub fn parse(method: &http::Method, path: &str, query: &Query) -> RequestInfo {
        let mut info = RequestInfo {
            resource_request: false,
            verb: method.as_str().to_ascii_lowercase(),
            path: path.to_owned(),
            api_group: String::new(),
            api_version: String::new(),
            namespace: None,
            resource: String::new(),
            subresource: None,
            name: None,
        };
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        // Non-resource URLs: fewer than three parts, or another prefix.
        if parts.len() < 3 || !matches!(parts[0], "api" | "apis") {
            return info;
        }
        let mut rest = &parts[1..];
        if parts[0] == "apis" {
            if rest.len() < 3 {
                return info;
            }
            rest[0].clone_into(&mut info.api_group);
            rest = &rest[1..];
        }
        info.resource_request = true;
        rest[0].clone_into(&mut info.api_version);
        rest = &rest[1..];
        match *method {
            http::Method::POST => "create",
            http::Method::PUT => "update",
            http::Method::PATCH => "patch",
            http::Method::DELETE => "delete",
            _ => "get",
        }
        .clone_into(&mut info.verb);
        if rest[0] == "namespaces" && rest.len() > 1 {
            info.namespace = Some(rest[1].to_owned());
            // `namespaces/<ns>/<resource>...`; `namespaces/<ns>` is the Namespace itself.
            if rest.len() > 2 {
                rest = &rest[2..];
            }
        }
        if rest.len() >= 3 {
            info.subresource = Some(rest[2].to_owned());
        }
        if rest.len() >= 2 {
            info.name = Some(rest[1].to_owned());
        }
        rest[0].clone_into(&mut info.resource);
        if info.name.is_none() && info.verb == "get" {
            if query.flag("watch") { "watch" } else { "list" }.clone_into(&mut info.verb);
            if let Some(sel) = query.get("fieldSelector") {
                info.name = FieldSelector::parse(sel).ok().and_then(|s| s.name.clone());
            }
        }
        if info.name.is_none() && info.verb == "delete" {
            "deletecollection".clone_into(&mut info.verb);
        }
        info
    }

    /// `nodes`, `ipamblocks.crd.projectcalico.org` (kubectl's `resource.group` form).
    pub fn resource_label(&self) -> String {
        if self.api_group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.api_group)
        }
    }
}

/// A field selector of the fields every resource supports (`metadata.name`,
/// `metadata.namespace`), with `=`, `==` and `!=` terms joined by `,` (all must hold).
/// Any other field is refused, as the API server refuses a field a resource does not index
/// (`field label not supported: <field>`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector {
    /// `metadata.name=<name>` (the only term that names one object, so the one that sets the
    /// request's name for RBAC).
    pub name: Option<String>,
    pub not_names: Vec<String>,
    pub namespace: Option<String>,
    pub not_namespaces: Vec<String>,
}

impl FieldSelector {
    /// Parse `sel`.
    ///
    /// Errors: a term without an operator, or a field other than `metadata.name` and
    /// `metadata.namespace` (the message the API server gives).
    pub fn parse(sel: &str) -> Result<FieldSelector, String> {
        let mut out = FieldSelector::default();
        for term in sel.split(',').filter(|t| !t.is_empty()) {
            let (field, value, negated) = if let Some((f, v)) = term.split_once("!=") {
                (f, v, true)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, v, false)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, v, false)
            } else {
                return Err(format!("invalid selector: '{sel}'; can't understand '{term}'"));
            };
            match (field.trim(), negated) {
                ("metadata.name", false) => out.name = Some(value.to_owned()),
                ("metadata.name", true) => out.not_names.push(value.to_owned()),
                ("metadata.namespace", false) => out.namespace = Some(value.to_owned()),
                ("metadata.namespace", true) => out.not_namespaces.push(value.to_owned()),
                (other, _) => return Err(format!("field label not supported: {other}")),
            }
        }
        Ok(out)
    }

    /// Whether the object `namespace`/`name` (`""` for a cluster-scoped one) is selected.
    pub fn matches(&self, namespace: &str, name: &str) -> bool {
        self.name.as_deref().is_none_or(|n| n == name)
            && !self.not_names.iter().any(|n| n == name)
            && self.namespace.as_deref().is_none_or(|n| n == namespace)
            && !self.not_namespaces.iter().any(|n| n == namespace)
    }

    /// No term at all.
    pub fn is_empty(&self) -> bool {
        *self == FieldSelector::default()
    }
}
