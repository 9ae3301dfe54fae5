//! Stop strings: finding them in streamed output at a cost independent of how many a
//! request gives.
//!
//! [`StopMatcher`] is an Aho-Corasick automaton over the bytes of a request's stop strings,
//! fed each new piece of output once. Its state after the last byte is the longest suffix of
//! the output that is a prefix of some stop string, which is exactly the text to hold back
//! (it may still become a stop string). Per output byte the work is amortised constant,
//! whatever the number of stop strings; building costs their total length.
//!
//! Among matches that end in the same piece, the one that starts first wins (the output is
//! cut at the earliest point); among those, the one that ends first. Stop strings are UTF-8,
//! so a match always starts and ends on a character boundary of the output.

use std::collections::VecDeque;

const ROOT: usize = 0;

#[derive(Debug, Clone)]
struct Node {
    /// Trie edges, sorted by byte (most nodes have one).
    next: Vec<(u8, usize)>,
    /// Longest proper suffix of this node's string that is also a trie node.
    fail: usize,
    /// Length of this node's string, in bytes.
    depth: usize,
    /// Index of the stop string that ends exactly here.
    pattern: Option<usize>,
    /// The nearest node on the failure chain (this one included) where a stop string ends:
    /// the longest stop string that ends at this point of the output.
    output: Option<usize>,
}

impl Node {
    fn child(&self, b: u8) -> Option<usize> {
        self.next
            .binary_search_by_key(&b, |&(k, _)| k)
            .ok()
            .map(|i| self.next[i].1)
    }

    fn new(depth: usize) -> Self {
        Node {
            next: Vec::new(),
            fail: ROOT,
            depth,
            pattern: None,
            output: None,
        }
    }
}

/// A match of stop string `pattern` at bytes `start..end` of the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopMatch {
    pub pattern: usize,
    pub start: usize,
    pub end: usize,
}

/// Streaming matcher of a request's stop strings (see the module documentation).
#[derive(Debug, Clone)]
pub struct StopMatcher {
    nodes: Vec<Node>,
    patterns: Vec<String>,
    /// Current node: the longest suffix of the output fed so far that is a trie node.
    state: usize,
    /// Bytes fed so far.
    fed: usize,
}

