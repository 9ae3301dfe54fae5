//! One request inside the scheduler: its tokens, KV slots, sampler, and the output processing
//! that turns sampled tokens into text deltas and finish decisions (EOS, stop ids, stop
//! strings across token boundaries, length).

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use crate::cache::NodeId;
use crate::request::{FinishReason, SamplingParams, StreamEvent, Usage};
use crate::sampling::Sampler;
use crate::tokenizer::{DecodeStream, Tokenizer};

pub struct Req {
    pub id: u64,
    pub rid: String,
    pub prompt: Vec<u32>,
    pub output: Vec<u32>,
    pub params: SamplingParams,
    pub sampler: Sampler,
    pub events: UnboundedSender<StreamEvent>,
    pub arrival: Instant,
    pub first_token_at: Option<Instant>,
    /// KV slots of `fill_ids()[..slots.len()]`: computed (or cached) tokens.
    pub slots: Vec<u32>,
    /// The radix node this request holds locked (its cached prefix ends there).
    pub last_node: NodeId,
    /// Prompt tokens served from the radix cache at admission.
    pub cached_tokens: usize,
    out: OutputText,
}

impl Req {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: u64,
        rid: String,
        prompt: Vec<u32>,
        params: SamplingParams,
        seed: u64,
        events: UnboundedSender<StreamEvent>,
        arrival: Instant,
        tokenizer: Option<Arc<Tokenizer>>,
        root: NodeId,
    ) -> Self {
        let out = OutputText::new(
            tokenizer.map(|t| DecodeStream::new(t, params.skip_special_tokens)),
            &params,
        );
        Req {
            id,
            rid,
            prompt,
            output: Vec::new(),
            sampler: Sampler::new(params.seed.unwrap_or(seed)),
            params,
            events,
            arrival,
            first_token_at: None,
            slots: Vec::new(),
            last_node: root,
            cached_tokens: 0,
            out,
        }
    }

    /// Prompt plus output tokens.
    pub fn total_len(&self) -> usize {
        self.prompt.len() + self.output.len()
    }

    /// Tokens still without KV. After each sampled token this is 1 (the token itself, fed in
    /// the next decode step); more while a prompt (or a retracted request) is being prefilled.
    pub fn pending(&self) -> usize {
        self.total_len() - self.slots.len()
    }

    /// Token at position `i` of prompt ++ output.
    pub fn token_at(&self, i: usize) -> u32 {
        if i < self.prompt.len() {
            self.prompt[i]
        } else {
            self.output[i - self.prompt.len()]
        }
    }

    pub fn all_tokens(&self) -> Vec<u32> {
        let mut v = self.prompt.clone();
        v.extend_from_slice(&self.output);
        v
    }

    pub fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.prompt.len(),
            completion_tokens: self.output.len(),
            cached_tokens: self.cached_tokens,
        }
    }

    /// Record a sampled token, stream its text, and decide whether the request is done.
    pub fn push_token(
        &mut self,
        token: u32,
        eos_ids: &[u32],
        context_length: usize,
    ) -> Option<FinishReason> {
        self.output.push(token);
        let p = &self.params;
        let mut finish = None;
        let is_stop_id =
            p.stop_token_ids.contains(&token) || (!p.ignore_eos && eos_ids.contains(&token));
        if is_stop_id {
            finish = Some(FinishReason::Stop {
                matched: serde_json::json!(token),
            });
        }
        // Text of a stop token is not part of the output.
        let (delta, stop_hit) = if is_stop_id {
            (String::new(), None)
        } else {
            self.out.push(token)
        };
        if let Some(s) = stop_hit {
            finish = Some(FinishReason::Stop {
                matched: serde_json::json!(s),
            });
        }
        if finish.is_none()
            && (self.output.len() >= self.params.max_new_tokens
                || self.prompt.len() + self.output.len() >= context_length)
        {
            finish = Some(FinishReason::Length {
                length: self.output.len(),
            });
        }
        // A client that went away makes this send fail; the scheduler notices and aborts.
        let _ = self.events.send(StreamEvent::Tokens {
            ids: vec![token],
            text: delta,
        });
        finish
    }

    /// Send the final event (with any held-back text when no stop string matched).
    pub fn finish(&mut self, reason: FinishReason) {
        let text = match reason {
            FinishReason::Stop { ref matched } if matched.is_string() => String::new(),
            _ => self.out.flush(),
        };
        let _ = self.events.send(StreamEvent::Finished {
            reason,
            usage: self.usage(),
            text,
        });
    }

    pub fn fail(&self, message: String) {
        let _ = self.events.send(StreamEvent::Error { message });
    }

    pub fn client_gone(&self) -> bool {
        self.events.is_closed()
    }
}

