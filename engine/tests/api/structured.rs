//! Structured output with the real model: JSON schemas, `json_object`, regexes and EBNF
//! grammars on `/generate` and the OpenAI routes, with the llguidance (default) and outlines
//! backends. Outputs are checked with independent tools: the `jsonschema` crate validates
//! JSON against its schema, the `regex` crate checks full matches.

use serde_json::{Value, json};

use crate::common::{Server, sse_json};
use crate::{assert_error, outlines_server, server, skip_tokenizer_server};

/// A flat object with bounded fields.
fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120}
        },
        "required": ["name", "age"],
        "additionalProperties": false
    })
}

/// A nested object with an enum and an array.
fn pet_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "pet": {
                "type": "object",
                "properties": {
                    "kind": {"enum": ["cat", "dog", "fish"]},
                    "legs": {"type": "integer", "minimum": 0, "maximum": 8}
                },
                "required": ["kind", "legs"],
                "additionalProperties": false
            },
            "colors": {
                "type": "array",
                "items": {"enum": ["red", "green", "blue"]},
                "minItems": 1,
                "maxItems": 3
            }
        },
        "required": ["pet", "colors"],
        "additionalProperties": false
    })
}

/// A top-level array of objects.
fn trips_schema() -> Value {
    json!({
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 15},
                "visited": {"type": "boolean"}
            },
            "required": ["city", "visited"],
            "additionalProperties": false
        },
        "minItems": 1,
        "maxItems": 2
    })
}

fn schemas() -> Vec<(&'static str, Value, &'static str)> {
    vec![
        ("person", person_schema(), "Describe a person as JSON."),
        (
            "pet",
            pet_schema(),
            "Describe a pet and its colors as JSON.",
        ),
        ("trips", trips_schema(), "List cities you visited as JSON."),
    ]
}

/// Parses `text` as JSON and validates it against `schema`; panics with the details.
fn assert_valid(schema: &Value, text: &str, case: &str) -> Value {
    let value: Value = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("{case}: output is not JSON ({e}): {text:?}"));
    let validator = jsonschema::validator_for(schema).expect("test schema compiles");
    let errors: Vec<String> = validator
        .iter_errors(&value)
        .map(|e| e.to_string())
        .collect();
    assert!(
        errors.is_empty(),
        "{case}: {text:?} does not follow the schema: {errors:?}"
    );
    value
}

fn assert_fullmatch(pattern: &str, text: &str, case: &str) {
    let re = regex::Regex::new(&format!("^(?:{pattern})$")).expect("test regex compiles");
    assert!(
        re.is_match(text),
        "{case}: {text:?} does not match {pattern}"
    );
}

/// The output was ended by its grammar (or EOS), not by the token budget.
fn assert_stopped(meta: &Value, case: &str) {
    assert_eq!(
        meta["finish_reason"]["type"],
        json!("stop"),
        "{case}: {meta}"
    );
}

async fn generate(s: &Server, text: &str, params: Value) -> Value {
    let (status, r) = s
        .post(
            "/generate",
            &json!({"text": text, "sampling_params": params}),
        )
        .await;
    assert_eq!(status, 200, "{params}: {r}");
    r
}

#[tokio::test]
async fn json_schema_outputs_follow_their_schema() {
    let s = server();
    for (name, schema, prompt) in schemas() {
        // SGLang's form: the schema as a string; greedy and sampled (seeded).
        for (temperature, seed) in [(0.0, 0), (0.8, 7), (0.8, 11)] {
            let case = format!("{name} at temperature {temperature} seed {seed}");
            let r = generate(
                s,
                prompt,
                json!({"json_schema": schema.to_string(), "temperature": temperature,
                       "seed": seed, "max_new_tokens": 400}),
            )
            .await;
            assert_valid(&schema, r["text"].as_str().unwrap(), &case);
            assert_stopped(&r["meta_info"], &case);
        }
        // The schema as an object works the same.
        let r = generate(
            s,
            prompt,
            json!({"json_schema": schema, "temperature": 0, "max_new_tokens": 400}),
        )
        .await;
        assert_valid(&schema, r["text"].as_str().unwrap(), name);
    }
}

