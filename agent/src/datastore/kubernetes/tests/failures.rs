//! When the API server fails the datastore: 410 Gone, a silent watch, the server away or hung, backoff and jitter, the
//! list settle period and the mass-deletion breaker.

use super::*;

/// A synced datastore over a pool and two IPAM blocks (lists at resourceVersion 100), with the
/// ipamblocks re-list scripted (at 200, one block deleted meanwhile) and its watch after it.
/// Returns the fake, the first watches, the re-listed watch (kept open) and the datastore.
async fn two_blocks_then_one_relisted(
    group: CalicoGroup,
) -> (StdArc<FakeApi>, BTreeMap<&'static str, UnboundedSender<Bytes>>, UnboundedSender<Bytes>, Running) {
    let (api, watches, blocks) = two_blocks_scripted(group);
    api.json(&format!("GET {blocks}"), list(group, "ipamblocks", "200", &[block("10-244-1-0-26", "2", "10.244.1.0/26", "a")]));
    let relisted_watch = api.watch(&blocks);
    let mut ds = Running::start(&api, ApiGroupChoice::Auto);
    let s = ds.snapshot().await;
    assert_eq!(ds.next().await, DatastoreEvent::Synced);
    assert_eq!(s.cluster.ipam_blocks.len(), 2);
    api.take_log();
    (api, watches, relisted_watch, ds)
}

#[tokio::test]
async fn gone_410_during_watch_relists_and_applies_deletions_only_then() {
    let group = CalicoGroup::CrdV1;
    let (api, watches, _relisted_watch, mut ds) = two_blocks_then_one_relisted(group).await;

    // A bookmark moves the resourceVersion on; then the server says 410 Gone.
    let w = &watches["ipamblocks"];
    w.unbounded_send(event("BOOKMARK", &json!({"apiVersion": "crd.projectcalico.org/v1", "kind": "IPAMBlock", "metadata": {"resourceVersion": "150"}})))
        .unwrap();
    w.unbounded_send(event("ERROR", &status(410, "Expired", "too old resource version: 150 (190)"))).unwrap();
    let DatastoreEvent::Unsynced { reason } = ds.next().await else { panic!("expected Unsynced") };
    assert_eq!(reason, "ipamblocks.crd.projectcalico.org: watch ended with an error: too old resource version: 150 (190) (410 Expired)");
    let events = ds.until_synced().await;
    assert_deletion_only_after_the_relist(&events);
    // Exactly one re-list of that resource, then a watch from the new list's version.
    assert_eq!(api.take_log(), vec![list_url(group, "ipamblocks"), watch_url(group, "ipamblocks", "200")]);
}

/// A hung watch: the API server answers, but one resource's watch stops delivering.
/// Once the watch has had a bookmark, events keep it alive; silence past
/// `--kube-watch-silence` (90 s) makes the datastore unsynced with a `stale` reason, counts it
/// (`LoadFailed` with code `stale`), and re-lists that resource only; every snapshot before
/// the re-list keeps every object. Watches that never had a bookmark (a server that sends
/// none) are never called stale. Virtual time from the first sync on.
#[tokio::test]
async fn a_silent_watch_after_a_bookmark_is_stale_and_relisted() {
    let group = CalicoGroup::CrdV1;
    let (api, watches, _relisted_watch, mut ds) = two_blocks_then_one_relisted(group).await;
    tokio::time::pause();
    let lists_and_watches = |log: Vec<String>| log.into_iter().filter(|l| !l.contains("/version")).collect::<Vec<_>>();

    // A bookmark arms the check; an event every 60 s for 3 minutes keeps the watch current.
    let w = &watches["ipamblocks"];
    w.unbounded_send(event("BOOKMARK", &json!({"apiVersion": "crd.projectcalico.org/v1", "kind": "IPAMBlock", "metadata": {"resourceVersion": "150"}})))
        .unwrap();
    for rv in ["151", "152", "153"] {
        tokio::time::sleep(Duration::from_mins(1)).await;
        w.unbounded_send(event("MODIFIED", &block("10-244-1-0-26", rv, "10.244.1.0/26", "a"))).unwrap();
    }
    let last_event = tokio::time::Instant::now();
    ds.quiet(1).await;

    // Then nothing: stale 90 s after the last event; the other watches, silent for 4.5 minutes
    // but never bookmarked, are not.
    let mut next = async || tokio::time::timeout(Duration::from_mins(5), ds.rx.recv()).await.expect("an event").expect("running");
    let reason = "ipamblocks.crd.projectcalico.org: stale: no event and no bookmark for 90 s although the API server sends a bookmark every 60 s; re-listing";
    assert_eq!(next().await, DatastoreEvent::Unsynced { reason: reason.to_owned() });
    let noticed = last_event.elapsed();
    assert!(noticed >= Duration::from_secs(90) && noticed <= Duration::from_secs(91), "noticed after {noticed:?}");
    assert_eq!(next().await, DatastoreEvent::LoadFailed(LoadError::new("ipamblocks.crd.projectcalico.org", LoadErrorKind::Stale, reason)));
    let events = ds.until_synced().await;
    assert_deletion_only_after_the_relist(&events);
    // The ipamblocks watch from 100, then exactly one re-list of that resource and a watch
    // from the new list's version; no other resource was touched.
    assert_eq!(lists_and_watches(api.take_log()), vec![list_url(group, "ipamblocks"), watch_url(group, "ipamblocks", "200")]);
}

