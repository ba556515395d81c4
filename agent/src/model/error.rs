//! Why an object is left out of the [`Cluster`](super::Cluster): the field problem
//! ([`FieldProblem`]), the object's error with its kind and name ([`ModelError`], with stable
//! codes for metrics), and the rejection that carries it with the CIDRs the object mentions
//! ([`Rejected`]).

use ipnet::IpNet;

use super::kind::Kind;

/// What is wrong with one field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FieldProblem {
    #[error("missing")]
    Missing,
    #[error("empty")]
    Empty,
    #[error("expected {expected}, found {found}")]
    WrongType { expected: &'static str, found: &'static str },
    #[error("invalid CIDR {0:?}")]
    InvalidCidr(String),
    #[error("invalid IP address {0:?}")]
    InvalidIp(String),
    #[error("invalid value {value:?} (expected {expected})")]
    InvalidValue { value: String, expected: &'static str },
    #[error("{value} is out of range {min}..={max}")]
    OutOfRange { value: String, min: u64, max: u64 },
    #[error("{0}")]
    Inconsistent(String),
}

/// An object that could not be read. The object is left out of the [`Cluster`](super::Cluster); the other
/// objects are unaffected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// A field has a wrong type, a bad CIDR or address, or an impossible value.
    #[error("{kind} {name:?}: {field}: {problem}")]
    Field { kind: Kind, name: String, field: String, problem: FieldProblem },
    /// An object of a known kind without `metadata.name`.
    #[error("{kind} without metadata.name")]
    MissingName { kind: Kind },
    /// A document that is not a mapping, or has no `kind`.
    #[error("not a Kubernetes object: {reason}")]
    NotAnObject { reason: String },
    /// A known kind under an API group routewarden does not read (for example an IPPool in
    /// `apps/v1`).
    #[error("{kind} {name:?}: unsupported apiVersion {api_version:?} (expected {})", kind.api_versions())]
    UnsupportedApiVersion { kind: Kind, name: String, api_version: String },
    /// An object of a kind and name defined more than once. Every definition is refused (one
    /// error each): none can be known to be the right one, so none decides a route, and what
    /// each names stays frozen until one definition is left.
    #[error("{kind} {name:?}: defined more than once; every definition is refused until one is left")]
    Duplicate { kind: Kind, name: String },
    /// An object the YAML loader stopped building: too large, a duplicate key, an integer out
    /// of range ([`Chunk::Invalid`](super::yaml::Chunk::Invalid)). Kind and name are those seen before the problem.
    #[error("{}line {line}: {reason}", object_label(*kind, name.as_deref()))]
    Unreadable { kind: Option<Kind>, name: Option<String>, line: usize, reason: String },
}

fn object_label(kind: Option<Kind>, name: Option<&str>) -> String {
    match (kind, name) {
        (Some(k), Some(n)) => format!("{k} {n:?}: "),
        (Some(k), None) => format!("{k} without a name: "),
        _ => String::new(),
    }
}

impl ModelError {
    /// Stable label for metrics: `field`, `missing-name`, `not-an-object`, `api-version`,
    /// `duplicate`, `unreadable`.
    pub fn code(&self) -> &'static str {
        match self {
            ModelError::Field { .. } => "field",
            ModelError::MissingName { .. } => "missing-name",
            ModelError::NotAnObject { .. } => "not-an-object",
            ModelError::UnsupportedApiVersion { .. } => "api-version",
            ModelError::Duplicate { .. } => "duplicate",
            ModelError::Unreadable { .. } => "unreadable",
        }
    }

    /// The object's kind and name, when known.
    pub fn object(&self) -> Option<(Kind, &str)> {
        match self {
            ModelError::Field { kind, name, .. }
            | ModelError::UnsupportedApiVersion { kind, name, .. }
            | ModelError::Duplicate { kind, name }
            | ModelError::Unreadable { kind: Some(kind), name: Some(name), .. } => Some((*kind, name)),
            ModelError::MissingName { .. } | ModelError::NotAnObject { .. } | ModelError::Unreadable { .. } => None,
        }
    }
}

/// An object left out of the [`Cluster`](super::Cluster): why, and the CIDRs and addresses it
/// mentions ([`mentioned_cidrs`](super::mentioned_cidrs)). While no good version of it is in
/// force, nothing inside those prefixes may be deleted or claimed (it could be the object that
/// wants them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejected {
    pub error: ModelError,
    /// Sorted and deduplicated; addresses as host prefixes (`/32`, `/128`).
    pub cidrs: Vec<IpNet>,
    /// A last good version of the object is in the cluster in its place (the datastore sets
    /// this when it substitutes one).
    pub last_good: bool,
}

impl Rejected {
    /// A rejection with no last good version.
    pub fn new(error: ModelError, cidrs: Vec<IpNet>) -> Rejected {
        Rejected { error, cidrs, last_good: false }
    }
}