#[tokio::test]
async fn json_schema_with_parallel_samples_and_streaming() {
    let s = server();
    let schema = pet_schema();
    // n = 2: each sample has its own grammar state.
    let r = generate(
        s,
        "Describe a pet as JSON.",
        json!({"json_schema": schema.to_string(), "temperature": 0.8, "seed": 3, "n": 2,
               "max_new_tokens": 300}),
    )
    .await;
    let list = r.as_array().expect("n = 2 answers with a list");
    assert_eq!(list.len(), 2, "{r}");
    for (i, o) in list.iter().enumerate() {
        assert_valid(&schema, o["text"].as_str().unwrap(), &format!("sample {i}"));
        assert_stopped(&o["meta_info"], &format!("sample {i}"));
    }

    // /generate streaming: the last cumulative text is the whole output.
    let data = s
        .post_sse(
            "/generate",
            &json!({"text": "Describe a person as JSON.", "stream": true,
                    "sampling_params": {"json_schema": person_schema().to_string(),
                                        "temperature": 0, "max_new_tokens": 200}}),
        )
        .await;
    let chunks = sse_json(&data);
    let last = chunks.last().expect("chunks");
    assert_valid(&person_schema(), last["text"].as_str().unwrap(), "stream");
    assert_stopped(&last["meta_info"], "stream");

    // Chat with response_format json_schema, streamed and not, n = 2.
    let body = json!({
        "model": "default",
        "messages": [{"role": "user", "content": "List two cities you visited, as JSON."}],
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "trips", "schema": trips_schema(), "strict": true}},
        "temperature": 0.8,
        "seed": 5,
        "n": 2,
        "max_tokens": 300,
    });
    let (status, r) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{r}");
    let choices = r["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2);
    for c in choices {
        assert_valid(
            &trips_schema(),
            c["message"]["content"].as_str().unwrap(),
            "chat",
        );
        assert_eq!(c["finish_reason"], json!("stop"), "{c}");
    }
    let mut stream_body = body.clone();
    stream_body["stream"] = json!(true);
    stream_body["n"] = json!(1);
    let chunks = sse_json(&s.post_sse("/v1/chat/completions", &stream_body).await);
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_valid(&trips_schema(), &text, "chat stream");
    let finish: Vec<&Value> = chunks
        .iter()
        .map(|c| &c["choices"][0]["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finish, vec![&json!("stop")], "chat stream");
}

#[tokio::test]
async fn json_object_regex_and_ebnf() {
    let s = server();
    // json_object on completions and chat.
    let (status, r) = s
        .post(
            "/v1/completions",
            &json!({"model": "default", "prompt": "A JSON object with a name and an age:",
                    "response_format": {"type": "json_object"}, "temperature": 0, "max_tokens": 300}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    let text = r["choices"][0]["text"].as_str().unwrap();
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    assert!(v.is_object(), "{text}");
    let (status, r) = s
        .post(
            "/v1/chat/completions",
            &json!({"model": "default", "messages": [{"role": "user", "content": "Describe a dog in JSON."}],
                    "response_format": {"type": "json_object"}, "temperature": 0.8, "seed": 1,
                    "max_tokens": 300}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    let text = r["choices"][0]["message"]["content"].as_str().unwrap();
    if r["choices"][0]["finish_reason"] == json!("stop") {
        let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        assert!(v.is_object(), "{text}");
    } else {
        assert!(text.trim_start().starts_with('{'), "{text}");
    }
    // `response_format: text` is no constraint.
    let (status, r) = s
        .post(
            "/v1/chat/completions",
            &json!({"model": "default", "messages": [{"role": "user", "content": "Hi"}],
                    "response_format": {"type": "text"}, "temperature": 0, "max_tokens": 4}),
        )
        .await;
    assert_eq!(status, 200, "{r}");

    // Regexes: the whole output matches, and the request ends when the regex is complete.
    let cases = [
        (r"[1-9][0-9]", "A number from 10 to 99:"),
        (
            r"(yes|no), because [a-z ]{1,20}\.",
            "Is the sky blue? Answer:",
        ),
        (
            r"[A-Z][a-z]{2,8}@example\.(com|org)",
            "Write an email address:",
        ),
    ];
    for (pattern, prompt) in cases {
        for temperature in [0.0, 0.8] {
            let case = format!("{pattern} at {temperature}");
            let r = generate(
                s,
                prompt,
                json!({"regex": pattern, "temperature": temperature, "seed": 2, "max_new_tokens": 60}),
            )
            .await;
            assert_fullmatch(pattern, r["text"].as_str().unwrap(), &case);
            assert_stopped(&r["meta_info"], &case);
            assert!(
                r["meta_info"]["completion_tokens"].as_u64().unwrap() < 60,
                "{case}: {r}"
            );
        }
    }
    // Logprobs stay those of the raw logits: the model's favourite next token after this
    // prompt is a word, which the regex forbids, so it tops the list but is not sampled.
    let (status, r) = s
        .post(
            "/generate",
            &json!({"text": "The capital of France is", "return_logprob": true, "top_logprobs_num": 3,
                    "sampling_params": {"regex": "[0-9]", "temperature": 0, "max_new_tokens": 5}}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert_fullmatch("[0-9]", r["text"].as_str().unwrap(), "logprobs");
    let meta = &r["meta_info"];
    let sampled = &meta["output_token_logprobs"][0];
    let top = &meta["output_top_logprobs"][0];
    assert_eq!(meta["completion_tokens"], json!(1), "{r}");
    assert_ne!(
        top[0][1], sampled[1],
        "raw top-1 is not the constrained pick: {r}"
    );
    assert!(
        top[0][0].as_f64().unwrap() > sampled[0].as_f64().unwrap(),
        "{r}"
    );

    // `regex` as an extra field of the OpenAI routes, streamed.
    let chunks = sse_json(
        &s.post_sse(
            "/v1/chat/completions",
            &json!({"model": "default", "messages": [{"role": "user", "content": "Pick a color."}],
                    "regex": "(red|green|blue)", "temperature": 0, "max_tokens": 20, "stream": true}),
        )
        .await,
    );
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_fullmatch("(red|green|blue)", &text, "chat regex stream");

    // EBNF (GBNF style, as SGLang documents it).
    let grammar = r#"root ::= "The answer is " answer "."
answer ::= "yes" | "no" | "maybe""#;
    for temperature in [0.0, 0.8] {
        let r = generate(
            s,
            "Will it rain tomorrow?",
            json!({"ebnf": grammar, "temperature": temperature, "seed": 4, "max_new_tokens": 30}),
        )
        .await;
        let text = r["text"].as_str().unwrap();
        assert!(
            [
                "The answer is yes.",
                "The answer is no.",
                "The answer is maybe."
            ]
            .contains(&text),
            "{text:?}"
        );
        assert_stopped(&r["meta_info"], "ebnf");
    }
    let (status, r) = s
        .post(
            "/v1/completions",
            &json!({"model": "default", "prompt": "Digits:", "ebnf": "root ::= [0-9] [0-9]? [0-9]? \";\"",
                    "temperature": 0, "max_tokens": 30}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert_fullmatch(
        "[0-9]{1,3};",
        r["choices"][0]["text"].as_str().unwrap(),
        "completions ebnf",
    );
    assert_eq!(r["choices"][0]["finish_reason"], json!("stop"), "{r}");
}

#[tokio::test]
async fn invalid_grammars_are_400s_with_the_compiler_message() {
    let s = server();
    let cases = [
        (
            json!({"json_schema": "{\"type\":"}),
            "sampling_params.json_schema",
            "not JSON",
        ),
        (
            json!({"json_schema": {"type": "frobnicate"}}),
            "sampling_params.json_schema",
            "frobnicate",
        ),
        (
            json!({"json_schema": 5}),
            "sampling_params.json_schema",
            "JSON schema",
        ),
        (
            json!({"regex": "[a-"}),
            "sampling_params.regex",
            "unclosed character class",
        ),
        (
            json!({"ebnf": "root ::= ("}),
            "sampling_params.ebnf",
            "expected ')'",
        ),
        (
            json!({"ebnf": "start ::= \"a\""}),
            "sampling_params.ebnf",
            "root",
        ),
        (
            json!({"json_schema": "{}", "regex": "a"}),
            "sampling_params.json_schema",
            "cannot be combined",
        ),
        (
            json!({"regex": "a", "ebnf": "root ::= \"a\""}),
            "sampling_params.ebnf",
            "cannot be combined",
        ),
    ];
    for (params, field, text) in cases {
        let (status, r) = s
            .post(
                "/generate",
                &json!({"text": "x", "sampling_params": params}),
            )
            .await;
        assert_error(status, &r, 400, text, &params.to_string());
        assert_eq!(r["error"]["param"], json!(field), "{r}");
    }
    let chat = |extra: Value| {
        let mut body = json!({"model": "default", "messages": [{"role": "user", "content": "x"}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let cases = [
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "bogus"}}}}}}),
            "response_format.json_schema.schema",
            "bogus",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
            "response_format.json_schema.schema",
            "required",
        ),
        (
            json!({"response_format": {"type": "yaml"}}),
            "response_format.type",
            "yaml",
        ),
        (
            json!({"response_format": {"type": "json_object"}, "regex": "a"}),
            "response_format",
            "cannot be combined",
        ),
        (json!({"regex": "(a"}), "regex", "unclosed group"),
    ];
    for (extra, field, text) in cases {
        let (status, r) = s.post("/v1/chat/completions", &chat(extra.clone())).await;
        assert_error(status, &r, 400, text, &extra.to_string());
        assert_eq!(r["error"]["param"], json!(field), "{r}");
    }
    // The same checks hold on /v1/completions.
    let (status, r) = s
        .post(
            "/v1/completions",
            &json!({"model": "default", "prompt": "x", "ebnf": "root ::= \"a"}),
        )
        .await;
    assert_error(status, &r, 400, "ebnf", "completions ebnf");

    // Without a tokenizer there is no vocabulary to constrain.
    let st = skip_tokenizer_server();
    let (status, r) = st
        .post(
            "/generate",
            &json!({"input_ids": [504, 3459, 314], "sampling_params": {"regex": "[0-9]+"}}),
        )
        .await;
    assert_error(status, &r, 400, "--skip-tokenizer-init", "skip tokenizer");
}

/// outlines-core does not enforce numeric bounds: its schemas leave them out.
fn outlines_pet_schema() -> Value {
    let mut schema = pet_schema();
    schema["properties"]["pet"]["properties"]["legs"] = json!({"type": "integer"});
    schema
}

#[tokio::test]
async fn outlines_backend_serves_json_schema_and_regex() {
    let s = outlines_server();
    let mut schema = person_schema();
    schema["properties"]["age"] = json!({"type": "integer"});
    for temperature in [0.0, 0.8] {
        let r = generate(
            s,
            "Describe a person as JSON.",
            json!({"json_schema": schema.to_string(), "temperature": temperature, "seed": 9,
                   "max_new_tokens": 200}),
        )
        .await;
        assert_valid(
            &schema,
            r["text"].as_str().unwrap(),
            &format!("outlines {temperature}"),
        );
        assert_stopped(&r["meta_info"], "outlines json");
    }
    let (status, r) = s
        .post(
            "/v1/chat/completions",
            &json!({"model": "default", "messages": [{"role": "user", "content": "Describe a pet."}],
                    "response_format": {"type": "json_schema", "json_schema": {"name": "pet", "schema": outlines_pet_schema()}},
                    "temperature": 0, "max_tokens": 200}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert_valid(
        &outlines_pet_schema(),
        r["choices"][0]["message"]["content"].as_str().unwrap(),
        "outlines chat",
    );
    let r = generate(
        s,
        "A number from 10 to 99:",
        json!({"regex": "[1-9][0-9]", "temperature": 0, "max_new_tokens": 10}),
    )
    .await;
    assert_fullmatch("[1-9][0-9]", r["text"].as_str().unwrap(), "outlines regex");
    assert_stopped(&r["meta_info"], "outlines regex");
    // EBNF is beyond regular languages: refused with the reason.
    let (status, r) = s
        .post(
            "/generate",
            &json!({"text": "x", "sampling_params": {"ebnf": "root ::= \"a\""}}),
        )
        .await;
    assert_error(
        status,
        &r,
        400,
        "--grammar-backend llguidance for ebnf",
        "outlines ebnf",
    );
    assert_eq!(r["error"]["param"], json!("sampling_params.ebnf"), "{r}");
}

#[tokio::test]
async fn grammar_state_survives_retraction() {
    // A KV cache too small for all requests at once: the scheduler retracts running requests
    // and resumes them later; their grammar state goes with them.
    // (conservativeness 0: admission takes every prompt that fits, so requests are retracted)
    let s = Server::start(
        "grammar-retract",
        &[
            "--max-total-tokens",
            "128",
            "--schedule-conservativeness",
            "0",
        ],
    );
    let schema = pet_schema();
    let client = s.client();
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let client = client.clone();
            let url = s.url("/generate");
            let body = json!({"text": format!("Pet number {i} described as JSON:"),
                              "sampling_params": {"json_schema": schema.to_string(),
                                                  "temperature": 0, "max_new_tokens": 120}});
            tokio::spawn(async move {
                let resp = client.post(url).json(&body).send().await.unwrap();
                crate::common::read(resp).await
            })
        })
        .collect();
    for (i, t) in tasks.into_iter().enumerate() {
        let (status, r) = t.await.unwrap();
        assert_eq!(status, 200, "{r}");
        let case = format!("request {i}");
        assert_valid(&schema, r["text"].as_str().unwrap(), &case);
        assert_stopped(&r["meta_info"], &case);
    }
    assert!(
        s.log_text().contains("retracting"),
        "the cache was expected to overflow: {}",
        s.log_tail()
    );
}
