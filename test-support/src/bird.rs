//! [`Bird`]: a real BIRD 2 (Debian's `bird2`) run by a test inside a lab namespace, with its
//! configuration, control socket and pid file in a directory the test owns.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Where Debian's `bird2` installs the daemon.
pub const BIRD: &str = "/usr/sbin/bird";
/// ... and its client.
pub const BIRDC: &str = "/usr/sbin/birdc";

/// True when BIRD 2 is installed (tests print why they skip otherwise).
pub fn available() -> bool {
    Path::new(BIRD).exists() && Path::new(BIRDC).exists()
}

/// A running BIRD; killed (SIGKILL: its kernel routes stay, as after a crash) on drop.
pub struct Bird {
    child: Option<Child>,
    dir: PathBuf,
    name: String,
}

impl Bird {
    /// Check `conf` with `bird -p`, then start BIRD in the foreground inside network namespace
    /// `netns` (or the calling thread's namespace with `None`) and wait for its control socket.
    /// Files: `<dir>/<name>.conf`, `.ctl`, `.pid`, `.log` (BIRD's stderr).
    ///
    /// # Errors
    /// The configuration does not parse (BIRD's message in the error), or BIRD does not come up
    /// within 10 s.
    pub fn start(netns: Option<&str>, dir: &Path, name: &str, conf: &str) -> Result<Bird> {
        let bird = Bird { child: None, dir: dir.to_path_buf(), name: name.to_string() };
        bird.check_and_write(conf)?;
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, BIRD]);
                c
            }
            None => Command::new(BIRD),
        };
        let log = std::fs::File::create(bird.path("log"))?;
        cmd.arg("-f").arg("-c").arg(bird.path("conf")).arg("-s").arg(bird.path("ctl")).arg("-P").arg(bird.path("pid"));
        let child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log).spawn().context("start bird")?;
        let mut bird = bird;
        bird.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while bird.birdc(&["show", "status"]).is_err() {
            if Instant::now() > deadline {
                bail!("BIRD {name} did not come up: {}", std::fs::read_to_string(bird.path("log")).unwrap_or_default());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(bird)
    }

    fn path(&self, ext: &str) -> PathBuf {
        self.dir.join(format!("{}.{ext}", self.name))
    }

    fn check_and_write(&self, conf: &str) -> Result<()> {
        let candidate = self.path("conf.new");
        std::fs::write(&candidate, conf)?;
        let out = Command::new(BIRD).arg("-p").arg("-c").arg(&candidate).output().context("run bird -p")?;
        if !out.status.success() {
            bail!("bird -p rejects {}: {}", candidate.display(), String::from_utf8_lossy(&out.stderr).trim());
        }
        std::fs::rename(&candidate, self.path("conf"))?;
        Ok(())
    }

    /// Run `birdc -s <ctl> <args>` and return its output.
    ///
    /// # Errors
    /// birdc fails (BIRD not running, unknown command).
    pub fn birdc(&self, args: &[&str]) -> Result<String> {
        let out = Command::new(BIRDC).arg("-s").arg(self.path("ctl")).args(args).output().context("run birdc")?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            bail!("birdc {} failed: {text}{}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        }
        Ok(text)
    }

    /// Replace the configuration (checked with `bird -p` first) and `birdc configure`.
    ///
    /// # Errors
    /// The new configuration does not parse, or BIRD does not report reconfiguration.
    pub fn configure(&self, conf: &str) -> Result<()> {
        self.check_and_write(conf)?;
        let out = self.birdc(&["configure"])?;
        if !out.contains("Reconfigured") && !out.contains("Reconfiguration in progress") {
            bail!("birdc configure: {out}");
        }
        Ok(())
    }

    /// Names of the BGP protocols in state Established.
    ///
    /// # Errors
    /// birdc fails.
    pub fn established(&self) -> Result<Vec<String>> {
        let out = self.birdc(&["show", "protocols"])?;
        Ok(out.lines().filter(|l| l.contains(" BGP ") && l.contains("Established")).filter_map(|l| l.split_whitespace().next().map(str::to_string)).collect())
    }

    /// The BIRD process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL BIRD and reap it: a crash or an upgrade that kills the pod; BIRD's routes stay
    /// in the kernel (it gets no chance to remove them).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Bird {
    fn drop(&mut self) {
        self.kill();
    }
}