#[tokio::test]
async fn api_server_away_keeps_the_view_and_recovery_syncs_again() {
    let group = CalicoGroup::CrdV1;
    let api = StdArc::new(FakeApi::default());
    script_discovery(&api, group);
    let mut objects = Objects::new();
    objects.insert("ippools", vec![pool("p", "1", "10.244.0.0/16")]);
    objects.insert(
        "nodes",
        vec![node("a", "5", &json!({"projectcalico.org/IPv4Address": "10.0.0.1/24"}), &json!([{"type": "InternalIP", "address": "10.0.0.1"}]))],
    );
    let mut watches = script_lists(&api, group, &objects, "100");
    let mut ds = Running::start(&api, ApiGroupChoice::Auto);
    let _ = ds.snapshot().await;
    assert_eq!(ds.next().await, DatastoreEvent::Synced);
    api.take_log();

    // The API server goes away: the pool watch ends, re-watching fails, then listing fails
    // with 503, then the list works again.
    let pools = path(group, "ippools");
    api.on(&format!("WATCH {pools}"), Reply::Unreachable);
    api.on(&format!("GET {pools}"), Reply::Json(StatusCode::SERVICE_UNAVAILABLE, status(503, "ServiceUnavailable", "apiserver is shutting down")));
    let back = api.deferred(&format!("GET {pools}"));
    let _w2 = api.watch(&pools);
    drop(watches.remove("ippools"));

    // While it is away: Unsynced (the watch could not be restarted), again when the reason
    // changes (the list fails with 503), and a snapshot that keeps every object and names the
    // broken resource (so the app deletes nothing).
    let mut reasons = Vec::new();
    let outage = loop {
        match ds.next().await {
            DatastoreEvent::Unsynced { reason } => reasons.push(reason),
            DatastoreEvent::Snapshot(s) => break s,
            other => panic!("unexpected {other:?}"),
        }
    };
    while reasons.len() < 2 {
        let DatastoreEvent::Unsynced { reason } = ds.next().await else { panic!("expected Unsynced") };
        reasons.push(reason);
    }
    assert_eq!(
        reasons,
        vec![
            "ippools.crd.projectcalico.org: watch failed to start: ServiceError: connection refused".to_owned(),
            "ippools.crd.projectcalico.org: list failed: apiserver is shutting down (503 ServiceUnavailable)".to_owned(),
        ]
    );
    assert!(outage.cluster.ip_pools.contains_key("p") && outage.cluster.nodes.contains_key("a"));
    assert_eq!(outage.load_errors.len(), 1);
    assert_eq!(outage.load_errors[0].file, PathBuf::from("ippools.crd.projectcalico.org"));
    // Retries of a list that keeps failing the same way are not reported again.
    ds.quiet(100).await;

    // Back: one snapshot without the load error, then Synced.
    back.send(Reply::Json(StatusCode::OK, list(group, "ippools", "300", &[pool("p", "1", "10.244.0.0/16")]))).ok().unwrap();
    let events = ds.until_synced().await;
    let [DatastoreEvent::Snapshot(s), DatastoreEvent::Synced] = &events[..] else { panic!("{events:?}") };
    assert!(s.load_errors.is_empty() && s.cluster.ip_pools.contains_key("p"));
    // Requests: re-watch from the last version (kube-runtime), failed; a fresh list (503);
    // the held list (ok), then a watch from it.
    assert_eq!(
        api.take_log(),
        vec![watch_url(group, "ippools", "100"), list_url(group, "ippools"), list_url(group, "ippools"), watch_url(group, "ippools", "300"),]
    );
    ds.quiet(100).await;
}

