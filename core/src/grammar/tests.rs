//! Grammar backends against the real SmolLM2 tokenizer (fetched with `scripts/fetch-model.sh`;
//! set `SGL_TEST_GGUF` to use another copy). Each walk simulates a model: at every step it takes
//! the allowed token with the best fixed pseudo-random score, then checks the decoded text
//! against the spec with an independent validator.

use std::sync::{Arc, OnceLock};

use serde_json::json;

use super::vocab::TokenVocab;
use super::*;
use crate::tokenizer::tests::smollm2;

fn backend(name: &'static str) -> Option<Arc<dyn GrammarBackend>> {
    static LLG: OnceLock<Option<Arc<dyn GrammarBackend>>> = OnceLock::new();
    static OUTLINES: OnceLock<Option<Arc<dyn GrammarBackend>>> = OnceLock::new();
    let cell = match name {
        "llguidance" => &LLG,
        "outlines" => &OUTLINES,
        other => panic!("no test backend {other}"),
    };
    cell.get_or_init(|| {
        let tok = smollm2()?;
        Some(build_backend(name, &tok, tok.vocab_size()).expect("build backend"))
    })
    .clone()
}

fn token_vocab() -> Option<Arc<TokenVocab>> {
    static VOCAB: OnceLock<Option<Arc<TokenVocab>>> = OnceLock::new();
    VOCAB
        .get_or_init(|| {
            let tok = smollm2()?;
            Some(Arc::new(
                TokenVocab::new(&tok, tok.vocab_size()).expect("vocab"),
            ))
        })
        .clone()
}

/// splitmix64: a fixed pseudo-random score per (seed, step, token).
fn score(seed: u64, step: usize, token: u32) -> f64 {
    let mut z = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add((step as u64) << 32 | token as u64);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// The simulated model's preference: random, but it avoids whitespace-only tokens and, after a
/// few steps, prefers tokens that close strings, objects and groups, and EOS, so walks end.
fn preference(vocab: &TokenVocab, seed: u64, step: usize, token: u32) -> f64 {
    let mut s = score(seed, step, token);
    if vocab.is_eos(token) {
        return if step > 12 { s + 10.0 } else { s - 1.0 };
    }
    let bytes = &vocab.bytes[token as usize];
    if !bytes.is_empty() && bytes.iter().all(u8::is_ascii_whitespace) {
        s -= 5.0;
    }
    if step > 12
        && bytes
            .iter()
            .any(|b| matches!(b, b'"' | b'}' | b']' | b')' | b'.'))
    {
        s += 2.0;
    }
    s
}

struct Walk {
    tokens: Vec<u32>,
    text: String,
    steps: usize,
}

/// Walks a fresh matcher of `spec` to EOS, checking every mask on the way.
fn walk(backend: &dyn GrammarBackend, spec: &GrammarSpec, seed: u64) -> Walk {
    let tok = smollm2().expect("tokenizer");
    let vocab = token_vocab().expect("vocab");
    let grammar = backend
        .compile(spec)
        .unwrap_or_else(|e| panic!("{} compiles {spec:?}: {e}", backend.name()));
    let mut matcher = grammar.matcher();
    let mut mask = backend.new_mask();
    let mut tokens = Vec::new();
    for step in 0..3000 {
        matcher.fill_mask(&mut mask).expect("fill_mask");
        let allowed: Vec<u32> = mask.allowed_ids().collect();
        assert!(!allowed.is_empty(), "step {step}: nothing allowed");
        for &id in &allowed {
            assert!(
                !vocab.special[id as usize] || vocab.is_eos(id),
                "step {step}: special token {id} allowed"
            );
        }
        if matcher.is_finished() {
            assert!(
                allowed.iter().all(|&id| vocab.is_eos(id)),
                "finished, yet non-EOS tokens are allowed"
            );
        }
        let best = allowed
            .iter()
            .copied()
            .max_by(|&a, &b| {
                preference(&vocab, seed, step, a).total_cmp(&preference(&vocab, seed, step, b))
            })
            .expect("non-empty");
        matcher
            .accept(best)
            .unwrap_or_else(|e| panic!("step {step}: allowed token {best} rejected: {e}"));
        if vocab.is_eos(best) {
            assert!(matcher.is_finished());
            let text = tok.decode(&tokens, false).expect("decode");
            return Walk {
                tokens,
                text,
                steps: step + 1,
            };
        }
        tokens.push(best);
    }
    let text = tok.decode(&tokens, false).unwrap_or_default();
    panic!("no EOS after 3000 steps: {text:?}");
}

const NESTED_SCHEMA: &str = r#"{
  "type": "object",
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 20},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "role": {"enum": ["admin", "user", "guest"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
    "address": {
      "type": "object",
      "properties": {
        "city": {"type": "string", "maxLength": 30},
        "zip": {"type": "string", "pattern": "^[0-9]{5}$"}
      },
      "required": ["city", "zip"],
      "additionalProperties": false
    },
    "active": {"type": "boolean"}
  },
  "required": ["name", "age", "role", "address"],
  "additionalProperties": false
}"#;

