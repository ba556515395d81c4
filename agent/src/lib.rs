//! routewarden: a node agent for Kubernetes clusters that use Calico IPAM.
//!
//! It decides which component owns each class of cluster routes, programs the routes it owns
//! over netlink, and watches the kernel (eBPF) for route flaps between writers.
//!
//! Data flow (see DESIGN.md): watchers observe and send typed [`app::Event`]s; handlers own
//! the logic and state and are the only places with side effects:
//!
//! ```text
//! datastore ─┐                                   ┌─> dataplane (route table over netlink)
//! netlink  ──┼─> events ─> app loop ─> ownership ┼─> bpf maps
//! bpf      ──┤            (handlers)  + routes   └─> metrics
//! timers  ───┘
//! ```
//!
//! The pure core ([`model`], [`ownership`], [`routes`]) does no I/O.

pub mod app;
pub mod bird_filter;
pub mod bpf;
pub mod dataplane;
pub mod datastore;
pub mod explain;
pub mod model;
pub mod observe;
pub mod ownership;
pub mod plan;
pub mod routes;
pub mod text;
pub mod vocabulary;