/// Bad input row 17: the API server answers a re-list with an empty IPAMBlock list (CRDs
/// reinstalled, a restored backup, a broken aggregation layer). The agent's pipeline — this
/// datastore, the view, the plan and the reconciler over a fake kernel — deletes none of
/// node-a's seven routes: the mass-deletion breaker holds them; the list restored within the
/// settle period costs no route and no write. (That a deletion wanted for the whole settle
/// period goes through is `dataplane::reconciler::tests::deletions::mass_deletion_is_held_for_the_settle_period`.)
#[tokio::test]
async fn empty_relist_is_held_by_the_breaker_and_a_restored_list_costs_nothing() {
    use crate::app::view::ViewState;
    use crate::dataplane::fake::{FakeClock, FakeNetlink};
    use crate::dataplane::{DataplaneConfig, Reconciler};
    use crate::plan::{plan, Plan, PlanConfig};
    use crate::routes::RouteDevices;

    struct Pipeline {
        view: ViewState,
        config: PlanConfig,
        last: Option<Plan>,
        r: Reconciler<FakeNetlink, FakeClock>,
    }
    impl Pipeline {
        async fn feed(&mut self, ev: &DatastoreEvent) -> crate::dataplane::ApplyReport {
            self.view.on_event(ev);
            if let DatastoreEvent::Snapshot(s) = ev {
                let previous = self.last.as_ref().map(|p| p.programmed.clone()).unwrap_or_default();
                let owned = self.last.as_ref().map(|p| p.policy.owned.clone()).unwrap_or_default();
                let p = plan(s, &self.config, &previous, &owned);
                self.r.set_policy(p.policy.clone());
                self.r.set_desired_with_handover(&p.desired.values().map(|r| (**r).clone()).collect::<Vec<_>>(), &p.handovers);
                self.last = Some(p);
            }
            self.r.set_datastore_synced(self.view.deletions_allowed(self.last.as_ref()));
            self.r.apply().await
        }
    }

    let group = CalicoGroup::CrdV1;
    let objects = cluster_objects(&examples_cluster(), group);
    let api = StdArc::new(FakeApi::default());
    script_discovery(&api, group);
    let watches = script_lists(&api, group, &objects, "100");
    let blocks_path = path(group, "ipamblocks");
    // The re-list after the first 410: empty. After the second: everything back.
    api.json(&format!("GET {blocks_path}"), list(group, "ipamblocks", "200", &[]));
    let second_watch = api.watch(&blocks_path);
    api.json(&format!("GET {blocks_path}"), list(group, "ipamblocks", "300", &objects["ipamblocks"]));
    let _third_watch = api.watch(&blocks_path);

    let nl = FakeNetlink::with_links(&[(1, "lo"), (2, "eth0"), (3, "tunl0")]);
    let clock = FakeClock::new();
    let cfg = DataplaneConfig::default();
    let ownership = felix("node-a");
    let mut p = Pipeline {
        view: ViewState::default(),
        config: PlanConfig { node: "node-a".into(), ownership, devices: RouteDevices::default(), protocol: 80, table: 254 },
        last: None,
        r: Reconciler::new(cfg.clone(), cfg.base_policy(), nl.clone(), clock.clone()),
    };
    let mut ds = Running::start(&api, ApiGroupChoice::Auto);
    for ev in ds.until_synced().await {
        p.feed(&ev).await;
    }
    let healthy = nl.state().routes.clone();
    assert_eq!(healthy.len(), 7, "node-a's IPIP routes: {healthy:#?}");
    let lines = |nl: &FakeNetlink| nl.state().routes.keys().map(ToString::to_string).collect::<Vec<_>>();
    let healthy_lines = lines(&nl);
    nl.take_log();

    // 410, then the empty re-list.
    watches["ipamblocks"].unbounded_send(event("ERROR", &status(410, "Expired", "too old resource version"))).unwrap();
    let mut held = 0;
    for ev in ds.until_synced().await {
        let rep = p.feed(&ev).await;
        held = held.max(rep.deletes_held_mass);
    }
    assert!(p.last.as_ref().unwrap().desired.is_empty(), "the empty list wants no route");
    assert_eq!(held, 7, "all seven deletes held by the breaker");
    assert_eq!(lines(&nl), healthy_lines);
    clock.advance(Duration::from_secs(20));
    let rep = p.r.apply().await;
    assert_eq!((rep.deletes, rep.deletes_held_mass), (0, 7), "{rep:?}");
    assert!(nl.take_log().is_empty(), "no write and no delete while held");

    // Restored (another 410 and a full re-list) within the settle period: nothing changes.
    second_watch.unbounded_send(event("ERROR", &status(410, "Expired", "too old resource version"))).unwrap();
    let mut last = None;
    for ev in ds.until_synced().await {
        last = Some(p.feed(&ev).await);
    }
    let rep = last.unwrap();
    assert_eq!((rep.writes, rep.deletes, rep.deletes_held_mass, rep.mass_deletion), (0, 0, 0, None), "{rep:?}");
    clock.advance(Duration::from_mins(1));
    let rep = p.r.apply().await;
    assert_eq!((rep.writes, rep.deletes), (0, 0));
    assert_eq!(nl.state().routes, healthy);
    assert!(nl.take_log().is_empty(), "the outage cost no route operation");
}

