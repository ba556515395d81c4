//! The aggregator on a manual clock: what is reported, when, and with how many occurrences.

use super::*;

fn ev(reason: NodeEventReason, subject: &str, note: &str) -> NodeEvent {
    NodeEvent { reason, subject: subject.into(), note: note.into() }
}

fn report(reason: NodeEventReason, subject: &str, note: &str, occurrences: u32) -> Report {
    Report { reason, subject: subject.into(), note: note.into(), occurrences }
}

/// The first occurrence goes out at once; later ones within the period wait for its end and go
/// out as one report; a pair is forgotten once quiet for `FORGET_AFTER`.
#[test]
fn first_occurrence_at_once_then_one_report_per_period() {
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    let mut a = Aggregator::new(Duration::from_mins(1), 8);
    let c = NodeEventReason::RouteConflict;
    assert_eq!(a.observe(ev(c, "p", "n1"), at(0)), Ok(Some(report(c, "p", "n1", 1))));
    assert_eq!(a.next_due(), None);
    assert_eq!(a.observe(ev(c, "p", "n2"), at(10)), Ok(None));
    assert_eq!(a.observe(ev(c, "p", "n3"), at(30)), Ok(None));
    assert_eq!(a.next_due(), Some(at(60)));
    assert_eq!(a.due(at(59)), []);
    assert_eq!(a.due(at(60)), [report(c, "p", "n3", 2)]);
    assert_eq!(a.due(at(200)), []);
    // After a quiet period an occurrence goes out at once again.
    assert_eq!(a.observe(ev(c, "p", "n4"), at(200)), Ok(Some(report(c, "p", "n4", 1))));
    // Another subject and another reason are their own pairs.
    assert_eq!(a.observe(ev(c, "q", "m"), at(201)), Ok(Some(report(c, "q", "m", 1))));
    assert_eq!(a.observe(ev(NodeEventReason::RouteFlap, "p", "f"), at(201)), Ok(Some(report(NodeEventReason::RouteFlap, "p", "f", 1))));
    assert_eq!(a.due(at(200) + FORGET_AFTER), []);
    assert!(!a.tracks(c, "p") && a.tracks(c, "q"));
    assert_eq!(a.due(at(201) + FORGET_AFTER), []);
    assert!(!a.tracks(c, "q"));
}

/// Nothing in, nothing out, however long.
#[test]
fn quiet_reports_nothing() {
    let t0 = Instant::now();
    let mut a = Aggregator::default();
    for s in (0..3600).step_by(10) {
        assert_eq!(a.due(t0 + Duration::from_secs(s)), []);
    }
    assert_eq!(a.next_due(), None);
}

/// A new pair beyond the bound is refused (the caller counts it); a known one still counts.
#[test]
fn subjects_beyond_the_bound_are_refused() {
    let t0 = Instant::now();
    let mut a = Aggregator::new(PERIOD, 2);
    let c = NodeEventReason::RouteConflict;
    assert!(a.observe(ev(c, "a", "n"), t0).unwrap().is_some());
    assert!(a.observe(ev(c, "b", "n"), t0).unwrap().is_some());
    assert_eq!(a.observe(ev(c, "c", "n"), t0), Err(ev(c, "c", "n")));
    assert_eq!(a.observe(ev(c, "a", "n"), t0), Ok(None));
    assert_eq!(a.due(t0 + PERIOD), [report(c, "a", "n", 1)]);
    // Once a pair is forgotten, a new one takes its place.
    assert_eq!(a.observe(ev(c, "c", "n"), t0 + FORGET_AFTER), Ok(Some(report(c, "c", "n", 1))));
    assert!(!a.tracks(c, "b") && a.tracks(c, "a"));
}

#[test]
fn notes_are_cut_to_one_kilobyte_at_a_character_boundary() {
    assert_eq!(cut_note("short"), "short");
    let long = "é".repeat(600);
    let cut = cut_note(&long);
    assert!(cut.len() <= NOTE_MAX && cut.ends_with("...") && cut.len() > NOTE_MAX - 8, "{}", cut.len());
    assert_eq!(NodeEventReason::ALL.map(NodeEventReason::label), crate::observe::metrics::node_events::NODE_EVENT_REASONS);
}
