//! The API server probe: `GET /version` on a timer, in a task of its own, so a hung server
//! (TCP up, nothing answered) is noticed although every watch is silent.

use std::time::Duration;

use kube::Client;
use tokio::sync::mpsc;

use super::error::describe_kube_error;

/// The API server probe: `GET /version` every `interval`; no answer within `timeout` means the
/// server is hung (TCP up, nothing answered: watches would stay silent until their 290 s
/// timeout while `/readyz` said synced).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    pub interval: Duration,
    pub timeout: Duration,
}

/// Probes in a row without an answer before every watch is restarted (the first miss only
/// makes the datastore unsynced).
pub const PROBE_MISSES_BEFORE_RELIST: u32 = 2;

/// Probe every 30 s, allow 10 s.
pub const DEFAULT_PROBE: Probe = Probe { interval: Duration::from_secs(30), timeout: Duration::from_secs(10) };

/// Probe the API server every `probe.interval` in a task of its own; send `Ok` when it
/// answered (any HTTP answer, even an error status: it is not hung) and `Err(reason)` when it
/// did not within `probe.timeout` or could not be reached. Ends when the receiver is dropped.
pub(super) fn spawn_probe(client: Client, probe: Probe) -> mpsc::Receiver<Result<(), String>> {
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = tx.closed() => return,
                () = tokio::time::sleep(probe.interval) => {}
            }
            let answered = match tokio::time::timeout(probe.timeout, client.apiserver_version()).await {
                Ok(Ok(_) | Err(kube::Error::Api(_))) => Ok(()),
                Ok(Err(e)) => Err(format!("API server not reachable: GET /version: {}", describe_kube_error(&e))),
                Err(_) => Err(format!("API server not answering: GET /version got no answer within {} s", probe.timeout.as_secs())),
            };
            if tx.send(answered).await.is_err() {
                return;
            }
        }
    });
    rx
}
