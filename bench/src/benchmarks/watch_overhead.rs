//! `watch-overhead` (benchmark 5): what the churn watch, attached as the agent attaches it (the
//! best backend the kernel allows), adds to the writers it watches. Three writers of the same
//! 10,000 routes into an empty table, each with the watch, with the listener floor, and with
//! nothing:
//!
//! - `rw`: routewarden's own cold programming (benchmark 1);
//! - `ip_batch`: a foreign writer, `ip -batch` of the same routes (one process, one write per
//!   route, as Felix writes);
//! - `bird`: BIRD 2 from its start on a static configuration of the same routes until the last
//!   is in the kernel (benchmark 2's BIRD side), the writer whose routes the watch mostly sees
//!   beside Felix's.
//!
//! The statistic, per writer: [`ROUNDS`] rounds of `--runs` alternating runs of each variant;
//! each round's ratio is its with-watch median over its without median, and the writer's ratio
//! is the median of its rounds' ratios (a slow phase of a noisy machine hitting one round moves
//! one round, not the figure). Ratio: the largest of the writers' ratios; target at most 1.05.
//! Needs the embedded BPF object; BIRD's side is skipped (and said so) when BIRD is not
//! installed.
//!
//! The line also gives what the watch adds to each route write (`*_added_us_per_write`, µs,
//! from the overall medians): the backend runs in the writer's own call, so a ratio grows as
//! its writer gets faster and this figure does not. Beside them, the listener floor
//! (`routewarden::bpf::route_watch::listener_floor`: the socket-filter backend's socket with a
//! classic filter that drops every message, as any listener of route notifications costs the
//! writer): `*_floor_ratio` (floor ÷ nothing) and `*_above_floor_ratio`,
//! `*_above_floor_us_per_write` (watch ÷ floor: what the watch's own program adds), each the
//! median of the rounds' ratios like the statistic. They say which part a cheaper watch could
//! remove; they are context, not the target. This host allows only the socket filter;
//! the fentry and kprobe backends are measured by the QEMU lane's route-watch tests
//! (DESIGN.md), not here.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;

use super::cold_program_10k::{ip_batch_once_with, write_ip_batch};
use super::cold_program_vs_bird::{bird_config, bird_once_with, BIRD};
use crate::fixtures::cluster_routes;
use crate::report::{fmt_ratio, kv, ms};
use crate::runs::{rw_program_once_with, Listener};
use crate::{median, median_f64, Benchmark, Options, Outcome, Shared, Target};

/// This benchmark's registry entry: its name and [`run`].
pub const BENCHMARK: Benchmark = Benchmark { name: "watch-overhead", run };

/// Rounds of the statistic: each writer's ratio is the median of this many rounds' ratios.
pub const ROUNDS: usize = 7;

/// One writer's runs: every run of each variant, and each round's ratios.
#[derive(Default)]
struct Writer {
    with: Vec<Duration>,
    floor: Vec<Duration>,
    without: Vec<Duration>,
    /// Per round: with the watch ÷ with nothing (the statistic).
    round_ratios: Vec<f64>,
    /// Per round: with the listener floor ÷ with nothing (context: any listener's price).
    round_floor: Vec<f64>,
    /// Per round: with the watch ÷ with the listener floor (context: the watch's own part).
    round_above_floor: Vec<f64>,
}

impl Writer {
    /// Time `runs` alternating runs of each variant (`once(listener)`), then record the
    /// round's ratios of medians.
    fn round(&mut self, runs: usize, mut once: impl FnMut(Listener) -> Result<Duration>) -> Result<()> {
        let (mut with, mut floor, mut without) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..runs {
            without.push(once(Listener::Nothing)?);
            floor.push(once(Listener::Floor)?);
            with.push(once(Listener::Watch)?);
        }
        self.with.extend_from_slice(&with);
        self.floor.extend_from_slice(&floor);
        self.without.extend_from_slice(&without);
        let (with, floor, without) = (median(with).as_secs_f64(), median(floor).as_secs_f64(), median(without).as_secs_f64());
        self.round_ratios.push(with / without);
        self.round_floor.push(floor / without);
        self.round_above_floor.push(with / floor);
        Ok(())
    }