fn check_schema_walks(name: &'static str) {
    let Some(backend) = backend(name) else { return };
    let mut schema: serde_json::Value = serde_json::from_str(NESTED_SCHEMA).expect("schema");
    if name == "outlines" {
        // outlines-core does not enforce numeric bounds.
        let age = &mut schema["properties"]["age"];
        age.as_object_mut().expect("age").retain(|k, _| k == "type");
    }
    let validator = jsonschema::validator_for(&schema).expect("validator");
    let spec = GrammarSpec::JsonSchema(schema.to_string());
    for seed in 0..4 {
        let w = walk(backend.as_ref(), &spec, seed);
        let value: serde_json::Value = serde_json::from_str(&w.text)
            .unwrap_or_else(|e| panic!("{name} seed {seed}: not JSON ({e}): {:?}", w.text));
        assert!(
            validator.is_valid(&value),
            "{name} seed {seed}: {:?} does not match the schema: {:?}",
            w.text,
            validator
                .iter_errors(&value)
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
        );
        assert!(w.steps > 5);
        assert_eq!(
            w.tokens.len() + 1,
            w.steps,
            "every step but EOS adds a token"
        );
    }
}

#[test]
fn llguidance_json_schema_walks_validate() {
    check_schema_walks("llguidance");
}

#[test]
fn outlines_json_schema_walks_validate() {
    check_schema_walks("outlines");
}

fn check_json_object(name: &'static str) {
    let Some(backend) = backend(name) else { return };
    for seed in 0..3 {
        let w = walk(backend.as_ref(), &GrammarSpec::JsonObject, seed);
        let value: serde_json::Value = serde_json::from_str(&w.text)
            .unwrap_or_else(|e| panic!("{name} seed {seed}: not JSON ({e}): {:?}", w.text));
        assert!(value.is_object(), "{name}: {:?} is not an object", w.text);
    }
}

#[test]
fn llguidance_json_object_is_an_object() {
    check_json_object("llguidance");
}

#[test]
fn outlines_json_object_is_an_object() {
    check_json_object("outlines");
}

const REGEXES: &[&str] = &[
    r"[a-z]{3,8}@[a-z]{2,5}\.(com|org|net)",
    r"(\+|-)?[0-9]{1,4}(\.[0-9]{1,2})?",
    r"(yes|no|maybe), because [A-Z][a-z ]{0,20}\.",
    r"\d{4}-\d{2}-\d{2}",
];

fn check_regex_walks(name: &'static str) {
    let Some(backend) = backend(name) else { return };
    for rx in REGEXES {
        let anchored = regex::Regex::new(&format!("^(?:{rx})$")).expect("regex");
        for seed in 0..3 {
            let w = walk(backend.as_ref(), &GrammarSpec::Regex(rx.to_string()), seed);
            assert!(
                anchored.is_match(&w.text),
                "{name}: {:?} does not match {rx}",
                w.text
            );
        }
    }
}

