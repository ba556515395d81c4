//! `tracing` setup: human-readable on a terminal, JSON otherwise (or as `--log-format` says),
//! filtered by `RUST_LOG` (default `info`).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use super::flags::LogFormat;

/// Install the global subscriber. Logs go to stderr.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let json = match format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(std::io::stderr().is_terminal());
    // A second init (tests) is harmless: keep the first subscriber.
    let _ = if json { builder.json().flatten_event(true).try_init() } else { builder.try_init() };
}
