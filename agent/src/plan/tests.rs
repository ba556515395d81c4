//! Unit tests of the plan, one file per topic, each planning the example cluster (or a
//! generated one) through the file datastore.

mod block_overlap;
mod bounds;
mod claims;
mod felix_expectations;
mod restart;
