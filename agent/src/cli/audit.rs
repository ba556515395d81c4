//! `routewarden audit`: one-shot comparison of the kernel's routes with what each owner
//! should have programmed ([`routewarden::dataplane::audit_kernel`] on the plan's
//! expectations). Programs nothing.

use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use routewarden::app::flags::{ClusterArgs, LogFormat, Mode};
use routewarden::app::{self};
use routewarden::dataplane::{audit_kernel, AuditReport, KernelDump};
use routewarden::text::escape;

use super::{devices_for, load, plan_once, runtime, Output};

/// `routewarden audit`.
#[derive(Args, Clone, Debug)]
pub struct AuditArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    pub output: Output,
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
    report: &'a AuditReport,
    skipped: &'a [SkippedObject],
}

/// Audit this node's kernel table (and, with `--route-table` other than main, the policy rules
/// that select it); exit 1 on findings, on a family of routewarden's routes no rule selects,
/// or on objects left out.
///
/// # Errors
/// The datastore did not load, the role or Calico version is invalid, or the kernel's routes
/// could not be dumped.
pub fn audit(args: &AuditArgs) -> Result<ExitCode> {
    app::logging::init(LogFormat::Text);
    runtime()?.block_on(audit_async(args))
}

async fn audit_async(args: &AuditArgs) -> Result<ExitCode> {
    let snap = load(args.cluster.required_datastore_spec()?).await?;
    let node = app::node_name(args.cluster.node.as_deref())?;
    let role = args.cluster.role.clone().unwrap_or_else(|| "audit".into());
    let mode = if role == "audit" { Mode::Audit } else { Mode::Program };
    let ownership = app::ownership_config(&role, &args.cluster.calico_version, mode, &node)?;
    let devices = devices_for(&args.cluster, &snap.cluster, Some(&node)).await;
    let p = plan_once(&snap, &args.cluster, node, ownership, devices);
    let mut nl = KernelDump::connect().context("open the rtnetlink socket")?;
    let report = audit_kernel(&mut nl, p.expected.values(), &p.audit_scope).await.context("dump the kernel's routes")?;
    // What the audit could not look at: objects left out (their routes are not expected, so
    // a route for them may show as stale or missing) and the inputs that did not load.
    let skipped: Vec<SkippedObject> = snap
        .object_errors
        .iter()
        .map(|e| SkippedObject { file: e.file.display().to_string(), error: e.error.to_string(), last_good_kept: e.last_good })
        .chain(snap.load_errors.iter().map(|e| SkippedObject { file: e.file.display().to_string(), error: e.message.clone(), last_good_kept: !e.never_loaded }))
        .collect();
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&AuditOutput { report: &report, skipped: &skipped })?),
        Output::Yaml => print!("{}", serde_yaml_ng::to_string(&AuditOutput { report: &report, skipped: &skipped })?),
        Output::Table => print_table(&report, &skipped),
    }
    Ok(if report.is_clean() && skipped.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// The human-readable report: one line per finding, then the WireGuard and skipped sections.
fn print_table(report: &AuditReport, skipped: &[SkippedObject]) {
    println!("audit of table {}: {} expected routes, {} kernel routes on cluster prefixes", report.table, report.expected, report.kernel_routes);
    if report.is_clean() && skipped.is_empty() {
        println!("clean: every owner's routes are present and nothing else writes cluster prefixes");
    }
    for f in &report.findings {
        println!("{:<16} {:<20} {}", f.code.as_str(), f.prefix.to_string(), f.detail);
    }
    // routewarden's table other than main: whether an ip rule sends traffic to it.
    for line in report.table_rules.iter().filter_map(routewarden::dataplane::table_rule::TableRuleCheck::line) {
        println!("{line}");
    }
    if !report.wireguard.is_empty() {
        println!("over WireGuard (Felix routes these in its own table; BIRD's filter rejects them, so no main-table route is expected from BIRD):");
        for w in &report.wireguard {
            println!("  {:<20} to WireGuard peer {} ({})", w.prefix.to_string(), escape(&w.peer), w.bgp_address);
        }
    }
    if !skipped.is_empty() {
        println!("skipped (not audited; their routes are not expected):");
        for s in skipped {
            let kept = if s.last_good_kept { " (last good version audited instead)" } else { "" };
            println!("  {}: {}{kept}", escape(&s.file), escape(&s.error));
        }
    }
}
