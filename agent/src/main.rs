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
//!
//! Exit codes: 0 clean, 1 findings (explain, audit, bird-filter), 2 error.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
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
}

fn main() -> ExitCode {
    routewarden::app::memory::configure_allocator();
    let result = match Cli::parse().command {
        Command::Run(args) => cli::run::run(*args),
        Command::Explain(args) => cli::explain::explain(&args),
        Command::Audit(args) => cli::audit::audit(&args),
        Command::Events(args) => cli::events::events(&args),
        Command::BirdFilter(args) => cli::bird_filter::bird_filter(&args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("routewarden: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
