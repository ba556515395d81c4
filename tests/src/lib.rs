//! Test harness shared by routewarden's privileged integration tests and `cargo xtask run`:
//!
//! - [`NetNsGuard`]: move the current thread into a fresh network namespace (with `lo` up) for
//!   the life of the guard, and back on drop (the habit of aya's integration tests).
//! - [`Lab`]: a throw-away lab of named network namespaces that mirrors a small cluster: one
//!   namespace per node, joined by a bridge in an underlay namespace, each with the node's
//!   address on its host NIC and a tunnel device; optionally a router namespace between
//!   subnets, a tunnel overlay and workload namespaces.
//! - [`bird::Bird`]: a real BIRD 2 run in a lab namespace; [`traffic`]: UDP echo and probes.
//!
//! SAFETY RULE: everything here changes links, routes and BPF state only inside namespaces it
//! created itself. Nothing touches the namespace the process started in.

pub mod bird;
pub mod lab;
pub mod netns;
pub mod traffic;

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
        eprintln!("SKIPPED {test}: needs root (CAP_NET_ADMIN) to create network namespaces; run `cargo xtask test` as root");
        true
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
