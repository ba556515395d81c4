//! What `routewarden status` prints, from what it gathered: one [`NodeStatus`] per agent pod
//! (its [`StatusDocument`], or why it gave none) and per node without one, the table
//! ([`table`]) and the one-line verdict ([`verdict`]). Pure: no I/O, no clock (ages are the
//! agent's own: its document's `generatedAt` minus an episode's `lastSeen`).

use std::fmt::Write as _;

use routewarden::observe::status::{Episode, StatusDocument};
use routewarden::text::escape;
use serde::Serialize;

/// `apiVersion` of the cluster status `-o json|yaml` prints.
pub const API_VERSION: &str = "routewarden.io/v1";
/// `kind` of the cluster status.
pub const KIND: &str = "ClusterStatus";

/// At most this many nodes are named in the verdict per kind of trouble, then `+N more`.
const VERDICT_NAMES: usize = 3;

/// What was heard from one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum Heard {
    /// The agent answered with its document.
    Answered {
        /// The agent's pod.
        pod: String,
        /// Its document.
        status: Box<StatusDocument>,
    },
    /// The agent's pod is there, but no document came back.
    NoAnswer {
        /// The agent's pod.
        pod: String,
        /// Why: the API server's message (`error trying to reach service: ...`), a timeout,
        /// a document that did not parse.
        reason: String,
    },
    /// The node has no agent pod.
    NoAgent,
}

/// One row: a node and what its agent said.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    /// The node (the pod's `spec.nodeName`, or a Node's name).
    pub node: String,
    /// What the agent said.
    #[serde(flatten)]
    pub agent: Heard,
}

/// The whole cluster, as `-o json|yaml` prints it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// [`API_VERSION`].
    pub api_version: &'static str,
    /// [`KIND`].
    pub kind: &'static str,
    /// The one-line verdict ([`verdict`]).
    pub verdict: String,
    /// Nothing to look at: every node answers, is ready, has no error finding and no
    /// conflict or flap in the last hour.
    pub ok: bool,
    /// Why the Nodes could not be listed (so nodes without an agent are not shown); `None`
    /// when they were.
    pub nodes_unlisted: Option<String>,
    /// One row per node, sorted by node then pod.
    pub nodes: Vec<NodeStatus>,
}

impl ClusterStatus {
    /// The status of `nodes` (sorted here), with its verdict.
    pub fn new(mut nodes: Vec<NodeStatus>, nodes_unlisted: Option<String>) -> ClusterStatus {
        nodes.sort_by(|a, b| (&a.node, pod(&a.agent)).cmp(&(&b.node, pod(&b.agent))));
        let (ok, verdict) = verdict(&nodes);
        ClusterStatus { api_version: API_VERSION, kind: KIND, verdict, ok, nodes_unlisted, nodes }
    }
}

fn pod(a: &Heard) -> &str {
    match a {
        Heard::Answered { pod, .. } | Heard::NoAnswer { pod, .. } => pod,
        Heard::NoAgent => "",
    }
}

/// The episode a reader should see first: the newest conflict, else the newest flap (the
/// document lists episodes newest last seen first).
pub fn last_fight(doc: &StatusDocument) -> Option<&Episode> {
    doc.episodes.iter().find(|e| e.kind == "conflict").or_else(|| doc.episodes.first())
}

/// `bird[77] vs routewarden[4242]`: the first two writers of an episode (`+N` more), or the
/// one writer of a flap.
pub fn writers(e: &Episode) -> String {
    let mut out = e.writers.iter().take(2).map(|w| escape(&w.label()).into_owned()).collect::<Vec<_>>().join(" vs ");
    if e.writers.len() > 2 {
        let _ = write!(out, " (+{})", e.writers.len() - 2);
    }
    if out.is_empty() {
        out.push_str("unknown writers");
    }
    out
}

/// An age in seconds as `42s`, `17m`, `3h` (whole units, rounded down; seconds below two
/// minutes, minutes below two hours).
pub fn age(seconds: u64) -> String {
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s => format!("{}h", s / 3600),
    }
}

/// Sum of the event counts of the document's episodes of `kind`.
fn events(doc: &StatusDocument, kind: &str) -> u64 {
    doc.episodes.iter().filter(|e| e.kind == kind).map(|e| e.count).sum()
}

/// The cells of an answered row, after NODE.
fn cells(doc: &StatusDocument) -> Vec<String> {
    let ready = if doc.readiness.ready { "yes" } else { "no" };
    let calico = doc
        .calico
        .as_ref()
        .map_or_else(|| "-".to_owned(), |c| if c.source == "assumed" { format!("{} (assumed)", escape(&c.line)) } else { escape(&c.line).into_owned() });
    let programs: Vec<&str> = doc.classes.iter().filter(|c| c.programmed_here).map(|c| c.class.as_str()).collect();
    let mut codes: Vec<&str> = Vec::new();
    for f in &doc.findings {
        if !codes.contains(&f.code.as_str()) {
            codes.push(&f.code);
        }
    }
    let mut findings = if codes.is_empty() { "-".to_owned() } else { escape(&codes.join(",")).into_owned() };
    if doc.findings_omitted > 0 {
        let _ = write!(findings, " (+{})", doc.findings_omitted);
    }
    let fight = last_fight(doc)
        .map_or_else(|| "-".to_owned(), |e| format!("{} {} {} ago", writers(e), escape(&e.prefix), age(doc.generated_at.saturating_sub(e.last_seen))));
    vec![
        ready.to_owned(),
        escape(&doc.mode).into_owned(),
        escape(&doc.role).into_owned(),
        calico,
        if programs.is_empty() { "-".to_owned() } else { escape(&programs.join(",")).into_owned() },
        findings,
        events(doc, "conflict").to_string(),
        events(doc, "flap").to_string(),
        fight,
    ]
}

