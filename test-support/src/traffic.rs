//! Workload traffic for the lab: UDP echo servers and probes run on threads that entered a
//! lab namespace, so the sockets live there. Used to prove that cross-node workload traffic
//! flows (or fails) instead of assuming it from the routes.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::lab::in_named_netns;

/// The UDP port echo servers listen on.
pub const ECHO_PORT: u16 = 7007;

/// A UDP echo server on `ip:ECHO_PORT` inside a namespace; stops when dropped.
pub struct UdpEcho {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl UdpEcho {
    /// Bind `ip:ECHO_PORT` inside namespace `netns` and echo every datagram back.
    ///
    /// # Errors
    /// The namespace cannot be entered or the address cannot be bound.
    pub fn start(netns: &str, ip: IpAddr) -> Result<UdpEcho> {
        let sock =
            in_named_netns(netns, move || UdpSocket::bind(SocketAddr::new(ip, ECHO_PORT)))?.with_context(|| format!("bind {ip}:{ECHO_PORT} in {netns}"))?;
        sock.set_read_timeout(Some(Duration::from_millis(100)))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while !flag.load(Ordering::Relaxed) {
                if let Ok((n, from)) = sock.recv_from(&mut buf) {
                    let _ = sock.send_to(&buf[..n], from);
                }
            }
        });
        Ok(UdpEcho { stop, thread: Some(thread) })
    }
}

impl Drop for UdpEcho {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Send `tries` datagrams from namespace `netns` (bound to `from`) to `to:ECHO_PORT`, one at a
/// time, waiting up to `wait` for each echo. Returns how many came back.
///
/// # Errors
/// The namespace cannot be entered or the socket cannot be bound.
pub fn echo_count(netns: &str, from: IpAddr, to: IpAddr, tries: u32, wait: Duration) -> Result<u32> {
    in_named_netns(netns, move || -> Result<u32> {
        let sock = UdpSocket::bind(SocketAddr::new(from, 0)).with_context(|| format!("bind {from}"))?;
        sock.set_read_timeout(Some(wait))?;
        let mut ok = 0;
        let mut buf = [0u8; 64];
        for i in 0..tries {
            let msg = format!("probe {i}");
            // A send can fail with EHOSTUNREACH/ENETUNREACH after an ICMP error: a lost probe.
            if sock.send_to(msg.as_bytes(), SocketAddr::new(to, ECHO_PORT)).is_err() {
                std::thread::sleep(wait.min(Duration::from_millis(100)));
                continue;
            }
            let deadline = Instant::now() + wait;
            while Instant::now() < deadline {
                match sock.recv_from(&mut buf) {
                    Ok((n, _)) if &buf[..n] == msg.as_bytes() => {
                        ok += 1;
                        break;
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
        }
        Ok(ok)
    })?
}

/// What a [`Probe`] measured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeResult {
    /// Datagrams sent.
    pub sent: u64,
    /// Datagrams whose echo came back (each counted once).
    pub echoed: u64,
    /// Sequence numbers with no echo.
    pub lost: Vec<u64>,
}

/// A continuous probe: one datagram every `interval` from a namespace to `to:ECHO_PORT`, each
/// with a sequence number; echoes are matched by sequence number.
pub struct Probe {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<ProbeResult>>>,
}

impl Probe {
    /// Start probing from `netns` (source `from`) to `to`.
    ///
    /// # Errors
    /// The namespace cannot be entered or the socket cannot be bound.
    ///
    /// # Panics
    /// Never in practice: the probe thread reads its sequence number from an 8-byte prefix
    /// it checked the length of.
    pub fn start(netns: &str, from: IpAddr, to: IpAddr, interval: Duration) -> Result<Probe> {
        let sock = in_named_netns(netns, move || UdpSocket::bind(SocketAddr::new(from, 0)))?.with_context(|| format!("bind {from} in {netns}"))?;
        sock.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || -> Result<ProbeResult> {
            let target = SocketAddr::new(to, ECHO_PORT);
            let mut seen = std::collections::BTreeSet::new();
            let mut sent = 0u64;
            let mut buf = [0u8; 64];
            let mut next = Instant::now();
            let mut drain_until: Option<Instant> = None;
            loop {
                let now = Instant::now();
                if drain_until.is_none() && flag.load(Ordering::Relaxed) {
                    // Give the last echoes time to come back.
                    drain_until = Some(now + Duration::from_millis(300));
                }
                if drain_until.is_some_and(|d| now >= d) {
                    break;
                }
                if drain_until.is_none() && now >= next {
                    let _ = sock.send_to(&sent.to_be_bytes(), target);
                    sent += 1;
                    next += interval;
                }
                while let Ok((n, _)) = sock.recv_from(&mut buf) {
                    if n == 8 {
                        seen.insert(u64::from_be_bytes(buf[..8].try_into().expect("8 bytes")));
                    }
                }
                std::thread::sleep(Duration::from_micros(500));
            }
            let lost = (0..sent).filter(|s| !seen.contains(s)).collect();
            Ok(ProbeResult { sent, echoed: seen.len() as u64, lost })
        });
        Ok(Probe { stop, thread: Some(thread) })
    }

    /// Stop sending, wait 300 ms for the last echoes, and return the result.
    ///
    /// # Errors
    /// The probe thread panicked.
    ///
    /// # Panics
    /// Only if called twice (the thread handle is taken once).
    pub fn finish(mut self) -> Result<ProbeResult> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().expect("running").join().map_err(|_| anyhow::anyhow!("probe thread panicked"))?
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