#[test]
fn llguidance_regex_walks_match() {
    check_regex_walks("llguidance");
}

#[test]
fn outlines_regex_walks_match() {
    check_regex_walks("outlines");
}

#[test]
fn llguidance_ebnf_walks_stay_in_the_language() {
    let Some(backend) = backend("llguidance") else {
        return;
    };
    // A finite language: every sentence it has, enumerated.
    let grammar = r#"
root ::= answer " because " reason "."   # the sentence
answer ::= "yes" | "no" | "maybe"
reason ::= "it is " ("raining" | "sunny" | "late")
"#;
    let mut language = Vec::new();
    for a in ["yes", "no", "maybe"] {
        for r in ["raining", "sunny", "late"] {
            language.push(format!("{a} because it is {r}."));
        }
    }
    let spec = GrammarSpec::Ebnf(grammar.to_string());
    let mut seen = std::collections::HashSet::new();
    for seed in 0..12 {
        let w = walk(backend.as_ref(), &spec, seed);
        assert!(
            language.contains(&w.text),
            "{:?} is not in the language",
            w.text
        );
        seen.insert(w.text);
    }
    assert!(seen.len() > 1, "the walks should differ");

    // SGLang's documented example.
    let spec = GrammarSpec::Ebnf(r#"root ::= "yes" | "no""#.to_string());
    for seed in 0..4 {
        let w = walk(backend.as_ref(), &spec, seed);
        assert!(w.text == "yes" || w.text == "no", "{:?}", w.text);
    }

    // Recursion, repetition, classes, and rules split over lines.
    let grammar = r#"
root ::= "[" ws item (ws "," ws item)* ws "]" tail
item ::= [0-9]+ | "(" nested ")"
nested ::= "x" | "(" nested ")"
ws ::= [ ]?
tail ::= (
    "!" |
    ""
)
"#;
    let check = regex::Regex::new(r"^\[ ?(?:[0-9]+|\(+x\)+)(?: ?, ?(?:[0-9]+|\(+x\)+))* ?\]!?$")
        .expect("regex");
    let spec = GrammarSpec::Ebnf(grammar.to_string());
    for seed in 0..6 {
        let w = walk(backend.as_ref(), &spec, seed);
        assert!(check.is_match(&w.text), "{:?}", w.text);
        let opens = w.text.matches('(').count();
        assert_eq!(opens, w.text.matches(')').count(), "{:?}", w.text);
    }
}

#[test]
fn llguidance_lark_walks_match() {
    let Some(backend) = backend("llguidance") else {
        return;
    };
    let lark = "start: \"name=\" NAME (\";\" \"age=\" AGE)?\nNAME: /[A-Z][a-z]{1,8}/\nAGE: /[1-9][0-9]?/\n";
    let check = regex::Regex::new(r"^name=[A-Z][a-z]{1,8}(;age=[1-9][0-9]?)?$").expect("regex");
    for spec in [
        GrammarSpec::Lark(lark.to_string()),
        // Lark text passed as EBNF is used as is.
        GrammarSpec::Ebnf(lark.to_string()),
    ] {
        for seed in 0..4 {
            let w = walk(backend.as_ref(), &spec, seed);
            assert!(check.is_match(&w.text), "{:?}", w.text);
        }
    }
}

#[test]
fn invalid_specs_are_errors_with_the_compilers_message() {
    for name in ["llguidance", "outlines"] {
        let Some(backend) = backend(name) else { return };
        let cases = [
            GrammarSpec::JsonSchema("{not json".into()),
            GrammarSpec::JsonSchema("[1, 2]".into()),
            GrammarSpec::JsonSchema(r#"{"type": "no-such-type"}"#.into()),
            GrammarSpec::Regex("(abc".into()),
            GrammarSpec::Regex("[z-a]".into()),
            GrammarSpec::Regex(r"a\".into()),
        ];
        for spec in cases {
            match backend.compile(&spec) {
                Ok(_) => panic!("{name}: {spec:?} compiled"),
                Err(e) => {
                    assert!(e.is_user_error(), "{name}: {spec:?}: {e}");
                    assert!(e.to_string().len() > 10, "{name}: {spec:?}: {e}");
                }
            }
        }
    }

    let Some(llg) = backend("llguidance") else {
        return;
    };
    for spec in [
        GrammarSpec::Ebnf("root ::= missing".into()),
        GrammarSpec::Ebnf("root ::= \"a".into()),
        GrammarSpec::Ebnf("item ::= \"a\"".into()),
        GrammarSpec::Ebnf("".into()),
        GrammarSpec::Lark("start: undefined_rule".into()),
        GrammarSpec::Lark("start: /[/".into()),
        GrammarSpec::Lark("no start rule here".into()),
    ] {
        let err = match llg.compile(&spec) {
            Ok(_) => panic!("{spec:?} compiled"),
            Err(e) => e,
        };
        assert!(
            matches!(err, GrammarError::Invalid { .. }),
            "{spec:?}: {err:?}"
        );
    }
    match llg.compile(&GrammarSpec::Ebnf("root ::= missing".into())) {
        Err(e) => assert!(e.to_string().contains("undefined rule 'missing'"), "{e}"),
        Ok(_) => panic!("compiled"),
    }

    let Some(outlines) = backend("outlines") else {
        return;
    };
    for spec in [
        GrammarSpec::Ebnf(r#"root ::= "yes" | "no""#.into()),
        GrammarSpec::Lark("start: \"a\"".into()),
    ] {
        match outlines.compile(&spec) {
            Err(e @ GrammarError::Unsupported(_)) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("supports json_schema and regex")
                        && msg.contains("--grammar-backend llguidance"),
                    "{msg}"
                );
                assert!(e.is_user_error());
            }
            other => panic!("{spec:?}: {:?}", other.err()),
        }
    }
    // A regex whose DFA explodes is refused quickly instead of compiling for minutes.
    let start = std::time::Instant::now();
    for rx in ["[ab]*a[ab]{14}", "[ab]*a[ab]{18}"] {
        match outlines.compile(&GrammarSpec::Regex(rx.into())) {
            Err(e) => assert!(e.to_string().contains("automaton is too large"), "{e}"),
            Ok(_) => panic!("{rx} compiled"),
        }
    }
    assert!(start.elapsed().as_secs() < 20);
}

#[test]
fn backend_names() {
    let Some(tok) = smollm2() else { return };
    let n = tok.vocab_size();
    assert_eq!(
        build_backend("xgrammar", &tok, n).expect("xgrammar").name(),
        "llguidance"
    );
    assert!(matches!(
        build_backend("none", &tok, n).err(),
        Some(GrammarError::Disabled)
    ));
    assert!(matches!(
        build_backend("nope", &tok, n).err(),
        Some(GrammarError::UnknownBackend(_))
    ));
    if let Some(b) = backend("llguidance") {
        assert_eq!(b.name(), "llguidance");
        assert_eq!(b.vocab_size(), n);
    }
    if let Some(b) = backend("outlines") {
        assert_eq!(b.name(), "outlines");
    }
}

#[test]
fn cache_hits_return_the_same_grammar() {
    for name in ["llguidance", "outlines"] {
        let Some(backend) = backend(name) else { return };
        let spec = GrammarSpec::Regex("cache-[0-9]{2}".into());
        let a = backend.compile(&spec).expect("compile");
        let b = backend.compile(&spec).expect("compile");
        assert!(Arc::ptr_eq(&a, &b), "{name}: cache miss");
        let c = backend
            .compile(&GrammarSpec::Regex("cache-[0-9]{3}".into()))
            .expect("compile");
        assert!(
            !Arc::ptr_eq(&a, &c),
            "{name}: different specs share a grammar"
        );
    }
}

#[test]
fn cache_evicts_the_least_recently_used() {
    struct Dummy;
    impl CompiledGrammar for Dummy {
        fn matcher(&self) -> Box<dyn GrammarMatcher> {
            unreachable!("not used")
        }
    }
    let cache = GrammarCache::new(2);
    let spec = |i: u32| GrammarSpec::Regex(format!("r{i}"));
    let compile = || Ok(Arc::new(Dummy) as Arc<dyn CompiledGrammar>);
    let first = cache.get_or_compile(&spec(1), compile).expect("insert");
    cache.get_or_compile(&spec(2), compile).expect("insert");
    // Touch 1, so 2 is the least recently used when 3 arrives.
    let again = cache.get_or_compile(&spec(1), compile).expect("hit");
    assert!(Arc::ptr_eq(&first, &again));
    cache.get_or_compile(&spec(3), compile).expect("insert");
    assert_eq!(cache.len(), 2);
    let still = cache.get_or_compile(&spec(1), compile).expect("hit");
    assert!(Arc::ptr_eq(&first, &still));
    // A panicking compiler is an error, not a crash.
    let err = cache
        .get_or_compile(&spec(5), || panic!("compiler bug"))
        .err()
        .expect("error");
    assert!(err.to_string().contains("compiler bug"), "{err}");
    // Errors are not cached.
    let err = cache.get_or_compile(&spec(4), || Err(GrammarError::invalid("regex", "bad")));
    assert!(err.is_err());
    assert_eq!(cache.len(), 2);
}

/// Ids of `text` tokenized as the model would (no BOS).
fn ids(text: &str) -> Vec<u32> {
    smollm2()
        .expect("tokenizer")
        .encode(text, false)
        .expect("encode")
}

#[test]
fn disallowed_tokens_are_rejected_and_state_is_kept() {
    for name in ["llguidance", "outlines"] {
        let Some(backend) = backend(name) else { return };
        let grammar = backend
            .compile(&GrammarSpec::Regex("[0-9]+".into()))
            .expect("compile");
        let mut m = grammar.matcher();
        let mut before = backend.new_mask();
        m.fill_mask(&mut before).expect("mask");
        let letter = ids("a")[0];
        assert!(!before.get(letter));
        assert_eq!(
            m.accept(letter),
            Err(GrammarError::TokenRejected { token: letter })
        );
        // EOS before the grammar accepts anything is rejected too.
        let eos = smollm2().expect("tok").eos_token_ids()[0];
        assert!(!before.get(eos));
        assert!(m.accept(eos).is_err());
        // Out of vocabulary.
        assert!(m.accept(backend.vocab_size() as u32 + 5).is_err());
        let mut after = backend.new_mask();
        m.fill_mask(&mut after).expect("mask");
        assert_eq!(before, after, "{name}: a rejected token changed the state");
        // The matcher still works.
        let digit = ids("7")[0];
        assert!(before.get(digit));
        m.accept(digit).expect("digit");
        m.fill_mask(&mut after).expect("mask");
        assert!(after.get(eos), "{name}: EOS allowed after a digit");
        assert!(!m.is_finished(), "{name}: more digits may follow");
        // Wrong mask size.
        let mut small = TokenMask::new(10);
        assert!(matches!(
            m.fill_mask(&mut small),
            Err(GrammarError::MaskSize { .. })
        ));
    }
}

#[test]
fn finished_grammar_allows_only_eos() {
    let tok = match smollm2() {
        Some(t) => t,
        None => return,
    };
    for name in ["llguidance", "outlines"] {
        let Some(backend) = backend(name) else { return };
        let grammar = backend
            .compile(&GrammarSpec::Regex("(yes|no)".into()))
            .expect("compile");
        let mut m = grammar.matcher();
        assert!(!m.is_finished());
        for id in ids("yes") {
            m.accept(id).expect("accept");
        }
        assert!(m.is_finished(), "{name}: 'yes' completes the grammar");
        let mut mask = backend.new_mask();
        m.fill_mask(&mut mask).expect("mask");
        let allowed: Vec<u32> = mask.allowed_ids().collect();
        let mut eos = tok.eos_token_ids().to_vec();
        eos.sort_unstable();
        assert_eq!(allowed, eos, "{name}: only EOS ids after the end");
        let other = ids(" maybe")[0];
        assert_eq!(
            m.accept(other),
            Err(GrammarError::TokenRejected { token: other })
        );
        m.accept(tok.eos_token_ids()[0]).expect("EOS");
        assert!(m.is_finished());
        assert!(m.accept(other).is_err());
        m.fill_mask(&mut mask).expect("mask");
        assert_eq!(mask.allowed_ids().collect::<Vec<_>>(), eos);
    }
}

#[test]
fn model_vocab_larger_than_tokenizer_never_allows_padding_ids() {
    let Some(tok) = smollm2() else { return };
    let n = tok.vocab_size();
    for name in ["llguidance", "outlines"] {
        let backend = build_backend(name, &tok, n + 64).expect("backend");
        assert_eq!(backend.vocab_size(), n + 64);
        let grammar = backend
            .compile(&GrammarSpec::Regex("[a-z ]{1,40}".into()))
            .expect("compile");
        let mut m = grammar.matcher();
        let mut mask = backend.new_mask();
        m.fill_mask(&mut mask).expect("mask");
        assert!(mask.count_allowed() > 1000);
        assert!(mask.allowed_ids().all(|id| (id as usize) < n));
        assert!(m.accept(n as u32 + 3).is_err());
    }
}

#[test]
fn token_bytes_round_trip_the_tokenizer() {
    let (Some(tok), Some(vocab)) = (smollm2(), token_vocab()) else {
        return;
    };
    for text in [
        "Hello world",
        " {\"key\": [1, 2.5e3]}\n",
        "héllo 世界 🎉\ttab",
    ] {
        let ids = tok.encode(text, false).expect("encode");
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&id| vocab.bytes[id as usize].clone())
            .collect();
        assert_eq!(String::from_utf8(bytes).expect("utf8"), text);
    }
    for &eos in tok.eos_token_ids() {
        assert!(vocab.special[eos as usize] && vocab.bytes[eos as usize].is_empty());
    }
}

#[test]
fn matchers_of_one_grammar_run_concurrently() {
    let Some(backend) = backend("llguidance") else {
        return;
    };
    let spec = GrammarSpec::JsonSchema(NESTED_SCHEMA.to_string());
    backend.compile(&spec).expect("compile");
    let texts: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..3)
            .map(|seed| {
                let backend = backend.clone();
                let spec = spec.clone();
                s.spawn(move || walk(backend.as_ref(), &spec, 100 + seed).text)
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("walk thread"))
            .collect()
    });
    for (seed, text) in texts.iter().enumerate() {
        let single = walk(backend.as_ref(), &spec, 100 + seed as u64).text;
        assert_eq!(text, &single, "a walk depends only on its seed");
    }
}

