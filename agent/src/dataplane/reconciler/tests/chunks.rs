//! A write pass in chunks, pipelined and ramped, ends exactly as in one chunk.

use super::*;

/// One apply of the chunked-pass scenario: its report and the kernel's changes, as text.
async fn traced_apply(r: &mut Reconciler<FakeNetlink, FakeClock>, nl: &FakeNetlink, trace: &mut Vec<String>) {
    let rep = r.apply().await;
    trace.push(format!("{rep:?}"));
    trace.extend(nl.take_log());
}

/// The chunked-pass scenario with `chunk` writes per chunk: a cold start of 40 routes with two
/// failed writes, a foreign route at one key and a stale route of ours; the retries; then the
/// IPIP routes handed over to BIRD (each steps aside to metric+1 before it goes) while a
/// no-encap route changes its gateway. Returns every report, every kernel change in order,
/// and the kernel's routes at the end.
async fn chunked_pass_scenario(chunk: usize) -> Vec<String> {
    let (mut r, nl, clock) = setup(None);
    nl.state().write_chunk = Some(chunk);
    let dst = |i: u32| format!("10.244.{}.{}/26", i / 4, (i % 4) * 64);
    let route = |i: u32| {
        if i.is_multiple_of(2) {
            cr(&dst(i), RoutePath::HostNic, Some("10.0.0.12"))
        } else {
            cr(&dst(i), RoutePath::Tunnel, Some("10.0.1.13"))
        }
    };
    nl.insert(ObservedRoute { protocol: 80, ..foreign("10.244.200.0/26", 80, Some(TUNL0), RouteKind::Unicast) });
    nl.insert(foreign(&dst(9), 4, Some(ETH0), RouteKind::Unicast));
    nl.state().fail_writes.insert(block(&dst(3)), (Errno::ENETUNREACH, 1));
    nl.state().fail_writes.insert(block(&dst(30)), (Errno::ENOBUFS, 1));
    let mut trace = Vec::new();
    r.set_desired(&(0..40).rev().map(route).collect::<Vec<_>>());
    traced_apply(&mut r, &nl, &mut trace).await;
    clock.advance(Duration::from_secs(5));
    traced_apply(&mut r, &nl, &mut trace).await;
    let mut next: Vec<ClusterRoute> = (0..40).step_by(2).map(route).collect();
    next[3] = cr(&dst(6), RoutePath::HostNic, Some("10.0.0.14"));
    r.set_desired_with_handover(&next, &[Handover { class: PoolClass::Ipip, to: Writer::Bird, protocol: 12, table: 254, metric: None }]);
    clock.advance(Duration::from_secs(1));
    traced_apply(&mut r, &nl, &mut trace).await;
    trace.push(format!("{:?}", nl.state().routes));
    trace
}

/// A write pass handed to the kernel in chunks, pipelined (a chunk's results come back with
/// the next call, so the reconciler plans one chunk and records another while the kernel
/// inserts a third), ends exactly as the pass in one chunk: the same changes in the same
/// order, the same reports, the same routes; from one write per chunk to all at once.
#[tokio::test]
async fn a_write_pass_in_chunks_ends_exactly_as_in_one() {
    let whole = chunked_pass_scenario(usize::MAX).await;
    // The scenario does what it says: written, failed, held, stepped aside, changed.
    assert!(whole[0].contains("writes: 37, ") && whole[0].contains("write_errors: 3, "), "{}", whole[0]);
    assert_eq!(whole.iter().filter(|l| l.starts_with("create ") && l.ends_with(" metric 1025")).count(), 19, "{whole:#?}");
    assert!(whole.contains(&"replace 10.244.1.128/26 table 254 metric 1024".to_string()), "{whole:#?}");
    for chunk in [1, 2, 3, 5, 16] {
        assert_eq!(chunked_pass_scenario(chunk).await, whole, "{chunk} writes a chunk");
    }
}

/// The `i`th of many /26 blocks (1,024 a /16, from 10.244.0.0/16 on), in ascending order.
fn many_dst(i: u32) -> String {
    format!("10.{}.{}.{}/26", 244 + i / 1024, (i / 4) % 256, (i % 4) * 64)
}

