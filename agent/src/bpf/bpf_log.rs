//! Kernel-side log lines (`aya-log-ebpf` in `ebpf/src/bpf_log.rs`) forwarded into `tracing`
//! under the target `bpf` (issue 14).
//!
//! The programs log only rare events a person debugging them needs — a full ring buffer, a
//! map insert that failed, kernel struct offsets that do not match the running kernel, a
//! packet or netlink message that could not be parsed — each kind at most once per second per
//! CPU. `--bpf-log-level` (default `off`) is written into the object's `AYA_LOG_LEVEL` global
//! before load, so with it off the kernel side writes nothing and no reader thread runs; with
//! `error`/`warn`/`info`/`debug` a thread per loaded object drains the `AYA_LOGS` ring buffer
//! into `tracing` (`RUST_LOG` still filters: `bpf=debug`).
//!
//! A line: `WARN bpf: route watch: ring buffer full, record lost (kind 5); userspace is not
//! keeping up watch="route-watch" module="routewarden_ebpf::route_detector"`.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use aya::{Ebpf, EbpfLoader};

/// The object's global holding the kernel-side log level (`aya_log::LEVEL`).
const LEVEL_GLOBAL: &str = aya_log::LEVEL;

/// `--bpf-log-level`: the most verbose kernel-side log level written (`off`: none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BpfLogLevel {
    /// Nothing is logged; the programs pay one global read on their error paths.
    #[default]
    Off,
    /// Errors only.
    Error,
    /// Warnings and errors (every event routewarden's programs log today is a warning).
    Warn,
    /// Informational lines too.
    Info,
    /// Debug lines too.
    Debug,
}

impl BpfLogLevel {
    /// The value of `AYA_LOG_LEVEL` (`aya_log_common::Level` numbering; 0 = off), static
    /// because the loader keeps a reference until it loads.
    fn kernel_value(self) -> &'static u8 {
        static VALUES: [u8; 5] = [0, 1, 2, 3, 4];
        &VALUES[self as usize]
    }

    /// Set the level on a loader, before [`EbpfLoader::load`]. Every object routewarden loads
    /// is the one embedded ELF, which always has the global.
    pub fn apply(self, loader: &mut EbpfLoader<'_>) {
        loader.override_global(LEVEL_GLOBAL, self.kernel_value(), true);
    }
}

/// `log::Log` → `tracing`, tagged with the watch the object belongs to.
struct ToTracing {
    watch: &'static str,
}

impl log::Log for ToTracing {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let (watch, module, message) = (self.watch, record.target(), record.args());
        match record.level() {
            log::Level::Error => tracing::error!(target: "bpf", watch, module, "{message}"),
            log::Level::Warn => tracing::warn!(target: "bpf", watch, module, "{message}"),
            log::Level::Info => tracing::info!(target: "bpf", watch, module, "{message}"),
            log::Level::Debug => tracing::debug!(target: "bpf", watch, module, "{message}"),
            log::Level::Trace => tracing::trace!(target: "bpf", watch, module, "{message}"),
        }
    }

    fn flush(&self) {}
}

/// The thread that drains one object's log ring buffer; stopped (and joined) on drop.
pub struct BpfLogForwarder {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for BpfLogForwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BpfLogForwarder").finish_non_exhaustive()
    }
}

impl BpfLogForwarder {
    /// Start forwarding the log lines of `bpf` (loaded with `level` applied) as the watch
    /// `watch`. `None` when `level` is off, or (with a warning) when the object has no log map.
    /// The thread logs through the `tracing` dispatcher of the calling thread.
    pub fn start(bpf: &mut Ebpf, watch: &'static str, level: BpfLogLevel) -> Option<BpfLogForwarder> {
        if level == BpfLogLevel::Off {
            return None;
        }
        let mut logger = match aya_log::EbpfLogger::init_with_logger(bpf, ToTracing { watch }) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(watch, error = %e, "kernel-side logging unavailable");
                return None;
            }
        };
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let dispatch = tracing::dispatcher::get_default(Clone::clone);
        let thread = std::thread::Builder::new()
            .name(format!("bpf-log-{watch}"))
            .spawn(move || {
                tracing::dispatcher::with_default(&dispatch, || {
                    while !stopping.load(Ordering::Relaxed) {
                        let mut fds = [nix::poll::PollFd::new(logger.as_fd(), nix::poll::PollFlags::POLLIN)];
                        let _ = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(POLL_MS));
                        logger.flush();
                    }
                    logger.flush();
                });
            })
            .ok()?;
        Some(BpfLogForwarder { stop, thread: Some(thread) })
    }
}

impl Drop for BpfLogForwarder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How long (ms) [`BpfLogForwarder`] waits for the ring buffer before checking whether to
/// stop: the delay of dropping a watch.
const POLL_MS: u16 = 250;
