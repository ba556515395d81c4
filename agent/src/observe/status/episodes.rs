//! Route-watch episodes for the status document: the conflict, flap and failing-writer events of one prefix
//! (and kind, and table) folded into one [`Episode`] with its writers, first and last seen,
//! and count, kept while its last event is younger than
//! [`EPISODE_WINDOW`](super::limits::EPISODE_WINDOW).
//!
//! Bounded whatever the fight: at most `2 × MAX_EPISODES` episodes are held (the least
//! recently seen is dropped first) and each keeps at most
//! [`MAX_EPISODE_WRITERS`](super::limits::MAX_EPISODE_WRITERS) writers.

use std::collections::HashMap;

use super::document::{Episode, EpisodeWriter};
use super::limits::{EPISODE_WINDOW, MAX_EPISODES, MAX_EPISODE_WRITERS};
use crate::bpf::route_watch::event::{RouteWatchEvent, WriterInfo};

/// The episodes of the last window, by (kind, prefix, table).
#[derive(Debug, Default)]
pub struct Episodes {
    by_key: HashMap<(&'static str, String, u32), Episode>,
    /// Episodes dropped by the bound since the agent started (reported as omitted).
    dropped: usize,
}

fn writer(w: &WriterInfo) -> EpisodeWriter {
    EpisodeWriter { class: w.class.to_owned(), protocol: w.protocol, pid: w.pid, comm: w.comm.clone() }
}

impl Episodes {
    /// Fold a conflict, flap or failing writer seen at `now` (Unix seconds) into its episode;
    /// other events are ignored. The previous writer is added before the new one, so a fight reads in order.
    pub fn record(&mut self, event: &RouteWatchEvent, now: u64) {
        let (kind, route, previous) = match event {
            RouteWatchEvent::Conflict { route, previous, .. } => ("conflict", route, previous),
            RouteWatchEvent::Flap { route, previous, .. } => ("flap", route, previous),
            RouteWatchEvent::FailingWriter { route, .. } => ("failing-writer", route, &route.writer),
            _ => return,
        };
        self.expire(now);
        let key = (kind, route.dst.to_string(), route.table);
        if !self.by_key.contains_key(&key) && self.by_key.len() >= 2 * MAX_EPISODES {
            // The least recently seen goes; it may still be in the window.
            if let Some(oldest) = self.by_key.iter().min_by_key(|(k, e)| (e.last_seen, (*k).clone())).map(|(k, _)| k.clone()) {
                self.by_key.remove(&oldest);
                self.dropped += 1;
            }
        }
        let episode = self.by_key.entry(key).or_insert_with(|| Episode {
            kind: kind.to_owned(),
            prefix: route.dst.to_string(),
            table: route.table,
            writers: Vec::new(),
            first_seen: now,
            last_seen: now,
            count: 0,
        });
        episode.last_seen = now;
        episode.count += 1;
        for w in [writer(previous), writer(&route.writer)] {
            if episode.writers.len() < MAX_EPISODE_WRITERS && !episode.writers.contains(&w) {
                episode.writers.push(w);
            }
        }
    }

    fn expire(&mut self, now: u64) {
        let window = EPISODE_WINDOW.as_secs();
        self.by_key.retain(|_, e| now.saturating_sub(e.last_seen) < window);
    }

    /// The episodes of the window at `now`, most recently seen first (then by prefix), at most
    /// `MAX_EPISODES`, and how many the bound left out (those of the window past
    /// `MAX_EPISODES`, plus those dropped while held since the agent started).
    pub fn current(&mut self, now: u64) -> (Vec<Episode>, usize) {
        self.expire(now);
        let mut all: Vec<Episode> = self.by_key.values().cloned().collect();
        all.sort_by(|a, b| b.last_seen.cmp(&a.last_seen).then_with(|| a.prefix.cmp(&b.prefix)).then_with(|| a.kind.cmp(&b.kind)));
        let omitted = all.len().saturating_sub(MAX_EPISODES) + self.dropped;
        all.truncate(MAX_EPISODES);
        (all, omitted)
    }
}
