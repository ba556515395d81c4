//! The agent's software bill of materials: a CycloneDX 1.5 JSON document (`cyclonedx-bom`)
//! listing exactly the crates the release agent links for one target, each with its version,
//! purl (`pkg:cargo/<name>@<version>`) and licence (the SPDX expression of its `Cargo.toml`).
//!
//! The crates come from `cargo metadata --locked --filter-platform <target>`: the agent, then
//! every package reached from it through normal dependencies, not through build or dev
//! dependencies, and not through proc-macro crates (they run in the compiler and are not
//! linked). That is `cargo tree -p routewarden --target <target> -e normal,no-proc-macro`
//! (the unit test checks it). `cargo auditable` (see [`crate::build`]) embeds the same graph in
//! the binary's `.dep-v0` section; it counts a proc-macro crate with test targets as linked,
//! which `agent/tests/privileged/image.rs` allows for when it compares the two.
//!
//! The document is reproducible: no serial number or timestamp, components sorted by name and
//! version, so the same lock file gives the same bytes (and the image that names its digest the
//! same id).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use cyclonedx_bom::external_models::spdx::SpdxExpression;
use cyclonedx_bom::external_models::uri::Purl;
use cyclonedx_bom::models::bom::Bom;
use cyclonedx_bom::models::component::{Classification, Component, Components};
use cyclonedx_bom::models::dependency::{Dependencies, Dependency};
use cyclonedx_bom::models::license::{LicenseChoice, Licenses};
use cyclonedx_bom::models::metadata::Metadata;
use serde_json::Value;

/// One crate the agent links, as `cargo metadata` describes it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Linked {
    /// The crate's name.
    pub name: String,
    /// Its version (semver, from the lock file).
    pub version: String,
    /// Its `license` field: an SPDX expression (the legacy `/` read as `OR`).
    pub licence: Option<String>,
    /// The `cargo metadata` ids of the crates it links (its normal, non-proc-macro dependencies).
    pub deps: BTreeSet<String>,
    /// Its `cargo metadata` id.
    pub id: String,
}

impl Linked {
    /// `pkg:cargo/<name>@<version>`, the component's purl and bom-ref.
    pub fn purl(&self) -> String {
        format!("pkg:cargo/{}@{}", self.name, self.version)
    }
}

/// The crates `agent` links according to one `cargo metadata` document (resolved for one
/// target with `--filter-platform`): the agent first, then the rest sorted by name and version.
///
/// # Errors
/// `agent` not a workspace package of the document, or a dependency without a node.
pub fn linked(metadata: &Value, agent: &str) -> Result<Vec<Linked>> {
    let packages: BTreeMap<&str, &Value> = metadata["packages"].as_array().into_iter().flatten().filter_map(|p| Some((p["id"].as_str()?, p))).collect();
    let nodes: BTreeMap<&str, &Value> = metadata["resolve"]["nodes"].as_array().into_iter().flatten().filter_map(|n| Some((n["id"].as_str()?, n))).collect();
    let Some(root) = packages.iter().find(|(_, p)| p["name"] == agent && p["source"].is_null()).map(|(id, _)| *id) else {
        bail!("package {agent} is not in the workspace");
    };
    let proc_macro = |id: &str| {
        packages
            .get(id)
            .is_some_and(|p| p["targets"].as_array().into_iter().flatten().any(|t| t["kind"].as_array().into_iter().flatten().any(|k| k == "proc-macro")))
    };
    let linked_deps = |id: &str| -> Result<BTreeSet<String>> {
        let node = nodes.get(id).with_context(|| format!("no resolve node for {id}"))?;
        Ok(node["deps"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| d["dep_kinds"].as_array().into_iter().flatten().any(|k| k["kind"].is_null()))
            .filter_map(|d| d["pkg"].as_str())
            .filter(|pkg| !proc_macro(pkg))
            .map(str::to_owned)
            .collect())
    };
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_owned()];
    while let Some(id) = stack.pop() {
        if out.contains_key(&id) {
            continue;
        }
        let p = packages.get(id.as_str()).with_context(|| format!("no package for {id}"))?;
        let deps = linked_deps(&id)?;
        stack.extend(deps.iter().cloned());
        let linked = Linked {
            name: p["name"].as_str().unwrap_or_default().to_owned(),
            version: p["version"].as_str().unwrap_or_default().to_owned(),
            licence: p["license"].as_str().map(str::to_owned),
            deps,
            id: id.clone(),
        };
        out.insert(id, linked);
    }
    let mut all: Vec<Linked> = out.into_values().collect();
    all.sort_by(|a, b| (a.id != root, &a.name, &a.version).cmp(&(b.id != root, &b.name, &b.version)));
    Ok(all)
}

