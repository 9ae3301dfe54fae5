//! One request inside the scheduler: its tokens, KV slots, sampler, and the output processing
//! that turns sampled tokens into text deltas and finish decisions (EOS, stop ids, stop
//! strings across token boundaries, length).
//!
//! Logprobs: a request that wants prompt logprobs from position `s` needs the logits rows of
//! prompt positions `s..` (row `i` predicts token `i + 1`), so its radix prefix match is cut to
//! at most `s` tokens ([`Req::match_key_len`]) and each prefill chunk asks the backend for the
//! rows it covers ([`Req::logit_rows`]). The entries are gathered chunk by chunk and sent in
//! one `PromptLogprobs` event once the prompt is done.
//!
//! Structured output: a request with a grammar holds its own matcher ([`GrammarState`]). The
//! scheduler fills the matcher's token mask for the next token (on a worker thread while the
//! forward pass runs), [`Req::sample`] applies it to the logits row before penalties and
//! sampling (logprobs stay those of the raw row), and [`Req::accept_grammar`] advances the
//! matcher by the sampled token. Once the grammar is complete the request stops. The state
//! lives in the `Req`, so a retracted request resumes where its grammar was.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use super::lease::KvLease;
use crate::backend::SampleInput;
use crate::cache::NodeId;
use crate::engine::PendingRequest;
use crate::grammar::{GrammarMatcher, TokenMask};
use crate::request::{
    FinishReason, GenerateRequest, LogprobRequest, SamplingParams, StreamEvent, TokenLogprob, Usage,
};
use crate::sampling::{LogitProcessor, Sampler, log_sum_exp, token_logprob, top_logprobs};
use crate::tokenizer::{DecodeStream, Tokenizer};

pub struct Req {
    pub id: u64,
    pub rid: String,
    pub prompt: Vec<u32>,
    pub output: Vec<u32>,
    pub params: SamplingParams,
    sampler: Sampler,
    /// Penalties, `logit_bias`, `min_new_tokens` (`None` when the request has none).
    logit_proc: Option<LogitProcessor>,
    pub logprobs: Option<LogprobRequest>,
    /// Prompt logprobs still being gathered (`None` when not asked for or already sent).
    prompt_lp: Option<PromptLogprobs>,
    events: UnboundedSender<StreamEvent>,
    pub arrival: Instant,
    pub first_token_at: Option<Instant>,
    /// KV slots of the first tokens (computed, cached or being computed) and the radix node
    /// this request holds locked.
    pub kv: KvLease,
    /// Prompt tokens served from the radix cache at admission.
    pub cached_tokens: usize,
    /// The grammar state of a constrained request (`None`: unconstrained, or taken out by
    /// the scheduler while its mask is being computed).
    pub grammar: Option<GrammarState>,
    /// Serial number of the admission this request runs under (a retracted request is
    /// admitted again under a new one), so that a pass landing late only touches the
    /// requests it was launched for.
    pub admission: u64,
    /// The pass in flight that samples this request's next token, and the token's index
    /// among that pass's sampled tokens (overlap scheduling).
    pub inflight: Option<(u64, u32)>,
    out: OutputText,
}

/// The grammar matcher of one request and the mask of its next token.
pub struct GrammarState {
    /// The kind of spec (`json_schema`, `regex`, ...), for messages.
    kind: &'static str,
    matcher: Box<dyn GrammarMatcher>,
    /// Allowed next tokens; allocated at the first fill (the model's vocabulary size).
    mask: Option<TokenMask>,
    /// The outcome of filling `mask` for the next token; `None` until it is filled (again).
    filled: Option<Result<(), String>>,
}

impl GrammarState {
    /// Computes the mask of the next token, once per token. Never panics: a failing or
    /// panicking matcher leaves an error that fails the request at sampling.
    pub fn fill_mask(&mut self, vocab_size: usize) {
        if self.filled.is_some() {
            return;
        }
        let mask = self.mask.get_or_insert_with(|| TokenMask::new(vocab_size));
        let matcher = &mut self.matcher;
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| matcher.fill_mask(mask)));
        self.filled = Some(match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("the {} grammar failed: {e}", self.kind)),
            Err(_) => Err(format!(
                "the {} grammar failed while computing the allowed tokens",
                self.kind
            )),
        });
    }

    /// Whether the output is complete: only EOS may follow.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_finished()
    }
}

