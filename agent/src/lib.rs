//! routewarden: a node agent for Kubernetes clusters that use Calico IPAM.
//!
//! It decides which component owns each class of cluster routes, programs the routes it owns
//! over netlink, and watches the kernel (eBPF) for route flaps between writers.
//!
//! Data flow (see DESIGN.md): watchers observe and send typed events; the app loop
//! ([`app`]) hands them to handlers, which own the logic and state and are the only places
//! with side effects:
//!
//! ```text
//! datastore ─┐                      ┌─ plan (pure) ─┬─> dataplane (route table over netlink)
//! netlink  ──┼─> events ─> app loop ┤               ├─> bpf maps (forwarding watch)
//! bpf      ──┤                      │               └─> metrics
//! timers  ───┘                      └─ bpf watch handlers ─> metrics
//! ```
//!
//! The pure core ([`model`], [`vocabulary`], [`ownership`], [`routes`], [`plan`]) does no
//! I/O. The binary's commands live in `cli/` (one file each).

// Every `unsafe` block says why it is sound (BPF map and ring-buffer reads, the allocator).
#![warn(clippy::undocumented_unsafe_blocks)]

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
