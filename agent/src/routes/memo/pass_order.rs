//! The route pass's order (a block's or an affinity's CIDR, then its name) for the memo's
//! sets. Each element is found by that order through [`PassOrder`], so the sets hold one
//! contribution per block and one pointer per affinity, not a copy of the key beside each
//! (a `(CIDR, name)` key is 40 bytes: 8 MB at 100,000 blocks and as many affinities).

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::ops::Bound;
use std::sync::Arc;

use ipnet::IpNet;

use crate::model::BlockAffinity;

/// Where an element sorts in the pass: its CIDR, then its name.
pub(super) trait PassOrder {
    /// (CIDR, name).
    fn pass_key(&self) -> (IpNet, &str);
}

impl PartialEq for dyn PassOrder + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.pass_key() == other.pass_key()
    }
}

impl Eq for dyn PassOrder + '_ {}

impl PartialOrd for dyn PassOrder + '_ {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for dyn PassOrder + '_ {
    fn cmp(&self, other: &Self) -> Ordering {
        self.pass_key().cmp(&other.pass_key())
    }
}

/// A place in the pass, to look an element up by or start a range at.
pub(super) struct At<'a>(pub(super) IpNet, pub(super) &'a str);

impl PassOrder for At<'_> {
    fn pass_key(&self) -> (IpNet, &str) {
        (self.0, self.1)
    }
}

/// Order, equality and lookup of an element type by its [`PassOrder`] alone.
macro_rules! ordered_by_pass {
    ($t:ty) => {
        impl PartialEq for $t {
            fn eq(&self, other: &Self) -> bool {
                self.pass_key() == other.pass_key()
            }
        }
        impl Eq for $t {}
        impl PartialOrd for $t {
            fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(other))
            }
        }
        impl Ord for $t {
            fn cmp(&self, other: &Self) -> std::cmp::Ordering {
                self.pass_key().cmp(&other.pass_key())
            }
        }
        impl<'a> std::borrow::Borrow<dyn $crate::routes::memo::pass_order::PassOrder + 'a> for $t {
            fn borrow(&self) -> &(dyn $crate::routes::memo::pass_order::PassOrder + 'a) {
                self
            }
        }
    };
}
pub(super) use ordered_by_pass;

/// An active BlockAffinity, by its CIDR and its own name.
#[derive(Clone, Debug)]
pub(super) struct ByCidr(pub(super) Arc<BlockAffinity>);

impl PassOrder for ByCidr {
    fn pass_key(&self) -> (IpNet, &str) {
        (self.0.cidr, &self.0.name)
    }
}

ordered_by_pass!(ByCidr);

/// The elements of `set` at `cidr`, by name.
pub(super) fn at_cidr<T>(set: &BTreeSet<T>, cidr: IpNet) -> impl Iterator<Item = &T>
where
    T: PassOrder + Ord + for<'a> Borrow<dyn PassOrder + 'a>,
{
    let start: &dyn PassOrder = &At(cidr, "");
    set.range::<dyn PassOrder, _>((Bound::Included(start), Bound::Unbounded)).take_while(move |t| t.pass_key().0 == cidr)
}
