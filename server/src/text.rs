//! Stop strings on streamed text: text is released only once no stop string can start in
//! it, so a client never sees any part of a stop string, even one split across tokens.

pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    /// The stop string found, once one is.
    matched: Option<usize>,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
            matched: None,
        }
    }

    /// Adds decoded text. Returns the text that is safe to send and whether a stop string
    /// was found (then the text ends right before it and nothing more may be sent).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.held.push_str(text);
        if self.stops.is_empty() {
            return (std::mem::take(&mut self.held), false);
        }
        let first = self
            .stops
            .iter()
            .enumerate()
            .filter_map(|(k, s)| self.held.find(s.as_str()).map(|at| (at, k)))
            .min();
        if let Some((at, k)) = first {
            let out = self.held[..at].to_string();
            self.held.clear();
            self.matched = Some(k);
            return (out, true);
        }
        // Hold back the longest tail that could still grow into a stop string.
        let keep = self
            .stops
            .iter()
            .map(|s| longest_suffix_prefix(&self.held, s))
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        (out, false)
    }

    /// The stop string that ended the text, once one has.
    pub fn matched(&self) -> Option<&str> {
        self.matched.map(|k| self.stops[k].as_str())
    }

    /// The held-back text, at the end of generation (no stop string completed).
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// Length in bytes of the longest suffix of `text` that is a proper prefix of `stop`, cut
/// at a char boundary.
fn longest_suffix_prefix(text: &str, stop: &str) -> usize {
    let max = text.len().min(stop.len().saturating_sub(1));
    (1..=max)
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && stop.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(stops: &[&str], pieces: &[&str]) -> (String, bool, String) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let (t, stop) = m.push(p);
            out.push_str(&t);
            if stop {
                return (out, true, String::new());
            }
        }
        let rest = m.flush();
        (out, false, rest)
    }

    #[test]
    fn no_stops_passes_everything_through() {
        assert_eq!(feed(&[], &["a", "b"]), ("ab".into(), false, "".into()));
    }

    #[test]
    fn stop_split_across_pieces_is_never_emitted() {
        let (out, stop, _) = feed(&["\n\nUser:"], &["Hi there", "\n", "\nUs", "er: more"]);
        assert_eq!((out.as_str(), stop), ("Hi there", true));
    }

    #[test]
    fn earliest_stop_wins_and_text_before_it_is_kept() {
        let (out, stop, _) = feed(&["cd", "b"], &["abcdef"]);
        assert_eq!((out.as_str(), stop), ("a", true));
    }

    #[test]
    fn a_false_start_is_released_later() {
        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.push("the E"), ("the ".into(), false));
        assert_eq!(m.push("N"), ("".into(), false));
        assert_eq!(m.push("D?"), ("".into(), true));
        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.push("EN"), ("".into(), false));
        assert_eq!(m.push("Dx"), ("".into(), true));
        let mut m = StopMatcher::new(vec!["END".into()]);
        m.push("EN");
        assert_eq!(m.push("x"), ("ENx".into(), false));
        assert_eq!(m.flush(), "");
    }

    #[test]
    fn held_text_is_flushed_at_the_end() {
        assert_eq!(feed(&["END"], &["ok E"]), ("ok ".into(), false, "E".into()));
    }

    #[test]
    fn multibyte_text_is_cut_at_char_boundaries() {
        let (out, stop, rest) = feed(&["éx"], &["aé", "é"]);
        assert_eq!((out.as_str(), stop, rest.as_str()), ("aé", false, "é"));
        let (out, stop, _) = feed(&["éx"], &["aé", "éx"]);
        assert_eq!((out.as_str(), stop), ("aé", true));
    }
}
