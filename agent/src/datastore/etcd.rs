//! Calico's etcdv3 datastore (`--datastore etcd`): one range read of `/calico/` at a
//! revision, then a watch from the next revision.
//!
//! The keys read and how their values become model objects are in `etcd/layout.rs` (each
//! key's Calico source cited there); the last good object of every key and the snapshots in
//! `etcd/view.rs`. Behaviour, as the other datastores:
//!
//! - The range read is a consistent view at its revision: the snapshot built from it is
//!   complete, so `Synced` follows it; the watch starts at revision + 1, so nothing is missed.
//! - A watch whose start revision was compacted away (etcd's equivalent of a 410) or that
//!   etcd cancels is re-listed at once; until that read completes the datastore is
//!   `Unsynced` (keep every route, delete nothing).
//! - An unreachable etcd (connect, read or watch failing) makes it `Unsynced` with the error;
//!   it reconnects after the Kubernetes datastore's retry delays
//!   ([`crate::datastore::retry_delays`]: 500 ms doubling to 5 s plus jitter, under 10 s) and
//!   re-lists.
//!   Keys absent from the re-list are gone: positive evidence, applied only when synced again.
//! - A value that is not JSON, or not a good object, keeps that key's last good object; the
//!   error names the key (`/calico/resources/v3/projectcalico.org/ippools/p: ...`).
//! - A key deletion removes the object; it is applied as soon as the watch delivers it, and
//!   the watch runs only while synced.

mod layout;
mod view;

use std::path::{Path, PathBuf};
use std::time::Duration;

use backon::{BackoffBuilder as _, ExponentialBackoff};
use etcd_client::{Certificate, Client, ConnectOptions, EventType, GetOptions, Identity, TlsOptions, WatchOptions};
use tokio::sync::mpsc;

pub use layout::{affinity_key, block_key, classify, etcd_entry, KeyKind, AFFINITY_TYPES, PREFIX, RESOURCE_PLURALS};
pub(crate) use view::View;

use super::error::DatastoreError;
use super::event::{Datastore, DatastoreEvent, Snapshot};

/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// HTTP/2 keep-alive: a silently dead etcd is noticed within interval + timeout.
const KEEP_ALIVE: (Duration, Duration) = (Duration::from_secs(5), Duration::from_secs(5));

/// Where etcd is and how to authenticate (calicoctl's `ETCD_*` settings).
///
/// TLS is on when any of the three files is set, and then every endpoint is `https://`
/// (etcd-client refuses TLS options on an `http://` URL; a bare `host:port` gets `https://`).
/// An `https://` endpoint needs `ca_file`: the server certificate is checked against that CA
/// bundle only (the agent carries no system roots for etcd). [`EtcdOptions::check`] enforces
/// both before anything connects.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EtcdOptions {
    /// `http(s)://host:port` URLs (or `host:port`); at least one.
    pub endpoints: Vec<String>,
    /// PEM CA bundle the server certificate must chain to (enables TLS).
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate (mTLS); needs `key_file`.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
}

/// The etcdv3 datastore.
#[derive(Clone, Debug)]
pub struct EtcdDatastore {
    options: EtcdOptions,
}

impl EtcdOptions {
    /// The settings that can never connect, refused up front with what to change: no
    /// endpoint, an `http://` endpoint with TLS files, an `https://` endpoint without a CA
    /// file, a client certificate without its key (or the reverse).
    pub fn check(&self) -> Result<(), DatastoreError> {
        if self.endpoints.is_empty() {
            return Err(no_endpoints());
        }
        let tls = self.tls();
        for e in &self.endpoints {
            if tls && e.starts_with("http://") {
                return Err(DatastoreError::Etcd(format!(
                    "etcd endpoint {e} is http:// but --etcd-ca-file/--etcd-cert-file/--etcd-key-file are set: write it https://{} (TLS needs an https:// endpoint)",
                    e.trim_start_matches("http://")
                )));
            }
            if e.starts_with("https://") && self.ca_file.is_none() {
                return Err(DatastoreError::Etcd(format!(
                    "etcd endpoint {e} is https:// but --etcd-ca-file (ETCD_CA_CERT_FILE) is not set: the server certificate is checked against that CA only"
                )));
            }
        }
        match (&self.cert_file, &self.key_file) {
            (Some(_), None) | (None, Some(_)) => {
                Err(DatastoreError::Etcd("--etcd-cert-file and --etcd-key-file go together (ETCD_CERT_FILE, ETCD_KEY_FILE)".to_owned()))
            }
            _ => Ok(()),
        }
    }

