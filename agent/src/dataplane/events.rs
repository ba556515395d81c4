//! Netlink event watcher: route (IPv4 + IPv6) and link notifications as typed
//! [`DataplaneEvent`]s.
//!
//! Felix does not listen to route events (reference §3.3) and notices foreign changes only on
//! its periodic resync; this watcher lets the reconciler re-install a removed or flushed route
//! within a debounce interval instead. Kernel quirks it accounts for
//! (`../shared/reference/toolchain.md`): IPv4 sends no `RTM_DELROUTE` when a link goes down and
//! its routes are flushed (so link down/up events matter), and a replace with identical
//! attributes sends nothing.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use rtnetlink::packet_core::NetlinkPayload;
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::sys::AsyncSocket;
use rtnetlink::MulticastGroup;
use tokio::sync::mpsc;

use super::error::DataplaneError;
use super::kernel_route::{parse_route, ObservedRoute};
use super::netlink::link_info;

/// A route or link change seen on the rtnetlink multicast groups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataplaneEvent {
    /// `RTM_NEWROUTE`: a route was added or replaced (any table, any protocol).
    RouteAdded {
        /// The route as the kernel reported it.
        route: ObservedRoute,
        /// `nlmsg_pid` of the notification: the writer's netlink port id (often its PID; 0 for
        /// routes the kernel made).
        writer_port: u32,
    },
    /// `RTM_DELROUTE`: a route was deleted (IPv4 flushes on link down send none).
    RouteRemoved {
        /// The route as the kernel reported it.
        route: ObservedRoute,
        /// `nlmsg_pid` of the notification.
        writer_port: u32,
    },
    /// A link appeared administratively up, or went up.
    LinkUp {
        /// ifindex.
        index: u32,
        /// Name.
        name: String,
    },
    /// A link appeared down, or went down (IPv4 routes through it are gone).
    LinkDown {
        /// ifindex.
        index: u32,
        /// Name.
        name: String,
    },
    /// A link changed its name.
    LinkRenamed {
        /// ifindex.
        index: u32,
        /// Previous name.
        old: String,
        /// New name.
        new: String,
    },
    /// A link was deleted (every route through it is gone).
    LinkRemoved {
        /// ifindex.
        index: u32,
        /// Name.
        name: String,
    },
    /// Notifications were lost (socket overrun or reconnect): the receiver must resync.
    Overrun,
}

/// Converts raw notifications to events, tracking link state to report only transitions.
#[derive(Debug, Default)]
pub struct EventDecoder {
    links: HashMap<u32, (String, bool)>,
}

impl EventDecoder {
    /// Decode one notification into zero or more events.
    pub fn decode(&mut self, msg: &RouteNetlinkMessage, writer_port: u32) -> Vec<DataplaneEvent> {
        match msg {
            RouteNetlinkMessage::NewRoute(r) => parse_route(r).map(|route| DataplaneEvent::RouteAdded { route, writer_port }).into_iter().collect(),
            RouteNetlinkMessage::DelRoute(r) => parse_route(r).map(|route| DataplaneEvent::RouteRemoved { route, writer_port }).into_iter().collect(),
            RouteNetlinkMessage::NewLink(l) => {
                let Some(info) = link_info(l) else { return Vec::new() };
                let mut out = Vec::new();
                let prev = self.links.insert(info.index, (info.name.clone(), info.up));
                match prev {
                    Some((old, was_up)) => {
                        if old != info.name {
                            out.push(DataplaneEvent::LinkRenamed { index: info.index, old, new: info.name.clone() });
                        }
                        if was_up != info.up {
                            out.push(if info.up {
                                DataplaneEvent::LinkUp { index: info.index, name: info.name }
                            } else {
                                DataplaneEvent::LinkDown { index: info.index, name: info.name }
                            });
                        }
                    }
                    None => out.push(if info.up {
                        DataplaneEvent::LinkUp { index: info.index, name: info.name }
                    } else {
                        DataplaneEvent::LinkDown { index: info.index, name: info.name }
                    }),
                }
                out
            }
            RouteNetlinkMessage::DelLink(l) => {
                let index = l.header.index;
                let name = link_info(l).map(|i| i.name).or_else(|| self.links.get(&index).map(|(n, _)| n.clone()));
                self.links.remove(&index);
                vec![DataplaneEvent::LinkRemoved { index, name: name.unwrap_or_default() }]
            }
            _ => Vec::new(),
        }
    }
}

type Messages = futures::channel::mpsc::UnboundedReceiver<(rtnetlink::packet_core::NetlinkMessage<RouteNetlinkMessage>, rtnetlink::sys::SocketAddr)>;

/// Open a multicast connection for link, IPv4-route and IPv6-route notifications and spawn its
/// driver. Must run inside a tokio runtime; the socket lives in the calling thread's network
/// namespace.
fn subscribe() -> Result<(tokio::task::JoinHandle<()>, Messages), DataplaneError> {
    let groups = [MulticastGroup::Link, MulticastGroup::Ipv4Route, MulticastGroup::Ipv6Route];
    let (mut conn, _handle, messages) = rtnetlink::new_multicast_connection(&groups).map_err(|source| DataplaneError::Subscribe { source })?;
    // Bursts (a link flush, a cold start of 10,000 routes) must not overrun the socket.
    let _ = conn.socket_mut().socket_mut().set_rx_buf_sz(8 * 1024 * 1024);
    Ok((tokio::spawn(conn), messages))
}

/// Forward events from a subscription to `tx` until `tx` closes; on a broken subscription send
/// [`DataplaneEvent::Overrun`] and subscribe again after 100 ms.
async fn forward(mut sub: (tokio::task::JoinHandle<()>, Messages), tx: mpsc::Sender<DataplaneEvent>) {
    loop {
        let (driver, mut messages) = sub;
        let mut decoder = EventDecoder::default();
        while let Some((msg, _addr)) = messages.next().await {
            let port = msg.header.port_number;
            let events = match msg.payload {
                NetlinkPayload::InnerMessage(m) => decoder.decode(&m, port),
                NetlinkPayload::Overrun(_) => vec![DataplaneEvent::Overrun],
                _ => Vec::new(),
            };
            for ev in events {
                if tx.send(ev).await.is_err() {
                    driver.abort();
                    return;
                }
            }
        }
        driver.abort();
        sub = loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if tx.is_closed() {
                return;
            }
            if let Ok(s) = subscribe() {
                break s;
            }
        };
        if tx.send(DataplaneEvent::Overrun).await.is_err() {
            return;
        }
    }
}

/// Subscribe to `RTNLGRP_LINK`, `RTNLGRP_IPV4_ROUTE` and `RTNLGRP_IPV6_ROUTE` now (in the
/// calling thread's network namespace) and spawn a task that forwards [`DataplaneEvent`]s to
/// `tx` until the receiver is dropped. Every change made after this returns is reported.
///
/// If the subscription breaks (socket error, e.g. `ENOBUFS` after a burst) the task sends
/// [`DataplaneEvent::Overrun`] (the reconciler then resyncs) and subscribes again.
///
/// # Errors
/// [`DataplaneError::Subscribe`] if the socket cannot be opened or bound.
pub fn spawn_watcher(tx: mpsc::Sender<DataplaneEvent>) -> Result<tokio::task::JoinHandle<()>, DataplaneError> {
    let sub = subscribe()?;
    Ok(tokio::spawn(forward(sub, tx)))
}
