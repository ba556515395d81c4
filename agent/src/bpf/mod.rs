//! The kernel side of the agent: the embedded BPF object and the programs loaded from it.
//!
//! The object is built from `ebpf/` by `cargo xtask build` and embedded at compile time (see
//! `agent/build.rs`). A plain `cargo build` embeds nothing; the agent then runs without its
//! BPF watchers and says so ([`embedded_object`] returns `None`).

pub mod bpf_log;
pub mod forward;
pub mod route_watch;
pub mod tc_count;

/// The BPF object embedded at build time (ELF, `bpfel`, with BTF).
static OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/routewarden-ebpf.o"));

/// The embedded BPF object, or `None` when the agent was built without one (plain
/// `cargo build` instead of `cargo xtask build`).
pub fn embedded_object() -> Option<&'static [u8]> {
    if OBJECT.is_empty() {
        None
    } else {
        Some(OBJECT)
    }
}

/// Why a BPF program is not running. Shown in `/readyz` and logs; the agent keeps programming
/// routes either way.
#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    /// The binary was built without the kernel-side object.
    #[error("no BPF object is embedded in this build (build with `cargo xtask build`)")]
    NoObject,
    /// The object failed to load (parse, BTF relocation, verifier).
    #[error("loading BPF object: {source}")]
    Load {
        #[source]
        source: Box<aya::EbpfError>,
    },
    /// A program is missing from the object or has the wrong type.
    #[error("program {program}: {source}")]
    Program {
        program: &'static str,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    /// A map is missing from the object or has the wrong type.
    #[error("map {map}: {source}")]
    Map {
        map: &'static str,
        #[source]
        source: Box<aya::maps::MapError>,
    },
    /// Attaching a program to a device failed.
    #[error("attach {program} to {iface} {direction}: {source}")]
    Attach {
        program: &'static str,
        iface: String,
        direction: &'static str,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    /// A map the program needs is not in the object.
    #[error("map {0} not found in the BPF object")]
    MissingMap(&'static str),
    /// A program the agent needs is not in the object.
    #[error("program {0} not found in the BPF object")]
    MissingProgram(&'static str),
}
