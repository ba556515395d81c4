//! Test support shared by routewarden's tests, benchmarks and `cargo xtask run` (the library of
//! the `routewarden-test-support` package, named `routewarden_lab`):
//!
//! - [`NetNsGuard`]: move the current thread into a fresh network namespace (with `lo` up) for
//!   the life of the guard, and back on drop (the habit of aya's integration tests).
//! - [`Lab`]: a throw-away lab of named network namespaces that mirrors a small cluster: one
//!   namespace per node, joined by a bridge in an underlay namespace, each with the node's
//!   address on its host NIC and a tunnel device; optionally a router namespace between
//!   subnets, a tunnel overlay and workload namespaces.
//! - [`bird::Bird`]: a real BIRD 2 run in a lab namespace; [`traffic`]: UDP echo and probes.
//! - [`skip`], [`skip_unless_root`]: the one way a test says it cannot run here.
//! - Feature `standin`: `standin`, the Kubernetes API-server stand-in (kube, hyper, rustls).
//! - Feature `agent` (implies `standin`), built on the agent crate's types: `cluster_routes`
//!   (`ClusterRoute` builders), `example` (the example cluster as a Kubernetes datastore serves
//!   it), `podman` (the rendered DaemonSet run as a kubelet would), `fake` (the agent's fake
//!   netlink and clock).
//!
//! Without features this is the lab alone (anyhow, nix): `cargo xtask` depends on it.
//!
//! SAFETY RULE: everything here changes links, routes and BPF state only inside namespaces it
//! created itself. Nothing touches the namespace the process started in.

pub mod bird;
pub mod lab;
pub mod netns;
pub mod traffic;

#[cfg(feature = "agent")]
pub mod cluster_routes;
#[cfg(feature = "agent")]
pub mod example;
#[cfg(feature = "agent")]
pub mod podman;

/// The agent's fake kernel behind `RouteNetlink` and its manual `Clock`
/// (`routewarden::dataplane::fake`), for tests that drive a reconciler without root.
#[cfg(feature = "agent")]
pub use routewarden::dataplane::fake;
#[cfg(feature = "standin")]
pub mod standin;

pub use lab::{Lab, LabNodeSpec, LabSpec};
pub use netns::NetNsGuard;

/// True when the process runs as root (uid 0), which the privileged tests need.
pub fn is_root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

/// Print why a privileged test cannot run and return `true` if it must be skipped.
///
/// Tests call this first: `if routewarden_lab::skip_unless_root("test_name") { return; }`.
/// A skipped test says so on stderr; it never passes silently.
pub fn skip_unless_root(test: &str) -> bool {
    if is_root() {
        false
    } else {
        skip(test, "needs root (CAP_NET_ADMIN) to create network namespaces; run `cargo xtask test` as root");
        true
    }
}

/// Environment variable naming the file every [`skip`] is also appended to. `cargo xtask test`
/// sets it for the host lane and fails the run on a skip its allow-list does not name
/// (`xtask/src/test.rs`, `HOST_ALLOWED_SKIPS`), so that no test passes with nothing checked.
pub const SKIP_LOG_ENV: &str = "ROUTEWARDEN_SKIP_LOG";

/// Say that test `test` cannot run here and why: prints `SKIPPED <test>: <reason>` to stderr
/// (the line the QEMU lane parses from its console) and, when [`SKIP_LOG_ENV`] names a file,
/// appends `<binary>\t<test>\t<reason>` to it as one line (`<binary>`: the test executable's
/// name without cargo's hash suffix; tabs and newlines in `reason` become spaces).
///
/// Every test that returns early without checking anything calls this; a repository scan
/// (`test-support/tests/skips.rs`) keeps any other way of printing `SKIPPED` out.
///
/// # Panics
/// When the skip log is named but cannot be appended to: a skip nobody can count would be the
/// silent skip this exists to prevent.
pub fn skip(test: &str, reason: impl std::fmt::Display) {
    let reason = reason.to_string().replace(['\t', '\n', '\r'], " ");
    eprintln!("SKIPPED {test}: {reason}");
    let Some(path) = std::env::var_os(SKIP_LOG_ENV) else { return };
    let exe = std::env::current_exe().ok();
    let name = exe.as_deref().and_then(std::path::Path::file_name).and_then(|n| n.to_str()).unwrap_or("?");
    let binary = match name.rsplit_once('-') {
        Some((stem, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => stem,
        _ => name,
    };
    let line = format!("{binary}\t{test}\t{reason}\n");
    let written = std::fs::OpenOptions::new().create(true).append(true).open(&path).and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
    if let Err(e) = written {
        panic!("cannot append the skip of {test} to {} ({SKIP_LOG_ENV}): {e}", std::path::Path::new(&path).display());
    }
}

/// A copy of the program `program` (looked up in `PATH`) named `name`, in `routewarden-named`
/// under the temporary directory (one for every test process, so that runs leave one
/// directory behind, not one each): run from there, its command name (`comm`, what the route
/// watch classes a writer by) is `name`. A writer that looks like BIRD (`bird`) or Felix
/// (`calico-node`) to the watch, with the behaviour of `program` (`ip`).
///
/// # Panics
/// When `program` is not in `PATH` or the copy fails.
pub fn program_named(program: &str, name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join("routewarden-named");
    let path = dir.join(name);
    if path.exists() {
        return path;
    }
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    let source = std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{program} not in PATH"));
    // Copied under a name of its own, then renamed: tests running at once (in this process or
    // another) never run a half copy.
    let part = dir.join(format!("{name}.{}.{:?}.part", std::process::id(), std::thread::current().id()).replace(['(', ')'], ""));
    std::fs::copy(&source, &part).unwrap_or_else(|e| panic!("copy {} to {}: {e}", source.display(), part.display()));
    std::fs::rename(&part, &path).unwrap_or_else(|e| panic!("rename {}: {e}", part.display()));
    path
}

/// The workspace root (this crate's parent folder), where `examples/`, `deploy/` and `docs/` are.
///
/// # Panics
/// Never: the crate's folder is compiled in and always has a parent.
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the crate sits in the workspace").to_path_buf()
}

/// The bundled example cluster (`examples/cluster`: Calico resources, IPAM, Nodes), the
/// datastore most tests read.
pub fn example_cluster_dir() -> std::path::PathBuf {
    repo_root().join("examples/cluster")
}

/// The shipped manifests (`deploy/`, a kustomize base), canonical: kustomize wants relative
/// paths computed from real ones.
///
/// # Panics
/// When `deploy/` is missing.
pub fn deploy_dir() -> std::path::PathBuf {
    repo_root().join("deploy").canonicalize().expect("deploy/ exists")
}
