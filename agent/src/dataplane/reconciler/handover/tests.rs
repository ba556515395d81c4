//! Unit tests of `handover.rs`.

use super::*;
use crate::vocabulary::PoolClass;

const GRACE: Duration = Duration::from_secs(30);

fn key(metric: u32) -> RouteKey {
    RouteKey::new(254, "10.244.1.0/26".parse().unwrap(), 0, metric)
}

fn to(writer: Writer, protocol: u8, metric: Option<u32>) -> Handover {
    Handover { class: PoolClass::Ipip, to: writer, protocol, table: 254, metric }
}

#[test]
fn bird_at_our_key_or_an_unknown_metric_needs_a_step_aside() {
    assert!(to(Writer::Bird, 12, None).needs_step_aside(&key(1024)));
    assert!(to(Writer::Bird, 12, Some(1024)).needs_step_aside(&key(1024)));
    assert!(!to(Writer::Bird, 12, Some(32)).needs_step_aside(&key(1024)));
    assert!(!to(Writer::Felix, 80, None).needs_step_aside(&key(1024)));
    assert!(!Handover { table: 48, ..to(Writer::Bird, 12, None) }.needs_step_aside(&key(1024)));
}

#[test]
fn wait_until_seen_or_the_grace_ends() {
    let now = Instant::now();
    let mut h = Handovers::new(GRACE);
    let k = key(1024);
    assert_eq!(h.delete_gate(&k, now), DeleteGate::NotHandedOver);
    h.begin(k, &to(Writer::Felix, 80, None), now);
    assert_eq!(h.delete_gate(&k, now), DeleteGate::Wait);
    assert_eq!(h.next_deadline(), Some(now + GRACE));
    assert_eq!(h.delete_gate(&k, now + GRACE), DeleteGate::GraceOver);
    assert!(h.route_seen(&k.dst, 12, 254).is_empty(), "another protocol");
    assert_eq!(h.route_seen(&k.dst, 80, 254), vec![k]);
    assert!(h.route_seen(&k.dst, 80, 254).is_empty(), "seen once");
    assert_eq!(h.delete_gate(&k, now), DeleteGate::Now);
    assert_eq!(h.next_deadline(), None);
    let mut out = Vec::new();
    h.finish(now + Duration::from_secs(2), |_| true, &mut out);
    assert!(out.is_empty(), "our route is still in the kernel");
    h.finish(now + Duration::from_secs(2), |_| false, &mut out);
    assert_eq!(out, vec![HandoverOutcome { dst: k.dst, to: Writer::Felix, end: HandoverEnd::Seen, waited: Duration::from_secs(2) }]);
}

#[test]
fn one_check_dump_per_family_table_and_protocol() {
    let now = Instant::now();
    let mut h = Handovers::new(GRACE);
    let k = key(1024);
    h.begin(k, &to(Writer::Bird, 12, Some(32)), now);
    assert_eq!(h.unchecked(), BTreeSet::from([(Family::V4, 254, 12)]));
    assert_eq!(h.checked(Family::V4, 254, 12, &BTreeSet::from([k.dst])), vec![k]);
    assert!(h.unchecked().is_empty());
    assert_eq!(h.delete_gate(&k, now), DeleteGate::Now);
}

#[test]
fn step_aside_moves_the_handover_to_the_copy() {
    let now = Instant::now();
    let mut h = Handovers::new(GRACE);
    let (original, copy) = (key(1024), key(1025));
    h.begin(original, &to(Writer::Bird, 12, None), now);
    assert_eq!(h.step_aside_copy(&original, now), Some(copy));
    assert_eq!(h.step_aside_copy(&original, now + GRACE), None, "grace over");
    h.stepped_aside(original, copy);
    assert_eq!(h.delete_gate(&original, now), DeleteGate::Now, "make before break");
    assert_eq!(h.delete_gate(&copy, now), DeleteGate::Wait);
    assert_eq!(h.step_aside_copy(&copy, now), None, "the copy does not step aside again");
    h.deleted(&original);
    assert_eq!(h.delete_gate(&original, now), DeleteGate::NotHandedOver);
    // Desired again: the copy's handover is due now.
    assert_eq!(h.resume(&original, now), Some(copy));
    assert_eq!(h.delete_gate(&copy, now), DeleteGate::GraceOver);
}

#[test]
fn eexist_at_metric_plus_one_gives_up_stepping_aside() {
    let now = Instant::now();
    let mut h = Handovers::new(GRACE);
    let original = key(1024);
    h.begin(original, &to(Writer::Bird, 12, None), now);
    h.give_up_step_aside(&original);
    assert_eq!(h.step_aside_copy(&original, now), None);
    assert_eq!(h.delete_gate(&original, now), DeleteGate::Wait);
}

#[test]
fn released_and_adopted() {
    let now = Instant::now();
    let mut h = Handovers::new(GRACE);
    h.release(&key(1024), Writer::Felix);
    let copy = key(1025);
    h.adopt_step_aside_copy(copy, now);
    assert_eq!(h.unchecked(), BTreeSet::from([(Family::V4, 254, RTPROT_BIRD)]));
    let mut out = Vec::new();
    h.finish(now, |_| false, &mut out);
    let ends: Vec<HandoverEnd> = out.iter().map(|o| o.end).collect();
    assert_eq!(ends, [HandoverEnd::GraceExpired, HandoverEnd::Released], "finished first, then released");
}
