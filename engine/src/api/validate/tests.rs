//! Unit tests of request parsing and validation.

#![allow(clippy::unwrap_used)]

use super::*;
use serde_json::json;

fn sampling(v: Value, d: Dialect) -> Result<SamplingInput> {
    parse_sampling(&v, "", d)
}

fn msg(e: EngineError) -> String {
    e.to_string()
}

const LIMITS: Limits = Limits {
    context_length: 100,
    vocab_size: 1000,
    detokenize: true,
};

#[test]
fn sampling_defaults_and_values() {
    let s = sampling(json!({}), Dialect::OpenAi).unwrap();
    assert_eq!(s.params, SamplingParams::default());
    assert_eq!(s.max_tokens, None);
    let s = sampling(
        json!({"temperature": 0, "top_p": 0.5, "top_k": 5, "min_p": 0.1, "max_tokens": 7,
               "stop": "x", "seed": -3, "ignore_eos": true, "frequency_penalty": 0}),
        Dialect::OpenAi,
    )
    .unwrap();
    assert_eq!(s.params.temperature, 0.0);
    assert_eq!(s.params.top_k, 5);
    assert_eq!(s.max_tokens, Some(7));
    assert_eq!(s.params.stop, vec!["x".to_string()]);
    assert_eq!(s.params.seed, Some((-3i64) as u64));
    assert!(s.params.ignore_eos);
    let s = sampling(
        json!({"max_completion_tokens": 3, "max_tokens": 9}),
        Dialect::OpenAi,
    )
    .unwrap();
    assert_eq!(s.max_tokens, Some(3));
    assert_eq!(s.max_tokens_field, "max_completion_tokens");
}

#[test]
fn sampling_errors_name_the_field() {
    let cases = [
        (json!({"temperature": -1}), "temperature"),
        (json!({"temperature": "hot"}), "temperature"),
        (json!({"top_p": 0}), "top_p"),
        (json!({"top_p": 1.5}), "top_p"),
        (json!({"top_k": 0}), "top_k"),
        (json!({"top_k": -2}), "top_k"),
        (json!({"min_p": 2}), "min_p"),
        (json!({"max_tokens": 0}), "max_tokens"),
        (json!({"max_tokens": -5}), "max_tokens"),
        (json!({"stop": 3}), "stop"),
        (json!({"stop": ["a", 1]}), "stop[1]"),
        (json!({"presence_penalty": 3.0}), "presence_penalty"),
        (json!({"frequency_penalty": -2.5}), "frequency_penalty"),
        (json!({"repetition_penalty": 0}), "repetition_penalty"),
        (json!({"repetition_penalty": 2.5}), "repetition_penalty"),
        (json!({"min_tokens": -1}), "min_tokens"),
        (json!({"logit_bias": {"abc": 1}}), "logit_bias"),
        (json!({"logit_bias": {"1.5": 1}}), "logit_bias"),
        (json!({"logit_bias": {"5": 101}}), "logit_bias"),
        (json!({"logit_bias": [1]}), "logit_bias"),
        (json!({"no_stop_trim": "yes"}), "no_stop_trim"),
        (json!({"n": 0}), "n"),
        (json!({"n": 17}), "n"),
        (
            json!({"response_format": {"type": "xml"}}),
            "response_format.type",
        ),
        (json!({"response_format": {}}), "response_format.type"),
        (
            json!({"response_format": {"type": "json_schema"}}),
            "response_format.json_schema",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
            "response_format.json_schema.schema",
        ),
        (json!({"regex": 5}), "regex"),
        (json!({"regex": "a", "ebnf": "root ::= \"a\""}), "ebnf"),
        (
            json!({"regex": "a", "response_format": {"type": "json_object"}}),
            "response_format",
        ),
    ];
    for (body, field) in cases {
        let e = sampling(body.clone(), Dialect::OpenAi).expect_err(&body.to_string());
        assert!(matches!(e, EngineError::BadRequest { .. }));
        assert!(msg(e).contains(&format!("`{field}`")), "{body}");
    }
    let e = sampling(json!({"max_new_tokens": "x"}), Dialect::Native).unwrap_err();
    assert!(msg(e).contains("max_new_tokens"));
}

#[test]
fn grammar_fields() {
    let g = |v: Value, d: Dialect| sampling(v, d).unwrap().grammar;
    assert_eq!(g(json!({}), Dialect::Native), None);
    assert_eq!(
        g(
            json!({"response_format": {"type": "text"}}),
            Dialect::OpenAi
        ),
        None
    );
    let obj = g(
        json!({"response_format": {"type": "json_object"}}),
        Dialect::OpenAi,
    )
    .unwrap();
    assert_eq!(obj.spec, GrammarSpec::JsonObject);
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let js = g(
        json!({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": true}}}),
        Dialect::OpenAi,
    )
    .unwrap();
    assert_eq!(js.field, "response_format.json_schema.schema");
    match js.spec {
        GrammarSpec::JsonSchema(text) => {
            assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), schema)
        }
        other => panic!("{other:?}"),
    }
    // Native: json_schema as a string (SGLang) or as an object.
    let text = schema.to_string();
    assert_eq!(
        g(json!({"json_schema": text}), Dialect::Native)
            .unwrap()
            .spec,
        GrammarSpec::JsonSchema(text.clone())
    );
    assert_eq!(
        g(json!({"json_schema": schema}), Dialect::Native)
            .unwrap()
            .spec,
        GrammarSpec::JsonSchema(text)
    );
    let r = g(json!({"regex": "[0-9]+"}), Dialect::Native).unwrap();
    assert_eq!(
        (r.spec, r.field.as_str()),
        (GrammarSpec::Regex("[0-9]+".into()), "regex")
    );
    let e = sampling(json!({"json_schema": "{}", "regex": "a"}), Dialect::Native).unwrap_err();
    let m = msg(e);
    assert!(m.contains("`regex`") && m.contains("`json_schema`"), "{m}");
    assert!(sampling(json!({"json_schema": 3}), Dialect::Native).is_err());
}

