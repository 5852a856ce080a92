//! [`StopStrings`]: ends generation at the first occurrence of any stop
//! string in the streamed text, even when it arrives split across chunks. It
//! owns only the text held back for that; it must not know about tokens.

pub struct StopStrings {
    stops: Vec<String>,
    /// Text not printed yet because it could be the start of a stop string.
    held: String,
    stopped: bool,
}

impl StopStrings {
    /// Empty strings are ignored: they would stop before the first character.
    pub fn new(stops: Vec<String>) -> Self {
        StopStrings {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
            stopped: false,
        }
    }

    /// Feeds the next chunk of generated text. Returns the text that can be
    /// printed now and whether a stop string was reached; once it was, the
    /// text from the stop string on is dropped and every later call returns
    /// `("", true)`.
    pub fn push(&mut self, text: &str) -> (String, bool) {
        if self.stopped {
            return (String::new(), true);
        }
        self.held.push_str(text);
        let first_stop = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = first_stop {
            self.held.truncate(at);
            self.stopped = true;
            return (std::mem::take(&mut self.held), true);
        }
        let keep = self.partial_stop_len();
        let out = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        (out, false)
    }

    /// Text still held back when generation ended for another reason (EOS,
    /// length limit): it turned out not to be a stop string.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length of the longest end of `held` that is the beginning of some stop
    /// string (and so must wait for more text to decide).
    fn partial_stop_len(&self) -> usize {
        let held = self.held.as_str();
        // No tail longer than the longest stop string can be a prefix of one.
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let from = held.len().saturating_sub(longest);
        held.char_indices()
            .filter(|&(i, _)| i >= from)
            .map(|(i, _)| &held[i..])
            .find(|tail| self.stops.iter().any(|s| s.starts_with(tail)))
            .map_or(0, str::len)
    }
}
