//! The one load of the embedded BPF object.
//!
//! The object holds every program and map of every watch (route watch, forwarding watch,
//! `tc_count`). Loading it creates all of its maps — the preallocated LRU maps of the route
//! detector and of the forwarding watch's blocks, both ring buffers — so it is loaded once
//! per process ([`BpfObject::load`]), and each watch takes from that load what it uses:
//! its programs (loaded into the kernel on first use, attached through owned links that
//! detach when the watch drops them) and its maps ([`BpfObject::take_maps`], each map handed
//! out once). Why one load rather than one object per watch: DESIGN.md, "The eBPF watchers".
//!
//! Globals are set at load, so the load takes every watch's load-time settings
//! ([`LoadConfig`]): the route watch's window, threshold, self protocol and process, stream
//! flag, ring size, kernel struct offsets (from BTF, resolved here once) and network
//! namespace; the forwarding watch's threshold, window and sample interval; the kernel-side
//! log level (`AYA_LOG_LEVEL`, one for the whole object).
//!
//! The one exception to "load once": a socket filter is charged to its socket's option
//! memory, and the socket-filter program with kernel logs does not fit `net.core.optmem_max`
//! before Linux 6.9. The route watch then asks for the object to be loaded again without logs
//! ([`BpfObject::reload_without_logs`]); that is refused once any watch holds maps of the
//! first load, so the agent starts the route watch first.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use aya::maps::Map;
use aya::programs::links::LinkOrder;
use aya::programs::tc::{self, NlOptions, SchedClassifierLink, TcAttachOptions};
use aya::programs::{SchedClassifier, TcAttachType};
use aya::{Ebpf, EbpfLoader};
use routewarden_common::route_watch::{KernelOffsets, TaskOffsets};

use super::bpf_log::{BpfLogForwarder, BpfLogLevel};
use super::forward::settings::ForwardConfig;
use super::route_watch::btf;
use super::route_watch::settings::{current_netns_inode, RouteWatchBackend, RouteWatchConfig};
use super::BpfError;

/// Everything the load fixes: the kernel-side log level and each watch's globals. The
/// devices of the TC watches are not part of it (they are attached, and moved, later).
#[derive(Clone, Debug, Default)]
pub struct LoadConfig {
    /// Kernel-side log level of every program (`--bpf-log-level`).
    pub log_level: BpfLogLevel,
    /// The route watch's settings (its `log_level` is ignored: [`LoadConfig::log_level`]);
    /// `None`: a load without the route watch (its defaults, no BTF parse).
    pub route_watch: Option<RouteWatchConfig>,
    /// The forwarding watch's thresholds (its `devices` and `log_level` are ignored).
    pub forward: Option<ForwardConfig>,
}

impl LoadConfig {
    /// A load for the route watch alone (its defaults for the forwarding watch).
    pub fn for_route_watch(config: &RouteWatchConfig) -> LoadConfig {
        LoadConfig { log_level: config.log_level, route_watch: Some(config.clone()), forward: None }
    }

    /// A load for the forwarding watch alone.
    pub fn for_forward(config: &ForwardConfig) -> LoadConfig {
        LoadConfig { log_level: config.log_level, route_watch: None, forward: Some(config.clone()) }
    }
}

/// The loaded object, shared by every watch of the process (cheap to clone: one `Arc`).
/// The programs and the maps not handed out are released when the last clone is dropped.
#[derive(Clone)]
pub struct BpfObject {
    shared: Arc<Shared>,
}

struct Shared {
    bytes: &'static [u8],
    config: LoadConfig,
    /// Kernel struct offsets for the fentry/kprobe backends, or why BTF gave none.
    offsets: Result<KernelOffsets, String>,
    /// `task_struct` offsets for naming writers by process, or why there are none (the socket
    /// filter then names them by port).
    task_offsets: Result<TaskOffsets, String>,
    state: Mutex<State>,
}

struct State {
    ebpf: Ebpf,
    /// The log level in effect (the configured one, or off after [`BpfObject::reload_without_logs`]).
    log_level: BpfLogLevel,
    /// Drains `AYA_LOGS` (`None` with the level off).
    _log: Option<BpfLogForwarder>,
    /// Maps handed out with [`BpfObject::take_maps`].
    taken: BTreeSet<&'static str>,
}

