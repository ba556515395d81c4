//! [`DataplaneError`]: the errors of the dataplane's setup (per-route failures are not errors:
//! they are counted in [`ApplyReport`](crate::dataplane::reconciler::report::ApplyReport) and retried).

use crate::dataplane::kernel::netlink::NetlinkError;

/// Errors of the dataplane's setup (per-route failures are counted in
/// [`ApplyReport`](crate::dataplane::reconciler::report::ApplyReport)).
#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    /// Subscribing to rtnetlink multicast groups failed.
    #[error("subscribe to rtnetlink route and link notifications: {source}")]
    Subscribe {
        /// The socket error.
        source: std::io::Error,
    },
    /// A netlink request failed.
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    /// An invalid setting.
    #[error("invalid dataplane setting {setting}: {reason}")]
    Config {
        /// The setting's name.
        setting: &'static str,
        /// What is wrong.
        reason: String,
    },
}
