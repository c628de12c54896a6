//! Text output of a generation: tokens to text pieces without splitting characters
//! ([`Detokenizer`]), and stop strings applied to streamed text ([`StopFilter`]).

use crate::engine::Shared;
use crate::error::LlmError;

/// Turns tokens into text pieces without splitting multi-byte characters.
#[derive(Default)]
pub(crate) struct Detokenizer {
    ids: Vec<u32>,
    prev: usize,
    cur: usize,
}

impl Detokenizer {
    pub(crate) fn push(&mut self, shared: &Shared, tok: u32) -> Result<Option<String>, LlmError> {
        let before = shared.decode(&self.ids[self.prev..self.cur], true)?;
        self.ids.push(tok);
        let text = shared.decode(&self.ids[self.prev..], true)?;
        if text.len() > before.len() && !text.ends_with('\u{FFFD}') && text.starts_with(&before) {
            let piece = text[before.len()..].to_string();
            self.prev = self.cur;
            self.cur = self.ids.len();
            Ok(Some(piece))
        } else {
            Ok(None)
        }
    }

    pub(crate) fn flush(&mut self, shared: &Shared) -> Result<Option<String>, LlmError> {
        let before = shared.decode(&self.ids[self.prev..self.cur], true)?;
        let text = shared.decode(&self.ids[self.prev..], true)?;
        self.prev = self.ids.len();
        self.cur = self.ids.len();
        Ok(text
            .strip_prefix(before.as_str())
            .filter(|r| !r.is_empty())
            .map(str::to_string))
    }
}

/// Applies stop strings to streamed text: text that may be the start of a stop string is held
/// back until it is known not to be.
pub(crate) struct StopFilter {
    stops: Vec<String>,
    text: String,
    emitted: usize,
    stopped: bool,
}

impl StopFilter {
    pub(crate) fn new(stops: &[String]) -> Self {
        StopFilter {
            stops: stops.to_vec(),
            text: String::new(),
            emitted: 0,
            stopped: false,
        }
    }

    /// Adds a piece; returns true when a stop string was reached.
    pub(crate) fn push(&mut self, piece: &str, out: &mut dyn FnMut(&str)) -> bool {
        if self.stopped {
            return true;
        }
        let search_from = self
            .emitted
            .saturating_sub(self.stops.iter().map(String::len).max().unwrap_or(0));
        self.text.push_str(piece);
        let hit = self
            .stops
            .iter()
            .filter_map(|s| {
                let from = floor_char_boundary(&self.text, search_from);
                self.text[from..].find(s.as_str()).map(|i| from + i)
            })
            .min();
        if let Some(at) = hit {
            let at = at.max(self.emitted);
            if at > self.emitted {
                out(&self.text[self.emitted..at]);
            }
            self.text.truncate(at);
            self.emitted = at;
            self.stopped = true;
            return true;
        }
        let hold = self
            .stops
            .iter()
            .map(|s| partial_suffix(&self.text, s))
            .max()
            .unwrap_or(0);
        let upto = self.text.len() - hold;
        if upto > self.emitted {
            out(&self.text[self.emitted..upto]);
            self.emitted = upto;
        }
        false
    }

    pub(crate) fn flush(&mut self, out: &mut dyn FnMut(&str)) {
        if self.text.len() > self.emitted {
            out(&self.text[self.emitted..]);
            self.emitted = self.text.len();
        }
    }

    pub(crate) fn into_text(self) -> String {
        let mut t = self.text;
        t.truncate(self.emitted);
        t
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Length of the longest proper prefix of `stop` that `text` ends with.
fn partial_suffix(text: &str, stop: &str) -> usize {
    let mut best = 0;
    for (i, _) in stop.char_indices().skip(1) {
        if text.ends_with(&stop[..i]) {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, Vec<String>, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut f = StopFilter::new(&stops);
        let mut out = Vec::new();
        let mut hit = false;
        for p in pieces {
            if f.push(p, &mut |s| out.push(s.to_string())) {
                hit = true;
                break;
            }
        }
        if !hit {
            f.flush(&mut |s| out.push(s.to_string()));
        }
        (f.into_text(), out, hit)
    }

    #[test]
    fn stop_string_across_pieces() {
        let (text, out, hit) = run(&["END"], &["hello E", "N", "D more"]);
        assert!(hit);
        assert_eq!(text, "hello ");
        assert_eq!(out.concat(), text);
    }

    #[test]
    fn held_back_text_is_released() {
        let (text, out, hit) = run(&["END"], &["hello E", "x"]);
        assert!(!hit);
        assert_eq!(text, "hello Ex");
        assert_eq!(out.concat(), text);
        assert_eq!(out[0], "hello ");
    }

    #[test]
    fn no_stops_passes_through() {
        let (text, out, _) = run(&[], &["a", "é", "b"]);
        assert_eq!(text, "aéb");
        assert_eq!(out, vec!["a", "é", "b"]);
    }
}
