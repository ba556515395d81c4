//! The agent's event loop (`routewarden run`).
//!
//! Watchers only observe and send typed events; handlers own the logic and the state and are
//! the only places with side effects (DESIGN.md):
//!
//! - watchers: the datastore task ([`crate::datastore`]), the netlink route/link watcher
//!   ([`crate::dataplane::spawn_watcher`]), timers, signals;
//! - handlers: this loop's cluster handler (`cluster`: [`crate::plan::plan`] → dataplane
//!   commands, ownership metrics), the dataplane task ([`crate::dataplane::run`], which owns
//!   the route table) and its apply reports (`apply`: metrics, logs, readiness), the audit
//!   (`audit`, `--mode audit`), the BPF watches (one [`crate::bpf::watch::WatchHandler`] each,
//!   all from one load of the object), and the metrics/health state read by the HTTP server.
//!
//! This file holds [`run`]: the start-up sequence and the loop that hands each event to its
//! handler.

mod apply;
mod audit;
mod cluster;
pub mod flags;
pub mod logging;
pub mod memory;
pub mod node_events;
mod table_rule;
pub mod view;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::sync::mpsc;
use tracing::info;

use crate::bpf::forward::ForwardWatch;
use crate::bpf::loader::{BpfObject, LoadConfig};
use crate::bpf::route_watch::RouteWatch;
use crate::bpf::tc_count::{Direction, TcCounter};
use crate::bpf::watch::WatchHandler;
use crate::dataplane::{self, ApplyReport, DataplaneConfig, KernelDump, Reconciler, RtNetlink, SystemClock};
use crate::datastore::{Datastore, DatastoreEvent, FileDatastore, KubernetesDatastore};
use crate::observe::http::HttpServer;
use crate::observe::{Health, Metrics, StatusBoard};
use crate::ownership::{OwnershipConfig, Role, VersionChoice};
use crate::plan::{Plan, PlanConfig};
use crate::routes::RouteDevices;
use apply::{record_report, ReportLog};
use audit::AuditHandler;
use cluster::{ClusterHandler, HostNicAuto};
use flags::{DatastoreSpec, Mode, RunArgs};

/// Hand the forwarding watch, when it runs, the destinations of `plan` (the last plan), from
/// what changed since the ones it was last given (`kept`).
fn update_forward_destinations(forward: &mut WatchHandler<ForwardWatch>, plan: Option<&Plan>, kept: &mut crate::bpf::forward::EntriesMemo, metrics: &Metrics) {
    if let (Some(plan), Some(w)) = (plan, forward.watch_mut()) {
        w.update_destinations(&kept.entries(&plan.desired, &plan.expected, &plan.programmed), metrics);
    }
}

/// How often the BPF watches' counters are read into metrics.
const COUNTER_POLL: Duration = Duration::from_secs(1);

/// The latest the forwarding watch starts in program mode when no apply has been reported
/// (a datastore that does not sync); normally it starts with the first apply's report.
const FORWARD_START_LATEST: Duration = Duration::from_secs(5);

/// The forwarding watch's destinations for a plan: routewarden's desired routes for the
/// classes it programs, the expectation for the others
/// ([`crate::bpf::forward::entries_from_routes`]). Built here, in the app, so that the plan
/// knows nothing of the BPF side and the BPF side nothing of the plan.
pub fn forward_entries(plan: &Plan) -> Vec<crate::bpf::forward::ForwardEntry> {
    crate::bpf::forward::entries_from_routes(plan.desired.values().map(|r| &**r), plan.expected.values(), &plan.programmed)
}

/// Where the route watch judges conflicts and flaps under `plan`: inside the cluster's valid
/// IP pools (every class), and routewarden's own protocol in its table .
pub fn episode_scope(plan: &Plan) -> crate::bpf::route_watch::EpisodeScope {
    let mut pools: Vec<ipnet::IpNet> = plan.decision.pools.iter().map(|p| p.cidr).collect();
    pools.sort();
    pools.dedup();
    crate::bpf::route_watch::EpisodeScope { pools, protocol: plan.policy.protocol, table: plan.policy.table }
}

