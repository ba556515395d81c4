//! The bounds of one load: the limits ([`YamlLimits`]), the budget of the object being built
//! against them ([`Budget`]), and the error that stops a whole input ([`YamlError`]).

/// Limits of one load. The defaults fit every object Calico writes with a wide margin: the
/// largest IPAM block (`/20` or `/116`) has 4,096 allocations, and such a block with one
/// attribute per allocation is about 60,000 nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct YamlLimits {
    /// Deepest nesting of sequences and mappings (the document's root is depth 1).
    pub max_depth: usize,
    /// Longest sequence kept inside one object (a `List`'s `items` are objects of their own
    /// and are not limited).
    pub max_sequence_len: usize,
    /// Most nodes (scalars, sequences, mappings) in one object, alias expansions included.
    pub max_object_nodes: usize,
}

impl Default for YamlLimits {
    fn default() -> Self {
        YamlLimits { max_depth: 64, max_sequence_len: 65_536, max_object_nodes: 250_000 }
    }
}

/// A problem that stops the whole input: a YAML syntax error, nesting past the limit, an
/// unknown alias. `line` is 1-based.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct YamlError {
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// What is wrong (the parser's message, or the limit that was hit).
    pub message: String,
}

/// Budget state of the object being built.
#[derive(Default)]
pub(super) struct Budget {
    /// Nodes of the object so far.
    pub(super) nodes: usize,
    /// The object's first problem (line, reason): it is still closed normally but stops
    /// growing, and is delivered as [`Chunk::Invalid`](super::Chunk::Invalid).
    pub(super) problem: Option<(usize, String)>,
    /// With a problem: frames below this stack depth were open when it happened; only they
    /// are still attached to their parents as they close (so the partial keeps what was
    /// built before the problem, `metadata` and the `spec` fields before the bad one).
    pub(super) open_frames: usize,
}
