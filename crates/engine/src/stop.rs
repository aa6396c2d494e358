//! Stop strings over streamed text.
//!
//! Owns [`StopMatcher`]: text arrives in chunks (one detokenised token at a time); the matcher
//! emits everything that can no longer be part of a stop string and holds back the longest
//! suffix that is still a prefix of one. When a stop string completes, the text before it is
//! emitted and generation should end; the stop string and anything after it are dropped.
//!
//! The result does not depend on how the text is cut into chunks: the stop taken is the one
//! that *ends* first in the text (ties: the one that starts first, i.e. the longest, then the
//! first listed), which is exactly what a byte-at-a-time scan would see. Matching is on bytes of
//! valid UTF-8, so a held-back suffix always starts on a character boundary (a stop string
//! starts with a leading byte) and multibyte characters are never split.

/// Streaming matcher for a set of stop strings. Empty stop strings are ignored.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not yet emitted: a proper prefix of some stop string.
    held: String,
    /// Index into `stops` of the stop that ended the stream.
    matched: Option<usize>,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        let stops = stops.into_iter().filter(|s| !s.is_empty()).collect();
        Self { stops, held: String::new(), matched: None }
    }

    /// Feeds the next chunk. Returns the text that is safe to emit now and whether a stop
    /// string has completed. Once stopped, further pushes return `("", true)`.
    pub fn push(&mut self, text: &str) -> (String, bool) {
        if self.matched.is_some() {
            return (String::new(), true);
        }
        self.held.push_str(text);

        // The held text before this push contains no complete stop (it would have matched
        // earlier), so a match found now ends inside the new text.
        let mut best: Option<(usize, usize, usize)> = None; // (end, start, stop index)
        for (i, stop) in self.stops.iter().enumerate() {
            // First occurrence = earliest end for a fixed-length needle.
            if let Some(start) = self.held.find(stop.as_str()) {
                let key = (start + stop.len(), start, i);
                if best.is_none_or(|b| key < b) {
                    best = Some(key);
                }
            }
        }
        if let Some((_, start, i)) = best {
            self.matched = Some(i);
            let out = self.held[..start].to_string();
            self.held.clear();
            return (out, true);
        }

        let keep_from = self.partial_match_start();
        let out = self.held[..keep_from].to_string();
        self.held.drain(..keep_from);
        (out, false)
    }

    /// Ends the stream: returns the held-back text (empty if a stop string matched).
    pub fn finish(self) -> String {
        if self.matched.is_some() { String::new() } else { self.held }
    }

    /// True once a stop string has completed.
    pub fn is_stopped(&self) -> bool {
        self.matched.is_some()
    }

    /// The stop string that ended the stream, if any.
    pub fn matched(&self) -> Option<&str> {
        self.matched.map(|i| self.stops[i].as_str())
    }

    /// Text currently held back (a proper prefix of some stop string).
    pub fn held(&self) -> &str {
        &self.held
    }

    /// Byte index where the longest suffix of `held` that is a proper prefix of a stop string
    /// begins (`held.len()` if none).
    fn partial_match_start(&self) -> usize {
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let h = self.held.as_bytes();
        // Suffixes shorter than the longest stop, longest first.
        let lo = h.len().saturating_sub(longest.saturating_sub(1));
        for start in lo..h.len() {
            if !self.held.is_char_boundary(start) {
                continue;
            }
            let tail = &h[start..];
            if self.stops.iter().any(|s| s.len() > tail.len() && s.as_bytes().starts_with(tail)) {
                return start;
            }
        }
        h.len()
    }
}