impl StopMatcher {
    /// A matcher of `stops` (empty strings are ignored).
    pub fn new<S: AsRef<str>>(stops: &[S]) -> Self {
        let mut nodes = vec![Node::new(0)];
        let mut patterns = Vec::new();
        for stop in stops {
            let stop = stop.as_ref();
            if stop.is_empty() {
                continue;
            }
            let index = patterns.len();
            patterns.push(stop.to_string());
            let mut at = ROOT;
            for &b in stop.as_bytes() {
                at = match nodes[at].next.binary_search_by_key(&b, |&(k, _)| k) {
                    Ok(i) => nodes[at].next[i].1,
                    Err(i) => {
                        let depth = nodes[at].depth + 1;
                        nodes.push(Node::new(depth));
                        let n = nodes.len() - 1;
                        nodes[at].next.insert(i, (b, n));
                        n
                    }
                };
            }
            // A repeated stop string keeps its first position.
            nodes[at].pattern.get_or_insert(index);
        }
        // Failure and output links, breadth first (a node's links need its parent's).
        let mut queue: VecDeque<usize> = VecDeque::new();
        let root_children: Vec<usize> = nodes[ROOT].next.iter().map(|&(_, n)| n).collect();
        for child in root_children {
            nodes[child].fail = ROOT;
            nodes[child].output = nodes[child].pattern.map(|_| child);
            queue.push_back(child);
        }
        while let Some(node) = queue.pop_front() {
            for k in 0..nodes[node].next.len() {
                let (b, child) = nodes[node].next[k];
                let mut f = nodes[node].fail;
                let fail = loop {
                    if let Some(n) = nodes[f].child(b) {
                        break n;
                    }
                    if f == ROOT {
                        break ROOT;
                    }
                    f = nodes[f].fail;
                };
                nodes[child].fail = fail;
                nodes[child].output = if nodes[child].pattern.is_some() {
                    Some(child)
                } else {
                    nodes[fail].output
                };
                queue.push_back(child);
            }
        }
        StopMatcher {
            nodes,
            patterns,
            state: ROOT,
            fed: 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Stop string `i` as given.
    pub fn pattern(&self, i: usize) -> &str {
        &self.patterns[i]
    }

    fn step(&self, mut at: usize, b: u8) -> usize {
        loop {
            if let Some(n) = self.nodes[at].child(b) {
                return n;
            }
            if at == ROOT {
                return ROOT;
            }
            at = self.nodes[at].fail;
        }
    }

    /// Feeds the next `piece` of output; returns the match that starts first among those
    /// that end inside it. Positions count from the first byte ever fed.
    pub fn feed(&mut self, piece: &str) -> Option<StopMatch> {
        let mut best: Option<StopMatch> = None;
        for (i, &b) in piece.as_bytes().iter().enumerate() {
            self.state = self.step(self.state, b);
            if let Some(out) = self.nodes[self.state].output {
                let end = self.fed + i + 1;
                let found = StopMatch {
                    pattern: self.nodes[out].pattern.unwrap_or_default(),
                    start: end - self.nodes[out].depth,
                    end,
                };
                if best.is_none_or(|b| found.start < b.start) {
                    best = Some(found);
                }
            }
        }
        self.fed += piece.len();
        best
    }

    /// Bytes at the end of the output fed so far that begin some stop string (and may yet
    /// complete it): the text to hold back.
    pub fn pending(&self) -> usize {
        self.nodes[self.state].depth
    }

    /// Appends `piece` to the output `text`, of which the first `sent` bytes were sent, and
    /// returns the text that may be sent now and the stop string if one matched. Without a
    /// match, text that may begin a stop string is held back; with one, the output ends
    /// before the stop string (`no_stop_trim`: the whole piece is sent, the stop string and
    /// what follows it included). Every piece of the output must pass through here.
    pub fn append(
        &mut self,
        text: &mut String,
        sent: &mut usize,
        piece: &str,
        no_stop_trim: bool,
    ) -> (String, Option<String>) {
        text.push_str(piece);
        if let Some(hit) = self.feed(piece) {
            let end = if no_stop_trim {
                text.len()
            } else {
                hit.start.max(*sent)
            };
            let out = text[*sent..end].to_string();
            *sent = text.len();
            return (out, Some(self.patterns[hit.pattern].clone()));
        }
        let end = (text.len() - self.pending()).max(*sent);
        let out = text[*sent..end].to_string();
        *sent = end;
        (out, None)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The reference: every stop string searched in the whole text.
    fn earliest(stops: &[&str], text: &str) -> Option<(usize, usize)> {
        stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| text.find(s).map(|p| (p, p + s.len())))
            .min()
    }

    #[test]
    fn finds_stops_across_pieces_and_holds_their_prefixes() {
        let mut m = StopMatcher::new(&["END", "\n\n"]);
        assert_eq!(m.feed("Hello E"), None);
        assert_eq!(m.pending(), 1);
        assert_eq!(m.feed("N"), None);
        assert_eq!(m.pending(), 2);
        let hit = m.feed("D tail").expect("match");
        assert_eq!((m.pattern(hit.pattern), hit.start, hit.end), ("END", 6, 9));
    }

    #[test]
    fn the_earliest_start_wins_within_a_piece() {
        let mut m = StopMatcher::new(&["world", "lo"]);
        let hit = m.feed("hello world").expect("match");
        assert_eq!((m.pattern(hit.pattern), hit.start), ("lo", 3));
        let mut m = StopMatcher::new(&["bc", "abcd"]);
        let hit = m.feed("xabcd").expect("match");
        assert_eq!((m.pattern(hit.pattern), hit.start), ("abcd", 1));
    }

    #[test]
    fn pending_is_the_longest_stop_prefix_at_the_end() {
        let mut m = StopMatcher::new(&["abab", "bx"]);
        m.feed("zaba");
        assert_eq!(m.pending(), 3);
        m.feed("z");
        assert_eq!(m.pending(), 0);
        let mut m = StopMatcher::new(&["é!"]);
        m.feed("café");
        assert_eq!(m.pending(), "é".len());
        assert!(StopMatcher::new(&["", ""]).is_empty());
    }

    #[test]
    fn thousands_of_stop_strings_cost_no_more_per_byte() {
        // Each piece is fed once; the work per byte does not grow with the stop count.
        let stops: Vec<String> = (0..20_000).map(|i| format!("stop-{i:06}!")).collect();
        let mut m = StopMatcher::new(&stops);
        for _ in 0..1000 {
            assert_eq!(m.feed("an ordinary token "), None);
        }
        let hit = m.feed("then stop-019999! here").expect("match");
        assert_eq!(m.pattern(hit.pattern), "stop-019999!");
    }

    fn append_all(
        stops: &[&str],
        pieces: &[&str],
        no_stop_trim: bool,
    ) -> Vec<(String, Option<String>)> {
        let mut m = StopMatcher::new(stops);
        let (mut text, mut sent) = (String::new(), 0);
        pieces
            .iter()
            .map(|p| m.append(&mut text, &mut sent, p, no_stop_trim))
            .collect()
    }

    fn pair(s: &str, m: Option<&str>) -> (String, Option<String>) {
        (s.to_string(), m.map(str::to_string))
    }

    #[test]
    fn append_holds_back_and_trims() {
        assert_eq!(
            append_all(&["END"], &["Hello E", "N", "D tail"], false),
            [pair("Hello ", None), pair("", None), pair("", Some("END"))]
        );
        assert_eq!(
            append_all(&["\n\n"], &["a\n", "b"], false),
            [pair("a", None), pair("\nb", None)]
        );
        assert_eq!(
            append_all(&["world", "lo"], &["hello world"], false),
            [pair("hel", Some("lo"))]
        );
        assert_eq!(
            append_all(&["é!"], &["café", "!"], false),
            [pair("caf", None), pair("", Some("é!"))]
        );
        assert_eq!(
            append_all(&["END"], &["a E", "ND b"], true),
            [pair("a ", None), pair("END b", Some("END"))]
        );
        assert_eq!(
            append_all(&[], &["x", "y"], false),
            [pair("x", None), pair("y", None)]
        );
    }

    proptest! {
        #[test]
        fn agrees_with_searching_the_whole_text(
            stops in prop::collection::vec("[ab]{0,4}", 1..6),
            pieces in prop::collection::vec("[abc]{0,5}", 1..8),
        ) {
            let stops: Vec<&str> = stops.iter().map(String::as_str).collect();
            let mut m = StopMatcher::new(&stops);
            let mut text = String::new();
            for piece in &pieces {
                let before = text.len();
                text.push_str(piece);
                let got = m.feed(piece);
                // No match ended earlier: the text before this piece has none.
                prop_assert!(earliest(&stops, &text[..before]).is_none());
                // A match ending in this piece: the earliest start among those that end here.
                let want = stops
                    .iter()
                    .filter(|s| !s.is_empty())
                    .flat_map(|s| {
                        text.match_indices(s).map(|(p, _)| (p, p + s.len())).collect::<Vec<_>>()
                    })
                    .filter(|&(_, end)| end > before)
                    .map(|(start, _)| start)
                    .min();
                prop_assert_eq!(got.map(|h| h.start), want);
                if let Some(h) = got {
                    prop_assert_eq!(&text[h.start..h.end], m.pattern(h.pattern));
                    break;
                }
                // Pending: the longest suffix of the text that is a proper prefix of a stop.
                let longest = (1..=text.len())
                    .filter(|&k| stops.iter().any(|s| s.len() > k && s.starts_with(&text[text.len() - k..])))
                    .max()
                    .unwrap_or(0);
                prop_assert_eq!(m.pending(), longest);
            }
        }
    }
}
