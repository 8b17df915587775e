//! What a running sweep tells the command as it goes, for it to show.

use super::rank::Trial;

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Starting { labels: Vec<String>, servers: usize },
    Measuring { labels: Vec<String> },
    TrialDone(Box<Trial>),
    Applying { label: String, servers: usize },
}
