//! The `routewarden` command: `run` (the agent), `explain` (who programs what, and this
//! node's routes), `audit` (compare the kernel with the ownership matrix).

use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use routewarden::app;
use routewarden::app::config::{AuditArgs, ClusterArgs, DatastoreSpec, ExplainArgs, LogFormat, Mode, Output, RunArgs};
use routewarden::dataplane::{audit_kernel, RtNetlink};
use routewarden::datastore::{Datastore, FileDatastore, KubernetesDatastore, Snapshot};
use routewarden::explain::{explain, explain_all_nodes, ExplainOptions, OutputFormat};
use routewarden::plan;
use routewarden::routes::RouteDevices;

#[derive(Parser)]
#[command(name = "routewarden", version, about = "Decides, programs and watches Calico cluster routes on a Kubernetes node")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent: watch the cluster, program the routes routewarden owns, serve metrics.
    Run(Box<RunArgs>),
    /// Show who programs each IP pool's cluster routes, the findings, and a node's routes
    /// (`--all-nodes`: every node's decision, one row each). Exits 1 when a finding is an
    /// error (double-programmed, unowned), on the node or on any node.
    Explain(ExplainArgs),
    /// Compare the kernel's routes with what each owner should have programmed (programs
    /// nothing). Exits 1 on findings.
    Audit(AuditArgs),
    /// Stream route writes, flushes, conflicts and flaps live from the in-kernel route watch
    /// (like `ip monitor route`, with the writer's process and the verdict).
    Events(routewarden::bpf::route_watch::events_cmd::EventsArgs),
    /// Print BIRD 2 filter snippets (kernel export filter, iBGP export reject) consistent with
    /// the ownership decision, for upstream BIRD running next to routewarden (no confd).
    BirdFilter(BirdFilterArgs),
}

/// `routewarden bird-filter`.
#[derive(clap::Args)]
struct BirdFilterArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Path the header's `include` line names (where you save the output).
    #[arg(long, default_value = "/etc/bird/routewarden.conf")]
    include_path: String,
}

/// `routewarden bird-filter`: load and decide as `explain` does, then render. Fails closed: an
/// IP pool that could not be classified (invalid, overlapping, unreadable) is rejected for
/// BIRD in the printed filters and makes the command exit 1, naming the object and field.
fn cmd_bird_filter(args: &BirdFilterArgs) -> Result<ExitCode> {
    use routewarden::bird_filter::{render, BirdFilterOptions};
    devices(&args.cluster).validate()?;
    let snap = load_blocking(&args.cluster)?;
    // Pools, and objects whose kind is not known (they may be pools), that did not make it.
    let unclassified: Vec<_> = snap
        .object_errors
        .iter()
        .filter(|e| e.error.object().is_none_or(|(k, _)| k == routewarden::model::Kind::IpPool))
        .filter(|e| !e.cidrs.is_empty() || e.error.object().is_some())
        .collect();
    let role = args.cluster.role.clone().unwrap_or_else(|| "felix".into());
    let node = args.cluster.node.clone();
    let config = app::ownership_config(&role, &args.cluster.calico_version, Mode::Program, node.as_deref().unwrap_or(""))?;
    let decision = routewarden::ownership::decide(&snap.cluster, &config);
    let opts = BirdFilterOptions {
        route_protocol: args.cluster.route_protocol,
        tunnel_device: args.cluster.tunnel_device.clone(),
        include_path: args.include_path.clone(),
        local_subnet_v4: node.as_deref().and_then(|n| snap.cluster.nodes.get(n)).and_then(|n| n.subnet(false)),
        unclassified: unclassified.iter().flat_map(|e| e.cidrs.iter().map(|c| (*c, e.error.to_string()))).collect(),
        wireguard_peers: node.as_deref().map(|n| routewarden::bird_filter::wireguard_peers(&snap.cluster, n)).unwrap_or_default(),
        ..BirdFilterOptions::default()
    };
    print!("{}", render(&decision, &opts));
    for e in &snap.object_errors {
        let level = if unclassified.iter().any(|u| std::ptr::eq(*u, e)) { "error" } else { "warning" };
        eprintln!("{level}: skipped: {}", routewarden::text::escape(&e.to_string()));
    }
    if unclassified.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!(
            "routewarden: error: {} IP pool(s) could not be classified; their CIDRs are rejected for BIRD in the filters above (fix the objects and run again)",
            unclassified.len()
        );
        Ok(ExitCode::from(1))
    }
}

async fn load(cluster: &ClusterArgs) -> Result<Snapshot> {
    load_spec(cluster.datastore_spec()).await
}

