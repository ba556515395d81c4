//! The `routewarden` command. One file per subcommand in `cli/`; each parses its flags
//! (the shared cluster flags are one flattened
//! [`ClusterArgs`](routewarden::app::flags::ClusterArgs)) and calls the library, where
//! the logic lives.
//!
//! | command       | file                 | calls                                                   |
//! |---------------|----------------------|---------------------------------------------------------|
//! | `run`         | `cli/run.rs`         | [`routewarden::app::run`]                               |
//! | `explain`     | `cli/explain.rs`     | [`routewarden::explain`]                                |
//! | `audit`       | `cli/audit.rs`       | [`routewarden::plan`], [`routewarden::dataplane::audit_kernel`] |
//! | `events`      | `cli/events.rs`      | [`routewarden::bpf::route_watch::events_stream`]        |
//! | `bird-filter` | `cli/bird_filter.rs` | [`routewarden::bird_filter`]                            |
//! | `status`      | `cli/status.rs`      | every agent's [`routewarden::observe::status`] document |
//!
//! Exit codes: 0 clean, 1 findings (explain, audit, bird-filter; status with `--exit-code`),
//! 2 error.
//!
//! Installed as `kubectl-routewarden` (on `PATH`, or by krew: `deploy/krew/`), the binary is a
//! kubectl plugin: `kubectl routewarden status` runs it with `status` as its first argument, and
//! its help names it `kubectl routewarden`.

use std::process::ExitCode;

use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};
use routewarden::app::flags::RunArgs;

mod cli;

/// mimalloc: freed memory goes back to the system (`routewarden::app::memory`).
#[global_allocator]
static ALLOCATOR: routewarden::app::memory::Allocator = routewarden::app::memory::Allocator {};

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
    Explain(cli::explain::ExplainArgs),
    /// Compare the kernel's routes with what each owner should have programmed (programs
    /// nothing). Exits 1 on findings.
    Audit(cli::audit::AuditArgs),
    /// Stream route writes, flushes, conflicts and flaps live from the in-kernel route watch
    /// (like `ip monitor route`, with the writer's process and the verdict).
    Events(cli::events::EventsArgs),
    /// Print BIRD 2 filter snippets (kernel export filter, iBGP export reject) consistent with
    /// the ownership decision, for upstream BIRD running next to routewarden (no confd).
    BirdFilter(cli::bird_filter::BirdFilterArgs),
    /// Every agent's status in one table, through the API server (pod proxy): readiness, mode,
    /// role, Calico line, classes programmed, findings, the last hour's conflicts and flaps with
    /// the writers, nodes without an agent, and a one-line verdict.
    Status(cli::status::StatusArgs),
}

/// The name kubectl runs a plugin by: `kubectl routewarden` finds `kubectl-routewarden` on
/// `PATH` and runs it with the arguments after `routewarden`.
const KUBECTL_PLUGIN: &str = "kubectl-routewarden";

/// The arguments, parsed; run as [`KUBECTL_PLUGIN`] (the basename of `argv[0]`), usage and
/// help say `kubectl routewarden`.
fn parse() -> Cli {
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let plugin = std::path::Path::new(&argv0).file_name().is_some_and(|n| n == KUBECTL_PLUGIN);
    if !plugin {
        return Cli::parse();
    }
    let matches = Cli::command().name(KUBECTL_PLUGIN).bin_name("kubectl routewarden").get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

fn main() -> ExitCode {
    routewarden::app::memory::configure_allocator();
    let result = match parse().command {
        Command::Run(args) => cli::run::run(*args),
        Command::Explain(args) => cli::explain::explain(&args),
        Command::Audit(args) => cli::audit::audit(&args),
        Command::Events(args) => cli::events::events(&args),
        Command::BirdFilter(args) => cli::bird_filter::bird_filter(&args),
        Command::Status(args) => cli::status::status(&args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("routewarden: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