/// Lists come from the watch cache: each completed list, the first and a re-list
/// after 410, holds deletions for the settle period (`settled: false`), and a snapshot with
/// `settled: true` follows when it ends, without any new event.
#[tokio::test]
async fn cache_lists_hold_deletions_for_the_settle_period_after_every_list() {
    let group = CalicoGroup::CrdV1;
    let (api, watches, blocks) = two_blocks_scripted(group);
    api.json(&format!("GET {blocks}"), list(group, "ipamblocks", "200", &[block("10-244-1-0-26", "2", "10.244.1.0/26", "a")]));
    let _relisted = api.watch(&blocks);
    let settle = Duration::from_millis(400);
    let mut ds = Running::start_settling(&api, ApiGroupChoice::Auto, settle);
    let first = ds.snapshot().await;
    assert!(!first.settled, "the first list settles first");
    assert_eq!(ds.next().await, DatastoreEvent::Synced);
    let started = std::time::Instant::now();
    let settled = ds.snapshot().await;
    assert!(settled.settled && started.elapsed() < settle + Duration::from_millis(300), "settled after {:?}", started.elapsed());
    assert_eq!(*settled.cluster, *first.cluster);

    // 410 Gone, re-list without one block: the deletion arrives unsettled, then settles.
    watches["ipamblocks"].unbounded_send(event("ERROR", &status(410, "Expired", "too old resource version"))).unwrap();
    let events = ds.until_synced().await;
    let last = events.iter().rev().find_map(|e| if let DatastoreEvent::Snapshot(s) = e { Some(s.clone()) } else { None }).expect("a snapshot");
    assert_eq!(last.cluster.ipam_blocks.len(), 1);
    assert!(!last.settled, "a re-list's absences are not evidence yet");
    let s = ds.snapshot().await;
    assert!(s.settled);
    assert_eq!(s.cluster.ipam_blocks.len(), 1);
    // Every list asked the watch cache.
    let lists: Vec<String> = api.log().into_iter().filter(|l| l.contains(&blocks) && !l.contains("watch=true")).collect();
    assert_eq!(lists, [list_url(group, "ipamblocks"), list_url(group, "ipamblocks")]);
    assert!(lists[0].contains("resourceVersion=0&resourceVersionMatch=NotOlderThan"));
}

