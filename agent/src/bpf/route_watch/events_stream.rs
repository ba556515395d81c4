//! The engine of `routewarden events [-o json]` (flags in the binary's `cli/events.rs`):
//! stream route writes, flushes, conflicts and flaps live, like
//! `ip monitor route` but with the writer's process and the detector's verdict.
//!
//! It loads its own copy of the watch with write streaming on (the agent's copy only emits
//! conflict/flap records), in the calling thread's network namespace. Given the cluster
//! (`--datastore`), it also attaches its own copy of the forwarding watch and streams its
//! wrong-path samples and forwarding flaps in the same output (`"event": "wrong-path"` /
//! `"flap"` with `"block"`): TC programs coexist, so this runs next to the agent's.

use std::io::Write;
use std::time::Duration;

use tokio::sync::mpsc;

use super::{EpisodeScope, RouteWatch, RouteWatchBackend, RouteWatchConfig, RouteWatchEvent};
use crate::bpf::forward::{ForwardConfig, ForwardEntry, ForwardEvent, ForwardWatch};
use crate::bpf::loader::{BpfObject, LoadConfig};
use crate::bpf::BpfError;

/// The forwarding watch `routewarden events` runs too: where to attach and the cluster
/// destinations (from the plan, as the agent computes them).
#[derive(Clone, Debug)]
pub struct ForwardSetup {
    /// Devices and detector settings.
    pub config: ForwardConfig,
    /// Every cluster destination with its pool and expected path.
    pub entries: Vec<ForwardEntry>,
}

/// Output format of `routewarden events`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EventsFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per line (`{"event":"conflict","route":{...},"previous":{...}}`).
    Json,
}

/// Options of `routewarden events`.
#[derive(Clone, Debug)]
pub struct EventsOptions {
    /// Output format.
    pub format: EventsFormat,
    /// Force a backend (`--route-watch-backend`).
    pub backend: Option<RouteWatchBackend>,
    /// Detector window (same meaning as the agent's).
    pub window: Duration,
    /// Flap threshold.
    pub flap_threshold: u32,
    /// Failing-writer threshold (refused writes of one prefix by one writer, same errno).
    pub failing_threshold: u32,
    /// The agent's route protocol (the class `self` is decided by `self_pid`, not by it).
    pub self_protocol: u8,
    /// Stop after this many events (`None`: until Ctrl-C / SIGTERM).
    pub max_events: Option<usize>,
    /// Stop after this long (`None`: until Ctrl-C / SIGTERM).
    pub duration: Option<Duration>,
    /// Also stream the forwarding watch's events (`None`: route events only).
    pub forward: Option<ForwardSetup>,
    /// Kernel-side log level of both watches (`--bpf-log-level`; lines go to stderr).
    pub log_level: crate::bpf::bpf_log::BpfLogLevel,
    /// The process whose writes show as `self` (`--agent-pid`; `None`: this process, which
    /// writes nothing, so the agent's writes show as the class of its name, `other`).
    pub self_pid: Option<u32>,
    /// Where conflicts and flaps mean something (`--datastore` given: the plan's
    /// [`EpisodeScope`], as the agent judges them); outside it they are shown as the plain
    /// writes they are. `None`: every verdict of the kernel is shown.
    pub scope: Option<EpisodeScope>,
}

/// `ev`, or the write it carries when it is a conflict, flap or failing writer outside `scope`
/// ([`EpisodeScope::judges`]): another program's churn outside the pools is not an episode,
/// in the stream as in the agent's metrics.
pub fn in_scope(ev: RouteWatchEvent, scope: Option<&EpisodeScope>) -> RouteWatchEvent {
    if scope.is_none_or(|s| ev.episode().is_none_or(|(route, previous)| s.judges(route, previous))) {
        return ev;
    }
    match ev {
        RouteWatchEvent::Conflict { route, .. } | RouteWatchEvent::Flap { route, .. } => RouteWatchEvent::Write { route },
        RouteWatchEvent::FailingWriter { route, error, .. } => RouteWatchEvent::WriteFailed { route, error },
        other => other,
    }
}

impl Default for EventsOptions {
    fn default() -> Self {
        EventsOptions {
            format: EventsFormat::Text,
            backend: None,
            window: Duration::from_secs(30),
            flap_threshold: 3,
            failing_threshold: 3,
            self_protocol: 0,
            max_events: None,
            duration: None,
            forward: None,
            log_level: crate::bpf::bpf_log::BpfLogLevel::Off,
            self_pid: None,
            scope: None,
        }
    }
}

/// `routewarden events`: run [`stream_events`] to stdout on a current-thread runtime.
pub fn main(opts: &EventsOptions) -> Result<(), EventsError> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(stream_events(opts, std::io::stdout().lock())).map(|_| ())
}

