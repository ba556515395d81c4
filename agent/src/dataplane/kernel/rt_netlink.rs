//! [`RtNetlink`]: the [`RouteNetlink`] the agent runs, over rtnetlink: dumps on a
//! strict-checking rtnetlink connection, writes and deletes through the batching writer
//! ([`super::batch_writer`]) on a socket of their own.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rtnetlink::sys::protocols::NETLINK_ROUTE;
use rtnetlink::sys::AsyncSocket;

use super::batch_writer::{Batcher, DEFAULT_WINDOW, SOCKET_RCVBUF_BYTES};
use super::dump::{dump_addresses_with, dump_links_with, dump_routes_with, nexthop_messages, KernelDump, ReadKernel, DEFAULT_TIMEOUT};
use super::netlink::{ChunkPlace, Executed, LinkInfo, NetlinkError, NetlinkOp, RouteNetlink, RouteOp};
use super::nexthop::{group_members, parse_nexthop, NexthopMessage, NexthopOp, ObservedNexthop};
use super::route::{Family, ObservedRoute};
use super::route_wire::{all_tables_dump_request, dump_request, dump_request_both_families};

/// [`RouteNetlink`] over rtnetlink with strict checking (`NETLINK_GET_STRICT_CHK`, so dumps
/// are filtered in the kernel).
///
/// Dumps go through an rtnetlink connection. Writes and deletes are batched on a second,
/// plain `NETLINK_ROUTE` socket: up to `window` route messages (and at most
/// [`MAX_BATCH_BYTES`]) are packed into one `sendmsg`, each with its own sequence number, and
/// only the last with `NLM_F_ACK`. The kernel processes the messages of one buffer in order
/// inside `sendmsg`, carrying on after a failed one, and answers every failed message with
/// its errno whatever its flags (`netlink_rcv_skb` acks when `NLM_F_ACK` is set *or* the
/// handler failed), so once the last message's answer is read every failure of the batch has
/// been read before it, and each message without one succeeded: one `sendmsg` and one `recv`
/// per batch (plus one per failure) replace a round trip per route, and the kernel builds no
/// ack for a message that worked.
/// Both sockets live in the network namespace of the thread that called
/// [`RtNetlink::connect`]. Clones share both sockets; batches from clones are serialized.
#[derive(Clone, Debug)]
pub struct RtNetlink {
    handle: rtnetlink::Handle,
    /// A connection typed [`NexthopMessage`] for the nexthop dump (rtnetlink's cannot decode
    /// nexthop messages).
    nexthop_handle: rtnetlink::proto::ConnectionHandle<NexthopMessage>,
    batcher: Arc<tokio::sync::Mutex<Batcher>>,
    window: usize,
    /// Messages one batch may hold on the batch socket ([`BatchLimits`]).
    batch_messages: usize,
    timeout: Duration,
}