async fn load_spec(spec: DatastoreSpec) -> Result<Snapshot> {
    match spec {
        DatastoreSpec::File(path) => FileDatastore::load(&path).with_context(|| format!("load the cluster description from {}", path.display())),
        DatastoreSpec::Kubernetes(opts) => {
            let ds = KubernetesDatastore::connect(&opts).await?;
            ds.load().await.with_context(|| format!("list the cluster from {}", ds.describe()))
        }
    }
}

/// [`load`] for the synchronous commands.
fn load_blocking(cluster: &ClusterArgs) -> Result<Snapshot> {
    tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(load(cluster))
}

/// `routewarden events`; with `--datastore`, the forwarding watch's events too, from the same
/// plan the agent computes.
fn cmd_events(args: &routewarden::bpf::route_watch::events_cmd::EventsArgs) -> Result<ExitCode> {
    use routewarden::bpf::forward::ForwardConfig;
    use routewarden::bpf::route_watch::events_cmd::{self, ForwardSetup};
    let mut opts = args.options();
    if let Some(spec) = &args.datastore {
        let spec: DatastoreSpec = spec.parse().map_err(|e: String| anyhow::anyhow!("--datastore: {e}"))?;
        let snap = tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(load_spec(spec))?;
        let node = app::node_name(args.node.as_deref())?;
        let ownership = app::ownership_config(&args.role, "auto", Mode::Program, &node)?;
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let devices =
            rt.block_on(resolve_host_nic(RouteDevices { tunnel: args.tunnel_device.clone(), host_nic: args.host_device.clone() }, &snap.cluster, Some(&node)));
        let forward_devices = ForwardConfig::for_devices(std::slice::from_ref(&devices.tunnel), std::slice::from_ref(&devices.host_nic));
        let config = plan::PlanConfig { node, ownership, devices, protocol: args.route_protocol, table: 254 };
        let p = plan::plan(&snap, &config, &std::collections::BTreeSet::new(), &[]);
        opts.forward = Some(ForwardSetup { config: ForwardConfig { log_level: args.bpf_log_level, ..forward_devices }, entries: app::forward_entries(&p) });
    }
    events_cmd::main(&opts)?;
    Ok(ExitCode::SUCCESS)
}

fn devices(c: &ClusterArgs) -> RouteDevices {
    RouteDevices { tunnel: c.tunnel_device.clone(), host_nic: c.host_device.clone() }
}

/// [`devices`] with `--host-device auto` resolved for `node` in this network namespace (the
/// link holding its Calico address). Where no link here holds it (explain run away from the
/// node), `eth0`, said on stderr, so the route lines stay readable. Without a node nothing is
/// routed, and `eth0` stands in silently.
async fn devices_for(c: &ClusterArgs, cluster: &routewarden::model::Cluster, node: Option<&str>) -> RouteDevices {
    resolve_host_nic(devices(c), cluster, node).await
}

