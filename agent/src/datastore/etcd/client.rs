//! The etcd client half of the etcdv3 datastore (the `etcd` feature): connecting (with TLS),
//! the range read, the watch, and the reconnect loop. What the keys mean and how a snapshot
//! is built are in the parent module's `layout.rs` and `view.rs`.

use std::path::Path;
use std::time::Duration;

use backon::{BackoffBuilder as _, ExponentialBackoff};
use etcd_client::{Certificate, Client, ConnectOptions, EventType, GetOptions, Identity, TlsOptions, WatchOptions};
use tokio::sync::mpsc;

use super::layout::read_prefixes;
use super::{EtcdDatastore, View, PREFIX};
use crate::datastore::error::DatastoreError;
use crate::datastore::event::{DatastoreEvent, Snapshot};

/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// HTTP/2 keep-alive: a silently dead etcd is noticed within interval + timeout.
const KEEP_ALIVE: (Duration, Duration) = (Duration::from_secs(5), Duration::from_secs(5));

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
/// [`EtcdDatastore::load`]: one range read into a fresh view.
pub(super) async fn load(ds: &EtcdDatastore) -> Result<Snapshot, DatastoreError> {
    let mut client = ds.connect().await.map_err(DatastoreError::Etcd)?;
    let mut view = View::default();
    let mut seen = std::collections::BTreeSet::new();
    ds.range_read(&mut client, |page| view.relist_page(page, &mut seen)).await.map_err(DatastoreError::Etcd)?;
    view.end_relist(&seen);
    Ok(view.snapshot())
}

/// [`EtcdDatastore`]'s `Datastore::run` after the options are checked: sessions until the
/// receiver is gone, unsynced with the reason between them.
pub(super) async fn run(ds: &EtcdDatastore, tx: &mpsc::Sender<DatastoreEvent>) -> Result<(), DatastoreError> {
    let mut state = State { view: View::default(), synced: false, unsynced: None, last: None, backoff: None };
    loop {
        let (reason, delay) = match ds.session(&mut state, tx).await {
            Ok(()) | Err(Stop::Closed) => return Ok(()),
            Err(Stop::Failed(reason)) => (reason, Some(state.next_delay())),
            Err(Stop::Relist(reason)) => (reason, None),
        };
        if let Err(Stop::Closed) = state.unsync(tx, reason).await {
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

impl EtcdDatastore {
    /// A connected client. Errors name the endpoints and the TLS files.
    async fn connect(&self) -> Result<Client, String> {
        let options = self.connect_options()?;
        Client::connect(&self.options.endpoints, Some(options))
            .await
            .map_err(|e| format!("etcd {}: cannot connect: {}{}", self.endpoints(), describe(&e), self.options.tls_note()))
    }

    /// Every key under the read prefixes ([`read_prefixes`]: what the view reads of
    /// [`PREFIX`], not the workload endpoints, IPAM handles and policies that are most of a live
    /// cluster's keys) and the revision they were read at. Each prefix is read in pages of
    /// [`RANGE_PAGE`] keys, each after the last key of the one before; every page after the
    /// first is read at the first one's revision (one consistent view; a revision compacted
    /// meanwhile fails the read, which is retried). One unpaged read of 100,000 IPAM blocks is
    /// a 110 MB response, past gRPC's 4 MiB default, and refused whole.
    ///
    /// A page's range ends at its prefix's end, not at the end of `/calico/`: etcd before 3.5
    /// walks the whole rest of a paged range for every page (`treeIndex.Revisions` takes no
    /// limit there), so narrower ranges cost it less.
    /// Returns the revision; `on_page` takes each page's keys and values.
    async fn range_read(&self, client: &mut Client, mut on_page: impl FnMut(Vec<(String, Vec<u8>)>)) -> Result<i64, String> {
        let mut kv = client.kv_client().max_decoding_message_size(MAX_RESPONSE);
        let mut revision = 0;
        for prefix in read_prefixes() {
            let mut end = prefix.as_bytes().to_vec();
            if let Some(last) = end.last_mut() {
                *last += 1;
            }
            let mut from = prefix.as_bytes().to_vec();
            loop {
                let mut options = GetOptions::new().with_range(end.clone()).with_limit(RANGE_PAGE);
                if revision > 0 {
                    options = options.with_revision(revision);
                }
                let mut page = kv
                    .get(from.clone(), Some(options))
                    .await
                    .map_err(|e| format!("etcd {}: range read of {PREFIX}: {}{}", self.endpoints(), describe(&e), self.options.tls_note()))?;
                if revision == 0 {
                    revision = page.header().map_or(0, etcd_client::ResponseHeader::revision);
                }
                let more = page.more();
                let kvs = page.take_kvs();
                let next = kvs.last().map(|kv| [kv.key(), &[0]].concat());
                on_page(
                    kvs.into_iter()
                        .map(|kv| {
                            let (key, value) = kv.into_key_value();
                            (String::from_utf8_lossy(&key).into_owned(), value)
                        })
                        .collect(),
                );
                match (more, next) {
                    (true, Some(next)) => from = next,
                    _ => break,
                }
            }
        }
        Ok(revision)
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
        // Each page goes into the view as it comes (one page's values held at a time); keys
        // gone are dropped once the read is complete. A read that fails half-way leaves newer
        // values of some keys and drops none, and nothing is sent before a complete one.
        let mut seen = std::collections::BTreeSet::new();
        let revision = self.range_read(&mut client, |page| state.view.relist_page(page, &mut seen)).await.map_err(Stop::Failed)?;
        state.view.end_relist(&seen);
        tracing::info!(revision, keys = state.view.len(), "etcd: read {PREFIX}");
        // A watch response carries every event of a revision range: the same limit as a page.
        let mut watch_client = client.watch_client().max_decoding_message_size(MAX_RESPONSE);
        let mut watch = watch_client.watch(PREFIX, Some(WatchOptions::new().with_prefix().with_start_revision(revision + 1))).await.map_err(|e| {
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

/// Keys per page of the range read. etcd before 3.5 (Debian's 3.4) walks the rest of the
/// range for every page, so the page count decides its cost: at 100,000 blocks and their
/// affinities, pages of 1,000 made the first sync 7.1 s, pages of 5,000 4.8 s (etcd-100k,
/// BENCHMARKS.md).
const RANGE_PAGE: i64 = 5_000;

/// The largest response taken: a page of [`RANGE_PAGE`] full IPAM blocks (64 allocations with
/// their attributes, ~10 KB each) is ~50 MB.
const MAX_RESPONSE: usize = 64 << 20;

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
async fn send(tx: &mpsc::Sender<DatastoreEvent>, event: DatastoreEvent) -> Result<(), Stop> {
    tx.send(event).await.map_err(|_| Stop::Closed)
}