    /// The writer's ratio: the median of its rounds' ratios (watch ÷ nothing).
    fn ratio(&self) -> f64 {
        median_f64(&self.round_ratios)
    }

    /// `<name>_ratio` and its rounds; the same statistic for the floor alone and for the
    /// watch above the floor; the overall medians; the µs the watch adds to each write (above
    /// nothing, and above the floor).
    fn details(&self, name: &str, routes: usize, out: &mut Vec<(String, String)>) {
        let (with, floor, without) = (median(self.with.clone()), median(self.floor.clone()), median(self.without.clone()));
        let per_write = |a: Duration, b: Duration| format!("{:.3}", (a.as_secs_f64() - b.as_secs_f64()) * 1e6 / routes as f64);
        let rounds: Vec<String> = self.round_ratios.iter().map(|r| format!("{r:.3}")).collect();
        out.push(kv(&format!("{name}_ratio"), fmt_ratio(self.ratio())));
        out.push(kv(&format!("{name}_round_ratios"), rounds.join("/")));
        out.push(kv(&format!("{name}_floor_ratio"), fmt_ratio(median_f64(&self.round_floor))));
        out.push(kv(&format!("{name}_above_floor_ratio"), fmt_ratio(median_f64(&self.round_above_floor))));
        out.push(kv(&format!("{name}_with_watch_ms"), ms(with)));
        out.push(kv(&format!("{name}_with_floor_ms"), ms(floor)));
        out.push(kv(&format!("{name}_without_ms"), ms(without)));
        out.push(kv(&format!("{name}_added_us_per_write"), per_write(with, without)));
        out.push(kv(&format!("{name}_above_floor_us_per_write"), per_write(with, floor)));
    }
}

/// Benchmark 5: each writer with the churn watch attached / without it (the listener floor
/// beside them); the largest ratio.
pub fn run(opts: &Options, _shared: &mut Shared) -> Result<Outcome> {
    let name = BENCHMARK.name;
    if routewarden::bpf::embedded_object().is_none() {
        return Ok(Outcome::Skipped { name: name.into(), reason: "no BPF object embedded (`cargo xtask bench` builds one)".into() });
    }
    let routes = Arc::new(cluster_routes(opts.routes));
    let n = routes.len();
    let dir = tempfile::tempdir()?;
    let batch = write_ip_batch(dir.path(), &routes)?;
    let bird_conf = dir.path().join("bird.conf");
    let with_bird = Path::new(BIRD).exists();
    if with_bird {
        std::fs::write(&bird_conf, bird_config(dir.path(), &routes))?;
    }
    let (mut rw, mut ip, mut bird) = (Writer::default(), Writer::default(), Writer::default());
    let mut backend = String::new();
    // Alternate writers and variants, so slow phases of a noisy machine hit every side.
    for _ in 0..ROUNDS {
        rw.round(opts.runs, |listener| {
            let (d, b) = rw_program_once_with(routes.clone(), listener)?;
            if listener == Listener::Watch {
                backend = b;
            }
            Ok(d)
        })?;
        ip.round(opts.runs, |listener| ip_batch_once_with(batch.clone(), n, listener).map(|(d, _)| d))?;
        if with_bird {
            bird.round(opts.runs, |listener| bird_once_with(&bird_conf, dir.path(), n, listener).map(|(d, _)| d))?;
        }
    }
    let mut ratio = rw.ratio().max(ip.ratio());
    let mut details = vec![kv("routes", n)];
    rw.details("rw", n, &mut details);
    ip.details("ip_batch", n, &mut details);
    if with_bird {
        ratio = ratio.max(bird.ratio());
        bird.details("bird", n, &mut details);
    } else {
        details.push(kv("bird", format!("skipped:{BIRD}-not-installed")));
    }
    details.extend([kv("backend", backend), kv("rounds", ROUNDS), kv("runs_per_round", opts.runs)]);
    Ok(Outcome::Measured { name: name.into(), ratio, target: Target::AtMost(1.05), ok: with_bird, details })
}