#[test]
fn token_mask_basics() {
    let mut m = TokenMask::new(70);
    assert_eq!(m.len(), 70);
    assert_eq!(m.words().len(), 3);
    m.set(0, true);
    m.set(33, true);
    m.set(69, true);
    m.set(70, true); // past the end: ignored
    assert!(m.get(33) && !m.get(34) && !m.get(70));
    assert_eq!(m.allowed_ids().collect::<Vec<_>>(), vec![0, 33, 69]);
    let mut logits = vec![1.0f32; 72];
    m.apply_to(&mut logits);
    for (i, &l) in logits.iter().enumerate() {
        let allowed = [0, 33, 69].contains(&i);
        assert_eq!(l == 1.0, allowed, "logit {i}");
        assert_eq!(l == f32::NEG_INFINITY, !allowed, "logit {i}");
    }
    m.set_all(true);
    assert_eq!(m.count_allowed(), 70);
    m.set(33, false);
    assert_eq!(m.count_allowed(), 69);
    m.set_all(false);
    assert_eq!(m.count_allowed(), 0);
}

#[test]
fn public_types_are_thread_safe() {
    fn send_sync<T: Send + Sync + ?Sized>() {}
    fn send<T: Send + ?Sized>() {}
    send_sync::<dyn GrammarBackend>();
    send_sync::<dyn CompiledGrammar>();
    send::<dyn GrammarMatcher>();
    send_sync::<TokenMask>();
    send_sync::<GrammarError>();
    let _ = json!({});
}