impl RtNetlink {
    /// Open a strict-checking rtnetlink connection (spawning its driver on the current tokio
    /// runtime) and the batch socket with its thread. Both sockets live in the network
    /// namespace of the calling thread.
    ///
    /// # Errors
    /// [`NetlinkError::Connection`] if a socket cannot be opened or configured, or the batch
    /// socket's thread cannot be started.
    pub fn connect() -> Result<Self, NetlinkError> {
        let conn_err = |e: std::io::Error| NetlinkError::Connection { op: NetlinkOp::Connect, reason: e.to_string() };
        let (mut conn, handle, _unsolicited) = rtnetlink::new_connection_with_strict_check().map_err(conn_err)?;
        // A larger receive buffer keeps big dumps from hitting ENOBUFS.
        let _ = conn.socket_mut().socket_mut().set_rx_buf_sz(SOCKET_RCVBUF_BYTES);
        conn.socket_mut().socket_mut().set_ext_ack(true).map_err(conn_err)?;
        // Bound now (not at the first send), so the route watch, started after this, finds
        // the port among this process's and labels our writes `self` from the first one.
        conn.socket_mut().socket_mut().bind_auto().map_err(conn_err)?;
        let (mut nh_conn, nexthop_handle, _unsolicited) = rtnetlink::proto::new_connection::<NexthopMessage>(NETLINK_ROUTE).map_err(conn_err)?;
        nh_conn.socket_mut().socket_mut().set_netlink_get_strict_chk(true).map_err(conn_err)?;
        nh_conn.socket_mut().socket_mut().set_ext_ack(true).map_err(conn_err)?;
        let batcher = Batcher::open().map_err(conn_err)?;
        let batch_messages = batcher.batch_messages();
        tokio::spawn(conn);
        tokio::spawn(nh_conn);
        Ok(RtNetlink {
            handle,
            nexthop_handle,
            batcher: Arc::new(tokio::sync::Mutex::new(batcher)),
            window: DEFAULT_WINDOW,
            batch_messages,
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// Set how many route messages go into one `sendmsg` (at least 1; 1 = one round trip per
    /// route).
    #[must_use]
    pub fn with_window(mut self, window: usize) -> Self {
        self.window = window.max(1);
        self
    }

    /// The underlying rtnetlink handle (for link queries in tests and the app).
    pub fn handle(&self) -> &rtnetlink::Handle {
        &self.handle
    }
}

impl RouteNetlink for RtNetlink {
    fn dump_routes(&mut self, family: Family, table: u32, protocol: u8) -> impl Future<Output = Result<Vec<ObservedRoute>, NetlinkError>> + Send {
        let target = format!("{} table {table} proto {protocol}", family.label());
        dump_routes_with(self.handle.clone(), dump_request(family, table, protocol), target, self.timeout)
    }

    fn dump_routes_both_families(&mut self, table: u32, protocol: u8) -> impl Future<Output = Result<Vec<ObservedRoute>, NetlinkError>> + Send {
        let target = format!("table {table} proto {protocol}");
        dump_routes_with(self.handle.clone(), dump_request_both_families(table, protocol), target, self.timeout)
    }

    fn dump_links(&mut self) -> impl Future<Output = Result<Vec<LinkInfo>, NetlinkError>> + Send {
        dump_links_with(self.handle.clone(), self.timeout)
    }

    fn execute(&mut self, ops: &[RouteOp]) -> impl Future<Output = Vec<Result<(), NetlinkError>>> + Send {
        let batcher = Arc::clone(&self.batcher);
        let timeout = self.timeout;
        let window = self.window;
        // Borrowed, not copied: the future lives no longer than `ops` (a trait method's
        // `impl Future` captures the argument's lifetime).
        async move { batcher.lock().await.execute(ops, window, timeout).await }
    }

    fn write_chunk(&self) -> usize {
        self.window.min(self.batch_messages)
    }

    fn execute_chunk(&mut self, ops: Vec<RouteOp>, place: ChunkPlace) -> impl Future<Output = Vec<Executed>> + Send {
        let batcher = Arc::clone(&self.batcher);
        let timeout = self.timeout;
        let window = self.window;
        async move { batcher.lock().await.execute_chunk(ops, place, window, timeout).await }
    }

    fn dump_nexthops(&mut self) -> impl Future<Output = Result<Vec<ObservedNexthop>, NetlinkError>> + Send {
        let handle = self.nexthop_handle.clone();
        let timeout = self.timeout;
        async move { Ok(nexthop_messages(&handle, timeout).await?.iter().filter_map(parse_nexthop).collect()) }
    }

    fn execute_nexthops(&mut self, ops: &[NexthopOp]) -> impl Future<Output = Vec<Result<(), NetlinkError>>> + Send {
        let batcher = Arc::clone(&self.batcher);
        let timeout = self.timeout;
        let window = self.window;
        async move { batcher.lock().await.execute(ops, window, timeout).await }
    }

    fn nexthops_in_use(&mut self, ids: &[u32]) -> impl Future<Output = Result<std::collections::BTreeSet<u32>, NetlinkError>> + Send {
        let (handle, nexthop_handle) = (self.handle.clone(), self.nexthop_handle.clone());
        let timeout = self.timeout;
        let wanted: std::collections::BTreeSet<u32> = ids.iter().copied().collect();
        async move {
            // A group of another writer that holds one of them uses it too: the kernel
            // deletes a group whose last member goes, and the routes through the group.
            let groups = nexthop_messages(&nexthop_handle, timeout).await?;
            let mut used: std::collections::BTreeSet<u32> = groups.iter().flat_map(group_members).filter(|id| wanted.contains(id)).collect();
            let routes = dump_routes_with(handle, all_tables_dump_request(), "all tables".into(), timeout).await?;
            used.extend(routes.iter().filter_map(|r| r.nexthop).filter(|id| wanted.contains(id)));
            Ok(used)
        }
    }
}

impl RtNetlink {
    /// Every address of every link in this network namespace, as `(ifindex, address)`, both
    /// families ([`KernelDump::addresses`]).
    ///
    /// # Errors
    /// [`NetlinkError`] when the dump fails or times out.
    pub async fn dump_addresses(&self) -> Result<Vec<(u32, std::net::IpAddr)>, NetlinkError> {
        dump_addresses_with(&self.handle, self.timeout).await
    }

    /// The read-only side of this connection: its dump socket, without the batch socket.
    pub fn reader(&self) -> KernelDump {
        KernelDump::from_handle(self.handle.clone(), self.timeout)
    }
}

impl ReadKernel for RtNetlink {
    fn read_links(&mut self) -> impl Future<Output = Result<Vec<LinkInfo>, NetlinkError>> + Send {
        RouteNetlink::dump_links(self)
    }

    fn read_routes(&mut self, family: Family, table: u32, protocol: u8) -> impl Future<Output = Result<Vec<ObservedRoute>, NetlinkError>> + Send {
        RouteNetlink::dump_routes(self, family, table, protocol)
    }

    fn read_nexthops(&mut self) -> impl Future<Output = Result<Vec<ObservedNexthop>, NetlinkError>> + Send {
        RouteNetlink::dump_nexthops(self)
    }

    fn read_rules(&mut self, family: Family) -> impl Future<Output = Result<Vec<super::rule::ObservedRule>, NetlinkError>> + Send {
        let reader = self.reader();
        async move { reader.rules(family).await }
    }
}
