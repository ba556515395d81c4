//! The agent's DaemonSet run as a kubelet would hand it to a container runtime: `podman run`
//! with the container's args, env, securityContext and volume mounts, in a lab node namespace
//! standing in for the host network (`hostNetwork`). Shared by the image test (the shipped
//! `deploy/daemonset.yaml`) and the in-cluster test (the kustomize-rendered DaemonSet).
//!
//! This translates; it does not judge: each test asserts the settings it relies on before
//! running the container.

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};

use serde_json::Value;

/// What to run: the DaemonSet (as JSON), where, and what differs from the shipped container.
pub struct DaemonSetRun<'a> {
    /// The agent's DaemonSet; its pod template's first container is run.
    pub daemonset: &'a Value,
    /// The container's name (`podman run --name`).
    pub name: &'a str,
    /// The lab node namespace (under `/run/netns`) the container joins.
    pub netns: &'a str,
    /// The image id.
    pub image: &'a str,
    /// The node name the kubelet fills into env vars from `fieldRef: spec.nodeName`.
    pub node: &'a str,
    /// Env vars whose value replaces the DaemonSet's, by name.
    pub env_overrides: &'a [(&'a str, &'a str)],
    /// `--security-opt` values beyond the DaemonSet's (a seccomp profile).
    pub security_opts: &'a [String],
    /// Further `podman run` arguments (volumes, env), given after the DaemonSet's.
    pub extra_args: Vec<String>,
}

fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or_else(|| panic!("no string {key:?} in {v}"))
}

/// The `podman run` command for `run`, stdin closed.
///
/// podman's default runtime here, crun 1.8, refuses this machine's hybrid cgroups; runc runs it.
/// The default rlimits fail too (EPERM): RLIMIT_NOFILE 1048576 is above this process's hard
/// limit and this machine's root lacks CAP_SYS_RESOURCE to raise it, and podman runs with
/// RLIMIT_NPROC 32768 (measured in its /proc/<pid>/limits) but asks for more for the
/// container. So the limits passed are ours for files and 32768 processes.
///
/// # Panics
/// When the DaemonSet lacks a field a kubelet needs (container, securityContext, volumes), or
/// an env var is filled from anything but `spec.nodeName`.
pub fn daemonset_podman_run(run: &DaemonSetRun<'_>) -> Command {
    let pod = &run.daemonset["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let sc = &c["securityContext"];
    let nofile = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap().1;
    let nproc = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NPROC).unwrap().1.min(32_768);
    let mut cmd = Command::new("podman");
    cmd.args(["--runtime", "runc", "run", "--rm", "--name", run.name, "--pull", "never"])
        .arg(format!("--network=ns:/run/netns/{}", run.netns))
        .arg(format!("--ulimit=nofile={nofile}:{nofile}"))
        .arg(format!("--ulimit=nproc={nproc}:{nproc}"));
    if sc["readOnlyRootFilesystem"] == true {
        // Kubernetes adds no tmpfs to a read-only root; podman would.
        cmd.args(["--read-only", "--read-only-tmpfs=false"]);
    }
    if sc["allowPrivilegeEscalation"] == false {
        cmd.args(["--security-opt", "no-new-privileges"]);
    }
    // RuntimeDefault: the runtime's own profile, unless the caller passes one.
    for opt in run.security_opts {
        cmd.args(["--security-opt", opt]);
    }
    cmd.arg(format!("--user={}", sc["runAsUser"].as_u64().unwrap()));
    for cap in sc["capabilities"]["drop"].as_array().unwrap() {
        cmd.arg(format!("--cap-drop={}", cap.as_str().unwrap()));
    }
    for cap in sc["capabilities"]["add"].as_array().unwrap() {
        cmd.arg(format!("--cap-add={}", cap.as_str().unwrap()));
    }
    for m in c["volumeMounts"].as_array().unwrap() {
        let vol = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == m["name"]).unwrap();
        let ro = if m["readOnly"] == true { ":ro" } else { "" };
        cmd.arg(format!("--volume={}:{}{ro}", s(&vol["hostPath"], "path"), s(m, "mountPath")));
    }
    for e in c["env"].as_array().unwrap() {
        let key = s(e, "name");
        let value = if let Some((_, v)) = run.env_overrides.iter().find(|(k, _)| *k == key) {
            (*v).to_owned()
        } else if let Some(v) = e.get("value") {
            v.as_str().unwrap().to_owned()
        } else {
            assert_eq!(e["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName", "the only env var a kubelet fills: {e}");
            run.node.to_owned()
        };
        cmd.arg(format!("--env={key}={value}"));
    }
    cmd.args(&run.extra_args);
    cmd.arg(run.image);
    for a in c["args"].as_array().unwrap() {
        cmd.arg(a.as_str().unwrap());
    }
    cmd.stdin(Stdio::null());
    cmd
}

/// A `podman run` container, removed on drop (`podman rm -f`); its output in `log` when the
/// caller sent it to a file.
pub struct Container {
    /// The container's name.
    pub name: String,
    /// The `podman run` process, until stopped.
    pub run: Option<Child>,
    /// The file its output goes to, if any.
    pub log: Option<PathBuf>,
}

impl Container {
    /// Spawn `cmd` (a [`daemonset_podman_run`]) as the container `name`.
    ///
    /// # Panics
    /// When podman cannot be started.
    pub fn spawn(name: &str, cmd: &mut Command, log: Option<PathBuf>) -> Container {
        Container { name: name.to_owned(), run: Some(cmd.spawn().unwrap()), log }
    }

    /// Its output so far (empty without a log file).
    pub fn log(&self) -> String {
        self.log.as_ref().and_then(|l| std::fs::read_to_string(l).ok()).unwrap_or_default()
    }

    /// `podman run` has not exited yet.
    ///
    /// # Panics
    /// After [`Container::stop`].
    pub fn running(&mut self) -> bool {
        self.run.as_mut().unwrap().try_wait().unwrap().is_none()
    }

    /// SIGTERM, as the kubelet stops a pod (`podman stop -t 10`); the exit status of
    /// `podman run`, which is the agent's.
    ///
    /// # Panics
    /// When `podman stop` fails, or on a second call.
    pub fn stop(&mut self) -> ExitStatus {
        let out = Command::new("podman").args(["stop", "-t", "10", &self.name]).output().unwrap();
        assert!(out.status.success(), "podman stop: {}", String::from_utf8_lossy(&out.stderr));
        self.run.take().unwrap().wait().unwrap()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("podman").args(["rm", "-f", "-t", "0", &self.name]).output();
        if let Some(mut c) = self.run.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