/// Prompt logprobs gathered so far.
struct PromptLogprobs {
    /// Next prompt position whose logits row is still needed.
    next: usize,
    entries: Vec<TokenLogprob>,
}

/// The logprob entry of token `id` predicted by logits row `row`.
fn row_logprob(row: &[f32], id: u32, top_k: usize) -> TokenLogprob {
    let lse = log_sum_exp(row);
    TokenLogprob {
        id,
        logprob: Some(token_logprob(row, id, lse)),
        top: Some(top_logprobs(row, top_k, lse)),
    }
}

impl Req {
    /// A request as it arrives: `seed` seeds its sampler unless it brings its own, `eos_ids`
    /// end it (unless `ignore_eos`), `tokenizer` detokenizes its output when it asked for
    /// text, and `root` is the radix cache's root (its KV lease holds nothing yet).
    pub fn new(
        p: PendingRequest,
        seed: u64,
        eos_ids: &[u32],
        tokenizer: Option<Arc<Tokenizer>>,
        root: NodeId,
    ) -> Self {
        let PendingRequest {
            id,
            req,
            events,
            arrival,
        } = p;
        let GenerateRequest {
            rid,
            input_ids: prompt,
            sampling: params,
            detokenize,
            logprobs,
        } = req;
        let tokenizer = tokenizer.filter(|_| detokenize);
        let out = OutputText::new(
            tokenizer.map(|t| DecodeStream::new(t, params.skip_special_tokens)),
            &params,
        );
        let grammar = params.grammar.as_ref().map(|g| GrammarState {
            kind: g.kind,
            matcher: g.compiled.matcher(),
            mask: None,
            filled: None,
        });
        let prompt_lp = logprobs.map(|lp| {
            let mut entries = Vec::new();
            // The first prompt token has nothing to be predicted from.
            if lp.start_len == 0
                && let Some(&first) = prompt.first()
            {
                entries.push(TokenLogprob {
                    id: first,
                    logprob: None,
                    top: None,
                });
            }
            PromptLogprobs {
                next: lp.start_len,
                entries,
            }
        });
        Req {
            id,
            rid,
            logit_proc: LogitProcessor::new(&params, &prompt, eos_ids),
            logprobs,
            prompt_lp,
            prompt,
            output: Vec::new(),
            sampler: Sampler::new(params.seed.unwrap_or(seed)),
            params,
            events,
            arrival,
            first_token_at: None,
            kv: KvLease::new(root),
            cached_tokens: 0,
            grammar,
            admission: 0,
            inflight: None,
            out,
        }
    }

    /// Prompt plus output tokens.
    pub fn total_len(&self) -> usize {
        self.prompt.len() + self.output.len()
    }

    /// Output tokens this request may still generate: up to `max_new_tokens` and the context
    /// length.
    pub fn remaining_new(&self, context_length: usize) -> usize {
        let by_max = self.params.max_new_tokens.saturating_sub(self.output.len());
        by_max.min(context_length.saturating_sub(self.total_len()))
    }

    /// Tokens still without KV. After each sampled token this is 1 (the token itself, fed in
    /// the next decode step); more while a prompt (or a retracted request) is being prefilled.
    pub fn pending(&self) -> usize {
        self.total_len().saturating_sub(self.kv.len())
    }

    /// Tokens whose KV is computed, cached or being computed, and whose ids are known: the
    /// slots beyond these hold the KV of a token still being sampled (overlap).
    pub fn known_len(&self) -> usize {
        self.total_len().min(self.kv.len())
    }