/// Retry delays: every delay of [`default_backoff`] is its step (500 ms doubling to
/// 5 s) plus up to 100 % jitter, so under 10 s; and agents that fail together do not retry
/// together (1,000 agents' first retries spread over the step).
#[test]
fn backoff_is_capped_and_jittered_across_agents() {
    let mut b = default_backoff();
    let delays: Vec<Duration> = (0..12).map(|_| b.next().expect("endless")).collect();
    let steps = [500u64, 1000, 2000, 4000, 5000, 5000, 5000, 5000, 5000, 5000, 5000, 5000];
    for (d, step) in delays.iter().zip(steps) {
        let step = Duration::from_millis(step);
        assert!(*d >= step && *d < step * 2, "{d:?} for step {step:?}");
    }
    assert!(delays.iter().all(|d| *d < Duration::from_secs(10)));
    // 1,000 agents failing at the same instant: their first retries are spread, not in step.
    let firsts: Vec<u128> = (0..1000).map(|_| default_backoff().next().unwrap().as_millis()).collect();
    let distinct: BTreeSet<u128> = firsts.iter().copied().collect();
    assert!(distinct.len() > 300, "only {} distinct first delays among 1,000 agents", distinct.len());
    let (min, max) = (firsts.iter().min().unwrap(), firsts.iter().max().unwrap());
    assert!(*min < 600 && *max > 900, "first retries span {min}..{max} ms");
    // A complete list resets it.
    b.reset();
    assert!(b.next().unwrap() < Duration::from_secs(1));
}

/// A 20 s API outage during which a block was deleted: with the capped backoff the
/// datastore is synced again, with the deletion, within 30 s of the outage's start; and it
/// never claims to be synced while the list fails. Virtual time (tokio's paused clock) from
/// the first sync on.
#[tokio::test]
async fn a_20_s_outage_is_followed_within_one_backoff_step() {
    let group = CalicoGroup::CrdV1;
    let api = StdArc::new(FakeApi::default());
    script_discovery(&api, group);
    let mut objects = Objects::new();
    objects.insert("ippools", vec![pool("p", "1", "10.244.0.0/16")]);
    objects.insert("ipamblocks", vec![block("10-244-1-0-26", "2", "10.244.1.0/26", "a"), block("10-244-2-0-26", "3", "10.244.2.0/26", "b")]);
    let mut watches = script_lists(&api, group, &objects, "100");
    let (tx, mut rx) = mpsc::channel(64);
    let ds = KubernetesDatastore::new(api.client(), ApiGroupChoice::Auto).with_debounce(Duration::from_millis(30)).with_list_settle(Duration::ZERO);
    let task = ds.spawn(tx);
    let mut next = async || tokio::time::timeout(Duration::from_mins(1), rx.recv()).await.expect("an event").expect("running");
    while next().await != DatastoreEvent::Synced {}
    // From here on, virtual time: the clock only moves when every task waits.
    tokio::time::pause();

    // The outage: the block watch ends, re-watching is refused, and every list is refused
    // with 500 until t = 20 s.
    let blocks = path(group, "ipamblocks");
    api.on(&format!("WATCH {blocks}"), Reply::Unreachable);
    for _ in 0..200 {
        api.on(&format!("GET {blocks}"), Reply::Json(StatusCode::INTERNAL_SERVER_ERROR, status(500, "InternalError", "etcdserver: request timed out")));
    }
    api.take_log();
    let start = tokio::time::Instant::now();
    drop(watches.remove("ipamblocks"));
    let recovery = {
        let api = api.clone();
        let blocks = blocks.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(20)).await;
            api.replies_clear(&format!("GET {blocks}"));
            api.json(&format!("GET {blocks}"), list(group, "ipamblocks", "300", &[block("10-244-1-0-26", "2", "10.244.1.0/26", "a")]));
            api.watch(&blocks)
        })
    };
    let mut last = None;
    loop {
        match next().await {
            DatastoreEvent::Synced => break,
            DatastoreEvent::Snapshot(s) => last = Some(s),
            DatastoreEvent::Unsynced { .. } | DatastoreEvent::LoadFailed(_) => {}
        }
    }
    let took = start.elapsed();
    let _watch = recovery.await.unwrap();
    assert!(took >= Duration::from_secs(20) && took <= Duration::from_secs(30), "synced again {took:?} after the outage began");
    let last = last.expect("a snapshot with the re-list");
    assert_eq!(last.cluster.ipam_blocks.keys().map(|k| &**k).collect::<Vec<_>>(), ["10-244-1-0-26"]);
    // Retries during the 20 s: at most one per backoff step (0.5, 1, 2, 4, 5, 5 … s, each + up
    // to 100 %): between 3 and 12 lists, not a storm.
    let lists = api.log().iter().filter(|l| l.contains(&blocks) && !l.contains("watch=true")).count();
    assert!((3..=12).contains(&lists), "{lists} lists during the outage");
    task.abort();
}