    /// Whether TLS is configured (any of the three files set).
    fn tls(&self) -> bool {
        self.ca_file.is_some() || self.cert_file.is_some() || self.key_file.is_some()
    }

    /// What a TLS failure is checked against, for error messages: ` (TLS: CA file ..., client
    /// certificate ...)`, empty without TLS.
    fn tls_note(&self) -> String {
        if !self.tls() {
            return String::new();
        }
        let mut parts = Vec::new();
        if let Some(ca) = &self.ca_file {
            parts.push(format!("CA file {}", ca.display()));
        }
        if let Some(cert) = &self.cert_file {
            parts.push(format!("client certificate {}", cert.display()));
        }
        format!(" (TLS: {})", parts.join(", "))
    }
}

/// An etcd client error as one line: a gRPC status by its message and the causes under it
/// (tonic's "transport error" alone hides the TLS reason, such as `received fatal alert:
/// BadCertificate`, in its sources), anything else with its causes once
/// ([`crate::text::causes_once`]).
fn describe(e: &etcd_client::Error) -> String {
    match e {
        etcd_client::Error::GRpcStatus(status) => {
            let mut out = status.message().to_owned();
            crate::text::append_causes(&mut out, std::error::Error::source(status));
            out
        }
        other => crate::text::causes_once(other),
    }
}

impl EtcdDatastore {
    pub fn new(options: EtcdOptions) -> EtcdDatastore {
        EtcdDatastore { options }
    }

    /// Run as a task.
    pub fn spawn(self, tx: mpsc::Sender<DatastoreEvent>) -> tokio::task::JoinHandle<Result<(), DatastoreError>> {
        tokio::spawn(self.run(tx))
    }

    /// Read the cluster once (one range read of [`PREFIX`]); no retries. Keys whose value is
    /// broken are left out and reported in the snapshot.
    pub async fn load(&self) -> Result<Snapshot, DatastoreError> {
        self.options.check()?;
        let mut client = self.connect().await.map_err(DatastoreError::Etcd)?;
        let (_, kvs) = self.range_read(&mut client).await.map_err(DatastoreError::Etcd)?;
        let mut view = View::default();
        view.reset(kvs);
        Ok(view.snapshot())
    }

    /// A connected client. Errors name the endpoints and the TLS files.
    async fn connect(&self) -> Result<Client, String> {
        let options = self.connect_options()?;
        Client::connect(&self.options.endpoints, Some(options))
            .await
            .map_err(|e| format!("etcd {}: cannot connect: {}{}", self.endpoints(), describe(&e), self.options.tls_note()))
    }

    /// Every key under [`PREFIX`] and the revision they were read at.
    async fn range_read(&self, client: &mut Client) -> Result<(i64, Vec<(String, Vec<u8>)>), String> {
        let mut read = client
            .get(PREFIX, Some(GetOptions::new().with_prefix()))
            .await
            .map_err(|e| format!("etcd {}: range read of {PREFIX}: {}{}", self.endpoints(), describe(&e), self.options.tls_note()))?;
        let revision = read.header().map_or(0, etcd_client::ResponseHeader::revision);
        let kvs = read.take_kvs().into_iter().map(|kv| {
            let (key, value) = kv.into_key_value();
            (String::from_utf8_lossy(&key).into_owned(), value)
        });
        Ok((revision, kvs.collect()))
    }

    fn endpoints(&self) -> String {
        self.options.endpoints.join(",")
    }

    /// The connection options, reading the TLS files. Errors name the file.
    fn connect_options(&self) -> Result<ConnectOptions, String> {
        let read = |p: &Path, what: &str| std::fs::read(p).map_err(|e| format!("cannot read the etcd {what} {}: {e}", p.display()));
        let mut options = ConnectOptions::new().with_connect_timeout(CONNECT_TIMEOUT).with_keep_alive(KEEP_ALIVE.0, KEEP_ALIVE.1);
        let o = &self.options;
        if !o.tls() {
            return Ok(options);
        }
        let mut tls = TlsOptions::new();
        if let Some(ca) = &o.ca_file {
            tls = tls.ca_certificate(Certificate::from_pem(read(ca, "CA file")?));
        }
        match (&o.cert_file, &o.key_file) {
            (Some(cert), Some(key)) => tls = tls.identity(Identity::from_pem(read(cert, "certificate file")?, read(key, "key file")?)),
            (None, None) => {}
            _ => return Err("--etcd-cert-file and --etcd-key-file go together".to_owned()),
        }
        options = options.with_tls(tls);
        Ok(options)
    }