/// The datastore events to handle now, starting with `first`: when `first` is a snapshot and
/// newer snapshots already wait right behind it, only the newest of that run (each is the
/// whole view, so the older ones would be planned only to be replaced; at 100,000 blocks a
/// plan takes most of a second and queued snapshots would add up). Any other
/// event ends the run and is returned after it, in order: a snapshot is never moved past a
/// `Synced`, `Unsynced` or `LoadFailed`, so the view in force when deletions are allowed or
/// held is the one it was. Never waits.
pub fn newest_adjacent(first: DatastoreEvent, rx: &mut mpsc::Receiver<DatastoreEvent>) -> Vec<DatastoreEvent> {
    let mut out = vec![first];
    let mut skipped = 0u32;
    while matches!(out[0], DatastoreEvent::Snapshot(_)) && out.len() == 1 {
        match rx.try_recv() {
            Ok(next @ DatastoreEvent::Snapshot(_)) => {
                out[0] = next;
                skipped += 1;
            }
            Ok(other) => out.push(other),
            Err(_) => break,
        }
    }
    if skipped > 0 {
        tracing::debug!(skipped, "datastore: planned only the newest of adjacent snapshots");
    }
    out
}

/// Resolve this node's name: `--node`, else the host name.
///
/// # Errors
/// Fails when neither is available.
pub fn node_name(node: Option<&str>) -> Result<String> {
    match node {
        Some(n) if !n.is_empty() => Ok(n.to_string()),
        _ => nix::unistd::gethostname()
            .context("--node not given and the host name is unreadable")?
            .into_string()
            .map_err(|_| anyhow::anyhow!("--node not given and the host name is not UTF-8")),
    }
}

/// Build the ownership config from the flags.
///
/// # Errors
/// An unknown role or release line (`auto` or 3.26 and later), naming the flag.
pub fn ownership_config(role: &str, version: &str, mode: Mode, node: &str) -> Result<OwnershipConfig> {
    let role: Role = if mode == Mode::Audit { Role::Audit } else { role.parse().map_err(|e| anyhow::anyhow!("--role {role:?}: {e}"))? };
    let version: VersionChoice = version.parse().map_err(|e| anyhow::anyhow!("--calico-version {version:?}: {e}"))?;
    Ok(OwnershipConfig { role, version, node: Some(node.to_string()) })
}

