//! `routewarden run`: the agent ([`routewarden::app::run`]) on a two-thread runtime, logging
//! in the format `--log-format` asks for.

use std::process::ExitCode;

use anyhow::Result;
use routewarden::app::{self, flags::RunArgs};

/// Run the agent until SIGTERM/SIGINT.
///
/// # Errors
/// The agent could not start (bad flags, no datastore, no netlink socket) or stopped on a
/// fatal error.
pub fn run(args: RunArgs) -> Result<ExitCode> {
    app::logging::init(args.log_format);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(app::run(args))?;
    Ok(ExitCode::SUCCESS)
}
