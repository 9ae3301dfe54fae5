//! The llguidance backend: JSON schema, `json_object`, regex, Lark and GBNF-style EBNF.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use parking_lot::Mutex;

use super::vocab::TokenVocab;
use super::{
    CompiledGrammar, GRAMMAR_CACHE_CAPACITY, GrammarBackend, GrammarCache, GrammarError,
    GrammarMatcher, GrammarSpec, TokenMask, gbnf,
};
use crate::tokenizer::Tokenizer;

/// llguidance's view of our tokenizer: the token trie plus a tokenize function.
struct TokenizerEnvImpl {
    trie: TokTrie,
    tokenizer: Tokenizer,
}

impl TokenizerEnv for TokenizerEnvImpl {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        match std::str::from_utf8(s) {
            Ok(text) => match self.tokenizer.encode(text, false) {
                Ok(ids) => ids,
                Err(_) => self.trie.greedy_tokenize(s),
            },
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }

    fn tokenize_is_canonical(&self) -> bool {
        // Forced-token splicing is not used; masks never depend on this.
        false
    }
}

pub(crate) struct LlguidanceBackend {
    factory: Arc<ParserFactory>,
    vocab: Arc<TokenVocab>,
    cache: GrammarCache,
}

impl LlguidanceBackend {
    pub(crate) fn new(tokenizer: &Tokenizer, vocab_size: usize) -> Result<Self, GrammarError> {
        let vocab = Arc::new(TokenVocab::new(tokenizer, vocab_size)?);
        let words: Vec<Vec<u8>> = (0..vocab.size())
            .map(|id| {
                if vocab.special[id] {
                    let text = vocab
                        .special_text
                        .get(&(id as u32))
                        .map(String::as_str)
                        .unwrap_or("");
                    let mut w = Vec::with_capacity(text.len() + 1);
                    w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                    w.extend_from_slice(text.as_bytes());
                    w
                } else {
                    vocab.bytes[id].clone()
                }
            })
            .collect();
        let size = u32::try_from(vocab.size())
            .map_err(|_| GrammarError::Vocabulary("vocabulary too large".into()))?;
        let mut info = TokRxInfo::new(size, vocab.eos[0]);
        info.tok_bos = tokenizer.bos_token_id().filter(|&id| id < size);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&vocab.eos);
        let env: TokEnv = Arc::new(TokenizerEnvImpl {
            trie,
            tokenizer: tokenizer.clone(),
        });
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        factory.quiet();
        Ok(LlguidanceBackend {
            factory: Arc::new(factory),
            vocab,
            cache: GrammarCache::new(GRAMMAR_CACHE_CAPACITY),
        })
    }

    fn build(&self, spec: &GrammarSpec) -> Result<Arc<dyn CompiledGrammar>, GrammarError> {
        let kind = spec.kind();
        let grammar = match spec {
            GrammarSpec::JsonSchema(text) => {
                let schema: serde_json::Value = serde_json::from_str(text)
                    .map_err(|e| GrammarError::invalid(kind, format!("not JSON: {e}")))?;
                if !(schema.is_object() || schema.is_boolean()) {
                    return Err(GrammarError::invalid(
                        kind,
                        "a JSON schema must be an object or a boolean",
                    ));
                }
                TopLevelGrammar::from_json_schema(schema)
            }
            GrammarSpec::JsonObject => {
                TopLevelGrammar::from_json_schema(serde_json::json!({"type": "object"}))
            }
            GrammarSpec::Regex(rx) => {
                // llguidance rewrites the regex into Lark before parsing it; check the syntax
                // first so that every malformed regex gets the parser's message.
                regex_automata::util::syntax::parse(rx)
                    .map_err(|e| GrammarError::invalid(kind, e))?;
                TopLevelGrammar::from_regex(rx)
            }
            GrammarSpec::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
            GrammarSpec::Ebnf(text) => {
                let lark = if gbnf::looks_like_lark(text) {
                    text.clone()
                } else {
                    gbnf::gbnf_to_lark(text).map_err(|e| GrammarError::invalid(kind, e))?
                };
                TopLevelGrammar::from_lark(lark)
            }
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| GrammarError::invalid(kind, e))?;
        let mut matcher = Matcher::new(Ok(parser));
        // The first mask builds the lexer state every request's matcher then shares; computing
        // it here also surfaces grammars that cannot start.
        matcher
            .compute_mask()
            .map_err(|e| GrammarError::invalid(kind, e))?;
        Ok(Arc::new(LlguidanceGrammar {
            template: Mutex::new(matcher),
            vocab: self.vocab.clone(),
        }))
    }
}

