//! Netlink event watcher: route (IPv4 + IPv6), link and address notifications as typed
//! [`DataplaneEvent`]s.
//!
//! Felix does not listen to route events (reference §3.3) and notices foreign changes only on
//! its periodic resync; this watcher lets the reconciler re-install a removed or flushed route
//! within a debounce interval instead. Kernel quirks it accounts for
//! (`../shared/reference/toolchain.md`): IPv4 sends no `RTM_DELROUTE` when a link goes down and
//! its routes are flushed (so link down/up events matter), nor when a nexthop object is
//! deleted with the routes through it (so nexthop deletions matter), and a replace with
//! identical attributes sends nothing.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use rtnetlink::packet_core::NetlinkPayload;
use rtnetlink::packet_route::link::LinkFlags;
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::sys::protocols::NETLINK_ROUTE;
use rtnetlink::sys::AsyncSocket;
use rtnetlink::MulticastGroup;
use tokio::sync::mpsc;

use crate::dataplane::error::DataplaneError;
use crate::dataplane::kernel::netlink::link_info;
use crate::dataplane::kernel::nexthop::{parse_nexthop, NexthopMessage, ObservedNexthop, RTM_DELNEXTHOP, RTM_NEWNEXTHOP};
use crate::dataplane::kernel::route::ObservedRoute;
use crate::dataplane::kernel::route_wire::parse_route;

/// `RTNLGRP_NEXTHOP` (`include/uapi/linux/rtnetlink.h`).
const RTNLGRP_NEXTHOP: u32 = 32;

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
    /// An administratively up link lost or regained its carrier (neither `IFF_LOWER_UP` nor
    /// `IFF_RUNNING`, or one of them again). On the loss the kernel flushes the nexthop
    /// objects on the link (`nh_netdev_event`, `NETDEV_CHANGE`) and the routes through them,
    /// the IPv4 ones without a word, and refuses new ones until the carrier is back; classic
    /// routes stay (`linkdown`).
    LinkCarrier {
        /// ifindex.
        index: u32,
        /// Name.
        name: String,
        /// Whether the link has its carrier now.
        carrier: bool,
    },
    /// A nexthop object was created or replaced (`RTM_NEWNEXTHOP`), by any writer: the routes
    /// through it now go where it says.
    NexthopChanged {
        /// The object as the kernel reported it.
        nexthop: ObservedNexthop,
    },
    /// A nexthop object was deleted (`RTM_DELNEXTHOP`): the kernel deleted every route through
    /// it, and sends no `RTM_DELROUTE` for the IPv4 ones.
    NexthopRemoved {
        /// Its id.
        id: u32,
    },
    /// An address was added to or removed from a link (`RTM_NEWADDR`, `RTM_DELADDR`). Removing
    /// a link's IPv4 address makes the kernel flush the routes that depended on it without an
    /// `RTM_DELROUTE` (`fib_del_ifaddr`), and they cannot come back before an address does: the
    /// receiver resyncs on both.
    AddressChanged {
        /// ifindex of the link.
        index: u32,
        /// Whether the address was removed.
        removed: bool,
    },
    /// Notifications were lost (socket overrun or reconnect): the receiver must resync.
    Overrun,
}

/// Converts raw notifications to events, tracking link state to report only transitions.
#[derive(Debug, Default)]
pub struct EventDecoder {
    links: HashMap<u32, (String, bool)>,
    /// Whether each link had its carrier (`IFF_LOWER_UP` or `IFF_RUNNING`) when last seen.
    carriers: HashMap<u32, bool>,
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
                let carrier = l.header.flags.contains(LinkFlags::LowerUp) || l.header.flags.contains(LinkFlags::Running);
                let had_carrier = self.carriers.insert(info.index, carrier);
                // A link first seen up without a carrier has no nexthop objects either.
                let carrier_event = (info.up && had_carrier != Some(carrier) && (had_carrier.is_some() || !carrier)).then(|| DataplaneEvent::LinkCarrier {
                    index: info.index,
                    name: info.name.clone(),
                    carrier,
                });
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
                out.extend(carrier_event);
                out
            }
            RouteNetlinkMessage::NewAddress(a) => vec![DataplaneEvent::AddressChanged { index: a.header.index, removed: false }],
            RouteNetlinkMessage::DelAddress(a) => vec![DataplaneEvent::AddressChanged { index: a.header.index, removed: true }],
            RouteNetlinkMessage::DelLink(l) => {
                let index = l.header.index;
                let name = link_info(l).map(|i| i.name).or_else(|| self.links.get(&index).map(|(n, _)| n.clone()));
                self.links.remove(&index);
                self.carriers.remove(&index);
                vec![DataplaneEvent::LinkRemoved { index, name: name.unwrap_or_default() }]
            }
            _ => Vec::new(),
        }
    }
}

/// A subscription's connection driver (the task that reads its socket), aborted when dropped:
/// with its reader's task, which the app aborts at shutdown. A driver left running reads
/// every notification nobody takes, and netlink_proto logs a warning for each one ("ignoring
/// unsolicited message"), dozens of lines in the pod's last log.
struct Driver(tokio::task::JoinHandle<()>);

impl Drop for Driver {
    fn drop(&mut self) {
        self.0.abort();
    }
}

type Messages = futures::channel::mpsc::UnboundedReceiver<(rtnetlink::packet_core::NetlinkMessage<RouteNetlinkMessage>, rtnetlink::sys::SocketAddr)>;