/// `routewarden run`: run until SIGTERM/SIGINT.
#[expect(clippy::too_many_lines, reason = "one linear start-up sequence: watchers, handlers, then the loop; splitting it hides the data flow")]
///
/// # Errors
/// Bad flags, an HTTP address that cannot be bound, or a netlink socket that cannot be opened.
/// Datastore and BPF failures are reported and survived, never fatal.
pub async fn run(args: RunArgs) -> Result<()> {
    // The stop signals are taken before anything else: in a container the agent is PID 1, for
    // which the kernel drops a signal that has no handler, so a SIGTERM during start-up (the
    // BPF load takes tens of milliseconds) would be lost and `kubectl delete pod` would end in
    // SIGKILL after the grace period. Taken here, it ends the loop as soon as it starts.
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let node = node_name(args.cluster.node.as_deref())?;
    let ownership = ownership_config(args.cluster.role.as_deref().unwrap_or("felix"), &args.cluster.calico_version, args.mode, &node)?;
    let mut devices = RouteDevices { tunnel: args.cluster.tunnel_device.clone(), host_nic: args.cluster.host_device.clone() };
    devices.validate()?;
    // `auto`: found from the first snapshot (this node's Calico address) and looked up again
    // as links change; until then nothing is planned and the watches leave the NIC alone.
    let host_auto = devices.host_nic == crate::dataplane::tasks::host_nic::AUTO;
    if host_auto {
        devices.host_nic.clear();
    }
    let dp_config = DataplaneConfig {
        protocol: args.cluster.route_protocol,
        metric: args.cluster.route_metric,
        table: args.cluster.route_table,
        devices: devices.clone(),
        resync_interval: Duration::from_secs(args.resync_interval.max(1)),
        handover_grace: Duration::from_secs(args.handover_grace),
        mass_deletion_percent: args.mass_deletion_threshold,
        settle: Duration::from_secs(args.settle_period),
        nexthop_objects: args.nexthop_objects,
    };
    dp_config.validate()?;
    info!(
        version = env!("CARGO_PKG_VERSION"),
        %node,
        mode = ?args.mode,
        role = ?ownership.role,
        calico_version = %args.cluster.calico_version,
        protocol = dp_config.protocol,
        metric = dp_config.metric,
        table = dp_config.table,
        nexthop_objects = dp_config.nexthop_objects,
        bpf_object = crate::bpf::embedded_object().map_or("not embedded", |_| "embedded"),
        "routewarden starting"
    );

    let (registry, metrics) = Metrics::new_registry();
    let health = Arc::new(Health::default());
    health.progress();
    let mode_label = match args.mode {
        Mode::Program => "program",
        Mode::Audit => "audit",
    };
    let status = Arc::new(StatusBoard::new(&node, mode_label, &ownership.role.to_string()));
    let http_limits = args.http_limits();
    let http_server = HttpServer::bind(args.metrics_addr, crate::observe::http::router(registry, health.clone(), status.clone()), http_limits)
        .await
        .context("--metrics-addr")?;
    info!(
        addr = %args.metrics_addr,
        header_timeout_s = http_limits.header_read_timeout.as_secs(),
        idle_timeout_s = http_limits.idle_timeout.as_secs(),
        max_connections = http_limits.max_connections,
        request_timeout_s = http_limits.request_timeout.as_secs(),
        "serving /metrics, /healthz, /readyz, /status/v1"
    );
    let http = tokio::spawn(http_server.run());

    // Watchers.
    let (ds_tx, mut ds_rx) = mpsc::channel(16);
    let mut kube_client = None;
    let datastore = match args.cluster.required_datastore_spec()? {
        DatastoreSpec::File(path) => FileDatastore::new(path)
            .with_options(crate::datastore::FileOptions {
                settle: Duration::from_secs(args.settle_period),
                max_file_size: args.cluster.datastore_max_file_size,
                ..crate::datastore::FileOptions::default()
            })
            .spawn(ds_tx),
        DatastoreSpec::Kubernetes(opts) => {
            let ds = KubernetesDatastore::connect(&opts).await.context("--datastore kubernetes")?;
            info!(datastore = %ds.describe(), "reading the cluster from the API server");
            kube_client = Some(ds.client());
            ds.spawn(ds_tx)
        }
        DatastoreSpec::Etcd(opts) => {
            // Settings that can never connect stop the agent here, not in a retry loop.
            opts.check().context("--datastore etcd")?;
            let ds = crate::datastore::EtcdDatastore::new(opts);
            info!(datastore = %ds.describe(), "reading the cluster from etcd");
            ds.spawn(ds_tx)
        }
    };
    let mut node_events = node_events::start(args.node_events, kube_client, &node, Duration::from_secs(args.route_watch_window), &metrics)?;

    // The dataplane handler (program mode) owns the route table.
    let (report_tx, mut report_rx) = mpsc::channel::<ApplyReport>(64);
    let mut dataplane_task = None;
    let commands = if args.mode == Mode::Program {
        let (cmd_tx, cmd_rx) = mpsc::channel(16);
        let (ev_tx, ev_rx) = mpsc::channel(4096);
        let watcher = dataplane::spawn_watcher(ev_tx).context("subscribe to route and link notifications")?;
        let nl = RtNetlink::connect().context("open the rtnetlink socket")?;
        let reconciler = Reconciler::new(dp_config.clone(), dp_config.base_policy(), nl, SystemClock);
        dataplane_task = Some((watcher, tokio::spawn(dataplane::run(reconciler, cmd_rx, ev_rx, report_tx, dataplane::DEFAULT_DEBOUNCE))));
        Some(cmd_tx)
    } else {
        None
    };
    let mut auditor = if args.mode == Mode::Audit {
        Some(AuditHandler { nl: KernelDump::connect().context("open the rtnetlink socket")?, last_findings: Vec::new() })
    } else {
        None
    };

    // `--route-table` other than main: the policy rules that select it (and ours, if asked).
    let mut table_rules = if args.mode == Mode::Program {
        table_rule::TableRuleHandler::new(
            KernelDump::connect().context("open the rtnetlink socket")?,
            dp_config.table,
            args.route_table_rule_priority,
            dp_config.protocol,
        )
    } else {
        None
    };

    // The TC watches' devices for a host NIC (empty: not known yet, `--host-device auto`).
    let tunnel_dev = devices.tunnel.clone();
    let tc_devices_for = |host_nic: &str| -> Vec<String> {
        if args.tc_devices.is_empty() {
            [host_nic, tunnel_dev.as_str()].into_iter().filter(|d| !d.is_empty()).map(str::to_owned).collect()
        } else {
            args.tc_devices.clone()
        }
    };
    let forward_config_for = |host_nic: &str| {
        let or_default =
            |list: &[String], dev: &str| if list.is_empty() { [dev].into_iter().filter(|d| !d.is_empty()).map(str::to_owned).collect() } else { list.to_vec() };
        let mut c = crate::bpf::forward::ForwardConfig::for_devices(
            &or_default(&args.forward_tunnel_devices, &tunnel_dev),
            &or_default(&args.forward_host_devices, host_nic),
        );
        c.flap_threshold = args.forward_flap_threshold;
        c.window = Duration::from_secs(args.forward_flap_window);
        c.log_level = args.bpf_log_level;
        c
    };
    // Route-churn watch (`bpf::route_watch`): every route write in this namespace.
    let route_watch_config = crate::bpf::route_watch::RouteWatchConfig {
        backend: args.route_watch_backend,
        window: Duration::from_secs(args.route_watch_window),
        flap_threshold: args.route_watch_flap_threshold,
        failing_threshold: args.route_watch_failing_threshold,
        self_protocol: dp_config.protocol,
        log_level: args.bpf_log_level,
        ..Default::default()
    };
    // One load of the BPF object for every watch (`bpf::loader`): each map exists once. A load
    // that fails (no object, `bpf()` refused) degrades every watch with its reason.
    let object = BpfObject::load_embedded(LoadConfig {
        log_level: args.bpf_log_level,
        route_watch: Some(route_watch_config),
        forward: Some(forward_config_for(&devices.host_nic)),
    })
    .map_err(Arc::new);
    let from_object = |object: &Result<BpfObject, Arc<crate::bpf::BpfError>>| object.clone().map_err(crate::bpf::BpfError::Object);
    // The route watch first: its socket-filter fallback without kernel logs loads the object
    // again, which only works before another watch holds maps of it.
    let mut route_watch = WatchHandler::start(from_object(&object).and_then(|o| RouteWatch::start_in(&o)), &metrics, &health);
    // Forwarding watch (`bpf::forward`): TC egress on the tunnel device and host NIC. In
    // program mode it starts once the first apply with a plan's routes is reported (or
    // FORWARD_START_LATEST after the loop starts, if none is): its program's verification
    // and the fill of its destinations are then not on the way of a cold node's first routes
    // into the kernel. It counts packets, which nothing before the first apply routes anyway.
    let start_forward = |nic: &str| from_object(&object).and_then(|o| ForwardWatch::start_in(&o, &forward_config_for(nic)));
    let mut forward_deferred = args.mode == Mode::Program;
    let mut forward = if forward_deferred { WatchHandler::not_started() } else { WatchHandler::start(start_forward(&devices.host_nic), &metrics, &health) };
    let forward_start_latest = tokio::time::Instant::now() + FORWARD_START_LATEST;
    // The build-chain demo probe, only with --tc-count.
    let start_tc_count = |nic: &str| from_object(&object).and_then(|o| TcCounter::attach_in(&o, &tc_devices_for(nic), Direction::Egress));
    let mut tc_count = args.tc_count.then(|| WatchHandler::start(start_tc_count(&devices.host_nic), &metrics, &health));

    let mut cluster = ClusterHandler {
        config: PlanConfig { node: node.clone(), ownership, devices, protocol: dp_config.protocol, table: dp_config.table },
        mode: args.mode,
        metrics: metrics.clone(),
        health: health.clone(),
        status: status.clone(),
        programmed: BTreeSet::new(),
        view: view::ViewState::default(),
        last: None,
        plan_memo: crate::plan::PlanMemo::default(),
        commands,
        host_nic: if host_auto {
            Some(HostNicAuto { nl: KernelDump::connect().context("open the rtnetlink socket")?, error: None, snapshot: None, changed: false })
        } else {
            None
        },
    };

    // The watches' start-up (kernel BTF parsed, ~20 MB) is done: give it back.
    memory::release_free_heap();
    // Set by work that allocates and frees a lot (a datastore snapshot, an apply); the free
    // heap is released at the next counter tick, so a burst of events costs one trim.
    let mut trim_pending = false;
    let mut report_log = ReportLog::default();
    // The forwarding entries of the last plan, to give the watch the next plan's from what
    // changed (a pass over every route per plan would cost tens of ms at 100,000 blocks).
    let mut forward_kept = crate::bpf::forward::EntriesMemo::default();

    let mut counters = tokio::time::interval(COUNTER_POLL);
    let mut heartbeat = tokio::time::interval(Duration::from_secs(5));
    let mut audit_tick = tokio::time::interval(dp_config.resync_interval);
    let reason = loop {
        tokio::select! {
            ev = ds_rx.recv() => match ev {
                Some(ev) => {
                    for ev in newest_adjacent(ev, &mut ds_rx) {
                        let snapshot = matches!(ev, DatastoreEvent::Snapshot(_));
                        trim_pending |= snapshot;
                        // A snapshot whose plan is the last one changes nothing downstream: at
                        // 100,000 blocks the forwarding entries and the audit are a pass over
                        // every route each.
                        let replanned = cluster.on_datastore(ev).await;
                        if replanned {
                            update_forward_destinations(&mut forward, cluster.last.as_ref(), &mut forward_kept, &metrics);
                            if let (Some(plan), Some(w)) = (cluster.last.as_ref(), route_watch.watch_mut()) {
                                w.set_episode_scope(episode_scope(plan));
                            }
                            if let Some(plan) = cluster.last.as_ref() {
                                node_events.on_plan(plan);
                            }
                            table_rule::recheck(table_rules.as_mut(), cluster.last.as_ref(), &metrics, &health).await;
                        }
                        if replanned || !snapshot {
                            if let (Some(a), Some(plan)) = (auditor.as_mut(), cluster.last.as_ref()) {
                                a.audit(plan, &metrics, &health, &status).await;
                            }
                        }
                    }
                }
                None => break DATASTORE_ENDED,
            },
            _ = audit_tick.tick(), if auditor.is_some() || table_rules.is_some() => {
                if let (Some(a), Some(plan)) = (auditor.as_mut(), cluster.last.as_ref()) {
                    a.audit(plan, &metrics, &health, &status).await;
                }
                table_rule::recheck(table_rules.as_mut(), cluster.last.as_ref(), &metrics, &health).await;
            }
            Some(report) = report_rx.recv() => {
                if forward_deferred && report.desired_sets > 0 {
                    forward_deferred = false;
                    forward = WatchHandler::start(start_forward(&cluster.config.devices.host_nic), &metrics, &health);
                    update_forward_destinations(&mut forward, cluster.last.as_ref(), &mut forward_kept, &metrics);
                }
                record_report(&metrics, &health, &status, &report, &mut report_log, dp_config.mass_deletion_percent, dp_config.settle);
                node_events.on_report(&report, dp_config.mass_deletion_percent, dp_config.settle);
                trim_pending = true;
            }
            _ = counters.tick() => {
                if std::mem::take(&mut trim_pending) {
                    memory::release_free_heap();
                }
                // A destination write that failed is retried here: a snapshot that makes no
                // new plan (most churn) no longer brings the entries again.
                if forward.watch_mut().is_some_and(|w| w.destinations_pending()) {
                    update_forward_destinations(&mut forward, cluster.last.as_ref(), &mut forward_kept, &metrics);
                }
                route_watch.poll(&metrics, &health);
                forward.poll(&metrics, &health);
                if let Some(t) = tc_count.as_mut() {
                    t.poll(&metrics, &health);
                }
            }
            Some(ev) = route_watch.next_event() => {
                route_watch.on_event(&metrics, &ev);
                status.record_route_watch(&ev, crate::observe::status::unix_now());
                node_events.on_route_watch(&ev);
                if matches!(ev, crate::bpf::route_watch::RouteWatchEvent::RuleChange { .. }) {
                    table_rule::recheck(table_rules.as_mut(), cluster.last.as_ref(), &metrics, &health).await;
                }
            }
            Some(ev) = forward.next_event() => forward.on_event(&metrics, &ev),
            () = tokio::time::sleep_until(forward_start_latest), if forward_deferred => {
                forward_deferred = false;
                info!(after_s = FORWARD_START_LATEST.as_secs(), "no apply yet; starting the forwarding watch");
                forward = WatchHandler::start(start_forward(&cluster.config.devices.host_nic), &metrics, &health);
                update_forward_destinations(&mut forward, cluster.last.as_ref(), &mut forward_kept, &metrics);
            },
            _ = heartbeat.tick() => {
                // `--host-device auto`: links and addresses change (a NIC renamed, an address
                // moved); look again every heartbeat.
                cluster.recheck_host_nic().await;
            },
            _ = sigint.recv() => break "SIGINT",
            _ = sigterm.recv() => break "SIGTERM",
        }
        if let Some(nic) = cluster.take_host_nic_change() {
            // The TC watches follow the host NIC: moved when running (counters and
            // destinations carry on), started when they could not start before.
            let devices = forward_config_for(&nic).devices;
            // Started here if it was not (a deferred start included).
            forward_deferred = false;
            forward.follow(&metrics, &health, |w| w.set_devices(&devices).map(|_| ()), || start_forward(&nic));
            update_forward_destinations(&mut forward, cluster.last.as_ref(), &mut forward_kept, &metrics);
            if let Some(t) = tc_count.as_mut() {
                let devices = tc_devices_for(&nic);
                t.follow(&metrics, &health, |w| w.set_devices(&devices), || start_tc_count(&nic));
            }
        }
        health.progress();
    };
    info!(reason, "shutting down; programmed routes stay in the kernel");
    // Routes stay: a restart must not make peers or this node lose routes (scenario S04). A
    // datastore that stopped by itself ends the agent with its error (exit 1, the reason in
    // the log and the pod's last state), never as a clean exit.
    let stopped = if reason == DATASTORE_ENDED {
        Some(datastore_stopped(datastore.await))
    } else {
        datastore.abort();
        None
    };
    if let Some((watcher, task)) = dataplane_task {
        watcher.abort();
        task.abort();
    }
    http.abort();
    drop(tc_count);
    drop(forward);
    drop(route_watch);
    stopped.map_or(Ok(()), Err)
}

/// The shutdown reason when the datastore task ended while the agent ran.
const DATASTORE_ENDED: &str = "datastore task ended";

/// Why the agent stops when its datastore task ended by itself: the task's own error (a
/// datastore that cannot run in this build, say), or that it ended with none. The task only
/// ends without an error when nobody listens any more, so either way it is an error to exit on.
fn datastore_stopped(joined: Result<Result<(), crate::datastore::DatastoreError>, tokio::task::JoinError>) -> anyhow::Error {
    match joined {
        Ok(Err(e)) => anyhow::Error::new(e).context("the datastore stopped"),
        Ok(Ok(())) => anyhow::anyhow!("the datastore stopped without an error"),
        Err(e) => anyhow::Error::new(e).context("the datastore task failed"),
    }
}

#[cfg(test)]
mod tests;