/// `devices` with a host NIC of `auto` resolved as [`devices_for`] says.
async fn resolve_host_nic(mut d: RouteDevices, cluster: &routewarden::model::Cluster, node: Option<&str>) -> RouteDevices {
    use routewarden::dataplane::host_nic;
    if d.host_nic != host_nic::AUTO {
        return d;
    }
    let Some(name) = node else {
        d.host_nic = "eth0".into();
        return d;
    };
    let found = match routewarden::dataplane::RtNetlink::connect() {
        Ok(mut nl) => host_nic::find_host_nic(&mut nl, name, cluster.nodes.get(name)).await.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    d.host_nic = found.unwrap_or_else(|why| {
        eprintln!("note: --host-device auto: {}; using eth0", routewarden::text::escape(&why));
        "eth0".into()
    });
    d
}

fn cmd_explain(args: &ExplainArgs) -> Result<ExitCode> {
    let snap = load_blocking(&args.cluster)?;
    let role = args.cluster.role.clone().unwrap_or_else(|| "felix".into());
    let node = args.cluster.node.clone();
    let config = app::ownership_config(&role, &args.cluster.calico_version, Mode::Program, node.as_deref().unwrap_or(""))?;
    let format = match args.output {
        Output::Table => OutputFormat::Table,
        Output::Json => OutputFormat::Json,
        Output::Yaml => OutputFormat::Yaml,
    };
    let out = if args.all_nodes {
        explain_all_nodes(&snap.cluster, &snap.object_errors, &config, format)?
    } else {
        let opts = ExplainOptions {
            format,
            route_protocol: args.cluster.route_protocol,
            metric: Some(args.cluster.route_metric),
            devices: tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(devices_for(&args.cluster, &snap.cluster, node.as_deref())),
            node,
        };
        explain(&snap.cluster, &snap.object_errors, &config, &opts)?
    };
    print!("{}", out.text);
    for e in &snap.object_errors {
        eprintln!("warning: skipped: {}", routewarden::text::escape(&e.to_string()));
    }
    Ok(if out.has_errors { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

async fn cmd_audit(args: &AuditArgs) -> Result<ExitCode> {
    let snap = load(&args.cluster).await?;
    let node = app::node_name(args.cluster.node.as_deref())?;
    let role = args.cluster.role.clone().unwrap_or_else(|| "audit".into());
    let mode = if role == "audit" { Mode::Audit } else { Mode::Program };
    let ownership = app::ownership_config(&role, &args.cluster.calico_version, mode, &node)?;
    let devices = devices_for(&args.cluster, &snap.cluster, Some(&node)).await;
    let config = plan::PlanConfig { node, ownership, devices, protocol: args.cluster.route_protocol, table: args.cluster.route_table };
    let p = plan::plan(&snap, &config, &std::collections::BTreeSet::new(), &[]);
    let mut nl = RtNetlink::connect().context("open the rtnetlink socket")?;
    let report = audit_kernel(&mut nl, &p.expected, &p.audit_scope).await.context("dump the kernel's routes")?;
    // What the audit could not look at: objects left out (their routes are not expected, so
    // a route for them may show as stale or missing) and the inputs that did not load.
    let skipped: Vec<SkippedObject> = snap
        .object_errors
        .iter()
        .map(|e| SkippedObject { file: e.file.display().to_string(), error: e.error.to_string(), last_good_kept: e.last_good })
        .chain(snap.load_errors.iter().map(|e| SkippedObject { file: e.file.display().to_string(), error: e.message.clone(), last_good_kept: !e.never_loaded }))
        .collect();
    let out = AuditOutput { report: &report, skipped: &skipped };
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&out)?),
        Output::Yaml => print!("{}", serde_yaml_ng::to_string(&out)?),
        Output::Table => {
            println!("audit of table {}: {} expected routes, {} kernel routes on cluster prefixes", report.table, report.expected, report.kernel_routes);
            if report.is_clean() && skipped.is_empty() {
                println!("clean: every owner's routes are present and nothing else writes cluster prefixes");
            }
            for f in &report.findings {
                println!("{:<16} {:<20} {}", f.code.as_str(), f.prefix.to_string(), f.detail);
            }
            if !report.wireguard.is_empty() {
                println!("over WireGuard (Felix routes these in its own table; BIRD's filter rejects them, so no main-table route is expected from BIRD):");
                for w in &report.wireguard {
                    println!("  {:<20} to WireGuard peer {} ({})", w.prefix.to_string(), routewarden::text::escape(&w.peer), w.bgp_address);
                }
            }
            if !skipped.is_empty() {
                println!("skipped (not audited; their routes are not expected):");
                for s in &skipped {
                    let kept = if s.last_good_kept { " (last good version audited instead)" } else { "" };
                    println!("  {}: {}{kept}", routewarden::text::escape(&s.file), routewarden::text::escape(&s.error));
                }
            }
        }
    }
    Ok(if report.is_clean() && skipped.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// An object or input `audit` did not look at, and why.
#[derive(serde::Serialize)]
struct SkippedObject {
    /// The file (or Kubernetes resource/name) it came from.
    file: String,
    /// Why it was left out (kind, name, field).
    error: String,
    /// Its last good version stood in for it.
    last_good_kept: bool,
}

/// `audit -o json|yaml`: the report and what was skipped.
#[derive(serde::Serialize)]
struct AuditOutput<'a> {
    #[serde(flatten)]
    report: &'a routewarden::dataplane::AuditReport,
    skipped: &'a [SkippedObject],
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => {
            app::logging::init(args.log_format);
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .map_err(anyhow::Error::from)
                .and_then(|rt| rt.block_on(app::run(*args)))
                .map(|()| ExitCode::SUCCESS)
        }
        Command::Explain(args) => {
            app::logging::init(LogFormat::Text);
            cmd_explain(&args)
        }
        Command::Audit(args) => {
            app::logging::init(LogFormat::Text);
            tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(anyhow::Error::from).and_then(|rt| rt.block_on(cmd_audit(&args)))
        }
        Command::Events(args) => {
            app::logging::init(LogFormat::Text);
            cmd_events(&args)
        }
        Command::BirdFilter(args) => {
            app::logging::init(LogFormat::Text);
            cmd_bird_filter(&args)
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("routewarden: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