/// Open a multicast connection for link, IPv4-route and IPv6-route notifications and spawn its
/// driver. Must run inside a tokio runtime; the socket lives in the calling thread's network
/// namespace.
fn subscribe() -> Result<(Driver, Messages), DataplaneError> {
    let groups = [MulticastGroup::Link, MulticastGroup::Ipv4Route, MulticastGroup::Ipv6Route, MulticastGroup::Ipv4Ifaddr, MulticastGroup::Ipv6Ifaddr];
    let (mut conn, _handle, messages) = rtnetlink::new_multicast_connection(&groups).map_err(|source| DataplaneError::Subscribe { source })?;
    // Bursts (a link flush, a cold start of 10,000 routes) must not overrun the socket.
    let _ = conn.socket_mut().socket_mut().set_rx_buf_sz(8 * 1024 * 1024);
    Ok((Driver(tokio::spawn(conn)), messages))
}

type NexthopMessages = futures::channel::mpsc::UnboundedReceiver<(rtnetlink::packet_core::NetlinkMessage<NexthopMessage>, rtnetlink::sys::SocketAddr)>;

/// Open a multicast connection for nexthop object notifications (`RTNLGRP_NEXTHOP`), typed
/// [`NexthopMessage`] (rtnetlink's connection cannot decode them), and spawn its driver.
fn subscribe_nexthops() -> Result<(Driver, NexthopMessages), DataplaneError> {
    let (mut conn, _handle, messages) =
        rtnetlink::proto::new_connection::<NexthopMessage>(NETLINK_ROUTE).map_err(|source| DataplaneError::Subscribe { source })?;
    let sock = conn.socket_mut().socket_mut();
    sock.bind_auto().map_err(|source| DataplaneError::Subscribe { source })?;
    sock.add_membership(RTNLGRP_NEXTHOP).map_err(|source| DataplaneError::Subscribe { source })?;
    let _ = sock.set_rx_buf_sz(1024 * 1024);
    Ok((Driver(tokio::spawn(conn)), messages))
}

/// Forward nexthop object changes and deletions to `tx` until `tx` closes; on a broken subscription send
/// [`DataplaneEvent::Overrun`] and subscribe again after 100 ms.
async fn forward_nexthops(mut sub: (Driver, NexthopMessages), tx: mpsc::Sender<DataplaneEvent>) {
    loop {
        let (driver, mut messages) = sub;
        while let Some((msg, _addr)) = messages.next().await {
            let event = match msg.payload {
                NetlinkPayload::InnerMessage(m) if m.message_type == RTM_DELNEXTHOP => {
                    // A deletion notification carries the object as it was: parse it as one.
                    parse_nexthop(&NexthopMessage { message_type: RTM_NEWNEXTHOP, ..m }).map(|n| DataplaneEvent::NexthopRemoved { id: n.id })
                }
                NetlinkPayload::InnerMessage(m) => parse_nexthop(&m).map(|nexthop| DataplaneEvent::NexthopChanged { nexthop }),
                NetlinkPayload::Overrun(_) => Some(DataplaneEvent::Overrun),
                _ => None,
            };
            if let Some(ev) = event {
                if tx.send(ev).await.is_err() {
                    drop(driver);
                    return;
                }
            }
        }
        drop(driver);
        let Some(next) = resubscribe(&tx, subscribe_nexthops).await else { return };
        sub = next;
    }
}

/// After a subscription broke: try `subscribe` every 100 ms until it works, then send
/// [`DataplaneEvent::Overrun`] (what happened meanwhile is unknown). `None` once `tx` closed.
async fn resubscribe<S>(tx: &mpsc::Sender<DataplaneEvent>, subscribe: impl Fn() -> Result<S, DataplaneError>) -> Option<S> {
    let sub = loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if tx.is_closed() {
            return None;
        }
        if let Ok(s) = subscribe() {
            break s;
        }
    };
    tx.send(DataplaneEvent::Overrun).await.ok()?;
    Some(sub)
}

/// Forward events from a subscription to `tx` until `tx` closes; on a broken subscription send
/// [`DataplaneEvent::Overrun`] and subscribe again after 100 ms.
async fn forward(mut sub: (Driver, Messages), tx: mpsc::Sender<DataplaneEvent>) {
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
                    drop(driver);
                    return;
                }
            }
        }
        drop(driver);
        let Some(next) = resubscribe(&tx, subscribe).await else { return };
        sub = next;
    }
}

/// Subscribe to `RTNLGRP_LINK`, `RTNLGRP_IPV4_ROUTE`, `RTNLGRP_IPV6_ROUTE` and
/// `RTNLGRP_NEXTHOP` (changes and deletions, on a socket of its own) now (in the
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
    // Nexthop objects (Linux 5.3+); without them there is nothing to watch.
    if let Ok(nexthops) = subscribe_nexthops() {
        tokio::spawn(forward_nexthops(nexthops, tx.clone()));
    }
    Ok(tokio::spawn(forward(sub, tx)))
}

#[cfg(test)]
mod tests {
    use super::Driver;

    /// Dropping a subscription's driver (its reader's task aborted) stops the driver's task.
    #[tokio::test]
    async fn a_dropped_driver_stops_its_task() {
        /// Says when the task holding it is dropped (aborted).
        struct Gone(Option<tokio::sync::oneshot::Sender<()>>);
        impl Drop for Gone {
            fn drop(&mut self) {
                if let Some(tx) = self.0.take() {
                    let _ = tx.send(());
                }
            }
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let gone = Gone(Some(tx));
        let driver = Driver(tokio::spawn(async move {
            let _held = gone;
            std::future::pending::<()>().await;
        }));
        tokio::task::yield_now().await;
        drop(driver);
        tokio::time::timeout(std::time::Duration::from_secs(5), rx).await.expect("the task stopped").expect("dropped, not leaked");
    }
}