/// Specs a request controls, nested or chained as deep as [`MAX_SPEC_BYTES`] allows. Each one
/// compiles or is refused with a 400, on a test thread whose stack is no larger than an async
/// worker's: before compilation moved to its own thread and the GBNF converter got its
/// nesting limit, the first one aborted the process with a stack overflow.
fn deep_specs() -> Vec<(&'static str, GrammarSpec)> {
    let budget = MAX_SPEC_BYTES - 64;
    let nested = |open: &str, inner: &str, close: &str| {
        let depth = (budget - inner.len()) / (open.len() + close.len());
        format!("{}{inner}{}", open.repeat(depth), close.repeat(depth))
    };
    let chain = |first: &str, line: &dyn Fn(usize) -> String, last: &str| {
        let mut text = first.to_string();
        let mut i = 0;
        while text.len() < budget - 200 {
            text.push_str(&line(i));
            i += 1;
        }
        text.push_str(&last.replace("{i}", &i.to_string()));
        text
    };
    vec![
        (
            "ebnf groups",
            GrammarSpec::Ebnf(format!("root ::= {}", nested("(", "\"a\"", ")"))),
        ),
        (
            "ebnf groups at 10,000",
            GrammarSpec::Ebnf(format!(
                "root ::= {}\"a\"{}",
                "(".repeat(10_000),
                ")".repeat(10_000)
            )),
        ),
        (
            "ebnf repetitions",
            GrammarSpec::Ebnf(format!("root ::= \"a\"{}", "?".repeat(budget - 20))),
        ),
        (
            "ebnf rule chain",
            GrammarSpec::Ebnf(chain(
                "root ::= r0\n",
                &|i| format!("r{i} ::= r{}\n", i + 1),
                "r{i} ::= \"a\"\n",
            )),
        ),
        (
            "ebnf recursive rule chain",
            GrammarSpec::Ebnf(chain(
                "root ::= r0\n",
                &|i| format!("r{i} ::= \"(\" r{} \")\" | root\n", i + 1),
                "r{i} ::= \"a\"\n",
            )),
        ),
        (
            "lark groups",
            GrammarSpec::Lark(format!("start: {}", nested("(", "\"a\"", ")"))),
        ),
        (
            "lark regex groups",
            GrammarSpec::Lark(format!("start: /{}/", nested("(", "a", ")"))),
        ),
        (
            "lark terminal chain",
            GrammarSpec::Lark(chain(
                "start: T0\n",
                &|i| format!("T{i}: T{}\n", i + 1),
                "T{i}: \"a\"\n",
            )),
        ),
        (
            "lark rule chain",
            GrammarSpec::Lark(chain(
                "start: r0\n",
                &|i| format!("r{i}: r{}\n", i + 1),
                "r{i}: \"a\"\n",
            )),
        ),
        ("regex groups", GrammarSpec::Regex(nested("(", "a", ")"))),
        ("regex classes", GrammarSpec::Regex(nested("[", "a", "]"))),
        (
            "json schema text nesting",
            GrammarSpec::JsonSchema(nested("{\"items\":", "{}", "}")),
        ),
        (
            "json schema nesting at the parser's limit",
            GrammarSpec::JsonSchema(format!(
                "{}{{}}{}",
                "{\"type\":\"array\",\"items\":".repeat(126),
                "}".repeat(126)
            )),
        ),
        (
            "json schema $ref chain",
            GrammarSpec::JsonSchema(chain(
                "{\"$ref\":\"#/$defs/d0\",\"$defs\":{",
                &|i| format!("\"d{i}\":{{\"$ref\":\"#/$defs/d{}\"}},", i + 1),
                "\"d{i}\":{\"type\":\"string\"}}}",
            )),
        ),
        (
            "json schema anyOf chain",
            GrammarSpec::JsonSchema(chain(
                "{\"$ref\":\"#/$defs/d0\",\"$defs\":{",
                &|i| {
                    format!(
                        "\"d{i}\":{{\"anyOf\":[{{\"$ref\":\"#/$defs/d{}\"}},{{\"type\":\"null\"}}]}},",
                        i + 1
                    )
                },
                "\"d{i}\":{\"type\":\"string\"}}}",
            )),
        ),
        (
            "json schema deep pattern",
            GrammarSpec::JsonSchema(format!(
                "{{\"type\":\"string\",\"pattern\":\"{}\"}}",
                nested("(", "a", ")")
            )),
        ),
    ]
}