impl std::fmt::Debug for BpfObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BpfObject").field("log_level", &self.log_level()).finish_non_exhaustive()
    }
}

impl BpfObject {
    /// Load `bytes` (the embedded ELF) once, with every global of `config`, in the calling
    /// thread's network namespace (the route watch's fentry/kprobe programs watch it). Kernel
    /// BTF is parsed here once when a backend that needs it may be tried.
    ///
    /// # Errors
    /// [`BpfError::NoObject`] for an empty object; [`BpfError::Load`] when a map cannot be
    /// created (`bpf()` refused: every watch is then degraded with this message).
    pub fn load(bytes: &'static [u8], config: LoadConfig) -> Result<BpfObject, BpfError> {
        if bytes.is_empty() {
            return Err(BpfError::NoObject);
        }
        // RLIMIT_MEMLOCK is left alone: kernels >= 5.11 account BPF memory to the memcg, and
        // raising it fails without CAP_SYS_RESOURCE (toolchain.md).
        let hooks = config.route_watch.as_ref().is_some_and(|r| r.backend != Some(RouteWatchBackend::SocketFilter));
        let tasks = config.route_watch.is_some();
        let kernel_btf = if hooks || tasks { btf::Btf::from_sys().map_err(|e| e.to_string()) } else { Err(String::new()) };
        let offsets = if hooks {
            kernel_btf.as_ref().map_err(Clone::clone).and_then(|b| btf::resolve_offsets(b).map_err(|e| e.to_string()))
        } else {
            Err("not resolved: this load does not run the fentry/kprobe backends".to_owned())
        };
        let task_offsets = if tasks {
            kernel_btf.as_ref().map_err(Clone::clone).and_then(|b| btf::resolve_task_offsets(b).map_err(|e| e.to_string()))
        } else {
            Err("not resolved: this load runs no route watch".to_owned())
        };
        drop(kernel_btf);
        let level = config.log_level;
        let globals =
            Globals { offsets: offsets.as_ref().unwrap_or(&KernelOffsets::UNRESOLVED), tasks: task_offsets.as_ref().unwrap_or(&TaskOffsets::UNRESOLVED) };
        let mut ebpf = load_with(bytes, &config, &globals, level)?;
        let log = BpfLogForwarder::start(&mut ebpf, level);
        let state = State { ebpf, log_level: level, _log: log, taken: BTreeSet::new() };
        Ok(BpfObject { shared: Arc::new(Shared { bytes, config, offsets, task_offsets, state: Mutex::new(state) }) })
    }

    /// [`BpfObject::load`] of the object embedded at build time.
    ///
    /// # Errors
    /// As [`BpfObject::load`]; [`BpfError::NoObject`] when none is embedded.
    pub fn load_embedded(config: LoadConfig) -> Result<BpfObject, BpfError> {
        Self::load(super::embedded_object().ok_or(BpfError::NoObject)?, config)
    }

    /// The settings the object was loaded with.
    pub fn config(&self) -> &LoadConfig {
        &self.shared.config
    }

    /// The kernel-side log level in effect: the configured one, or [`BpfLogLevel::Off`] after
    /// [`BpfObject::reload_without_logs`].
    pub fn log_level(&self) -> BpfLogLevel {
        self.lock().log_level
    }

    /// The kernel struct offsets the fentry/kprobe programs were loaded with.
    ///
    /// # Errors
    /// [`BpfError::Btf`] with why BTF gave none (missing, or a hooked prototype changed).
    pub(crate) fn kernel_offsets(&self) -> Result<KernelOffsets, BpfError> {
        self.shared.offsets.clone().map_err(BpfError::Btf)
    }

    /// The `task_struct` offsets the socket filter was loaded with, or why it has none.
    pub(crate) fn task_offsets(&self) -> Result<TaskOffsets, String> {
        self.shared.task_offsets.clone()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Run `f` on the loaded object (to load, attach or describe programs). Do not take maps
    /// through it: [`BpfObject::take_maps`] keeps the record of who holds what.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut Ebpf) -> R) -> R {
        f(&mut self.lock().ebpf)
    }

