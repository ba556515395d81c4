//! The ring-buffer reader: records decoded into [`ForwardEvent`]s (pool names resolved) and
//! sent to the app, and the log line of each event.

use std::sync::{Arc, RwLock};

use aya::maps::{MapData, RingBuf};
use routewarden_common::forward::FORWARD_EVENTS_MAP;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

use super::{event, map_err, ForwardEvent, ForwardEventKind, ForwardWatch, PoolTable};
use crate::bpf::BpfError;

impl ForwardWatch {
    /// Start the ring-buffer reader on the current tokio runtime: decodes each record into a
    /// [`ForwardEvent`] (pool names resolved) and sends it to `tx`. Undecodable records are
    /// logged and skipped. The task ends when `tx` is closed.
    ///
    /// # Errors
    /// [`BpfError::ReaderTaken`] on a second call; [`BpfError::Poll`] if the ring
    /// buffer cannot be registered with the runtime.
    pub fn spawn_reader(&mut self, tx: mpsc::Sender<ForwardEvent>) -> Result<tokio::task::JoinHandle<()>, BpfError> {
        let map = self.maps.take(FORWARD_EVENTS_MAP).ok_or(BpfError::ReaderTaken)?;
        let ring = RingBuf::try_from(map).map_err(map_err(FORWARD_EVENTS_MAP, "open"))?;
        // SAFETY: the RingBuf owns its map fd for its whole life and always returns that fd;
        // the AsyncFd owns the RingBuf, so the fd outlives the registration.
        let fd = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }.map_err(|e| BpfError::Poll(e.into()))?;
        let pools = self.pools.clone();
        Ok(tokio::spawn(read_ring(fd, pools, tx)))
    }
}

async fn read_ring(mut fd: AsyncFd<RingBuf<MapData>>, pools: Arc<RwLock<PoolTable>>, tx: mpsc::Sender<ForwardEvent>) {
    loop {
        let mut guard = match fd.readable_mut().await {
            Ok(g) => g,
            Err(e) => {
                tracing::warn!(error = %e, "forwarding watch: ring buffer poll failed; reader stops");
                return;
            }
        };
        let mut batch = Vec::new();
        {
            let names = pools.read().unwrap_or_else(std::sync::PoisonError::into_inner);
            let name = |id: u16| names.names.get(usize::from(id)).cloned();
            let ring = guard.get_inner_mut();
            while let Some(item) = ring.next() {
                match event::decode_record(&item, name) {
                    Ok(ev) => batch.push(ev),
                    Err(e) => tracing::warn!(error = %e, "forwarding watch: undecodable ring-buffer record skipped"),
                }
            }
        }
        guard.clear_ready();
        for ev in batch {
            if tx.send(ev).await.is_err() {
                return;
            }
        }
    }
}

/// Log one event: wrong-path samples and flaps at `warn`, with the block and the paths as
/// fields.
pub fn log_event(ev: &ForwardEvent) {
    let pool = ev.pool.as_deref().unwrap_or("?");
    let device = ev.device.as_deref().unwrap_or("?");
    match ev.event {
        ForwardEventKind::WrongPath => tracing::warn!(
            block = %ev.block, dst = %ev.dst, pool, expected = ev.expected, actual = ev.actual, device, seen_as = ev.seen_as,
            "cluster traffic leaving on the wrong path (sample; the counter has every packet)"
        ),
        ForwardEventKind::Flap => tracing::warn!(
            block = %ev.block, dst = %ev.dst, pool, previous = ev.previous.unwrap_or("?"), actual = ev.actual,
            changes = ev.changes.unwrap_or(0), expected = ev.expected, device,
            "forwarding flap: this block's egress path keeps changing"
        ),
    }
}
