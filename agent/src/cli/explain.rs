//! `routewarden explain`: who programs each IP pool's cluster routes, the findings, and one
//! node's routes ([`routewarden::explain::explain`]), or every node's decision in one table
//! ([`routewarden::explain::explain_all_nodes`]).

use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use routewarden::app::flags::{ClusterArgs, LogFormat, Mode};
use routewarden::app::{self};
use routewarden::explain::{explain_all_nodes, ExplainOptions, OutputFormat};

use super::{devices_for, load_blocking, runtime, Output};

/// `routewarden explain`.
#[derive(Args, Clone, Debug)]
pub struct ExplainArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Every node's decision, one row each, instead of one node's routes: Felix's value and
    /// its source (`FelixConfiguration node.<name>` or `default`), BIRD's, and the classes
    /// double-programmed or unowned there; exits 1 when any node is inconsistent. `--node`
    /// is not used.
    #[arg(long)]
    pub all_nodes: bool,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    pub output: Output,
}

/// Print the explanation; exit 1 when a finding is an error. Objects left out are named on
/// stderr.
///
/// # Errors
/// The datastore did not load, or the role or Calico version is invalid.
pub fn explain(args: &ExplainArgs) -> Result<ExitCode> {
    app::logging::init(LogFormat::Text);
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
            devices: runtime()?.block_on(devices_for(&args.cluster, &snap.cluster, node.as_deref())),
            node,
        };
        routewarden::explain::explain(&snap.cluster, &snap.object_errors, &config, &opts)?
    };
    print!("{}", out.text);
    for e in &snap.object_errors {
        eprintln!("warning: skipped: {}", routewarden::text::escape(&e.to_string()));
    }
    Ok(if out.has_errors { ExitCode::from(1) } else { ExitCode::SUCCESS })
}