/// Incremental text with stop-string detection. Text that could be the start of a stop string
/// is held back until it is known not to be one.
struct OutputText {
    decoder: Option<DecodeStream>,
    stops: Vec<String>,
    text: String,
    /// Bytes of `text` already sent.
    sent: usize,
}

impl OutputText {
    fn new(decoder: Option<DecodeStream>, p: &SamplingParams) -> Self {
        let stops = p.stop.iter().filter(|s| !s.is_empty()).cloned().collect();
        OutputText {
            decoder,
            stops,
            text: String::new(),
            sent: 0,
        }
    }

    /// Returns the text that can be sent now, and the stop string if one matched.
    fn push(&mut self, token: u32) -> (String, Option<String>) {
        let Some(dec) = self.decoder.as_mut() else {
            return (String::new(), None);
        };
        let piece = dec.step(token).unwrap_or_default();
        self.append(&piece)
    }

    fn append(&mut self, piece: &str) -> (String, Option<String>) {
        self.text.push_str(piece);
        if self.stops.is_empty() {
            let out = self.text[self.sent..].to_string();
            self.sent = self.text.len();
            return (out, None);
        }
        // A match can only involve unsent text plus the tail held back before it.
        let max_stop = self.stops.iter().map(|s| s.len()).max().unwrap_or(0);
        let mut from = self.sent.saturating_sub(max_stop);
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        let mut best: Option<(usize, &String)> = None;
        for s in &self.stops {
            if let Some(pos) = self.text[from..].find(s.as_str()) {
                let pos = from + pos;
                if best.is_none_or(|(b, _)| pos < b) {
                    best = Some((pos, s));
                }
            }
        }
        if let Some((pos, s)) = best {
            let out = if pos > self.sent {
                self.text[self.sent..pos].to_string()
            } else {
                String::new()
            };
            self.sent = self.text.len();
            return (out, Some(s.clone()));
        }
        // Hold back the longest suffix that is a proper prefix of some stop string.
        let mut hold = 0;
        for s in &self.stops {
            for (i, _) in s.char_indices().skip(1) {
                if i > hold && self.text.ends_with(&s[..i]) {
                    hold = i;
                }
            }
        }
        let end = (self.text.len() - hold).max(self.sent);
        let out = self.text[self.sent..end].to_string();
        self.sent = end;
        (out, None)
    }

    fn flush(&mut self) -> String {
        if let Some(dec) = self.decoder.as_mut() {
            let rest = dec.flush();
            self.text.push_str(&rest);
        }
        let out = self.text[self.sent..].to_string();
        self.sent = self.text.len();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_with_stops(stops: &[&str]) -> OutputText {
        let p = SamplingParams {
            stop: stops.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        OutputText::new(None, &p)
    }

    #[test]
    fn stop_string_split_across_pieces_is_trimmed() {
        let mut o = text_with_stops(&["END"]);
        assert_eq!(o.append("Hello E"), ("Hello ".to_string(), None));
        assert_eq!(o.append("N"), (String::new(), None));
        assert_eq!(o.append("D tail"), (String::new(), Some("END".to_string())));
    }

    #[test]
    fn held_text_is_released_when_it_is_not_a_stop() {
        let mut o = text_with_stops(&["\n\n"]);
        assert_eq!(o.append("a\n"), ("a".to_string(), None));
        assert_eq!(o.append("b"), ("\nb".to_string(), None));
        assert_eq!(o.flush(), "");
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        let mut o = text_with_stops(&["world", "lo"]);
        assert_eq!(
            o.append("hello world"),
            ("hel".to_string(), Some("lo".to_string()))
        );
    }

    #[test]
    fn multibyte_text_before_a_stop() {
        let mut o = text_with_stops(&["é!"]);
        assert_eq!(o.append("café"), ("caf".to_string(), None));
        assert_eq!(o.append("!"), (String::new(), Some("é!".to_string())));
    }

    #[test]
    fn flush_returns_held_tail() {
        let mut o = text_with_stops(&["STOP"]);
        assert_eq!(o.append("go ST"), ("go ".to_string(), None));
        assert_eq!(o.flush(), "ST");
    }
}
