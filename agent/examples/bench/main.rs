//! routewarden's benchmark harness (`cargo xtask bench` builds it in release mode and runs it).
//!
//! Kept out of the shipped CLI on purpose: it is an example of the agent crate, so `cargo test`
//! compiles it (it cannot rot), and `agent/tests/bench_smoke.rs` runs a tiny instance of it.
//!
//! ```text
//! bench [NAME...] [--agent-bin PATH] [--quick] [--runs N] [--tiny]
//! ```
//!
//! Each benchmark runs in network namespaces it creates (never the machine's own) and prints
//! exactly one line on stdout: `bench <name> ratio=<value> target=<value> <details>`.
//! Everything else goes to stderr. See BENCHMARKS.md at the repository root.

mod harness;

fn main() -> std::process::ExitCode {
    harness::main_cli()
}
