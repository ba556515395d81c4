//! Unit tests of the app, by topic: bad input and restarts driven through the agent's own
//! pipeline on a fake kernel, the coalescing of datastore events, and a datastore that stops.

mod bad_input;
mod coalesce;
mod datastore_stop;
mod restart;
