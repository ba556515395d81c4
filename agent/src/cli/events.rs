//! `routewarden events`: stream route writes, flushes, conflicts and flaps live from the
//! in-kernel route watch ([`routewarden::bpf::route_watch::events_stream`]); with
//! `--datastore`, the forwarding watch's wrong-path samples and flaps too, for the
//! destinations of the plan the agent computes.
//!
//! The cluster flags are the agent's ([`ClusterArgs`], with `--datastore` optional here), so
//! inside the agent's pod the command sees the agent's datastore, node, devices and route
//! protocol from the same `ROUTEWARDEN_*` environment.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use routewarden::app::flags::{ClusterArgs, LogFormat, Mode};
use routewarden::app::{self};
use routewarden::bpf::bpf_log::BpfLogLevel;
use routewarden::bpf::forward::ForwardConfig;
use routewarden::bpf::route_watch::events_stream::{self, EventsFormat, EventsOptions, ForwardSetup};
use routewarden::bpf::route_watch::RouteWatchBackend;

use super::{devices_for, load, plan_once, runtime};

/// `routewarden events`.
#[derive(Clone, Debug, Args)]
#[command(mut_arg("datastore", |a| a.required(false)))]
pub struct EventsArgs {
    /// Also stream wrong-path samples and forwarding flaps when `--datastore` is given (the
    /// cluster to take the destinations from, as for `routewarden run`); `--agent-pid` names
    /// the process whose writes are `self`.
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Output: `text` (one line per event) or `json` (one JSON object per line).
    #[arg(short = 'o', long = "output", default_value = "text", value_parser = ["text", "json"])]
    pub output: String,
    /// Force a backend: fentry, kprobe or socket-filter (default: the best that loads).
    #[arg(long = "route-watch-backend")]
    pub backend: Option<RouteWatchBackend>,
    /// Conflict / flap window, seconds.
    #[arg(long, default_value_t = 30)]
    pub window_seconds: u64,
    /// Changes within the window that make a flap.
    #[arg(long, default_value_t = 3)]
    pub flap_threshold: u32,
    /// Writes of one prefix by one writer refused with the same error within the window that
    /// make a failing writer (fentry and kprobe backends).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(2..))]
    pub failing_threshold: u32,
    /// Stop after this many events.
    #[arg(long)]
    pub count: Option<usize>,
    /// Kernel-side log lines of the watches, to stderr: off, error, warn, info, debug.
    #[arg(long, value_enum, default_value = "off")]
    pub bpf_log_level: BpfLogLevel,
    /// The routewarden agent's pid: its writes show as `self`, whatever their protocol.
    /// Without it nothing is `self` (this command writes no routes) and the agent's writes
    /// show as any other program's (`other`, with its pid and name).
    #[arg(long)]
    pub agent_pid: Option<u32>,
}

impl EventsArgs {
    /// The options these arguments describe (no forwarding watch yet).
    fn options(&self) -> EventsOptions {
        EventsOptions {
            format: if self.output == "json" { EventsFormat::Json } else { EventsFormat::Text },
            backend: self.backend,
            window: Duration::from_secs(self.window_seconds),
            flap_threshold: self.flap_threshold,
            failing_threshold: self.failing_threshold,
            self_protocol: self.cluster.route_protocol,
            max_events: self.count,
            duration: None,
            forward: None,
            log_level: self.bpf_log_level,
            self_pid: self.agent_pid,
            scope: None,
        }
    }
}

/// Stream events to stdout until Ctrl-C, SIGTERM or `--count`.
///
/// # Errors
/// The datastore did not load, the role is invalid, or a watch did not load or attach.
pub fn events(args: &EventsArgs) -> Result<ExitCode> {
    app::logging::init(LogFormat::Text);
    let mut opts = args.options();
    if let Some(spec) = args.cluster.datastore_spec() {
        let rt = runtime()?;
        let snap = rt.block_on(load(spec))?;
        let node = app::node_name(args.cluster.node.as_deref())?;
        let role = args.cluster.role.clone().unwrap_or_else(|| "felix".into());
        let ownership = app::ownership_config(&role, &args.cluster.calico_version, Mode::Program, &node)?;
        let devices = rt.block_on(devices_for(&args.cluster, &snap.cluster, Some(&node)));
        let forward_devices = ForwardConfig::for_devices(std::slice::from_ref(&devices.tunnel), std::slice::from_ref(&devices.host_nic));
        let p = plan_once(&snap, &args.cluster, node, ownership, devices);
        opts.scope = Some(app::episode_scope(&p));
        opts.forward = Some(ForwardSetup { config: ForwardConfig { log_level: args.bpf_log_level, ..forward_devices }, entries: app::forward_entries(&p) });
    }
    events_stream::main(&opts)?;
    Ok(ExitCode::SUCCESS)
}
