//! `watch-overhead` (benchmark 5): benchmark 1's cold programming with the churn watch attached,
//! against the same without it. Target: at most 1.05. Needs the embedded BPF object. The
//! line also gives what the watch adds to each route write (`added_us_per_write`, µs): the
//! backend runs in the writer's own call, so the ratio grows as the writer gets faster and
//! this figure does not.

use std::sync::Arc;

use anyhow::Result;

use crate::fixtures::cluster_routes;
use crate::report::{kv, ms};
use crate::runs::{rw_program_once, rw_program_once_with};
use crate::{median, Benchmark, Options, Outcome, Shared, Target};

/// This benchmark's registry entry: its name and [`run`].
pub const BENCHMARK: Benchmark = Benchmark { name: "watch-overhead", run };

/// Benchmark 5: benchmark 1's programming with the churn watch attached / without it.
pub fn run(opts: &Options, _shared: &mut Shared) -> Result<Outcome> {
    let name = BENCHMARK.name;
    if routewarden::bpf::embedded_object().is_none() {
        return Ok(Outcome::Skipped { name: name.into(), reason: "no BPF object embedded (`cargo xtask bench` builds one)".into() });
    }
    let routes = Arc::new(cluster_routes(opts.routes));
    let (mut with, mut without, mut backend) = (Vec::new(), Vec::new(), String::new());
    for _ in 0..opts.runs {
        without.push(rw_program_once(routes.clone())?);
        let (d, b) = rw_program_once_with(routes.clone(), true)?;
        with.push(d);
        backend = b;
    }
    let (with, without) = (median(with), median(without));
    // What the watch adds to each route write, whatever the writer's own speed (the ratio
    // grows as the writer gets faster): the socket filter runs in the writer's sendmsg.
    let added_us = (with.as_secs_f64() - without.as_secs_f64()) * 1e6 / routes.len() as f64;
    Ok(Outcome::Measured {
        name: name.into(),
        ratio: with.as_secs_f64() / without.as_secs_f64(),
        target: Target::AtMost(1.05),
        ok: true,
        details: vec![kv("routes", routes.len()), kv("with_watch_ms", ms(with)), kv("without_ms", ms(without)), kv("added_us_per_write", format!("{added_us:.3}")), kv("backend", backend), kv("runs", opts.runs)],
    })
}