/// The CycloneDX document of `linked` (the agent first, as [`linked`] returns it): the agent
/// as the metadata's component (an application), the rest as library components, and the
/// dependency graph between them.
///
/// # Errors
/// A crate without a licence, with a licence that is not an SPDX expression, or whose name
/// and version make no purl.
pub fn bom(linked: &[Linked]) -> Result<Bom> {
    let refs: BTreeMap<&str, String> = linked.iter().map(|l| (l.id.as_str(), l.purl())).collect();
    let component = |l: &Linked, class: Classification| -> Result<Component> {
        let purl = l.purl();
        let mut c = Component::new(class, &l.name, &l.version, Some(purl.clone()));
        c.purl = Some(Purl::new("cargo", &l.name, &l.version).with_context(|| format!("purl of {purl}"))?);
        let licence = l.licence.as_deref().with_context(|| format!("{purl} declares no licence"))?;
        let expression = SpdxExpression::parse_lax(licence.to_owned()).with_context(|| format!("{purl}: licence {licence:?} is not an SPDX expression"))?;
        c.licenses = Some(Licenses(vec![LicenseChoice::Expression(expression)]));
        Ok(c)
    };
    let (agent, libraries) = linked.split_first().context("no agent to describe")?;
    let components = libraries.iter().map(|l| component(l, Classification::Library)).collect::<Result<Vec<_>>>()?;
    let dependencies = linked
        .iter()
        .map(|l| Dependency { dependency_ref: l.purl(), dependencies: l.deps.iter().filter_map(|d| refs.get(d.as_str()).cloned()).collect() })
        .collect();
    Ok(Bom {
        serial_number: None,
        metadata: Some(Metadata { component: Some(component(agent, Classification::Application)?), ..Metadata::default() }),
        components: Some(Components(components)),
        dependencies: Some(Dependencies(dependencies)),
        ..Bom::default()
    })
}

/// `cargo metadata --locked --filter-platform <target>` of the workspace at `root`.
///
/// # Errors
/// `cargo metadata` failing or printing something that is not JSON.
pub fn metadata(root: &Path, target: &str) -> Result<Value> {
    let out = Command::new("cargo")
        .args(["metadata", "--format-version", "1", "--locked", "--filter-platform", target])
        .current_dir(root)
        .output()
        .context("cargo metadata")?;
    if !out.status.success() {
        bail!("cargo metadata --filter-platform {target} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    serde_json::from_slice(&out.stdout).context("cargo metadata prints JSON")
}

/// Write the SBOM of the agent (package `routewarden`) built for `target` to `path`; returns
/// the number of components (the agent's crates without the agent itself) and the file's
/// SHA-256 digest as lowercase hex.
///
/// # Errors
/// Any step of [`metadata`], [`linked`], [`bom`], or the write.
pub fn write(root: &Path, target: &str, path: &Path) -> Result<(usize, String)> {
    let linked = linked(&metadata(root, target)?, "routewarden")?;
    let mut json = Vec::new();
    bom(&linked)?.output_as_json_v1_5(&mut json).context("CycloneDX JSON")?;
    json.push(b'\n');
    std::fs::write(path, &json).with_context(|| format!("write {}", path.display()))?;
    Ok((linked.len() - 1, sha256_hex(&json)))
}

/// The SHA-256 digest of `bytes` as lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    ring::digest::digest(&ring::digest::SHA256, bytes).as_ref().iter().fold(String::with_capacity(64), |mut hex, b| {
        let _ = write!(hex, "{b:02x}");
        hex
    })
}

#[cfg(test)]
mod tests;