/// A hung API server: the connection is up but `GET /version` gets no answer. After
/// one probe interval plus its timeout the datastore says Unsynced (so `/readyz` stops saying
/// synced and nothing is deleted); an answer to the next probe makes it synced again without
/// any re-list; a second silent probe in a row restarts every watch, and it is synced again
/// only once every resource has listed. Virtual time from the first sync on.
#[tokio::test]
async fn a_hung_api_server_is_noticed_and_every_resource_relisted() {
    let group = CalicoGroup::CrdV1;
    let api = StdArc::new(FakeApi::default());
    script_discovery(&api, group);
    let mut objects = Objects::new();
    objects.insert("ippools", vec![pool("p", "1", "10.244.0.0/16")]);
    let _w = script_lists(&api, group, &objects, "100");
    // Probes 1 and 3 and 4 hang; probe 2 is answered (404 from the fake: an answer all the same).
    let hung1 = api.deferred("GET /version");
    api.on("GET /version", Reply::Json(StatusCode::NOT_FOUND, status(404, "NotFound", "no version")));
    let hung3 = api.deferred("GET /version");
    let hung4 = api.deferred("GET /version");
    let (tx, mut rx) = mpsc::channel(64);
    let probe = Probe { interval: Duration::from_secs(30), timeout: Duration::from_secs(10) };
    let ds = KubernetesDatastore::new(api.client(), ApiGroupChoice::Auto)
        .with_debounce(Duration::from_millis(30))
        .with_list_settle(Duration::ZERO)
        .with_probe(probe);
    let task = ds.spawn(tx);
    let mut next = async || tokio::time::timeout(Duration::from_mins(5), rx.recv()).await.expect("an event").expect("running");
    while next().await != DatastoreEvent::Synced {}
    tokio::time::pause();
    let start = tokio::time::Instant::now();
    api.take_log();
    let silent = "API server not answering: GET /version got no answer within 10 s";

    // Probe 1 (t ≈ 30 s) hangs: Unsynced at ≈ 40 s; probe 2 (≈ 70 s) answers: Synced, no re-list.
    assert_eq!(next().await, DatastoreEvent::Unsynced { reason: silent.to_owned() });
    let noticed = start.elapsed();
    // One interval (30 s, started before the clock was paused) plus the 10 s timeout.
    assert!(noticed >= Duration::from_secs(39) && noticed <= Duration::from_secs(41), "noticed after {noticed:?}");
    // Counted as stale (`routewarden_datastore_load_errors_total{reason="stale"}`).
    let stale = DatastoreEvent::LoadFailed(LoadError::new("kubernetes API server", LoadErrorKind::Stale, silent));
    assert_eq!(next().await, stale);
    assert_eq!(next().await, DatastoreEvent::Synced);
    assert!(api.take_log().iter().all(|l| l.contains("/version")), "an answer again re-lists nothing");

    // Probes 3 and 4 hang: Unsynced, then every watch restarted; the re-lists are answered.
    let _again = script_lists(&api, group, &objects, "200");
    assert_eq!(next().await, DatastoreEvent::Unsynced { reason: silent.to_owned() });
    assert_eq!(next().await, stale);
    let events = events_until_synced(&mut rx, Duration::from_mins(5)).await;
    assert!(events.iter().all(|e| !matches!(e, DatastoreEvent::Unsynced { .. })), "{events:?}");
    let lists: BTreeSet<String> =
        api.log().iter().filter(|l| !l.contains("watch=true") && !l.contains("/version")).map(|l| l.split('?').next().unwrap().to_owned()).collect();
    let mut want: BTreeSet<String> = CALICO_PLURALS.iter().chain(&["nodes"]).map(|p| format!("GET {}", path(group, p))).collect();
    want.insert(format!("GET {KUBE_SYSTEM_DS}"));
    assert_eq!(lists, want, "every resource listed again");
    drop((hung1, hung3, hung4));
    task.abort();
}