#[test]
fn request_controlled_depth_never_overflows_the_stack() {
    for name in ["llguidance", "outlines"] {
        let Some(backend) = backend(name) else { return };
        for (what, spec) in deep_specs() {
            assert!(spec.text().len() <= MAX_SPEC_BYTES, "{what}");
            let start = std::time::Instant::now();
            // A thread with an async worker's stack, as the HTTP handlers have.
            let b = backend.clone();
            let s = spec.clone();
            let result = std::thread::Builder::new()
                .stack_size(2 << 20)
                .spawn(move || b.compile(&s).map(|_| ()))
                .expect("spawn")
                .join()
                .expect("compile returns");
            eprintln!(
                "{name} {what}: {} bytes, {:.0} ms: {}",
                spec.text().len(),
                start.elapsed().as_secs_f64() * 1e3,
                match &result {
                    Ok(()) => "compiled".to_string(),
                    Err(e) => e.to_string().chars().take(120).collect(),
                }
            );
            if let Err(e) = result {
                assert!(e.is_user_error(), "{name} {what}: {e}");
            }
        }
    }
    // The nesting limit is named in the error.
    let Some(llg) = backend("llguidance") else {
        return;
    };
    let deep = GrammarSpec::Ebnf(format!(
        "root ::= {}\"a\"{}",
        "(".repeat(10_000),
        ")".repeat(10_000)
    ));
    let err = llg.compile(&deep).err().expect("refused");
    assert!(err.to_string().contains("nested more than"), "{err}");
}

