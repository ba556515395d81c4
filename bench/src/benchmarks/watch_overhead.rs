//! `watch-overhead` (benchmark 5): benchmark 1's cold programming with the churn watch attached,
//! against the same without it. Target: at most 1.05. Needs the embedded BPF object.

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
    Ok(Outcome::Measured {
        name: name.into(),
        ratio: with.as_secs_f64() / without.as_secs_f64(),
        target: Target::AtMost(1.05),
        ok: true,
        details: vec![kv("routes", routes.len()), kv("with_watch_ms", ms(with)), kv("without_ms", ms(without)), kv("backend", backend), kv("runs", opts.runs)],
    })
}
