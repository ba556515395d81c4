use std::fmt::Write as _;

use super::*;

const TABLE: &str = "\
sk               Eth Pid        Groups   Rmem     Wmem     Dump  Locks    Drops    Inode
0000000000000000 0   4242       00000441 0        0        0     2        0        777001
0000000000000000 0   4294963200 00000000 0        0        0     2        0        777002
0000000000000000 9   4242       00000000 0        0        0     2        0        777003
0000000000000000 0   0          00000000 0        0        0     2        0        777004
garbage line
";

#[test]
fn parses_route_sockets_only() {
    let m = parse_proc_net_netlink(TABLE);
    assert_eq!(m.get(&4242), Some(&777_001));
    assert_eq!(m.get(&4_294_963_200), Some(&777_002), "negative port ids print unsigned");
    assert_eq!(m.len(), 2, "audit (9) and kernel (port 0) sockets are skipped: {m:?}");
}

/// A fake `/proc` under a fresh directory: `procs` are (pid, comm, socket inodes held),
/// the netlink table lists `ports` as (port id, inode).
struct FakeProc {
    dir: PathBuf,
}

impl FakeProc {
    fn new(name: &str) -> FakeProc {
        let dir = std::env::temp_dir().join(format!("rw-resolver-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("proc/self/fd")).unwrap();
        std::fs::write(dir.join("netlink"), TABLE.lines().next().unwrap().to_string() + "\n").unwrap();
        FakeProc { dir }
    }

    fn process(&self, pid: u32, comm: &str, inodes: &[u64]) -> &FakeProc {
        let fd = self.dir.join(format!("proc/{pid}/fd"));
        std::fs::create_dir_all(&fd).unwrap();
        std::fs::write(self.dir.join(format!("proc/{pid}/comm")), format!("{comm}\n")).unwrap();
        std::os::unix::fs::symlink("/dev/null", fd.join("0")).unwrap();
        for (i, inode) in inodes.iter().enumerate() {
            std::os::unix::fs::symlink(format!("socket:[{inode}]"), fd.join((3 + i).to_string())).unwrap();
        }
        self
    }

    fn exit(&self, pid: u32) {
        std::fs::remove_dir_all(self.dir.join(format!("proc/{pid}"))).unwrap();
    }

    /// Replace the netlink table with these (port id, inode) route sockets.
    fn table(&self, ports: &[(u32, u64)]) {
        let mut t = TABLE.lines().next().unwrap().to_string() + "\n";
        for (port, inode) in ports {
            writeln!(t, "0000000000000000 0   {port:<10} 00000000 0        0        0     2        0        {inode}").unwrap();
        }
        std::fs::write(self.dir.join("netlink"), t).unwrap();
    }

    fn resolver(&self) -> PortResolver {
        PortResolver::new(self.dir.join("netlink"), self.dir.join("proc"))
    }
}

impl Drop for FakeProc {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[expect(clippy::unnecessary_wraps, reason = "compared with answers, which are options")]
fn info(pid: u32, comm: &str) -> Option<ProcessInfo> {
    Some(ProcessInfo { pid, comm: comm.into() })
}

/// A fake /proc: pid 31 holds socket 777001 as fd 5; a round finds it, caches it, and
/// reports the other route socket (no holder) and an unknown port as misses.
#[test]
fn resolves_through_fake_proc_and_caches() {
    let dir = std::env::temp_dir().join(format!("rw-resolver-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("proc/31/fd")).unwrap();
    std::fs::create_dir_all(dir.join("proc/self/fd")).unwrap();
    std::fs::write(dir.join("proc/31/comm"), "bird\n").unwrap();
    std::os::unix::fs::symlink("socket:[777001]", dir.join("proc/31/fd/5")).unwrap();
    std::os::unix::fs::symlink("/dev/null", dir.join("proc/31/fd/0")).unwrap();
    std::fs::write(dir.join("netlink"), TABLE).unwrap();
    let mut r = PortResolver::new(dir.join("netlink"), dir.join("proc"));
    let t0 = Instant::now();
    let got = r.try_round(&HashSet::from([4242, 4_294_963_200, 5]), t0).expect("first round runs at once");
    assert_eq!(got[&4242], info(31, "bird"));
    assert_eq!(got[&4_294_963_200], None, "in the table, held by nobody");
    assert_eq!(got[&5], None, "not in the table");
    assert_eq!(r.stats(), AttributionStats { rounds: 1, walks: 1, resolved: 1, unresolved: 2 });
    // Cached: removing the fixture does not change the answers within the TTLs.
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(r.cached(4242, t0 + Duration::from_secs(59)), Some(info(31, "bird")));
    assert_eq!(r.cached(5, t0 + Duration::from_millis(4999)), Some(None));
    assert_eq!(r.cached(5, t0 + MISS_TTL), None, "a miss expires after 5 s");
    assert_eq!(r.cached(4242, t0 + HIT_TTL), None, "a hit expires after 60 s");
}

/// One round resolves every pending port with one walk; the walk stops once all are
/// found; exited writers (ports gone from the table) cost a table read, no walk.
#[test]
fn one_walk_resolves_every_pending_port() {
    let f = FakeProc::new("batch");
    f.process(10, "bird", &[500]).process(11, "ip", &[501, 502]).process(12, "calico-felix", &[503]);
    f.table(&[(100, 500), (101, 501), (102, 502), (103, 503)]);
    let mut r = f.resolver();
    let t0 = Instant::now();
    let got = r.try_round(&HashSet::from([100, 101, 102, 103]), t0).unwrap();
    assert_eq!(got[&100], info(10, "bird"));
    assert_eq!(got[&101], info(11, "ip"));
    assert_eq!(got[&102], info(11, "ip"), "two sockets of one process");
    assert_eq!(got[&103], info(12, "calico-felix"));
    assert_eq!((r.stats().rounds, r.stats().walks), (1, 1));

    // Exited writers: their ports are no longer in the table; no walk.
    let t1 = t0 + ROUND_INTERVAL;
    let got = r.try_round(&HashSet::from([7001, 7002, 7003]), t1).unwrap();
    assert!(got.values().all(Option::is_none), "{got:?}");
    assert_eq!((r.stats().rounds, r.stats().walks, r.stats().unresolved), (2, 1, 3));

    // A process that holds its socket in the table but vanished from /proc before the
    // walk is a miss, not a nameless hit.
    f.exit(12);
    let got = r.try_round(&HashSet::from([103, 104]), t1 + ROUND_INTERVAL).unwrap();
    assert_eq!((got[&103].clone(), got[&104].clone()), (None, None));
    assert_eq!(r.stats().walks, 2);
}

#[test]
fn rounds_are_rate_limited() {
    let f = FakeProc::new("rate");
    f.process(10, "bird", &[500]).process(11, "ip", &[501]);
    f.table(&[(100, 500), (101, 501)]);
    let mut r = f.resolver();
    let t0 = Instant::now();
    assert!(r.try_round(&HashSet::from([100]), t0).is_some());
    assert_eq!(r.next_round_at(t0), t0 + ROUND_INTERVAL);
    assert!(r.try_round(&HashSet::from([101]), t0 + Duration::from_millis(199)).is_none(), "199 ms after a round");
    assert_eq!(r.cached(101, t0 + Duration::from_millis(199)), None, "a refused round caches nothing");
    assert_eq!(r.stats().rounds, 1);
    assert_eq!(r.try_round(&HashSet::from([101]), t0 + ROUND_INTERVAL).unwrap()[&101], info(11, "ip"));
    assert_eq!(r.stats(), AttributionStats { rounds: 2, walks: 2, resolved: 2, unresolved: 0 });
}

#[test]
fn cache_stays_bounded() {
    let f = FakeProc::new("bounded");
    let mut r = f.resolver();
    let t0 = Instant::now();
    let mut t = t0;
    for chunk in 0..10u32 {
        let ports: HashSet<u32> = (chunk * 1000..(chunk + 1) * 1000).collect();
        r.try_round(&ports, t).unwrap();
        assert!(r.cache_len() <= CACHE_CAPACITY, "{} ports cached", r.cache_len());
        t += ROUND_INTERVAL;
    }
    assert_eq!(r.stats().unresolved, 10_000);

    // Full with 2,096 expired and 2,000 fresh misses: the expired ones are dropped, the
    // fresh ones kept.
    let mut r = f.resolver();
    r.try_round(&(0..2096).collect(), t0).unwrap();
    r.try_round(&(10_000..12_000).collect(), t0 + Duration::from_millis(4900)).unwrap();
    assert_eq!(r.cache_len(), CACHE_CAPACITY);
    let t1 = t0 + Duration::from_millis(5500);
    r.try_round(&HashSet::from([50_000]), t1).unwrap();
    assert_eq!(r.cache_len(), 2001);
    assert_eq!(r.cached(11_999, t1), Some(None), "fresh misses kept");
}

fn write_event(dst: &str, port: Option<u32>, pid: Option<u32>) -> RouteWatchEvent {
    RouteWatchEvent::Write {
        route: super::super::event::RouteChange {
            at_ns: 0,
            family: "ipv4",
            op: "add",
            table: 254,
            dst: dst.parse().unwrap(),
            metric: 0,
            oif: 1,
            gateway: None,
            nexthop_id: None,
            writer: WriterInfo { protocol: 4, class: "static", class_inferred: false, kernel: false, netlink_port: port, pid, comm: None },
        },
    }
}

fn writer_of(ev: &RouteWatchEvent) -> (String, Option<u32>, Option<u32>, Option<String>) {
    let r = ev.route().unwrap();
    (r.dst.to_string(), r.writer.netlink_port, r.writer.pid, r.writer.comm.clone())
}

/// Events wait, in order, for the next round when their writer is not cached; an event
/// behind a waiting one waits too; no event waits longer than the round interval.
#[test]
fn attribution_keeps_order_and_waits_at_most_one_interval() {
    let f = FakeProc::new("queue");
    f.process(10, "bird", &[500]).process(11, "ip", &[501]).process(12, "ip", &[502]);
    f.table(&[(100, 500), (101, 501), (102, 502)]);
    let mut q = Attribution::new(f.resolver());
    let t0 = Instant::now();
    let ms = |n| t0 + Duration::from_millis(n);

    // First event: a round runs at once.
    q.extend([write_event("10.0.0.1/32", Some(100), None)]);
    let (out, next) = q.release(t0);
    assert_eq!(out.iter().map(writer_of).collect::<Vec<_>>(), [("10.0.0.1/32".into(), Some(100), Some(10), Some("bird".into()))]);
    assert_eq!(next, None);

    // 50 ms later: a new port (waits for t0 + 200 ms), then a cached one and a writer
    // known by pid (fentry), which wait behind it.
    q.extend([write_event("10.0.0.2/32", Some(101), None), write_event("10.0.0.3/32", Some(100), None), write_event("10.0.0.4/32", None, Some(77))]);
    let (out, next) = q.release(ms(50));
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(next, Some(ms(200)));
    q.extend([write_event("10.0.0.5/32", Some(102), None)]);
    assert!(q.release(ms(199)).0.is_empty());
    assert_eq!(q.resolver().stats().rounds, 1, "no round before the interval");

    // Writer 12 exits before the round: its event is released unresolved, port kept.
    f.exit(12);
    let (out, next) = q.release(ms(200));
    assert_eq!(next, None);
    assert_eq!(
        out.iter().map(writer_of).collect::<Vec<_>>(),
        [
            ("10.0.0.2/32".into(), Some(101), Some(11), Some("ip".into())),
            ("10.0.0.3/32".into(), Some(100), Some(10), Some("bird".into())),
            ("10.0.0.4/32".into(), None, Some(77), None),
            ("10.0.0.5/32".into(), Some(102), None, None),
        ]
    );
    assert_eq!(q.resolver().stats(), AttributionStats { rounds: 2, walks: 2, resolved: 2, unresolved: 1 });
    assert_eq!(q.held(), 0);

    // Cached writers (hit and miss) pass without a round, even right after one.
    q.extend([write_event("10.0.0.6/32", Some(101), None), write_event("10.0.0.7/32", Some(102), None)]);
    let (out, _) = q.release(ms(201));
    assert_eq!(out.len(), 2);
    assert_eq!(q.resolver().stats().rounds, 2);
}

/// The thread's loop, with a fake /proc: events come out in order, the one with a new
/// port after the next round (not before 200 ms after the first), and the thread sends
/// what it still held and ends once its input is closed.
#[test]
fn thread_releases_in_order_and_ends_when_input_closes() {
    let f = FakeProc::new("thread");
    f.process(10, "bird", &[500]).process(11, "ip", &[501]);
    f.table(&[(100, 500), (101, 501)]);
    let (btx, brx) = mpsc::channel(4);
    let (etx, mut erx) = mpsc::channel(16);
    let stats = Arc::new(Mutex::new(AttributionStats::default()));
    let queue = Attribution::new(f.resolver());
    let thread = {
        let stats = Arc::clone(&stats);
        std::thread::spawn(move || run_attribution(queue, brx, &etx, &stats))
    };
    let t0 = Instant::now();
    btx.blocking_send(vec![write_event("10.0.0.1/32", Some(100), None)]).unwrap();
    assert_eq!(writer_of(&erx.blocking_recv().unwrap()).2, Some(10));
    btx.blocking_send(vec![write_event("10.0.0.2/32", Some(101), None), write_event("10.0.0.3/32", Some(100), None)]).unwrap();
    btx.blocking_send(vec![write_event("10.0.0.4/32", None, Some(5))]).unwrap();
    let got: Vec<_> = (0..3).map(|_| writer_of(&erx.blocking_recv().unwrap())).collect();
    let waited = t0.elapsed();
    assert_eq!(
        got,
        [
            ("10.0.0.2/32".into(), Some(101), Some(11), Some("ip".into())),
            ("10.0.0.3/32".into(), Some(100), Some(10), Some("bird".into())),
            ("10.0.0.4/32".into(), None, Some(5), None),
        ]
    );
    assert!(waited >= ROUND_INTERVAL, "released {waited:?} after the first round's start");
    assert!(waited < ROUND_INTERVAL * 10, "released only after {waited:?}");
    btx.blocking_send(vec![write_event("10.0.0.5/32", Some(102), None)]).unwrap();
    drop(btx);
    assert_eq!(writer_of(&erx.blocking_recv().expect("held event sent before the thread ends")).1, Some(102));
    thread.join().unwrap();
    assert!(erx.blocking_recv().is_none(), "the thread ended");
    let s = *stats.lock().unwrap();
    assert_eq!((s.rounds, s.resolved, s.unresolved), (3, 2, 1), "{s:?}");
}

/// A storm: 1,000 distinct writers, one event each, 1 ms apart, released whenever the
/// queue asks (each arrival and each wake-up). At most one round per 200 ms, one walk per
/// round, every event out in order and none held longer than 200 ms.
#[test]
fn storm_of_writers_costs_one_round_per_interval() {
    let f = FakeProc::new("storm");
    // Every tenth writer is still alive when its round comes.
    let alive: Vec<u32> = (0..1000).filter(|i| i % 10 == 0).collect();
    for &i in &alive {
        f.process(20_000 + i, "ip", &[900_000 + u64::from(i)]);
    }
    f.table(&alive.iter().map(|&i| (20_000 + i, 900_000 + u64::from(i))).collect::<Vec<_>>());
    let mut q = Attribution::new(f.resolver());
    let t0 = Instant::now();
    let mut arrived = HashMap::new();
    let mut released = Vec::new();
    let mut wake: Option<Instant> = None;
    for i in 0..1000u32 {
        let now = t0 + Duration::from_millis(u64::from(i));
        // As the thread does: asleep until `wake` while events are held (arrivals queue
        // up), otherwise releasing at each arrival.
        while let Some(at) = wake.filter(|&at| at <= now) {
            let (out, next) = q.release(at);
            released.extend(out.into_iter().map(|e| (at, e)));
            wake = next;
        }
        let dst = format!("10.77.{}.{}/32", i / 256, i % 256);
        q.extend([write_event(&dst, Some(20_000 + i), None)]);
        arrived.insert(dst, now);
        if wake.is_none() {
            let (out, next) = q.release(now);
            released.extend(out.into_iter().map(|e| (now, e)));
            wake = next;
        }
    }
    while let Some(at) = wake {
        let (out, next) = q.release(at);
        released.extend(out.into_iter().map(|e| (at, e)));
        wake = next;
    }
    assert_eq!(released.len(), 1000, "every event out");
    let order: Vec<String> = released.iter().map(|(_, e)| writer_of(e).0).collect();
    let want: Vec<String> = (0..1000u32).map(|i| format!("10.77.{}.{}/32", i / 256, i % 256)).collect();
    assert_eq!(order, want, "in arrival order");
    let max_wait = released.iter().map(|(at, e)| *at - arrived[&writer_of(e).0]).max().unwrap();
    assert!(max_wait <= ROUND_INTERVAL, "held {max_wait:?}");
    let resolved = released.iter().filter(|(_, e)| writer_of(e).2.is_some()).count();
    assert_eq!(resolved, alive.len(), "the live writers get their pid");
    for (_, e) in &released {
        let (_, port, pid, comm) = writer_of(e);
        if let Some(pid) = pid {
            assert_eq!((Some(pid), comm.as_deref()), (port, Some("ip")));
        }
    }
    let s = q.resolver().stats();
    // 1 s of storm: a round at 0 ms and then one per 200 ms.
    assert!(s.rounds <= 6, "{s:?}");
    assert_eq!(s.walks, s.rounds, "one walk per round: {s:?}");
    assert_eq!(s.resolved + s.unresolved, 1000, "each port asked once: {s:?}");
}
