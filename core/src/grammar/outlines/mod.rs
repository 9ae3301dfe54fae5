//! The outlines backend (`outlines-core`): JSON schema (through a regex) and regex.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use outlines_core::index::Index;
use outlines_core::json_schema;
use outlines_core::vocabulary::Vocabulary;
use parking_lot::RwLock;
use regex_automata::Anchored;
use regex_automata::dfa::Automaton;
use regex_automata::dfa::dense;

mod regex_size;

use super::vocab::TokenVocab;
use super::{
    CompiledGrammar, GRAMMAR_CACHE_CAPACITY, GrammarBackend, GrammarCache, GrammarError,
    GrammarMatcher, GrammarSpec, TokenMask,
};
use crate::tokenizer::Tokenizer;

/// Regexes whose DFA has more states than this are refused: outlines walks every vocabulary
/// token through every state at compile time.
pub const OUTLINES_MAX_DFA_STATES: usize = 20_000;

/// Memory the DFA of a regex may take while it is built.
const DFA_SIZE_LIMIT: usize = 64 << 20;

pub(crate) struct OutlinesBackend {
    vocab: Arc<TokenVocab>,
    index_vocab: Vocabulary,
    cache: GrammarCache,
}

impl OutlinesBackend {
    pub(crate) fn new(tokenizer: &Tokenizer, vocab_size: usize) -> Result<Self, GrammarError> {
        let vocab = Arc::new(TokenVocab::new(tokenizer, vocab_size)?);
        let mut index_vocab = Vocabulary::new(vocab.eos[0]);
        for (id, bytes) in vocab.bytes.iter().enumerate() {
            let id = id as u32;
            if bytes.is_empty() || vocab.is_eos(id) {
                continue;
            }
            index_vocab
                .try_insert(bytes.clone(), id)
                .map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        }
        Ok(OutlinesBackend {
            vocab,
            index_vocab,
            cache: GrammarCache::new(GRAMMAR_CACHE_CAPACITY),
        })
    }

    fn build(&self, spec: &GrammarSpec) -> Result<Arc<dyn CompiledGrammar>, GrammarError> {
        let kind = spec.kind();
        let regex = match spec {
            GrammarSpec::JsonSchema(text) => {
                let schema: serde_json::Value =
                    serde_json::from_str(text).map_err(|e| GrammarError::invalid(kind, e))?;
                regex_size::check(&schema).map_err(|e| GrammarError::invalid(kind, match e {
                    regex_size::TooLarge::Regex => format!(
                        "the schema's regex would exceed {} MiB (nested arrays, objects or optional properties repeat their parts); simplify it or use --grammar-backend llguidance",
                        regex_size::MAX_SCHEMA_REGEX_BYTES >> 20
                    ),
                    regex_size::TooLarge::Depth => "the schema nests too deeply for the outlines backend; use --grammar-backend llguidance".to_string(),
                }))?;
                json_schema::regex_from_value(&schema, None, None)
                    .map_err(|e| GrammarError::invalid(kind, e))?
            }
            GrammarSpec::JsonObject => json_schema::regex_from_value(
                &serde_json::json!({"type": "object", "depth": 1}),
                None,
                None,
            )
            .map_err(|e| GrammarError::invalid(kind, e))?,
            GrammarSpec::Regex(rx) => rx.clone(),
            GrammarSpec::Ebnf(_) | GrammarSpec::Lark(_) => {
                return Err(GrammarError::Unsupported(format!(
                    "the outlines backend supports json_schema and regex; use --grammar-backend llguidance for {kind}"
                )));
            }
        };
        check_dfa_size(&regex).map_err(|e| GrammarError::invalid(kind, e))?;
        let index =
            Index::new(&regex, &self.index_vocab).map_err(|e| GrammarError::invalid(kind, e))?;
        Ok(Arc::new(OutlinesGrammar(Arc::new(OutlinesShared {
            index,
            vocab: self.vocab.clone(),
            masks: RwLock::new(HashMap::new()),
        }))))
    }
}

