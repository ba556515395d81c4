//! Calico's etcdv3 datastore (`--datastore etcd`): one range read at a revision of the parts
//! of `/calico/` it reads (`layout::read_prefixes`), then a watch of `/calico/` from the next
//! revision.
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
//!
//! The client half (`etcd/client.rs`: etcd-client, whose build needs `protoc`) is the
//! `etcd` feature, on by default; only `xtask` builds the agent without it, so that it
//! compiles on a fresh machine before `cargo xtask setup` has installed `protoc`. Built
//! without it, `--datastore etcd` fails at start and says so.

#[cfg(feature = "etcd")]
mod client;
mod layout;
#[cfg(feature = "etcd")]
mod view;

use std::path::PathBuf;

use tokio::sync::mpsc;

pub use layout::{affinity_key, block_key, classify, etcd_entry, KeyKind, AFFINITY_TYPES, PREFIX, RESOURCE_PLURALS};
#[cfg(feature = "etcd")]
pub(crate) use view::View;

use super::error::DatastoreError;
use super::event::{Datastore, DatastoreEvent, Snapshot};

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
    #[cfg_attr(not(feature = "etcd"), allow(dead_code, reason = "only the client half reports TLS failures"))]
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

impl EtcdDatastore {
    pub fn new(options: EtcdOptions) -> EtcdDatastore {
        EtcdDatastore { options }
    }

    /// Run as a task.
    pub fn spawn(self, tx: mpsc::Sender<DatastoreEvent>) -> tokio::task::JoinHandle<Result<(), DatastoreError>> {
        tokio::spawn(self.run(tx))
    }

    /// Read the cluster once (one range read of the read prefixes of [`PREFIX`]); no retries. Keys whose value is
    /// broken are left out and reported in the snapshot.
    ///
    /// Errors: [`EtcdOptions::check`]'s, then a connection or read failure naming the
    /// endpoints (and the TLS files); built without the `etcd` feature, that.
    #[cfg_attr(not(feature = "etcd"), allow(clippy::unused_async, reason = "async with the client half"))]
    pub async fn load(&self) -> Result<Snapshot, DatastoreError> {
        self.options.check()?;
        #[cfg(feature = "etcd")]
        let loaded = client::load(self).await;
        #[cfg(not(feature = "etcd"))]
        let loaded = Err(not_built());
        loaded
    }
}

fn no_endpoints() -> DatastoreError {
    DatastoreError::Etcd("no etcd endpoints: set --etcd-endpoints (or ETCD_ENDPOINTS)".to_owned())
}
/// The error of every etcd operation in a build without the `etcd` feature.
#[cfg(not(feature = "etcd"))]
fn not_built() -> DatastoreError {
    DatastoreError::Etcd("this routewarden was built without the `etcd` feature (cargo build --features etcd; it needs protoc)".to_owned())
}

impl Datastore for EtcdDatastore {
    fn describe(&self) -> String {
        format!("etcd:{}", self.options.endpoints.join(","))
    }
    async fn run(self, tx: mpsc::Sender<DatastoreEvent>) -> Result<(), DatastoreError> {
        self.options.check()?;
        #[cfg(feature = "etcd")]
        let ran = client::run(&self, &tx).await;
        #[cfg(not(feature = "etcd"))]
        let ran = {
            drop(tx);
            Err(not_built())
        };
        ran
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
