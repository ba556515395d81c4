//! The audit handler (`--mode audit`): the kernel compared with what each owner should have
//! programmed ([`crate::dataplane::audit_kernel`]), findings logged when they change and
//! counted ([`Metrics::record_audit`]).

use tracing::{info, warn};

use crate::dataplane::KernelDump;
use crate::observe::{Health, Metrics, StatusBoard};
use crate::plan::Plan;

/// The audit handler (`--mode audit`): compares the kernel with what each owner should have
/// programmed, on every plan change and every resync interval; programs nothing.
pub(super) struct AuditHandler {
    pub(super) nl: KernelDump,
    pub(super) last_findings: Vec<crate::dataplane::AuditFinding>,
}

impl AuditHandler {
    pub(super) async fn audit(&mut self, plan: &Plan, metrics: &Metrics, health: &Health, status: &StatusBoard) {
        match crate::dataplane::audit_kernel(&mut self.nl, plan.expected.values(), &plan.audit_scope).await {
            Ok(report) => {
                metrics.record_audit(&report);
                status.set_audit(&report, crate::observe::status::unix_now());
                if report.findings != self.last_findings {
                    if report.is_clean() {
                        info!(expected = report.expected, kernel_routes = report.kernel_routes, "audit clean");
                    }
                    for f in &report.findings {
                        warn!(code = f.code.as_str(), prefix = %f.prefix, owner = f.owner.map(crate::vocabulary::Writer::label), "{}", f.detail);
                    }
                    self.last_findings = report.findings;
                }
                health.set_first_apply_done();
            }
            Err(e) => {
                metrics.record_audit_failed();
                warn!(error = %e, "audit: dumping the kernel's routes failed");
            }
        }
    }
}