impl GrammarBackend for LlguidanceBackend {
    fn name(&self) -> &'static str {
        "llguidance"
    }

    fn vocab_size(&self) -> usize {
        self.vocab.model_vocab
    }

    fn compile(&self, spec: &GrammarSpec) -> Result<Arc<dyn CompiledGrammar>, GrammarError> {
        self.cache.get_or_compile(spec, || self.build(spec))
    }
}

struct LlguidanceGrammar {
    /// A matcher at the start of the grammar; requests get clones, which share its lexer.
    template: Mutex<Matcher>,
    vocab: Arc<TokenVocab>,
}

impl CompiledGrammar for LlguidanceGrammar {
    fn matcher(&self) -> Box<dyn GrammarMatcher> {
        Box::new(LlguidanceMatcher {
            matcher: self.template.lock().clone(),
            vocab: self.vocab.clone(),
            eos_accepted: false,
        })
    }
}

struct LlguidanceMatcher {
    matcher: Matcher,
    vocab: Arc<TokenVocab>,
    eos_accepted: bool,
}

impl LlguidanceMatcher {
    fn check(&self) -> Result<(), GrammarError> {
        match self.matcher.get_error() {
            Some(e) => Err(GrammarError::Matcher(e)),
            None => Ok(()),
        }
    }

    /// The grammar is complete: either finished, or EOS is allowed next.
    fn accepting(&mut self) -> bool {
        self.is_finished() || self.matcher.is_accepting().unwrap_or(false)
    }
}

fn eos_only(mask: &mut TokenMask, vocab: &TokenVocab) {
    mask.set_all(false);
    for &id in &vocab.eos {
        mask.set(id, true);
    }
}

impl GrammarMatcher for LlguidanceMatcher {
    fn fill_mask(&mut self, mask: &mut TokenMask) -> Result<(), GrammarError> {
        if mask.len() != self.vocab.model_vocab {
            return Err(GrammarError::MaskSize {
                expected: self.vocab.model_vocab,
                got: mask.len(),
            });
        }
        self.check()?;
        if self.is_finished() {
            eos_only(mask, &self.vocab);
            return Ok(());
        }
        let allowed = self
            .matcher
            .compute_mask()
            .map_err(|e| GrammarError::Matcher(e.to_string()))?;
        let src = allowed.as_slice();
        let dst = mask.words_mut();
        let n = dst.len().min(src.len());
        dst[..n].copy_from_slice(&src[..n]);
        dst[n..].fill(0);
        mask.clear_tail();
        if mask.count_allowed() == 0 {
            return Err(GrammarError::Matcher(
                "no token can continue the grammar".into(),
            ));
        }
        Ok(())
    }

    fn accept(&mut self, token: u32) -> Result<(), GrammarError> {
        self.check()?;
        if token as usize >= self.vocab.model_vocab {
            return Err(GrammarError::TokenRejected { token });
        }
        if self.vocab.is_eos(token) {
            if self.eos_accepted || self.accepting() {
                self.eos_accepted = true;
                return Ok(());
            }
            return Err(GrammarError::TokenRejected { token });
        }
        if self.is_finished() {
            return Err(GrammarError::TokenRejected { token });
        }
        let consumed = self
            .matcher
            .try_consume_tokens(&[token])
            .map_err(|e| GrammarError::Matcher(e.to_string()))?;
        if consumed == 0 {
            return Err(GrammarError::TokenRejected { token });
        }
        Ok(())
    }

    fn is_finished(&self) -> bool {
        self.eos_accepted || (self.matcher.is_stopped() && !self.matcher.is_error())
    }
}
