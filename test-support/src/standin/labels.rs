//! Label selectors on lists, the equality-based part of k8s.io/apimachinery
//! `pkg/labels/selector.go` (`Parse`): terms joined by `,`, all of which must hold; `k=v` and
//! `k==v` (the label is there with that value), `k!=v` (not there, or another value), `k` (there)
//! and `!k` (not there). Set-based terms (`in`, `notin`) are refused with `400`, which the
//! API server would serve: no client of the stand-in sends them.

use serde_json::Value;

/// One term.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Term {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector; empty selects everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<Term>);

impl LabelSelector {
    /// Parse `sel` (`app.kubernetes.io/name=routewarden,tier!=web`).
    ///
    /// Errors: a set-based term or an empty key, in words close to the API server's
    /// (`unable to parse requirement: ...`).
    pub fn parse(sel: &str) -> Result<LabelSelector, String> {
        let mut terms = Vec::new();
        for term in sel.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            if term.contains('(') || term.contains(" in ") || term.contains(" notin ") {
                return Err(format!("unable to parse requirement: the stand-in serves equality-based label selectors only: {term:?}"));
            }
            let t = if let Some((k, v)) = term.split_once("!=") {
                Term::NotEquals(k.trim().to_owned(), v.trim().to_owned())
            } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                Term::Equals(k.trim().to_owned(), v.trim().to_owned())
            } else if let Some(k) = term.strip_prefix('!') {
                Term::NotExists(k.trim().to_owned())
            } else {
                Term::Exists(term.to_owned())
            };
            let key = match &t {
                Term::Equals(k, _) | Term::NotEquals(k, _) | Term::Exists(k) | Term::NotExists(k) => k,
            };
            if key.is_empty() {
                return Err(format!("unable to parse requirement: key: Invalid value: \"\": name part must be non-empty (in {sel:?})"));
            }
            terms.push(t);
        }
        Ok(LabelSelector(terms))
    }

    /// No term at all.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether the object (JSON bytes) is selected, by its `metadata.labels`.
    pub fn matches(&self, object: &[u8]) -> bool {
        if self.0.is_empty() {
            return true;
        }
        let Ok(v) = serde_json::from_slice::<Value>(object) else { return false };
        let label = |k: &str| v["metadata"]["labels"].get(k).and_then(Value::as_str).map(str::to_owned);
        self.0.iter().all(|t| match t {
            Term::Equals(k, want) => label(k).as_deref() == Some(want.as_str()),
            Term::NotEquals(k, want) => label(k).as_deref() != Some(want.as_str()),
            Term::Exists(k) => label(k).is_some(),
            Term::NotExists(k) => label(k).is_none(),
        })
    }
}
