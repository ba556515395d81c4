//! The supply-chain rules of the lint step (`cargo xtask test`), checked from `cargo metadata`
//! and the lock file alone, so that they need no network and no extra tool:
//!
//! - **licences**: every package the agent links (normal and build dependencies of
//!   `routewarden`, transitively) has an SPDX licence expression satisfiable with
//!   [`ALLOWED_LICENCES`] alone (permissive licences only in the agent);
//! - **sources**: every package of the workspace's lock file comes from crates.io or is a
//!   path inside the workspace (no git or other registries);
//! - **bans**: no package of [`BANNED`] anywhere in the workspace, none of [`BANNED_DIRECT`] as
//!   a direct dependency of the agent.
//!
//! It is what `cargo deny check licenses bans sources` checks, without cargo-deny's build
//! (minutes of CI) or its advisory database download.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// SPDX identifiers the agent may link. All permissive; `WITH` exceptions are matched whole.
pub const ALLOWED_LICENCES: &[&str] = &[
    "MIT",
    "Apache-2.0",
    "Apache-2.0 WITH LLVM-exception",
    "BSD-2-Clause",
    "BSD-3-Clause",
    "ISC",
    "Zlib",
    "Unicode-3.0",
    "CC0-1.0",
    "Unlicense",
    "BSL-1.0",
    // webpki-roots' data (Mozilla's root list): a permissive data licence.
    "CDLA-Permissive-2.0",
];

/// Packages that may not appear, with why.
pub const BANNED: &[(&str, &str)] = &[
    ("openssl-sys", "TLS is rustls with ring everywhere: no system OpenSSL to match at run time"),
    ("openssl", "TLS is rustls with ring everywhere"),
    ("native-tls", "TLS is rustls with ring everywhere"),
];

/// Packages the agent may not depend on directly (they may come in through a maintained
/// crate that wraps them), with why.
pub const BANNED_DIRECT: &[(&str, &str)] =
    &[("unsafe-libyaml", "the datastores parse YAML with a maintained pure-Rust parser (saphyr-parser), never a C API driven by hand")];

/// The crates.io source string in `cargo metadata`.
const CRATES_IO: &str = "registry+https://github.com/rust-lang/crates.io-index";

/// Whether the SPDX `expression` is satisfiable with `allowed` (`OR`: either side; `AND`: both;
/// parentheses; `A WITH B` as one identifier; the legacy `/` as `OR`). `None` when the
/// expression does not parse.
pub fn satisfiable(expression: &str, allowed: &[&str]) -> Option<bool> {
    let spaced = expression.replace('(', " ( ").replace(')', " ) ").replace('/', " OR ");
    let tokens: Vec<&str> = spaced.split_whitespace().collect();
    let mut p = Parser { tokens: &tokens, at: 0, allowed };
    let v = p.or()?;
    (p.at == tokens.len()).then_some(v)
}

struct Parser<'a> {
    tokens: &'a [&'a str],
    at: usize,
    allowed: &'a [&'a str],
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<&'a str> {
        self.tokens.get(self.at).copied()
    }

    fn or(&mut self) -> Option<bool> {
        let mut v = self.and()?;
        while self.peek() == Some("OR") {
            self.at += 1;
            v |= self.and()?;
        }
        Some(v)
    }

    fn and(&mut self) -> Option<bool> {
        let mut v = self.atom()?;
        while self.peek() == Some("AND") {
            self.at += 1;
            v &= self.atom()?;
        }
        Some(v)
    }

    fn atom(&mut self) -> Option<bool> {
        let t = self.peek()?;
        self.at += 1;
        if t == "(" {
            let v = self.or()?;
            (self.peek() == Some(")")).then(|| self.at += 1)?;
            return Some(v);
        }
        if matches!(t, ")" | "AND" | "OR" | "WITH") {
            return None;
        }
        let id = if self.peek() == Some("WITH") {
            let exception = self.tokens.get(self.at + 1)?;
            self.at += 2;
            format!("{t} WITH {exception}")
        } else {
            t.to_string()
        };
        Some(self.allowed.contains(&id.as_str()))
    }
}