#[test]
fn penalties_bias_and_min_tokens() {
    let s = sampling(
        json!({"frequency_penalty": 0.5, "presence_penalty": -1, "repetition_penalty": 1.2,
               "min_tokens": 3, "logit_bias": {"7": -100, " 2": 5.5}, "no_stop_trim": true,
               "spaces_between_special_tokens": false}),
        Dialect::OpenAi,
    )
    .unwrap();
    let p = &s.params;
    assert_eq!(
        (
            p.frequency_penalty,
            p.presence_penalty,
            p.repetition_penalty
        ),
        (0.5, -1.0, 1.2)
    );
    assert_eq!(p.min_new_tokens, 3);
    assert_eq!(p.logit_bias, vec![(2, 5.5), (7, -100.0)]);
    assert!(p.no_stop_trim && !p.spaces_between_special_tokens);
    // The native name of min_tokens, and max_new_tokens 0 (prefill only) on /generate.
    let s = sampling(
        json!({"min_new_tokens": 2, "max_new_tokens": 0}),
        Dialect::Native,
    )
    .unwrap();
    assert_eq!(s.params.min_new_tokens, 2);
    assert_eq!(s.max_tokens, Some(0));
    let e = build_request(
        "r".into(),
        vec![1],
        "input_ids",
        &s,
        MaxTokensDefault::Fixed(1),
        &LIMITS,
    )
    .unwrap_err();
    assert!(msg(e).contains("`min_new_tokens`"));
    let s = sampling(json!({"logit_bias": {"1000": 1}}), Dialect::OpenAi).unwrap();
    let e = build_request(
        "r".into(),
        vec![1],
        "prompt",
        &s,
        MaxTokensDefault::Fixed(1),
        &LIMITS,
    )
    .unwrap_err();
    let m = msg(e);
    assert!(m.contains("logit_bias") && m.contains("1000"), "{m}");
}

#[test]
fn logprob_start_is_resolved_against_the_prompt() {
    let mut s = sampling(json!({}), Dialect::Native).unwrap();
    let build = |s: &SamplingInput| {
        build_request(
            "r".into(),
            vec![1, 2, 3],
            "input_ids",
            s,
            MaxTokensDefault::Fixed(1),
            &LIMITS,
        )
    };
    assert_eq!(build(&s).unwrap().logprobs, None);
    let lp = |start_len| LogprobInput {
        start_len,
        top_k: 4,
        start_field: "logprob_start_len",
    };
    s.logprobs = Some(lp(-1));
    assert_eq!(
        build(&s).unwrap().logprobs,
        Some(LogprobRequest {
            start_len: 2,
            top_k: 4
        })
    );
    s.logprobs = Some(lp(0));
    assert_eq!(build(&s).unwrap().logprobs.unwrap().start_len, 0);
    s.logprobs = Some(lp(3));
    assert!(msg(build(&s).unwrap_err()).contains("`logprob_start_len` is 3"));
}

#[test]
fn build_checks_prompt_and_budget() {
    let s = sampling(json!({"max_tokens": 10}), Dialect::OpenAi).unwrap();
    let r = build_request(
        "r".into(),
        vec![1, 2, 3],
        "prompt",
        &s,
        MaxTokensDefault::Fixed(128),
        &LIMITS,
    )
    .unwrap();
    assert_eq!(r.sampling.max_new_tokens, 10);
    let e = build_request(
        "r".into(),
        vec![],
        "prompt",
        &s,
        MaxTokensDefault::Fixed(1),
        &LIMITS,
    )
    .unwrap_err();
    assert!(msg(e).contains("empty"));
    let e = build_request(
        "r".into(),
        vec![1000],
        "input_ids",
        &s,
        MaxTokensDefault::Fixed(1),
        &LIMITS,
    )
    .unwrap_err();
    assert!(msg(e).contains("1000"));
    let s = sampling(json!({"max_tokens": 95}), Dialect::OpenAi).unwrap();
    let e = build_request(
        "r".into(),
        vec![1; 10],
        "prompt",
        &s,
        MaxTokensDefault::Fixed(1),
        &LIMITS,
    )
    .unwrap_err();
    let m = msg(e);
    assert!(
        m.contains("prompt has 10 tokens") && m.contains("max_tokens 95") && m.contains("100"),
        "{m}"
    );
    let s = sampling(json!({}), Dialect::OpenAi).unwrap();
    let r = build_request(
        "r".into(),
        vec![1; 90],
        "prompt",
        &s,
        MaxTokensDefault::Fixed(4096),
        &LIMITS,
    )
    .unwrap();
    assert_eq!(r.sampling.max_new_tokens, 10);
    let e = build_request(
        "r".into(),
        vec![1; 100],
        "prompt",
        &s,
        MaxTokensDefault::Fixed(1),
        &LIMITS,
    )
    .unwrap_err();
    assert!(msg(e).contains("context length 100"));
}

#[test]
fn stop_strings_need_a_tokenizer() {
    let limits = Limits {
        detokenize: false,
        ..LIMITS
    };
    let s = sampling(json!({"stop": ["a"]}), Dialect::Native).unwrap();
    let e = build_request(
        "r".into(),
        vec![1],
        "input_ids",
        &s,
        MaxTokensDefault::Fixed(1),
        &limits,
    )
    .unwrap_err();
    assert!(msg(e).contains("skip-tokenizer-init"));
}