/// The column heads.
pub const HEADER: [&str; 10] = ["NODE", "READY", "MODE", "ROLE", "CALICO", "PROGRAMS", "FINDINGS", "CONFLICTS(1h)", "FLAPS(1h)", "LAST-FIGHT"];

/// The table: a header, one row per node (columns three spaces apart, as kubectl prints them;
/// a node whose agent gave no document has its reason after READY), then the verdict line.
pub fn table(status: &ClusterStatus) -> String {
    let rows: Vec<Vec<String>> = status
        .nodes
        .iter()
        .map(|n| {
            let node = escape(&n.node).into_owned();
            match &n.agent {
                Heard::Answered { status, .. } => std::iter::once(node).chain(cells(status)).collect(),
                Heard::NoAnswer { reason, .. } => vec![node, "?".to_owned(), format!("no answer: {}", routewarden::text::one_line(reason))],
                Heard::NoAgent => vec![node, "-".to_owned(), "no agent pod on this node".to_owned()],
            }
        })
        .collect();
    // Widths from the full rows only: a reason runs on without widening the columns.
    let mut widths: Vec<usize> = HEADER.iter().map(|h| h.len()).collect();
    for row in rows.iter().filter(|r| r.len() == HEADER.len()) {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for row in &rows {
        widths[0] = widths[0].max(row[0].chars().count());
        widths[1] = widths[1].max(row[1].chars().count());
    }
    let mut out = String::new();
    let header: Vec<String> = HEADER.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}   ", w = widths[i]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out.push_str(&status.verdict);
    out.push('\n');
    out
}

/// Names, at most [`VERDICT_NAMES`] of them, then `+N more`.
fn names(list: &[String]) -> String {
    let mut out = list.iter().take(VERDICT_NAMES).cloned().collect::<Vec<_>>().join(", ");
    if list.len() > VERDICT_NAMES {
        let _ = write!(out, " +{} more", list.len() - VERDICT_NAMES);
    }
    out
}

/// Whether the cluster is fine, and the one line that says so (`ok: 3 nodes, no fights`) or
/// what to look at, most urgent first: how many nodes answer (those that do not, those with no
/// agent), then per answering node its fight (`node-a: bird[77] vs routewarden[4242] fight
/// over 10.244.1.0/26`) or flap, unreadiness and error findings.
pub fn verdict(nodes: &[NodeStatus]) -> (bool, String) {
    let total = nodes.len();
    let mut silent = Vec::new();
    let mut absent = Vec::new();
    let mut problems: Vec<String> = Vec::new();
    for n in nodes {
        let node = escape(&n.node).into_owned();
        match &n.agent {
            Heard::NoAgent => absent.push(node),
            Heard::NoAnswer { .. } => silent.push(node),
            Heard::Answered { status, .. } => {
                if let Some(e) = last_fight(status) {
                    let what = if e.kind == "conflict" { "fight over" } else { "flap on" };
                    problems.push(format!("{node}: {} {what} {}", writers(e), escape(&e.prefix)));
                }
                if !status.readiness.ready {
                    problems.push(format!("{node}: not ready"));
                }
                for f in status.findings.iter().filter(|f| f.severity == "error") {
                    let class = f.class.as_deref().map(|c| format!(" {}", escape(c))).unwrap_or_default();
                    problems.push(format!("{node}: {}{class}", escape(&f.code)));
                }
            }
        }
    }
    if total == 0 {
        return (false, "no agent pods and no nodes found".to_owned());
    }
    let answering = total - silent.len() - absent.len();
    if silent.is_empty() && absent.is_empty() && problems.is_empty() {
        return (true, format!("ok: {total} node{}, no fights", if total == 1 { "" } else { "s" }));
    }
    let mut parts = Vec::new();
    if answering < total {
        let mut why = Vec::new();
        if !silent.is_empty() {
            why.push(format!("no answer: {}", names(&silent)));
        }
        if !absent.is_empty() {
            why.push(format!("no agent: {}", names(&absent)));
        }
        parts.push(format!("{answering} of {total} nodes answer ({})", why.join("; ")));
    }
    let shown = problems.len().min(2 * VERDICT_NAMES);
    parts.extend(problems[..shown].iter().cloned());
    if problems.len() > shown {
        parts.push(format!("+{} more", problems.len() - shown));
    }
    (false, parts.join("; "))
}