    /// Connect, read everything, then apply the watch until it fails. Returns why it stopped
    /// (`Ok` when the receiver is gone).
    async fn session(&self, state: &mut State, tx: &mpsc::Sender<DatastoreEvent>) -> Result<(), Stop> {
        let endpoints = self.endpoints();
        let mut client = self.connect().await.map_err(Stop::Failed)?;
        let (revision, kvs) = self.range_read(&mut client).await.map_err(Stop::Failed)?;
        state.view.reset(kvs);
        tracing::info!(revision, keys = state.view.len(), "etcd: read {PREFIX}");
        let mut watch = client.watch(PREFIX, Some(WatchOptions::new().with_prefix().with_start_revision(revision + 1))).await.map_err(|e| {
            Stop::Failed(format!("etcd {endpoints}: watch of {PREFIX} from revision {}: {}{}", revision + 1, describe(&e), self.options.tls_note()))
        })?;
        state.publish(tx).await?;
        if !state.synced {
            state.synced = true;
            state.unsynced = None;
            send(tx, DatastoreEvent::Synced).await?;
        }
        state.backoff = None;
        loop {
            let response = match watch.message().await {
                Ok(Some(r)) => r,
                Ok(None) => return Err(Stop::Failed(format!("etcd {endpoints}: the watch of {PREFIX} ended"))),
                Err(e) => return Err(Stop::Failed(format!("etcd {endpoints}: watch of {PREFIX}: {}{}", describe(&e), self.options.tls_note()))),
            };
            if response.compact_revision() > 0 {
                return Err(Stop::Relist(format!(
                    "etcd {endpoints}: watch revision compacted (oldest kept {}); re-listing {PREFIX}",
                    response.compact_revision()
                )));
            }
            if response.canceled() {
                return Err(Stop::Relist(format!("etcd {endpoints}: watch canceled ({}); re-listing {PREFIX}", response.cancel_reason())));
            }
            // A snapshot is built from every key: only when an event touched one that
            // routewarden reads (the watch of `/calico/` also carries Felix's status keys).
            let mut changed = false;
            for event in response.events() {
                let Some(kv) = event.kv() else { continue };
                let key = String::from_utf8_lossy(kv.key());
                changed |= match event.event_type() {
                    EventType::Put => state.view.put(&key, kv.value()),
                    EventType::Delete => state.view.delete(&key),
                };
            }
            if changed {
                state.publish(tx).await?;
            }
        }
    }
}

/// Why a session stopped.
enum Stop {
    /// The receiver is gone.
    Closed,
    /// etcd failed: back off, then reconnect.
    Failed(String),
    /// The watch cannot continue from where it is: re-list now.
    Relist(String),
}

/// What survives reconnections.
struct State {
    view: View,
    synced: bool,
    /// The reason last sent with `Unsynced`.
    unsynced: Option<String>,
    last: Option<Snapshot>,
    /// The retry delays since the last successful read (`None`: start afresh).
    backoff: Option<ExponentialBackoff>,
}

impl State {
    /// Send the snapshot if it differs from the last one sent.
    async fn publish(&mut self, tx: &mpsc::Sender<DatastoreEvent>) -> Result<(), Stop> {
        let snapshot = self.view.snapshot();
        if self.last.as_ref() != Some(&snapshot) {
            self.last = Some(snapshot.clone());
            send(tx, DatastoreEvent::Snapshot(snapshot)).await?;
        }
        Ok(())
    }

    /// Become unsynced with `reason` (sent on the transition and when the reason changes).
    async fn unsync(&mut self, tx: &mpsc::Sender<DatastoreEvent>, reason: String) -> Result<(), Stop> {
        self.synced = false;
        if self.unsynced.as_ref() != Some(&reason) {
            tracing::warn!(%reason, "etcd: unsynced");
            self.unsynced = Some(reason.clone());
            send(tx, DatastoreEvent::Unsynced { reason }).await?;
        }
        Ok(())
    }

