use super::*;
use crate::observe::metrics::ProgramLabels;

/// A watch whose attachment the test flips.
struct Fake {
    detached: Option<String>,
}

impl Watch for Fake {
    type Event = ();
    const NAME: &'static str = "fake";
    const DEGRADED: &'static str = "fake watch not running";

    fn spawn_reader(&mut self, _tx: mpsc::Sender<()>) -> Result<Option<tokio::task::JoinHandle<()>>, BpfError> {
        Ok(None)
    }

    fn poll(&mut self, _metrics: &Metrics) {}

    fn detached_reason(&self) -> Option<String> {
        self.detached.clone()
    }
}

fn attached(metrics: &Metrics) -> i64 {
    metrics.bpf_program_attached.get_or_create(&ProgramLabels { program: "fake" }).get()
}

fn line(health: &Health) -> String {
    health.ready().1.lines().find(|l| l.starts_with("bpf fake: ")).unwrap_or_default().to_owned()
}

#[test]
fn gauge_and_health_line_follow_the_watch() {
    let (_, metrics) = Metrics::new_registry();
    let health = Health::default();
    let degraded: WatchHandler<Fake> = WatchHandler::start(Err(BpfError::NoObject), &metrics, &health);
    assert!(!degraded.is_running());
    assert_eq!(attached(&metrics), 0);
    assert!(line(&health).starts_with("bpf fake: degraded: no BPF object is embedded"), "{}", line(&health));

    let mut running = WatchHandler::start(Ok(Fake { detached: None }), &metrics, &health);
    assert_eq!((attached(&metrics), line(&health).as_str()), (1, "bpf fake: ready"));
    running.watch_mut().unwrap().detached = Some("none of the watched devices exists: [\"eth0\"]".into());
    running.poll(&metrics, &health);
    assert_eq!(attached(&metrics), 0);
    assert_eq!(line(&health), "bpf fake: degraded: none of the watched devices exists: [\"eth0\"]");
    running.watch_mut().unwrap().detached = None;
    running.poll(&metrics, &health);
    assert_eq!((attached(&metrics), line(&health).as_str()), (1, "bpf fake: ready"));
}

#[test]
fn follow_moves_a_running_watch_and_starts_a_degraded_one() {
    let (_, metrics) = Metrics::new_registry();
    let health = Health::default();
    let mut h: WatchHandler<Fake> = WatchHandler::start(Err(BpfError::NoDevice(vec!["eth0".into()])), &metrics, &health);
    let mut moved = false;
    h.follow(&metrics, &health, |_| Ok(()), || Ok(Fake { detached: None }));
    assert!(h.is_running());
    assert_eq!(attached(&metrics), 1);
    h.follow(
        &metrics,
        &health,
        |_| {
            moved = true;
            Ok(())
        },
        || panic!("a running watch is moved, not started again"),
    );
    assert!(moved);
}
