//! `watch-overhead` (benchmark 5): what the churn watch, attached as the agent attaches it (the
//! best backend the kernel allows), adds to the writers it watches. Two writers of the same
//! 10,000 routes into an empty table, each with the watch and without, runs alternating:
//! routewarden's own cold programming (benchmark 1) and a foreign writer, `ip -batch` (whose
//! writes are most of what the watch sees in a cluster: Felix's and BIRD's). Ratio: the larger
//! of the two with/without ratios; target at most 1.05. Needs the embedded BPF object.
//!
//! The line also gives what the watch adds to each route write (`*_added_us_per_write`, µs):
//! the backend runs in the writer's own call, so a ratio grows as its writer gets faster and
//! this figure does not. BIRD as the foreign writer, and the fentry and kprobe backends (this
//! host allows only the socket filter), are not measured here.

use std::sync::Arc;

use anyhow::Result;

use super::cold_program_10k::{ip_batch_once_with, write_ip_batch};
use crate::fixtures::cluster_routes;
use crate::report::{fmt_ratio, kv, ms};
use crate::runs::{rw_program_once, rw_program_once_with};
use crate::{median, Benchmark, Options, Outcome, Shared, Target};

/// This benchmark's registry entry: its name and [`run`].
pub const BENCHMARK: Benchmark = Benchmark { name: "watch-overhead", run };

/// Benchmark 5: each writer with the churn watch attached / without it; the larger ratio.
pub fn run(opts: &Options, _shared: &mut Shared) -> Result<Outcome> {
    let name = BENCHMARK.name;
    if routewarden::bpf::embedded_object().is_none() {
        return Ok(Outcome::Skipped { name: name.into(), reason: "no BPF object embedded (`cargo xtask bench` builds one)".into() });
    }
    let routes = Arc::new(cluster_routes(opts.routes));
    let dir = tempfile::tempdir()?;
    let batch = write_ip_batch(dir.path(), &routes)?;
    let (mut with, mut without, mut backend) = (Vec::new(), Vec::new(), String::new());
    let (mut ip_with, mut ip_without) = (Vec::new(), Vec::new());
    for _ in 0..opts.runs {
        without.push(rw_program_once(routes.clone())?);
        let (d, b) = rw_program_once_with(routes.clone(), true)?;
        with.push(d);
        backend = b;
        ip_without.push(ip_batch_once_with(batch.clone(), routes.len(), false)?.0);
        ip_with.push(ip_batch_once_with(batch.clone(), routes.len(), true)?.0);
    }
    let (with, without) = (median(with), median(without));
    let (ip_with, ip_without) = (median(ip_with), median(ip_without));
    let n = routes.len() as f64;
    let added_us = |w: std::time::Duration, wo: std::time::Duration| (w.as_secs_f64() - wo.as_secs_f64()) * 1e6 / n;
    let rw_ratio = with.as_secs_f64() / without.as_secs_f64();
    let ip_ratio = ip_with.as_secs_f64() / ip_without.as_secs_f64();
    Ok(Outcome::Measured {
        name: name.into(),
        ratio: rw_ratio.max(ip_ratio),
        target: Target::AtMost(1.05),
        ok: true,
        details: vec![
            kv("routes", routes.len()),
            kv("rw_ratio", fmt_ratio(rw_ratio)),
            kv("ip_batch_ratio", fmt_ratio(ip_ratio)),
            kv("rw_with_watch_ms", ms(with)),
            kv("rw_without_ms", ms(without)),
            kv("ip_batch_with_watch_ms", ms(ip_with)),
            kv("ip_batch_without_ms", ms(ip_without)),
            kv("rw_added_us_per_write", format!("{:.3}", added_us(with, without))),
            kv("ip_batch_added_us_per_write", format!("{:.3}", added_us(ip_with, ip_without))),
            kv("backend", backend),
            kv("runs", opts.runs),
        ],
    })
}