/// What the rules found wrong in one `cargo metadata` document (empty: all pass).
pub fn problems(metadata: &Value, agent: &str) -> Vec<String> {
    let mut out = Vec::new();
    let packages: BTreeMap<&str, &Value> = metadata["packages"].as_array().into_iter().flatten().filter_map(|p| Some((p["id"].as_str()?, p))).collect();
    let name = |id: &str| {
        packages.get(id).map_or_else(|| id.to_string(), |p| format!("{} {}", p["name"].as_str().unwrap_or("?"), p["version"].as_str().unwrap_or("?")))
    };
    for (id, p) in &packages {
        let pkg = p["name"].as_str().unwrap_or("?");
        match p["source"].as_str() {
            None | Some(CRATES_IO) => {}
            Some(other) => out.push(format!("source: {} comes from {other}, not crates.io", name(id))),
        }
        if let Some((_, why)) = BANNED.iter().find(|(b, _)| *b == pkg) {
            out.push(format!("banned: {} ({why})", name(id)));
        }
    }
    let nodes: BTreeMap<&str, &Value> = metadata["resolve"]["nodes"].as_array().into_iter().flatten().filter_map(|n| Some((n["id"].as_str()?, n))).collect();
    let Some(root) = packages.iter().find(|(_, p)| p["name"] == agent && p["source"].is_null()).map(|(id, _)| *id) else {
        out.push(format!("licences: package {agent} not in the workspace"));
        return out;
    };
    for dep in nodes.get(root).and_then(|n| n["deps"].as_array()).into_iter().flatten() {
        let Some(p) = dep["pkg"].as_str().and_then(|id| packages.get(id)) else { continue };
        if let Some((b, why)) = BANNED_DIRECT.iter().find(|(b, _)| p["name"] == *b) {
            out.push(format!("banned: {agent} depends on {b} directly ({why})"));
        }
    }
    let mut linked = BTreeSet::new();
    let mut stack = vec![root];
    while let Some(id) = stack.pop() {
        if !linked.insert(id) {
            continue;
        }
        for dep in nodes.get(id).and_then(|n| n["deps"].as_array()).into_iter().flatten() {
            let runtime = dep["dep_kinds"].as_array().into_iter().flatten().any(|k| k["kind"].is_null() || k["kind"] == "build");
            if let (true, Some(pkg)) = (runtime, dep["pkg"].as_str()) {
                stack.push(pkg);
            }
        }
    }
    for id in linked {
        let Some(p) = packages.get(id) else { continue };
        if p["source"].is_null() {
            continue; // the workspace's own crates: the workspace licence
        }
        match p["license"].as_str() {
            None => out.push(format!("licence: {} declares none (the agent links it)", name(id))),
            Some(expr) => match satisfiable(expr, ALLOWED_LICENCES) {
                Some(true) => {}
                Some(false) => out.push(format!("licence: {} is {expr}, not satisfiable with the allowed licences (the agent links it)", name(id))),
                None => out.push(format!("licence: {} has an expression that does not parse: {expr}", name(id))),
            },
        }
    }
    out
}

