//! `routewarden status` (and `kubectl routewarden status`): every agent's status document
//! ([`routewarden::observe::status::StatusDocument`]) in one table, read through the API
//! server, so it works from anywhere a kubeconfig works and needs no route to the nodes.
//!
//! One poll: list the agent pods (`--namespace`, `--selector`: the DaemonSet's labels in
//! `deploy/`), list the Nodes (to show those without an agent; optional, see
//! [`NODES_UNLISTED_NOTE`]), then GET each agent's [`STATUS_PATH`] through the pod proxy
//! (`/api/v1/namespaces/<ns>/pods/<pod>:<port>/proxy/status/v1`, the container port named
//! `metrics`), all at once, each within `--timeout`. An agent that does not answer is a row
//! that says why, never a failed command. The RBAC this needs is the ClusterRole
//! `routewarden-status-reader` in `deploy/clusterrole-status.yaml`.

mod render;

#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::Client;
use routewarden::datastore::kubernetes::{describe_kube_error, user_agent};
use routewarden::observe::status::{StatusDocument, API_VERSION, KIND, STATUS_PATH};

pub use render::{table, ClusterStatus, Heard, NodeStatus};

use super::{runtime, Output};

/// The note printed (stderr) and kept in the JSON when the Nodes cannot be listed: the table
/// then shows only the nodes that have an agent pod.
pub const NODES_UNLISTED_NOTE: &str = "nodes without an agent are not shown";

/// The container port the agent serves its status on (the DaemonSet's `metrics` port).
pub const PORT_NAME: &str = "metrics";

/// Agents asked at once.
const CONCURRENCY: usize = 32;

/// How long the lists of pods and Nodes may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(30);

/// `routewarden status`.
#[derive(Args, Clone, Debug)]
#[command(after_help = "Exit status: 0 whatever the agents say (a row says which did not answer and why), unless \
--exit-code is given: then 1 when the verdict is not `ok`. 2 when the API server cannot be reached or refuses to list \
the agent pods. The RBAC needed: deploy/clusterrole-status.yaml (get/list pods, get pods/proxy in the agents' \
namespace; list nodes).")]
pub struct StatusArgs {
    /// A kubeconfig file. Default: `KUBECONFIG`, else `~/.kube/config`, else the in-cluster
    /// service account.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long)]
    pub context: Option<String>,
    /// The namespace of the agent pods.
    #[arg(short = 'n', long, default_value = "routewarden")]
    pub namespace: String,
    /// The label selector of the agent pods (the DaemonSet's pod labels).
    #[arg(short = 'l', long, default_value = "app.kubernetes.io/name=routewarden")]
    pub selector: String,
    /// Only these nodes (repeat the flag for more).
    #[arg(long)]
    pub node: Vec<String>,
    /// Output format: the table and verdict, or the documents with the verdict as JSON or YAML.
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    pub output: Output,
    /// Seconds each agent has to answer.
    #[arg(long, default_value_t = 5)]
    pub timeout: u64,
    /// Poll again every `--interval` seconds until interrupted (each poll printed whole).
    #[arg(short = 'w', long)]
    pub watch: bool,
    /// Seconds between polls with `--watch`.
    #[arg(long, default_value_t = 5)]
    pub interval: u64,
    /// With `--watch`: stop after this many polls.
    #[arg(long)]
    pub count: Option<u64>,
    /// Exit 1 when the verdict is not `ok` (the last poll's, with `--watch`).
    #[arg(long)]
    pub exit_code: bool,
}

/// Print the cluster's status once, or every `--interval` with `--watch`.
///
/// # Errors
/// No client configuration (kubeconfig), or the API server cannot list the agent pods (without
/// `--watch`; with it, the failure is printed and the next poll tries again).
pub fn status(args: &StatusArgs) -> Result<ExitCode> {
    runtime()?.block_on(async {
        let clients = clients(args).await?;
        let mut ok;
        let mut polls = 0u64;
        loop {
            polls += 1;
            match poll(&clients, args).await {
                Ok(s) => {
                    ok = s.ok;
                    if let Some(why) = &s.nodes_unlisted {
                        eprintln!("note: {NODES_UNLISTED_NOTE}: {}", routewarden::text::one_line(why));
                    }
                    print!("{}", render_as(&s, args.output, args.watch && polls > 1)?);
                }
                Err(e) if args.watch => {
                    ok = false;
                    eprintln!("routewarden: error: {e:#}");
                }
                Err(e) => return Err(e),
            }
            if !args.watch || args.count.is_some_and(|c| polls >= c) {
                break;
            }
            tokio::time::sleep(Duration::from_secs(args.interval.max(1))).await;
        }
        Ok(if args.exit_code && !ok { ExitCode::from(1) } else { ExitCode::SUCCESS })
    })
}

/// One poll's output; `again`: not the first of a watch (a blank line before a table, `---`
/// before a YAML document).
fn render_as(s: &ClusterStatus, output: Output, again: bool) -> Result<String> {
    Ok(match output {
        Output::Table => format!("{}{}", if again { "\n" } else { "" }, table(s)),
        Output::Json => serde_json::to_string_pretty(s)? + "\n",
        Output::Yaml => format!("{}{}", if again { "---\n" } else { "" }, serde_yaml_ng::to_string(s)?),
    })
}

/// The two clients of the command, of one configuration.
pub struct Clients {
    /// Lists: kube's default retries of 429, 503 and 504 (an API server under load).
    pub api: Client,
    /// The pod proxy, without retries: a 503 there is the API server saying the agent cannot
    /// be reached, which retrying only turns into a timeout.
    pub proxy: Client,
}

/// The clients: `--kubeconfig` (with `--context`), else kube's inference; `User-Agent:
/// routewarden/<version>` as the agent's.
async fn clients(args: &StatusArgs) -> Result<Clients> {
    let options = kube::config::KubeConfigOptions { context: args.context.clone(), ..Default::default() };
    let mut config = match &args.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path).with_context(|| format!("kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &options).await.with_context(|| format!("kubeconfig {}", path.display()))?
        }
        None if args.context.is_some() => kube::Config::from_kubeconfig(&options).await.context("kubeconfig")?,
        None => kube::Config::infer().await.context("no Kubernetes client configuration (KUBECONFIG, ~/.kube/config or the in-cluster service account)")?,
    };
    config.headers.push(user_agent());
    let api = Client::try_from(config.clone()).context("Kubernetes client")?;
    config.default_retry = false;
    let proxy = Client::try_from(config).context("Kubernetes client")?;
    Ok(Clients { api, proxy })
}

