//! Embeds the kernel-side BPF object into the agent when `cargo xtask build` provides one.
//!
//! `ROUTEWARDEN_BPF_OBJECT` names the object built from `ebpf/` (by `cargo xtask build` or
//! `cargo xtask test`). Without it (a plain `cargo build`), an empty placeholder is embedded
//! and the agent reports at start that it runs without its BPF watchers.
use std::{env, fs, path::PathBuf};

fn main() {
    println!("cargo:rerun-if-env-changed=ROUTEWARDEN_BPF_OBJECT");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("routewarden-ebpf.o");
    match env::var_os("ROUTEWARDEN_BPF_OBJECT") {
        Some(src) if !src.is_empty() => {
            let src = PathBuf::from(src);
            println!("cargo:rerun-if-changed={}", src.display());
            fs::copy(&src, &out).unwrap_or_else(|e| panic!("copy BPF object {}: {e}", src.display()));
        }
        _ => fs::write(&out, []).expect("write empty BPF object placeholder"),
    }
}