    /// The next reconnection delay ([`crate::datastore::retry_delays`], endless; the jitter is
    /// never clipped, so agents at the longest step still retry apart).
    fn next_delay(&mut self) -> Duration {
        let backoff = self.backoff.get_or_insert_with(|| crate::datastore::retry_delays().build());
        backoff.next().unwrap_or(Duration::from_secs(5))
    }
}

fn no_endpoints() -> DatastoreError {
    DatastoreError::Etcd("no etcd endpoints: set --etcd-endpoints (or ETCD_ENDPOINTS)".to_owned())
}

async fn send(tx: &mpsc::Sender<DatastoreEvent>, event: DatastoreEvent) -> Result<(), Stop> {
    tx.send(event).await.map_err(|_| Stop::Closed)
}

impl Datastore for EtcdDatastore {
    fn describe(&self) -> String {
        format!("etcd:{}", self.options.endpoints.join(","))
    }

    async fn run(self, tx: mpsc::Sender<DatastoreEvent>) -> Result<(), DatastoreError> {
        self.options.check()?;
        let mut state = State { view: View::default(), synced: false, unsynced: None, last: None, backoff: None };
        loop {
            let (reason, delay) = match self.session(&mut state, &tx).await {
                Ok(()) | Err(Stop::Closed) => return Ok(()),
                Err(Stop::Failed(reason)) => (reason, Some(state.next_delay())),
                Err(Stop::Relist(reason)) => (reason, None),
            };
            if let Err(Stop::Closed) = state.unsync(&tx, reason).await {
                return Ok(());
            }
            if let Some(delay) = delay {
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = tx.closed() => return Ok(()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(endpoints: &[&str], ca: Option<&str>, cert: Option<&str>, key: Option<&str>) -> EtcdOptions {
        EtcdOptions {
            endpoints: endpoints.iter().map(|e| (*e).to_owned()).collect(),
            ca_file: ca.map(PathBuf::from),
            cert_file: cert.map(PathBuf::from),
            key_file: key.map(PathBuf::from),
        }
    }

    fn check(o: &EtcdOptions) -> Result<(), String> {
        o.check().map_err(|e| e.to_string())
    }

    #[test]
    fn settings_that_can_never_connect_are_refused_with_what_to_change() {
        assert_eq!(check(&opts(&["http://127.0.0.1:2379"], None, None, None)), Ok(()));
        assert_eq!(check(&opts(&["https://10.0.0.1:2379", "10.0.0.2:2379"], Some("/ca.pem"), Some("/c.pem"), Some("/k.pem"))), Ok(()));
        assert_eq!(check(&opts(&[], None, None, None)), Err("datastore etcd: no etcd endpoints: set --etcd-endpoints (or ETCD_ENDPOINTS)".to_owned()));
        assert_eq!(
            check(&opts(&["https://10.0.0.1:2379", "http://10.0.0.2:2379"], Some("/ca.pem"), None, None)),
            Err("datastore etcd: etcd endpoint http://10.0.0.2:2379 is http:// but --etcd-ca-file/--etcd-cert-file/--etcd-key-file are set: write it https://10.0.0.2:2379 (TLS needs an https:// endpoint)".to_owned())
        );
        assert_eq!(
            check(&opts(&["https://10.0.0.1:2379"], None, Some("/c.pem"), Some("/k.pem"))),
            Err("datastore etcd: etcd endpoint https://10.0.0.1:2379 is https:// but --etcd-ca-file (ETCD_CA_CERT_FILE) is not set: the server certificate is checked against that CA only".to_owned())
        );
        assert_eq!(
            check(&opts(&["https://10.0.0.1:2379"], Some("/ca.pem"), Some("/c.pem"), None)),
            Err("datastore etcd: --etcd-cert-file and --etcd-key-file go together (ETCD_CERT_FILE, ETCD_KEY_FILE)".to_owned())
        );
    }

    #[test]
    fn tls_errors_name_the_files_checked_against() {
        assert_eq!(opts(&["http://x:2379"], None, None, None).tls_note(), "");
        assert_eq!(opts(&["https://x:2379"], Some("/ca.pem"), Some("/c.pem"), Some("/k.pem")).tls_note(), " (TLS: CA file /ca.pem, client certificate /c.pem)");
    }
}