/// One poll of every agent (see the module docs).
///
/// # Errors
/// The agent pods cannot be listed.
pub async fn poll(clients: &Clients, args: &StatusArgs) -> Result<ClusterStatus> {
    let client = &clients.api;
    let wanted = |node: &str| args.node.is_empty() || args.node.iter().any(|n| n == node);
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), &args.namespace);
    let pods = tokio::time::timeout(LIST_TIMEOUT, pods_api.list(&ListParams::default().labels(&args.selector)))
        .await
        .map_err(|_| anyhow::anyhow!("list pods in namespace {} ({}): no answer within {LIST_TIMEOUT:?}", args.namespace, args.selector))?
        .map_err(|e| anyhow::anyhow!("list pods in namespace {} ({}): {}", args.namespace, args.selector, describe_kube_error(&e)))?;
    let nodes_api: Api<Node> = Api::all(client.clone());
    let (node_names, nodes_unlisted) = match tokio::time::timeout(LIST_TIMEOUT, nodes_api.list(&ListParams::default())).await {
        Ok(Ok(list)) => (list.items.into_iter().filter_map(|n| n.metadata.name).collect::<Vec<_>>(), None),
        Ok(Err(e)) => (Vec::new(), Some(format!("list nodes: {}", describe_kube_error(&e)))),
        Err(_) => (Vec::new(), Some(format!("list nodes: no answer within {LIST_TIMEOUT:?}"))),
    };
    let timeout = Duration::from_secs(args.timeout.max(1));
    let pods: Vec<Pod> = pods.items.into_iter().filter(|p| wanted(node_of(p))).collect();
    let mut rows: Vec<NodeStatus> =
        futures::stream::iter(pods).map(|p| ask(&clients.proxy, &args.namespace, p, timeout)).buffer_unordered(CONCURRENCY).collect().await;
    for name in node_names.into_iter().chain(args.node.iter().cloned()) {
        if wanted(&name) && !rows.iter().any(|r| r.node == name) {
            rows.push(NodeStatus { node: name, agent: Heard::NoAgent });
        }
    }
    Ok(ClusterStatus::new(rows, nodes_unlisted))
}

/// The node a pod runs on (`""` when not scheduled yet).
fn node_of(p: &Pod) -> &str {
    p.spec.as_ref().and_then(|s| s.node_name.as_deref()).unwrap_or_default()
}

/// The number of the container port named [`PORT_NAME`].
fn metrics_port(p: &Pod) -> Option<i32> {
    p.spec
        .as_ref()?
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .find(|port| port.name.as_deref() == Some(PORT_NAME))
        .map(|port| port.container_port)
}

/// One agent's row: its document through the pod proxy, or why not.
async fn ask(client: &Client, namespace: &str, p: Pod, timeout: Duration) -> NodeStatus {
    let pod = p.metadata.name.clone().unwrap_or_default();
    let node = if node_of(&p).is_empty() { "(not scheduled)".to_owned() } else { node_of(&p).to_owned() };
    let reason = match metrics_port(&p) {
        None => format!("pod {pod} has no container port named {PORT_NAME}"),
        Some(port) => {
            let path = format!("/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy{STATUS_PATH}");
            match tokio::time::timeout(timeout, get(client, &path)).await {
                Err(_) => format!("no answer within {}s", timeout.as_secs()),
                Ok(Err(why)) => why,
                Ok(Ok(doc)) => return NodeStatus { node, agent: Heard::Answered { pod, status: Box::new(doc) } },
            }
        }
    };
    NodeStatus { node, agent: Heard::NoAnswer { pod, reason } }
}

/// GET `path` and parse a status document of this version.
async fn get(client: &Client, path: &str) -> Result<StatusDocument, String> {
    let request = http::Request::get(path).body(Vec::new()).map_err(|e| e.to_string())?;
    let text = client.request_text(request).await.map_err(|e| match e {
        kube::Error::Api(s) => format!("{} ({} {})", s.message, s.code, s.reason),
        other => describe_kube_error(&other),
    })?;
    let doc: StatusDocument = serde_json::from_str(&text).map_err(|e| format!("not a status document: {e}"))?;
    if doc.api_version != API_VERSION || doc.kind != KIND {
        return Err(format!("not a status document: apiVersion {:?}, kind {:?} (want {API_VERSION}, {KIND})", doc.api_version, doc.kind));
    }
    Ok(doc)
}