/// Builds the DFA with bounded memory and counts its reachable states, so that a regex that
/// would make `Index::new` run for minutes is refused up front.
fn check_dfa_size(regex: &str) -> Result<(), String> {
    let dfa = dense::Builder::new()
        .configure(
            dense::DFA::config()
                .dfa_size_limit(Some(DFA_SIZE_LIMIT))
                .determinize_size_limit(Some(DFA_SIZE_LIMIT)),
        )
        .syntax(regex_automata::util::syntax::Config::new())
        .thompson(regex_automata::nfa::thompson::Config::new().nfa_size_limit(Some(DFA_SIZE_LIMIT)))
        .build(regex)
        .map_err(|e| {
            if e.is_size_limit_exceeded() {
                format!(
                    "the regex's automaton is too large ({e}); simplify it or use --grammar-backend llguidance"
                )
            } else {
                e.to_string()
            }
        })?;
    let start = dfa
        .universal_start_state(Anchored::Yes)
        .ok_or_else(|| "the regex has no anchored start state".to_string())?;
    let mut seen = HashSet::from([start]);
    let mut todo = vec![start];
    while let Some(state) = todo.pop() {
        for byte in 0..=255u8 {
            let next = dfa.next_state(state, byte);
            if dfa.is_dead_state(next) || dfa.is_quit_state(next) || !seen.insert(next) {
                continue;
            }
            if seen.len() > OUTLINES_MAX_DFA_STATES {
                return Err(format!(
                    "the regex's automaton is too large (more than {OUTLINES_MAX_DFA_STATES} states); simplify it or use --grammar-backend llguidance"
                ));
            }
            todo.push(next);
        }
    }
    Ok(())
}

impl GrammarBackend for OutlinesBackend {
    fn name(&self) -> &'static str {
        "outlines"
    }

    fn vocab_size(&self) -> usize {
        self.vocab.model_vocab
    }

    fn compile(&self, spec: &GrammarSpec) -> Result<Arc<dyn CompiledGrammar>, GrammarError> {
        self.cache.get_or_compile(spec, || self.build(spec))
    }
}

struct OutlinesGrammar(Arc<OutlinesShared>);

struct OutlinesShared {
    index: Index,
    vocab: Arc<TokenVocab>,
    /// Mask words per DFA state, filled the first time a state is reached.
    masks: RwLock<HashMap<u32, Arc<[u32]>>>,
}

impl OutlinesShared {
    fn mask_words(&self, state: u32) -> Arc<[u32]> {
        if let Some(words) = self.masks.read().get(&state) {
            return words.clone();
        }
        let mut mask = TokenMask::new(self.vocab.model_vocab);
        if let Some(tokens) = self.index.allowed_tokens_iter(&state) {
            for &id in tokens {
                if !self.vocab.is_eos(id) {
                    mask.set(id, true);
                }
            }
        }
        if self.index.is_final_state(&state) {
            for &id in &self.vocab.eos {
                mask.set(id, true);
            }
        }
        let words: Arc<[u32]> = mask.words().into();
        self.masks.write().insert(state, words.clone());
        words
    }

    /// Whether any token other than EOS leaves `state`.
    fn can_continue(&self, state: u32) -> bool {
        self.index
            .allowed_tokens_iter(&state)
            .is_some_and(|mut it| it.any(|&id| !self.vocab.is_eos(id)))
    }
}

impl CompiledGrammar for OutlinesGrammar {
    fn matcher(&self) -> Box<dyn GrammarMatcher> {
        Box::new(OutlinesMatcher {
            state: self.0.index.initial_state(),
            grammar: self.0.clone(),
            eos_accepted: false,
        })
    }
}

struct OutlinesMatcher {
    grammar: Arc<OutlinesShared>,
    state: u32,
    eos_accepted: bool,
}

impl GrammarMatcher for OutlinesMatcher {
    fn fill_mask(&mut self, mask: &mut TokenMask) -> Result<(), GrammarError> {
        let vocab = &self.grammar.vocab;
        if mask.len() != vocab.model_vocab {
            return Err(GrammarError::MaskSize {
                expected: vocab.model_vocab,
                got: mask.len(),
            });
        }
        if self.eos_accepted {
            mask.set_all(false);
            for &id in &vocab.eos {
                mask.set(id, true);
            }
            return Ok(());
        }
        let words = self.grammar.mask_words(self.state);
        mask.words_mut().copy_from_slice(&words);
        Ok(())
    }

    fn accept(&mut self, token: u32) -> Result<(), GrammarError> {
        let g = &self.grammar;
        if token as usize >= g.vocab.model_vocab {
            return Err(GrammarError::TokenRejected { token });
        }
        if g.vocab.is_eos(token) {
            if self.eos_accepted || g.index.is_final_state(&self.state) {
                self.eos_accepted = true;
                return Ok(());
            }
            return Err(GrammarError::TokenRejected { token });
        }
        if self.eos_accepted {
            return Err(GrammarError::TokenRejected { token });
        }
        match g.index.next_state(&self.state, &token) {
            Some(next) => {
                self.state = next;
                Ok(())
            }
            None => Err(GrammarError::TokenRejected { token }),
        }
    }

    fn is_finished(&self) -> bool {
        self.eos_accepted
            || (self.grammar.index.is_final_state(&self.state)
                && !self.grammar.can_continue(self.state))
    }
}