#[test]
fn a_stuck_compile_holds_its_slot_and_others_get_busy_not_a_hang() {
    struct Dummy;
    impl CompiledGrammar for Dummy {
        fn matcher(&self) -> Box<dyn GrammarMatcher> {
            unreachable!("not used")
        }
    }
    let slots = Arc::new(CompileSlots::new(1));
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let s = slots.clone();
    let stuck = std::thread::spawn(move || {
        compile_in_slot("lark", &s, std::time::Duration::from_secs(60), move || {
            let _ = started_tx.send(());
            let _ = release_rx.recv();
            Ok(Arc::new(Dummy) as Arc<dyn CompiledGrammar>)
        })
        .map(|_| ())
    });
    started_rx.recv().expect("the first compile runs");
    let busy = compile_in_slot(
        "regex",
        &slots,
        std::time::Duration::from_millis(50),
        || Ok(Arc::new(Dummy) as Arc<dyn CompiledGrammar>),
    );
    let err = busy.err().expect("no slot while the first compile runs");
    assert!(matches!(err, GrammarError::Busy(_)), "{err:?}");
    assert_eq!(EngineError::from(err).status_code(), 503);
    release_tx.send(()).expect("release");
    stuck.join().expect("joins").expect("compiles");
    // The slot is free again.
    assert!(
        compile_in_slot("regex", &slots, std::time::Duration::from_secs(10), || {
            Ok(Arc::new(Dummy) as Arc<dyn CompiledGrammar>)
        })
        .is_ok()
    );
}