    /// Whether the next pass runs one decode token of this request: its last token is known
    /// and waits for its KV, or the pass in flight samples a token that it goes on from
    /// (unless that token reaches `max_new_tokens` or the context length).
    pub fn decodes_next(&self, context_length: usize) -> bool {
        match self.inflight {
            None => self.pending() == 1 && !self.output.is_empty(),
            Some(_) => {
                let out = self.output.len() + 1;
                out < self.params.max_new_tokens && self.prompt.len() + out < context_length
            }
        }
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

    /// Length of the token prefix that may be looked up in the radix cache at admission: all
    /// but the last token (whose logits are needed), and no further than the first position
    /// whose logits row the prompt logprobs still need.
    pub fn match_key_len(&self) -> usize {
        let all = self.total_len().saturating_sub(1);
        match &self.prompt_lp {
            Some(lp) => all.min(lp.next),
            None => all,
        }
    }

    /// Logits rows needed from a forward pass over positions `start..start + n`: the rows of
    /// the prompt positions the prompt logprobs still need, and the last row when the pass
    /// reaches the end of the sequence (`completes`).
    pub fn logit_rows(&self, start: usize, n: usize, completes: bool) -> usize {
        let end = start + n;
        match &self.prompt_lp {
            Some(lp) if lp.next < end => end - lp.next.max(start),
            _ => usize::from(completes),
        }
    }

    /// Take logits row `row`, computed at position `pos`. Rows of prompt positions before the
    /// last feed the prompt logprobs; the last position's row is for sampling and is not
    /// handled here. Returns false for a row that is not a prompt row.
    pub fn take_prompt_row(&mut self, pos: usize, row: &[f32]) -> bool {
        let Some(next_id) = self.prompt.get(pos + 1).copied() else {
            return false;
        };
        let top_k = self.logprobs.map_or(0, |l| l.top_k);
        if let Some(lp) = self.prompt_lp.as_mut() {
            lp.entries.push(row_logprob(row, next_id, top_k));
            lp.next = pos + 1;
        }
        true
    }

    /// The prompt is computed: send the prompt logprobs gathered (once).
    pub fn send_prompt_logprobs(&mut self) {
        if let Some(lp) = self.prompt_lp.take() {
            let _ = self.events.send(StreamEvent::PromptLogprobs {
                logprobs: lp.entries,
            });
        }
    }

    /// Pick the next token from the last position's logits row (modified in place by the
    /// request's grammar mask and penalties). The logprob, when asked for, is taken from the
    /// raw row. Fails when the grammar could not compute the allowed tokens.
    pub fn sample(
        &mut self,
        row: &mut [f32],
    ) -> std::result::Result<(u32, Option<TokenLogprob>), String> {
        let Some(want) = self.logprobs else {
            self.constrain(row)?;
            return Ok((self.sampler.sample(row, &self.params), None));
        };
        let lse = log_sum_exp(row);
        let top = top_logprobs(row, want.top_k, lse);
        // Sample from a copy: the raw row must survive for the sampled token's logprob.
        let mut work = row.to_vec();
        self.constrain(&mut work)?;
        let token = self.sampler.sample(&mut work, &self.params);
        let logprob = TokenLogprob {
            id: token,
            logprob: Some(token_logprob(row, token, lse)),
            top: Some(top),
        };
        Ok((token, Some(logprob)))
    }

    /// Applies the grammar mask (computed now if the scheduler has not yet), then the
    /// penalties, `logit_bias` and `min_new_tokens`.
    fn constrain(&mut self, row: &mut [f32]) -> std::result::Result<(), String> {
        if let Some(g) = self.grammar.as_mut() {
            g.fill_mask(row.len());
            if let Some(Err(e)) = &g.filled {
                return Err(e.clone());
            }
            if let Some(mask) = &g.mask {
                mask.apply_to(row);
            }
        }
        if let Some(proc) = &self.logit_proc {
            proc.apply(row);
        }
        Ok(())
    }

    /// Whether this request's next token may be sampled anywhere, by the backend on its own
    /// device included: it needs nothing from the logits row but the token (no logprobs,
    /// penalties, `logit_bias`, `min_new_tokens` or grammar).
    pub fn samples_anywhere(&self) -> bool {
        self.logprobs.is_none()
            && self.prompt_lp.is_none()
            && self.logit_proc.is_none()
            && self.params.grammar.is_none()
    }

    /// Whether the next token may be sampled by the backend with logits edits (penalties,
    /// `logit_bias`, `min_new_tokens`): no logprobs and no grammar.
    pub fn samples_with_edits(&self) -> bool {
        self.logprobs.is_none() && self.prompt_lp.is_none() && self.params.grammar.is_none()
    }

    /// The logits edits of the next token, `(token, rep, add)` (empty without penalties).
    pub fn logit_edits(&self, vocab: usize) -> Vec<(u32, f32, f32)> {
        self.logit_proc
            .as_ref()
            .map_or_else(Vec::new, |p| p.edits(vocab))
    }

    /// The sampling parameters of the next token for a backend's own sampler, with a fresh
    /// draw from the request's generator (none for greedy requests, as on the host). A
    /// request that samples nothing (prefill only) gets greedy parameters.
    pub fn device_sample_input(&mut self) -> SampleInput {
        let p = &self.params;
        let greedy = p.is_greedy() || (self.output.is_empty() && p.max_new_tokens == 0);
        SampleInput {
            temperature: if greedy { 0.0 } else { p.temperature },
            top_p: p.top_p,
            top_k: p.top_k,
            min_p: p.min_p,
            uniform: if greedy { 0.0 } else { self.sampler.uniform() },
        }
    }

    /// Advances the grammar by the sampled token (nothing to do without a grammar).
    pub fn accept_grammar(&mut self, token: u32) -> std::result::Result<(), String> {
        let Some(g) = self.grammar.as_mut() else {
            return Ok(());
        };
        g.filled = None;
        g.matcher
            .accept(token)
            .map_err(|e| format!("the {} grammar refused the sampled token: {e}", g.kind))
    }

    /// Record a sampled token, stream its text, and decide whether the request is done.
    pub fn push_token(
        &mut self,
        token: u32,
        logprob: Option<TokenLogprob>,
        eos_ids: &[u32],
        context_length: usize,
    ) -> Option<FinishReason> {
        self.output.push(token);
        if let Some(proc) = self.logit_proc.as_mut() {
            proc.observe(token);
        }
        let p = &self.params;
        let mut finish = None;
        // A complete grammar ends the request: an EOS the grammar accepted counts as a stop
        // token even with `ignore_eos`.
        let grammar_done = self.grammar.as_ref().is_some_and(GrammarState::is_finished);
        let is_stop_id = p.stop_token_ids.contains(&token)
            || ((!p.ignore_eos || grammar_done) && eos_ids.contains(&token));
        if is_stop_id {
            finish = Some(FinishReason::Stop {
                matched: serde_json::json!(token),
            });
        }
        // Text of a stop token is not part of the output, unless `no_stop_trim`.
        let (delta, stop_hit) = if is_stop_id {
            if p.no_stop_trim {
                (self.out.push(token).0, None)
            } else {
                (String::new(), None)
            }
        } else {
            self.out.push(token)
        };
        if let Some(s) = stop_hit {
            finish = Some(FinishReason::Stop {
                matched: serde_json::json!(s),
            });
        }
        if finish.is_none() && grammar_done {
            finish = Some(FinishReason::Stop {
                matched: serde_json::Value::Null,
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
            logprobs: logprob.into_iter().collect(),
        });
        finish
    }

    /// Send the final event (with any held-back text when no stop string matched).
    pub fn finish(&mut self, reason: FinishReason) {
        let text = match reason {
            FinishReason::Stop { ref matched }
                if matched.is_string() && !self.params.no_stop_trim =>
            {
                String::new()
            }
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
    stops: crate::stop::StopMatcher,
    /// Keep the matched stop string (and anything after it in the same piece).
    no_stop_trim: bool,
    text: String,
    /// Bytes of `text` already sent.
    sent: usize,
}

impl OutputText {
    fn new(decoder: Option<DecodeStream>, p: &SamplingParams) -> Self {
        let stops = crate::stop::StopMatcher::new(&p.stop);
        OutputText {
            decoder,
            stops,
            no_stop_trim: p.no_stop_trim,
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
        let trim = self.no_stop_trim;
        self.stops
            .append(&mut self.text, &mut self.sent, piece, trim)
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
#[allow(clippy::unwrap_used)]
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
    fn no_stop_trim_keeps_the_stop_string() {
        let p = SamplingParams {
            stop: vec!["END".into()],
            no_stop_trim: true,
            ..Default::default()
        };
        let mut o = OutputText::new(None, &p);
        assert_eq!(o.append("Hello E"), ("Hello ".to_string(), None));
        assert_eq!(
            o.append("ND!"),
            ("END!".to_string(), Some("END".to_string()))
        );
    }

    fn req(prompt: Vec<u32>, logprobs: Option<LogprobRequest>) -> Req {
        req_with(prompt, SamplingParams::default(), logprobs)
    }

    fn req_with(prompt: Vec<u32>, params: SamplingParams, logprobs: Option<LogprobRequest>) -> Req {
        let (events, _rx) = tokio::sync::mpsc::unbounded_channel();
        let p = PendingRequest {
            id: 1,
            req: GenerateRequest {
                rid: "r".into(),
                input_ids: prompt,
                sampling: params,
                detokenize: false,
                logprobs,
            },
            events,
            arrival: Instant::now(),
        };
        Req::new(p, 7, &[], None, crate::cache::RadixCache::new(false).root())
    }

    #[test]
    fn logprobs_come_from_the_raw_logits() {
        // The bias makes token 0 the greedy pick; its logprob is still the unbiased one.
        let params = SamplingParams {
            temperature: 0.0,
            logit_bias: vec![(0, 100.0)],
            ..Default::default()
        };
        let lp = Some(LogprobRequest {
            start_len: 0,
            top_k: 1,
        });
        let mut r = req_with(vec![5], params, lp);
        let mut row = vec![1.0f32, 2.0];
        let (token, logprob) = r.sample(&mut row).unwrap();
        assert_eq!(token, 0);
        let logprob = logprob.unwrap();
        let want = 1.0 - (1.0f32.exp() + 2.0f32.exp()).ln();
        assert!((logprob.logprob.unwrap() - want).abs() < 1e-6);
        assert_eq!(logprob.top.unwrap()[0].0, 1, "top lists are unbiased too");
        // Penalties follow the output: after observing token 0 a repetition penalty applies.
        let params = SamplingParams {
            temperature: 0.0,
            repetition_penalty: 2.0,
            ..Default::default()
        };
        let mut r = req_with(vec![9], params, None);
        assert_eq!(r.push_token(0, None, &[], 100), None);
        // Token 0 (3.0 / 2 = 1.5) now loses to token 1 (2.0).
        let mut row = vec![3.0f32, 2.0];
        assert_eq!(r.sample(&mut row).unwrap().0, 1);
    }

    /// A grammar that allows exactly the tokens of `want`, in order, then only EOS (id 9).
    /// With `broken`, computing a mask fails.
    struct Sequence {
        want: Vec<u32>,
        broken: bool,
    }

    struct SequenceMatcher {
        want: Vec<u32>,
        broken: bool,
        pos: usize,
    }

    const EOS: u32 = 9;

    impl crate::grammar::CompiledGrammar for Sequence {
        fn matcher(&self) -> Box<dyn GrammarMatcher> {
            Box::new(SequenceMatcher {
                want: self.want.clone(),
                broken: self.broken,
                pos: 0,
            })
        }
    }

    impl GrammarMatcher for SequenceMatcher {
        fn fill_mask(&mut self, mask: &mut TokenMask) -> Result<(), crate::grammar::GrammarError> {
            if self.broken {
                return Err(crate::grammar::GrammarError::Matcher("broken".into()));
            }
            mask.set_all(false);
            mask.set(self.want.get(self.pos).copied().unwrap_or(EOS), true);
            Ok(())
        }

        fn accept(&mut self, token: u32) -> Result<(), crate::grammar::GrammarError> {
            match self.want.get(self.pos) {
                Some(&t) if t == token => {
                    self.pos += 1;
                    Ok(())
                }
                None if token == EOS => Ok(()),
                _ => Err(crate::grammar::GrammarError::TokenRejected { token }),
            }
        }

        fn is_finished(&self) -> bool {
            self.pos == self.want.len()
        }
    }

    fn constrained(want: Vec<u32>, broken: bool, logprobs: Option<LogprobRequest>) -> Req {
        let params = SamplingParams {
            temperature: 0.0,
            grammar: Some(crate::request::RequestGrammar {
                kind: "regex",
                compiled: Arc::new(Sequence { want, broken }),
            }),
            ..Default::default()
        };
        req_with(vec![1], params, logprobs)
    }

    #[test]
    fn grammar_masks_sampling_and_ends_the_request() {
        let lp = Some(LogprobRequest {
            start_len: 0,
            top_k: 1,
        });
        let mut r = constrained(vec![2, 3], false, lp);
        // Token 7 is the model's favourite, but the grammar allows only 2.
        let mut row = vec![0.0f32; 10];
        row[7] = 5.0;
        let (token, logprob) = r.sample(&mut row).unwrap();
        assert_eq!(token, 2);
        // Logprobs are those of the raw row: 7 stays the top alternative.
        let logprob = logprob.unwrap();
        assert_eq!(logprob.top.unwrap()[0].0, 7);
        assert!(logprob.logprob.unwrap() < -4.0);
        r.accept_grammar(token).unwrap();
        assert_eq!(r.push_token(token, None, &[EOS], 100), None);
        // The last token completes the grammar: the request stops there, matched null.
        let mut row = vec![0.0f32; 10];
        let (token, _) = r.sample(&mut row).unwrap();
        assert_eq!(token, 3);
        r.accept_grammar(token).unwrap();
        assert_eq!(
            r.push_token(token, None, &[EOS], 100),
            Some(FinishReason::Stop {
                matched: serde_json::Value::Null
            })
        );

        // An empty grammar allows only EOS: that is a stop on the EOS id, even with
        // ignore_eos (the grammar is complete).
        let mut r = constrained(Vec::new(), false, None);
        r.params.ignore_eos = true;
        let mut row = vec![0.0f32; 10];
        row[4] = 9.0;
        let (token, _) = r.sample(&mut row).unwrap();
        assert_eq!(token, EOS);
        r.accept_grammar(token).unwrap();
        assert_eq!(
            r.push_token(token, None, &[EOS], 100),
            Some(FinishReason::Stop {
                matched: serde_json::json!(EOS)
            })
        );
    }

    #[test]
    fn grammar_failures_are_request_errors() {
        let mut r = constrained(vec![2], true, None);
        let err = r.sample(&mut [0.0f32; 10]).unwrap_err();
        assert!(
            err.contains("regex grammar failed") && err.contains("broken"),
            "{err}"
        );
        let mut r = constrained(vec![2], false, None);
        let err = r.accept_grammar(5).unwrap_err();
        assert!(err.contains("refused the sampled token"), "{err}");
        // A request without a grammar accepts anything.
        let mut r = req(vec![1], None);
        assert!(r.accept_grammar(5).is_ok());
    }

    #[test]
    fn prompt_logprobs_limit_the_prefix_and_ask_for_rows() {
        // No logprobs: match all but the last token; one row when the prompt completes.
        let r = req(vec![5, 6, 7, 8, 9], None);
        assert_eq!(r.match_key_len(), 4);
        assert_eq!(r.logit_rows(0, 3, false), 0);
        assert_eq!(r.logit_rows(3, 2, true), 1);
        // Output logprobs only (start = len - 1): the same.
        let lp = |s| {
            Some(LogprobRequest {
                start_len: s,
                top_k: 2,
            })
        };
        let r = req(vec![5, 6, 7, 8, 9], lp(4));
        assert_eq!(r.match_key_len(), 4);
        assert_eq!(r.logit_rows(3, 2, true), 1);
        // From position 2: rows of positions 2.. in every chunk that covers them.
        let mut r = req(vec![5, 6, 7, 8, 9], lp(2));
        assert_eq!(r.match_key_len(), 2);
        assert_eq!(r.logit_rows(0, 2, false), 0);
        assert_eq!(r.logit_rows(2, 2, false), 2);
        assert!(r.take_prompt_row(2, &[0.0; 10]));
        assert!(r.take_prompt_row(3, &[0.0; 10]));
        // The last position's row is the sampling row, not a prompt row.
        assert!(!r.take_prompt_row(4, &[0.0; 10]));
        assert_eq!(r.logit_rows(4, 1, true), 1);
        let entries = &r.prompt_lp.as_ref().unwrap().entries;
        assert_eq!(entries.iter().map(|e| e.id).collect::<Vec<_>>(), vec![8, 9]);
        let l = entries[0].logprob.unwrap();
        assert!((l - (0.1f32).ln()).abs() < 1e-6, "{l}");
        assert_eq!(entries[0].top.as_ref().unwrap().len(), 2);
        // From 0: the first token has a null entry, and nothing may be matched.
        let r = req(vec![5, 6, 7], lp(0));
        assert_eq!(r.match_key_len(), 0);
        let e = &r.prompt_lp.as_ref().unwrap().entries;
        assert_eq!(e.len(), 1);
        assert_eq!((e[0].id, e[0].logprob), (5, None));
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
