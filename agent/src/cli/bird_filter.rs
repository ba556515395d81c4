//! `routewarden bird-filter`: BIRD 2 filter snippets consistent with the ownership decision
//! ([`routewarden::bird_filter::render`]), for upstream BIRD next to routewarden (no confd).

use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use routewarden::app::flags::{ClusterArgs, LogFormat, Mode};
use routewarden::app::{self};
use routewarden::bird_filter::{render, BirdFilterOptions};
use routewarden::model::Kind;
use routewarden::ownership::wireguard_peers;
use routewarden::text::escape;

use super::{devices, load_blocking};

/// `routewarden bird-filter`.
#[derive(Args, Clone, Debug)]
pub struct BirdFilterArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Path the header's `include` line names (where you save the output).
    #[arg(long, default_value = "/etc/bird/routewarden.conf")]
    pub include_path: String,
}

/// Load and decide as `explain` does, then render. Fails closed: an IP pool that could not be
/// classified (invalid, overlapping, unreadable) is rejected for BIRD in the printed filters
/// and makes the command exit 1, naming the object and field.
///
/// # Errors
/// A device name is invalid, the datastore did not load, or the role or Calico version is
/// invalid.
pub fn bird_filter(args: &BirdFilterArgs) -> Result<ExitCode> {
    app::logging::init(LogFormat::Text);
    devices(&args.cluster).validate()?;
    let snap = load_blocking(&args.cluster)?;
    // Pools, and objects whose kind is not known (they may be pools), that did not make it.
    let unclassified: Vec<_> = snap
        .object_errors
        .iter()
        .filter(|e| e.error.object().is_none_or(|(k, _)| k == Kind::IpPool))
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
        wireguard_peers: node.as_deref().map(|n| wireguard_peers(&snap.cluster, n)).unwrap_or_default(),
        ..BirdFilterOptions::default()
    };
    print!("{}", render(&decision, &opts));
    for e in &snap.object_errors {
        let level = if unclassified.iter().any(|u| std::ptr::eq(*u, e)) { "error" } else { "warning" };
        eprintln!("{level}: skipped: {}", escape(&e.to_string()));
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
