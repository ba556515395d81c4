//! FelixConfiguration (`api/pkg/apis/projectcalico/v3/felixconfig.go`) and BGPConfiguration
//! (`api/pkg/apis/projectcalico/v3/bgpconfig.go`): the route-related fields only.

use std::time::Duration;

use serde::Serialize;

use super::error::{FieldProblem, ModelError};
use super::fields::Fields;

/// Which nodes a FelixConfiguration applies to, from its name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(tag = "scope", content = "node", rename_all = "kebab-case")]
pub enum FelixScope {
    /// `default`: the global object.
    Global,
    /// `node.<name>`: overrides `default` field by field on that node
    /// (`felix/config/config_params.go` `SourcesInDescendingOrder`).
    Node(String),
    /// Any other name: Felix reads it from no node.
    Other,
}

/// The route-related fields of a FelixConfiguration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FelixConfiguration {
    pub name: String,
    pub scope: FelixScope,
    /// `spec.programClusterRoutes`, raw: Felix parses it case-insensitively, confd never reads
    /// it; the ownership engine interprets it per release line.
    pub program_cluster_routes: Option<String>,
    /// `spec.deviceRouteProtocol` (default 3, which Felix maps to 80 for cluster routes).
    pub device_route_protocol: Option<u8>,
    /// `spec.routeRefreshInterval` (Go duration, default 90 s).
    pub route_refresh_interval: Option<Duration>,
    /// `spec.ipv4NormalRoutePriority` (route metric, default 1024).
    pub ipv4_normal_route_priority: Option<u32>,
    /// `spec.ipv6NormalRoutePriority` (route metric, default 1024).
    pub ipv6_normal_route_priority: Option<u32>,
    /// `spec.removeExternalRoutes` (default true).
    pub remove_external_routes: Option<bool>,
}

impl FelixConfiguration {
    pub(crate) fn parse(f: &mut Fields<'_>, name: &str) -> Result<FelixConfiguration, Vec<ModelError>> {
        let scope = if name == "default" {
            FelixScope::Global
        } else if let Some(node) = name.strip_prefix("node.").filter(|n| !n.is_empty()) {
            FelixScope::Node(node.to_owned())
        } else {
            FelixScope::Other
        };
        let program_cluster_routes = f.string(&["spec", "programClusterRoutes"]).map(str::to_owned);
        let device_route_protocol = f.uint(&["spec", "deviceRouteProtocol"], 0, 255).and_then(|n| u8::try_from(n).ok());
        let route_refresh_interval = match f.string(&["spec", "routeRefreshInterval"]) {
            None => None,
            Some(s) => parse_go_duration(s).or_else(|| {
                f.fail("spec.routeRefreshInterval", FieldProblem::InvalidValue { value: s.to_owned(), expected: "a duration such as 1m30s" });
                None
            }),
        };
        let ipv4_normal_route_priority = priority(f, "ipv4NormalRoutePriority");
        let ipv6_normal_route_priority = priority(f, "ipv6NormalRoutePriority");
        let remove_external_routes = f.bool_lenient(&["spec", "removeExternalRoutes"]);
        f.take_result(FelixConfiguration {
            name: name.to_owned(),
            scope,
            program_cluster_routes,
            device_route_protocol,
            route_refresh_interval,
            ipv4_normal_route_priority,
            ipv6_normal_route_priority,
            remove_external_routes,
        })
    }
}

/// The route-related fields of a BGPConfiguration. Only the object named `default` affects
/// cluster-route ownership (`confd/pkg/backends/calico/client.go` `getBGPConfig`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BgpConfiguration {
    pub name: String,
    /// `spec.programClusterRoutes`, raw: confd compares it case-sensitively.
    pub program_cluster_routes: Option<String>,
    /// `spec.ipv4NormalRoutePriority` (BIRD `krt_metric`, default 1024).
    pub ipv4_normal_route_priority: Option<u32>,
    /// `spec.ipv6NormalRoutePriority` (default 1024).
    pub ipv6_normal_route_priority: Option<u32>,
}

impl BgpConfiguration {
    pub(crate) fn parse(f: &mut Fields<'_>, name: &str) -> Result<BgpConfiguration, Vec<ModelError>> {
        let program_cluster_routes = f.string(&["spec", "programClusterRoutes"]).map(str::to_owned);
        let ipv4_normal_route_priority = priority(f, "ipv4NormalRoutePriority");
        let ipv6_normal_route_priority = priority(f, "ipv6NormalRoutePriority");
        f.take_result(BgpConfiguration { name: name.to_owned(), program_cluster_routes, ipv4_normal_route_priority, ipv6_normal_route_priority })
    }
}

/// A route priority (metric): the CRDs allow 1..=2147483646.
fn priority(f: &mut Fields<'_>, key: &str) -> Option<u32> {
    let path = ["spec", key];
    f.uint(&path, 1, 2_147_483_646).and_then(|n| u32::try_from(n).ok())
}

/// Parse a Go `time.ParseDuration` string: a sequence of decimal numbers with units `ns`,
/// `us`/`µs`, `ms`, `s`, `m`, `h` (`1m30s`, `1.5h`, `90s`, `0`). Negative durations are
/// rejected. `None` on any other input.
pub fn parse_go_duration(s: &str) -> Option<Duration> {
    if s == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = s;
    let mut total = 0f64;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let num_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        if num_len == 0 {
            return None;
        }
        let n: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += n * scale;
    }
    Duration::try_from_secs_f64(total).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("90s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("1.5h"), Some(Duration::from_mins(90)));
        assert_eq!(parse_go_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_go_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_go_duration("90"), None);
        assert_eq!(parse_go_duration("-1s"), None);
        assert_eq!(parse_go_duration(""), None);
        assert_eq!(parse_go_duration("1x"), None);
    }
}