    /// Hand out `names`, all or none: each map exists once per process, so a map already
    /// handed out is an error, not a second copy.
    ///
    /// # Errors
    /// [`BpfError::Taken`] or [`BpfError::Missing`] for the first map that cannot be given.
    pub(crate) fn take_maps(&self, names: &[&'static str]) -> Result<TakenMaps, BpfError> {
        let mut state = self.lock();
        for name in names {
            if state.taken.contains(name) {
                return Err(BpfError::Taken(name));
            }
            if state.ebpf.map(name).is_none() {
                return Err(BpfError::Missing(name));
            }
        }
        let mut maps = BTreeMap::new();
        for name in names {
            if let Some(map) = state.ebpf.take_map(name) {
                maps.insert(*name, map);
            }
            state.taken.insert(name);
        }
        Ok(TakenMaps(maps))
    }

    /// Load the object again with the kernel-side log level off, replacing this load for
    /// every holder (the socket-filter program with logs too large for the socket, see the
    /// module docs). The old load's programs and maps are released.
    ///
    /// # Errors
    /// [`BpfError::Taken`] when a watch already holds maps of this load (its programs would
    /// keep the old maps); [`BpfError::Load`] when the second load fails.
    pub(crate) fn reload_without_logs(&self) -> Result<(), BpfError> {
        let mut state = self.lock();
        if let Some(first) = state.taken.first() {
            return Err(BpfError::Taken(first));
        }
        let globals = Globals {
            offsets: self.shared.offsets.as_ref().unwrap_or(&KernelOffsets::UNRESOLVED),
            tasks: self.shared.task_offsets.as_ref().unwrap_or(&TaskOffsets::UNRESOLVED),
        };
        let ebpf = load_with(self.shared.bytes, &self.shared.config, &globals, BpfLogLevel::Off)?;
        // The old forwarder (if any) stops with the old load.
        *state = State { ebpf, log_level: BpfLogLevel::Off, _log: None, taken: BTreeSet::new() };
        Ok(())
    }
}

/// The globals resolved from kernel BTF.
struct Globals<'a> {
    offsets: &'a KernelOffsets,
    tasks: &'a TaskOffsets,
}

/// One `EbpfLoader::load` with every global of `config`.
fn load_with(bytes: &[u8], config: &LoadConfig, globals: &Globals<'_>, level: BpfLogLevel) -> Result<Ebpf, BpfError> {
    use routewarden_common::forward as fw;
    use routewarden_common::route_watch as rw;
    let ns = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let route = config.route_watch.clone().unwrap_or_default();
    let route_window_ns = ns(route.window);
    let route_threshold = route.flap_threshold.max(1);
    let failing_threshold = route.failing_threshold.max(2);
    let self_protocol = u32::from(route.self_protocol);
    let stream = u32::from(route.stream_writes);
    let self_tgid = route.self_pid.unwrap_or_else(std::process::id);
    // Read by the fentry/kprobe programs only (a socket filter sees its own namespace).
    let netns = current_netns_inode().unwrap_or(0);
    let forward = config.forward.clone().unwrap_or_else(|| ForwardConfig::for_devices(&[], &[]));
    let forward_window_ns = ns(forward.window);
    let sample_ns = ns(forward.sample_interval);
    let forward_threshold = forward.flap_threshold.max(1);
    let mut loader = EbpfLoader::new();
    loader
        .override_global(rw::GLOBAL_WINDOW_NS, &route_window_ns, true)
        .override_global(rw::GLOBAL_FLAP_THRESHOLD, &route_threshold, true)
        .override_global(rw::GLOBAL_FAILING_THRESHOLD, &failing_threshold, true)
        .override_global(rw::GLOBAL_SELF_PROTOCOL, &self_protocol, true)
        .override_global(rw::GLOBAL_SELF_TGID, &self_tgid, true)
        .override_global(rw::GLOBAL_STREAM_WRITES, &stream, true)
        .override_global(rw::GLOBAL_NETNS_INUM, &netns, true)
        .override_global(rw::GLOBAL_OFFSETS, globals.offsets, true)
        .override_global(rw::GLOBAL_TASK_OFFSETS, globals.tasks, true)
        .override_global(fw::GLOBAL_FLAP_THRESHOLD, &forward_threshold, true)
        .override_global(fw::GLOBAL_WINDOW_NS, &forward_window_ns, true)
        .override_global(fw::GLOBAL_SAMPLE_INTERVAL_NS, &sample_ns, true);
    if let Some(bytes) = route.ring_buffer_bytes {
        loader.map_max_entries(rw::ROUTE_WATCH_EVENTS_MAP, bytes);
    }
    level.apply(&mut loader);
    loader.load(bytes).map_err(|e| BpfError::Load { source: Box::new(e) })
}