/// Run the rules on the workspace at `root`.
///
/// # Errors
/// `cargo metadata` failing, or any rule broken (each named).
pub fn check(root: &Path) -> Result<()> {
    let out = Command::new("cargo").args(["metadata", "--format-version", "1", "--locked"]).current_dir(root).output().context("cargo metadata")?;
    if !out.status.success() {
        bail!("cargo metadata --locked failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let metadata: Value = serde_json::from_slice(&out.stdout).context("cargo metadata prints JSON")?;
    let problems = problems(&metadata, "routewarden");
    let count = metadata["packages"].as_array().map_or(0, Vec::len);
    if problems.is_empty() {
        eprintln!("supply chain: {count} packages from crates.io or the workspace, none banned; the agent links only allowed licences");
        return Ok(());
    }
    for p in &problems {
        eprintln!("supply chain: {p}");
    }
    bail!("{} supply-chain rules broken (xtask/src/licences.rs)", problems.len())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn expressions_are_judged_as_spdx_reads_them() {
        let allowed = ALLOWED_LICENCES;
        assert_eq!(satisfiable("MIT OR Apache-2.0", allowed), Some(true));
        assert_eq!(satisfiable("MIT/Apache-2.0", allowed), Some(true));
        assert_eq!(satisfiable("Apache-2.0 AND ISC", allowed), Some(true));
        assert_eq!(satisfiable("(MIT OR Apache-2.0) AND Unicode-3.0", allowed), Some(true));
        assert_eq!(satisfiable("Apache-2.0 WITH LLVM-exception OR GPL-3.0-only", allowed), Some(true));
        assert_eq!(satisfiable("MIT OR Apache-2.0 OR LGPL-2.1-or-later", allowed), Some(true));
        assert_eq!(satisfiable("GPL-2.0-only", allowed), Some(false));
        assert_eq!(satisfiable("MIT AND GPL-2.0-only", allowed), Some(false));
        assert_eq!(satisfiable("(MIT OR GPL-2.0-only) AND MPL-2.0", allowed), Some(false));
        assert_eq!(satisfiable("GPL-2.0-only WITH Classpath-exception-2.0", allowed), Some(false));
        assert_eq!(satisfiable("MIT OR", allowed), None);
        assert_eq!(satisfiable("(MIT", allowed), None);
        assert_eq!(satisfiable("", allowed), None);
    }

    fn pkg(id: &str, name: &str, licence: Option<&str>, source: Option<&str>) -> Value {
        json!({"id": id, "name": name, "version": "1.0.0", "license": licence, "source": source})
    }

    fn dep(pkg: &str, kind: Option<&str>) -> Value {
        json!({"pkg": pkg, "dep_kinds": [{"kind": kind}]})
    }

    #[test]
    fn a_linked_copyleft_crate_a_git_source_and_a_banned_crate_are_each_named() {
        let metadata = json!({
            "packages": [
                pkg("agent", "routewarden", Some("Apache-2.0"), None),
                pkg("a", "fine", Some("MIT"), Some(CRATES_IO)),
                pkg("g", "copyleft", Some("GPL-3.0-only"), Some(CRATES_IO)),
                pkg("t", "test-only", Some("GPL-3.0-only"), Some(CRATES_IO)),
                pkg("x", "from-git", Some("MIT"), Some("git+https://example.org/x")),
                pkg("o", "openssl-sys", Some("MIT"), Some(CRATES_IO)),
                pkg("y", "unsafe-libyaml", Some("MIT"), Some(CRATES_IO)),
            ],
            "resolve": {"nodes": [
                {"id": "agent", "deps": [dep("a", None), dep("t", Some("dev")), dep("y", None)]},
                {"id": "a", "deps": [dep("g", Some("build")), dep("y", None)]},
                {"id": "g", "deps": []}, {"id": "t", "deps": []}, {"id": "x", "deps": []}, {"id": "o", "deps": []}, {"id": "y", "deps": []},
            ]},
        });
        assert_eq!(
            problems(&metadata, "routewarden"),
            [
                "banned: openssl-sys 1.0.0 (TLS is rustls with ring everywhere: no system OpenSSL to match at run time)",
                "source: from-git 1.0.0 comes from git+https://example.org/x, not crates.io",
                "banned: routewarden depends on unsafe-libyaml directly (the datastores parse YAML with a maintained pure-Rust parser (saphyr-parser), never a C API driven by hand)",
                "licence: copyleft 1.0.0 is GPL-3.0-only, not satisfiable with the allowed licences (the agent links it)",
            ]
        );
    }

    /// The rules hold for this workspace as locked (the lint step runs them too; here a
    /// failure names the package at `cargo test` time).
    #[test]
    fn the_workspace_keeps_the_rules() {
        check(&crate::workspace_root()).unwrap();
    }
}