/// A cold start's chunks start small and double up to the collaborator's batch, so the kernel
/// starts inserting at once, and halve again at the end, so little is left to record once the
/// kernel is done; every route is written once.
#[tokio::test]
async fn a_cold_start_ramps_its_chunks_up_to_the_batch_size_and_down_again() {
    let (mut r, nl, _clock) = setup(None);
    nl.state().write_chunk = Some(512);
    let routes: Vec<ClusterRoute> = (0..3000u32).map(|i| cr(&many_dst(i), RoutePath::Tunnel, Some("10.0.1.13"))).collect();
    r.set_desired(&routes);
    let rep = r.apply().await;
    assert_eq!((rep.writes, rep.error_count()), (3000, 0), "{rep:?}");
    // Up: 128, 256, 512; full while more than two are left (1,080 → 512); then half of what
    // is left (568 → 284, 142), the first size again, and the rest.
    assert_eq!(nl.state().chunk_sizes, [128, 256, 512, 512, 512, 512, 284, 142, 128, 14]);
    assert_eq!(nl.take_log().len(), 3000);
}

/// A cold start of 3,000 routes with `chunk` writes a chunk, its bad input in the chunks of
/// the ramp's two ends: a foreign route at a desired key in the first chunk and in the last
/// ones, a failed write in a halved chunk, a stale route of ours; then the retry. Returns
/// every report, every kernel change in order, and the kernel's routes at the end.
async fn ramped_pass_scenario(chunk: usize) -> Vec<String> {
    // 3,000 blocks reach 10.246.0.0/16 (`many_dst`): the pools own where they go.
    let (mut r, nl, clock) = setup(Some(DataplaneConfig::default().policy_owning(&["10.244.0.0/14"])));
    nl.state().write_chunk = Some(chunk);
    nl.insert(foreign(&many_dst(5), 4, Some(ETH0), RouteKind::Unicast));
    nl.insert(foreign(&many_dst(2990), 12, Some(ETH0), RouteKind::Unicast));
    nl.insert(ObservedRoute { protocol: 80, ..foreign("10.244.7.32/27", 80, Some(TUNL0), RouteKind::Unicast) });
    nl.state().fail_writes.insert(block(&many_dst(2900)), (Errno::ENOBUFS, 1));
    let mut trace = Vec::new();
    r.set_desired(&(0..3000u32).map(|i| cr(&many_dst(i), RoutePath::Tunnel, Some("10.0.1.13"))).collect::<Vec<_>>());
    traced_apply(&mut r, &nl, &mut trace).await;
    clock.advance(Duration::from_secs(5));
    traced_apply(&mut r, &nl, &mut trace).await;
    trace.push(format!("{:?}", nl.state().routes));
    trace
}

/// The chunks of the ramp (up from 128 and halving at the end) end exactly as one write a
/// chunk does, with foreign routes held, a failed write retried and a stale route deleted.
#[tokio::test]
async fn a_ramped_write_pass_with_bad_input_ends_exactly_as_one_write_a_chunk() {
    let ramped = ramped_pass_scenario(512).await;
    // The scenario does what it says: two keys held by other writers, one write failed, the
    // stale route gone after the writes; the failed write in again on the retry.
    assert!(ramped[0].contains("writes: 2997, ") && ramped[0].contains("write_errors: 3, ") && ramped[0].contains("deletes: 1, "), "{}", ramped[0]);
    // Its counts, tallied between chunks while later chunks were still out: every route
    // desired, the two held keys held, the failed write neither programmed nor held.
    assert!(ramped[0].contains("ClassCount { desired: 3000, programmed: 2997, held: 2 }"), "{}", ramped[0]);
    let retry = ramped.iter().filter(|l| l.starts_with("ApplyReport")).nth(1).unwrap();
    assert!(
        retry.contains("writes: 1, ") && retry.contains("write_errors: 0, ") && retry.contains("ClassCount { desired: 3000, programmed: 2998, held: 2 }"),
        "{retry}"
    );
    assert!(ramped.contains(&format!("create {} table 254 metric 1024", many_dst(2900))), "the failed write is retried");
    assert!(ramped.last().unwrap().contains("protocol: 12") && ramped.last().unwrap().contains("protocol: 4"), "the other writers' routes stay");
    assert_eq!(ramped_pass_scenario(1).await, ramped);
}