/// Errors of `routewarden events`.
#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    /// The object did not load or the route watch did not start.
    #[error(transparent)]
    Watch(#[from] BpfError),
    /// The forwarding watch did not start.
    #[error("forwarding watch: {0}")]
    Forward(#[source] BpfError),
    /// Writing to the output failed (closed pipe).
    #[error("writing events: {0}")]
    Output(#[from] std::io::Error),
}

/// Stream events of the embedded object's watch to `out` until Ctrl-C, SIGTERM, `max_events`
/// or `duration`. Returns the number of events written.
pub async fn stream_events(opts: &EventsOptions, out: impl Write) -> Result<usize, EventsError> {
    let object = crate::bpf::embedded_object().ok_or(BpfError::NoObject)?;
    stream_events_with(object, opts, out).await
}

/// One load for both watches of `routewarden events`: the route watch streaming every write
/// into a 4 MiB ring, the forwarding watch's thresholds when it runs too.
fn load_object(object: &'static [u8], opts: &EventsOptions) -> Result<BpfObject, BpfError> {
    let config = RouteWatchConfig {
        backend: opts.backend,
        window: opts.window,
        flap_threshold: opts.flap_threshold,
        failing_threshold: opts.failing_threshold,
        self_protocol: opts.self_protocol,
        stream_writes: true,
        ring_buffer_bytes: Some(1 << 22),
        log_level: opts.log_level,
        self_pid: opts.self_pid,
        task_senders: true,
    };
    let load = LoadConfig { log_level: opts.log_level, route_watch: Some(config), forward: opts.forward.as_ref().map(|f| f.config.clone()) };
    BpfObject::load(object, load)
}

/// [`stream_events`] with an explicit BPF object, loaded once for both watches.
pub async fn stream_events_with(object: &'static [u8], opts: &EventsOptions, mut out: impl Write) -> Result<usize, EventsError> {
    let object = load_object(object, opts)?;
    // The route watch first: its socket-filter fallback may load the object again.
    let mut watch = RouteWatch::start_in(&object)?;
    if opts.format == EventsFormat::Text {
        let me = opts.self_pid.map_or_else(|| "none (--agent-pid names the agent)".to_owned(), |p| format!("pid {p}"));
        writeln!(
            out,
            "# route watch backend {}, {}; window {:?}, flap threshold {}; self = {me}",
            watch.backend(),
            watch.senders(),
            opts.window,
            opts.flap_threshold
        )?;
        out.flush()?;
    }
    let (tx, mut rx) = mpsc::channel::<RouteWatchEvent>(4096);
    let reader = watch.spawn_reader(tx)?;
    let (ftx, mut frx) = mpsc::channel::<ForwardEvent>(1024);
    let mut forward = None;
    if let Some(setup) = &opts.forward {
        let mut fw = ForwardWatch::start_in(&object, &setup.config).map_err(EventsError::Forward)?;
        fw.set_destinations(&setup.entries).map_err(EventsError::Forward)?;
        let freader = fw.spawn_reader(ftx).map_err(EventsError::Forward)?;
        if opts.format == EventsFormat::Text {
            writeln!(out, "# forwarding watch on {} device(s), {} destinations", fw.attached().len(), setup.entries.len())?;
            out.flush()?;
        }
        forward = Some((fw, freader));
    } else {
        drop(ftx);
    }
    let deadline = opts.duration.map(|d| tokio::time::Instant::now() + d);
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let mut written = 0usize;
    let mut last_lost = 0u64;
    loop {
        let sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        let term = async {
            match sigterm.as_mut() {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            ev = rx.recv() => {
                let Some(ev) = ev else { break };
                let ev = in_scope(ev, opts.scope.as_ref());
                match opts.format {
                    EventsFormat::Text => writeln!(out, "{ev}")?,
                    EventsFormat::Json => {
                        serde_json::to_writer(&mut out, &ev).map_err(std::io::Error::other)?;
                        writeln!(out)?;
                    }
                }
                out.flush()?;
                written += 1;
                if opts.max_events.is_some_and(|m| written >= m) {
                    break;
                }
                if let Ok(c) = watch.counters() {
                    if c.records_lost > last_lost {
                        if opts.format == EventsFormat::Text {
                            writeln!(out, "# {} records lost (ring buffer full)", c.records_lost - last_lost)?;
                        }
                        last_lost = c.records_lost;
                    }
                }
            }
            Some(fev) = frx.recv() => {
                match opts.format {
                    EventsFormat::Text => writeln!(out, "{fev}")?,
                    EventsFormat::Json => {
                        serde_json::to_writer(&mut out, &fev).map_err(std::io::Error::other)?;
                        writeln!(out)?;
                    }
                }
                out.flush()?;
                written += 1;
                if opts.max_events.is_some_and(|m| written >= m) {
                    break;
                }
            }
            () = sleep => break,
            () = term => break,
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    reader.abort();
    if let Some((_watch, freader)) = forward {
        freader.abort();
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::{in_scope, EpisodeScope, RouteWatchEvent};
    use crate::bpf::route_watch::{RouteChange, WriterInfo};

    fn writer(class: &'static str, protocol: u8) -> WriterInfo {
        WriterInfo { protocol, class, class_inferred: false, kernel: false, netlink_port: Some(7), pid: Some(42), comm: Some("vpnc".into()) }
    }

    fn conflict(dst: &str) -> RouteWatchEvent {
        let route = RouteChange {
            at_ns: 1,
            family: "ipv4",
            op: "add",
            table: 254,
            dst: dst.parse().unwrap(),
            metric: 0,
            oif: 2,
            gateway: None,
            nexthop_id: None,
            writer: writer("static", 4),
        };
        RouteWatchEvent::Conflict { route, previous: writer("static", 4), writes_in_window: 2 }
    }

    /// In `routewarden events --datastore`: a conflict outside the pools is
    /// shown as the write it is (writer and process kept, no verdict); inside, unchanged;
    /// without a datastore (no scope), every verdict of the kernel as before.
    #[test]
    fn episodes_outside_the_scope_are_shown_as_writes() {
        let scope = EpisodeScope { pools: vec!["10.244.0.0/16".parse().unwrap()], protocol: 80, table: 254 };
        let RouteWatchEvent::Write { route } = in_scope(conflict("192.168.77.1/32"), Some(&scope)) else { panic!("not a write") };
        assert_eq!((route.dst.to_string(), route.writer.comm.as_deref()), ("192.168.77.1/32".to_owned(), Some("vpnc")));
        assert!(matches!(in_scope(conflict("10.244.20.0/26"), Some(&scope)), RouteWatchEvent::Conflict { .. }));
        assert!(matches!(in_scope(conflict("192.168.77.1/32"), None), RouteWatchEvent::Conflict { .. }));
    }
}
