//! Kernel-side log lines (`aya-log-ebpf` in `ebpf/src/bpf_log.rs`) forwarded into `tracing`
//! under the target `bpf`.
//!
//! The programs log only rare events a person debugging them needs — a full ring buffer, a
//! map insert that failed, kernel struct offsets that do not match the running kernel, a
//! packet or netlink message that could not be parsed — each kind at most once per second per
//! CPU. `--bpf-log-level` (default `off`) is written into the object's `AYA_LOG_LEVEL` global
//! before load, so with it off the kernel side writes nothing and no reader thread runs; with
//! `error`/`warn`/`info`/`debug` one thread for the process's one load drains the `AYA_LOGS`
//! ring buffer into `tracing` (`RUST_LOG` still filters: `bpf=debug`), each line tagged with the
//! watch its kernel module belongs to.
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

/// `log::Log` → `tracing`, tagged with the watch the logging program belongs to.
struct ToTracing;

/// The watch a kernel-side module belongs to (`routewarden_ebpf::tc_forward` →
/// `forwarding-watch`, `routewarden_ebpf::route_detector` → `route-watch`): one object holds
/// every program, so the record's module names the watch.
fn watch_of(module: &str) -> &'static str {
    let file = module.rsplit("::").next().unwrap_or(module);
    if file.starts_with("tc_forward") {
        "forwarding-watch"
    } else if file.starts_with("route") {
        "route-watch"
    } else if file.starts_with("tc_count") {
        "tc-count"
    } else {
        "bpf"
    }
}

impl log::Log for ToTracing {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let (module, message) = (record.target(), record.args());
        let watch = watch_of(module);
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

/// The thread that drains the object's log ring buffer; stopped (and joined) on drop.
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
    /// Start forwarding the log lines of `bpf` (loaded with `level` applied), each tagged with
    /// the watch its module belongs to. `None` when `level` is off, or (with a warning) when
    /// the object has no log map. The thread logs through the `tracing` dispatcher of the
    /// calling thread.
    pub fn start(bpf: &mut Ebpf, level: BpfLogLevel) -> Option<BpfLogForwarder> {
        if level == BpfLogLevel::Off {
            return None;
        }
        let mut logger = match aya_log::EbpfLogger::init_with_logger(bpf, ToTracing) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "kernel-side logging unavailable");
                return None;
            }
        };
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let dispatch = tracing::dispatcher::get_default(Clone::clone);
        let thread = std::thread::Builder::new()
            .name("bpf-log".to_owned())
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

#[cfg(test)]
mod tests {
    #[test]
    fn each_kernel_module_names_its_watch() {
        assert_eq!(super::watch_of("routewarden_ebpf::route_detector"), "route-watch");
        assert_eq!(super::watch_of("routewarden_ebpf::route_watch_netlink"), "route-watch");
        assert_eq!(super::watch_of("routewarden_ebpf::tc_forward"), "forwarding-watch");
        assert_eq!(super::watch_of("routewarden_ebpf::tc_count"), "tc-count");
        assert_eq!(super::watch_of("routewarden_ebpf::helpers"), "bpf");
    }
}