/// Maps a watch took from the load ([`BpfObject::take_maps`]), by name. They are the watch's
/// alone and are freed with it.
#[derive(Debug)]
pub struct TakenMaps(BTreeMap<&'static str, Map>);

impl TakenMaps {
    /// The map `name`.
    ///
    /// # Errors
    /// [`BpfError::Missing`] when it was not taken (or was moved out with [`TakenMaps::take`]).
    pub fn map(&self, name: &'static str) -> Result<&Map, BpfError> {
        self.0.get(name).ok_or(BpfError::Missing(name))
    }

    /// The map `name`, to update it.
    ///
    /// # Errors
    /// As [`TakenMaps::map`].
    pub fn map_mut(&mut self, name: &'static str) -> Result<&mut Map, BpfError> {
        self.0.get_mut(name).ok_or(BpfError::Missing(name))
    }

    /// Move the map `name` out (a ring buffer given to its reader task); `None` the second
    /// time.
    pub fn take(&mut self, name: &'static str) -> Option<Map> {
        self.0.remove(name)
    }
}

/// Whether TC programs attach with TCX links (kernel >= 6.6) rather than clsact + netlink.
pub(crate) fn has_tcx() -> bool {
    aya::util::KernelVersion::current().is_ok_and(|v| v >= aya::util::KernelVersion::new(6, 6, 0))
}

/// The classifier `program` of `ebpf`, loaded into the kernel (once: a second watch or a
/// second call finds it loaded).
///
/// # Errors
/// [`BpfError::Missing`], or [`BpfError::Program`] (`type`, `load`).
pub(crate) fn classifier<'a>(ebpf: &'a mut Ebpf, program: &'static str) -> Result<&'a mut SchedClassifier, BpfError> {
    let prog: &mut SchedClassifier = ebpf.program_mut(program).ok_or(BpfError::Missing(program))?.try_into().map_err(BpfError::program("type", program))?;
    match prog.load() {
        Ok(()) | Err(aya::programs::ProgramError::AlreadyLoaded) => Ok(prog),
        Err(e) => Err(BpfError::program("load", program)(e)),
    }
}

/// Attach the (loaded) classifier `program` to `hook` of `dev`: a TCX link (kernel >= 6.6;
/// `first` asks for the front of the hook and falls back to appending when another program
/// holds it), otherwise a clsact netlink filter with a kernel-chosen priority. Returns the
/// owned link (dropping it detaches) and the mode, `tcx` or `clsact`.
///
/// # Errors
/// [`BpfError::Attach`] naming the device, hook and mode.
pub(crate) fn attach_classifier(
    prog: &mut SchedClassifier,
    program: &'static str,
    dev: &str,
    hook: TcAttachType,
    first: bool,
) -> Result<(SchedClassifierLink, &'static str), BpfError> {
    let hook_label = if hook == TcAttachType::Ingress { "ingress" } else { "egress" };
    let attach_err = |mode, e| BpfError::Attach { program, iface: dev.to_string(), hook: hook_label, mode, source: Box::new(e) };
    let (id, mode) = if has_tcx() {
        let order = if first { LinkOrder::first() } else { LinkOrder::default() };
        match prog.attach_with_options(dev, hook, TcAttachOptions::TcxOrder(order)) {
            Ok(id) => (id, "tcx"),
            Err(first_err) if first => {
                tracing::info!(device = dev, program, error = %first_err, "cannot attach first on the TCX hook; appending");
                let id = prog.attach_with_options(dev, hook, TcAttachOptions::TcxOrder(LinkOrder::default())).map_err(|e| attach_err("tcx", e))?;
                (id, "tcx")
            }
            Err(e) => return Err(attach_err("tcx", e)),
        }
    } else {
        // EEXIST when Calico/Cilium (or we) already added it.
        let _ = tc::qdisc_add_clsact(dev);
        let id = prog.attach_with_options(dev, hook, TcAttachOptions::Netlink(NlOptions::default())).map_err(|e| attach_err("clsact", e))?;
        (id, "clsact")
    };
    let link = prog.take_link(id).map_err(|e| attach_err(mode, e))?;
    Ok((link, mode))
}
