//! The request types read real bodies; type errors name the field path.

#![allow(clippy::unwrap_used)]

use serde_json::json;

use super::*;

/// The message of the error reading `body` as a `T`, and the `param` it names.
fn error_of<T: DeserializeOwned + std::fmt::Debug>(body: Value) -> (String, Option<String>) {
    match read_owned::<T>(body, "").unwrap_err() {
        EngineError::BadRequest { message, param } => (message, param),
        other => panic!("{other:?}"),
    }
}

#[test]
fn type_errors_name_the_field_path() {
    let (msg, param) = error_of::<ChatBody>(json!({"messages": [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": 5},
    ]}));
    assert_eq!(
        msg,
        "`messages[2].content`: invalid type: integer `5`, expected a string or a list of parts"
    );
    assert_eq!(param.as_deref(), Some("messages[2].content"));
    let cases = [
        (
            json!({"messages": "hi"}),
            "`messages`: invalid type: string \"hi\", expected a list of message objects",
        ),
        (
            json!({"messages": [3]}),
            "`messages[0]`: invalid type: integer `3`, expected an object with `role` and `content`",
        ),
        (
            json!({"messages": [{"role": 1}]}),
            "`messages[0].role`: invalid type: integer `1`, expected a string",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "text", "text": 2}]}]}),
            "`messages[0].content[0].text`: invalid type: integer `2`, expected a string",
        ),
        (
            json!({"messages": [{"role": "user", "content": ["x"]}]}),
            "`messages[0].content[0]`: invalid type: string \"x\", expected a content part object: {\"type\": \"text\", \"text\": ...}",
        ),
        (
            json!({"stream": "yes"}),
            "`stream`: invalid type: string \"yes\", expected a boolean",
        ),
        (
            json!({"stream_options": {"include_usage": 1}}),
            "`stream_options.include_usage`: invalid type: integer `1`, expected a boolean",
        ),
        (
            json!({"top_logprobs": -1}),
            "`top_logprobs`: invalid value: integer `-1`, expected a non-negative integer",
        ),
        (
            json!({"chat_template_kwargs": []}),
            "`chat_template_kwargs`: invalid type: sequence, expected an object",
        ),
    ];
    for (body, want) in cases {
        assert_eq!(error_of::<ChatBody>(body.clone()).0, want, "{body}");
    }
    let cases = [
        (
            json!({"input_ids": [1, -2]}),
            "input_ids[1]",
            "expected a token id (an integer >= 0)",
        ),
        (
            json!({"input_ids": [1, 4294967296u64]}),
            "input_ids[1]",
            "integer `4294967296`",
        ),
        (
            json!({"input_ids": [[1], 2]}),
            "input_ids[1]",
            "expected a list of token ids",
        ),
        (
            json!({"input_ids": [[1], [2, "a"]]}),
            "input_ids[1][1]",
            "expected a token id",
        ),
        (
            json!({"input_ids": ["a"]}),
            "input_ids[0]",
            "expected a token id (an integer >= 0) or a list of token ids",
        ),
        (
            json!({"input_ids": "abc"}),
            "input_ids",
            "expected a list of token ids or a list of token-id lists",
        ),
        (json!({"text": ["a", 1]}), "text[1]", "expected a string"),
        (json!({"text": 1}), "text", "expected a string"),
        (json!({"rid": ["a", {}]}), "rid[1]", "expected a string"),
        (
            json!({"return_logprob": "yes"}),
            "return_logprob",
            "expected a boolean",
        ),
        (
            json!({"return_logprob": [true, 1]}),
            "return_logprob[1]",
            "expected a boolean",
        ),
        (
            json!({"logprob_start_len": 1.5}),
            "logprob_start_len",
            "expected an integer",
        ),
        (
            json!({"top_logprobs_num": -1}),
            "top_logprobs_num",
            "expected a non-negative integer",
        ),
    ];
    for (body, path, want) in cases {
        let (msg, param) = error_of::<GenerateBody>(body.clone());
        assert_eq!(param.as_deref(), Some(path), "{body}: {msg}");
        assert!(msg.starts_with(&format!("`{path}`: ")), "{body}: {msg}");
        assert!(msg.contains(want), "{body}: {msg}");
    }
    let cases = [
        (
            json!({"prompt": [1, "a"]}),
            "prompt[1]",
            "expected a token id",
        ),
        (
            json!({"prompt": ["a", 1]}),
            "prompt[1]",
            "expected a string",
        ),
        (
            json!({"prompt": [[1], "a"]}),
            "prompt[1]",
            "expected a list of token ids",
        ),
        (
            json!({"prompt": 3}),
            "prompt",
            "a string, a list of strings, a list of token ids, or a list of token-id lists",
        ),
        (
            json!({"logprobs": true}),
            "logprobs",
            "expected a non-negative integer",
        ),
    ];
    for (body, path, want) in cases {
        let (msg, param) = error_of::<CompletionBody>(body.clone());
        assert_eq!(param.as_deref(), Some(path), "{body}: {msg}");
        assert!(msg.contains(want), "{body}: {msg}");
    }
}

#[test]
fn errors_inside_an_object_carry_its_place() {
    let params = json!({"top_p": 0.5, "logit_bias": {"5": "high"}});
    let e = read::<CommonSampling>(&params, "sampling_params[1]").unwrap_err();
    let EngineError::BadRequest { message, param } = e else {
        panic!()
    };
    assert_eq!(param.as_deref(), Some("sampling_params[1].logit_bias.5"));
    assert!(message.contains("expected a number"), "{message}");
    let e = read::<CommonSampling>(&json!({"stop": ["a", 1]}), "").unwrap_err();
    assert!(e.to_string().starts_with("`stop[1]`: "), "{e}");
    let e = read::<OpenAiSampling>(&json!({"response_format": "json"}), "").unwrap_err();
    assert!(
        e.to_string().contains(
            "`response_format`: invalid type: string \"json\", expected an object with a `type`"
        ),
        "{e}"
    );
}

#[test]
fn prompts_and_ids_take_every_accepted_shape() {
    let read_prompt = |v: Value| {
        read_owned::<CompletionBody>(json!({ "prompt": v }), "")
            .unwrap()
            .prompt
            .unwrap()
    };
    assert_eq!(read_prompt(json!("a")), CompletionPrompt::Text("a".into()));
    assert_eq!(
        read_prompt(json!(["a", "b"])),
        CompletionPrompt::Texts(vec!["a".into(), "b".into()])
    );
    assert_eq!(
        read_prompt(json!([1, 2])),
        CompletionPrompt::Ids(vec![1, 2])
    );
    assert_eq!(
        read_prompt(json!([[1], [2, 3]])),
        CompletionPrompt::Batch(vec![vec![1], vec![2, 3]])
    );
    assert_eq!(read_prompt(json!([])), CompletionPrompt::Texts(vec![]));
    let ids = |v: Value| {
        read_owned::<GenerateBody>(json!({ "input_ids": v }), "")
            .unwrap()
            .input_ids
            .unwrap()
    };
    assert_eq!(ids(json!([7, 8])), InputIds::One(vec![7, 8]));
    assert_eq!(
        ids(json!([[7], []])),
        InputIds::Batch(vec![vec![7], vec![]])
    );
    assert_eq!(ids(json!([])), InputIds::One(vec![]));
    // A million ids in one list.
    let many: Vec<u32> = (0..1_000_000).collect();
    assert_eq!(ids(json!(many)), InputIds::One(many));
    // null is absent; one value or one per prompt.
    let b: GenerateBody = read_owned(
        json!({"text": null, "return_logprob": [true, false], "rid": "r"}),
        "",
    )
    .unwrap();
    assert!(b.text.is_none());
    assert_eq!(b.return_logprob, Some(OneOrMany::Many(vec![true, false])));
    assert_eq!(b.rid, Some(OneOrMany::One("r".into())));
    let s: CommonSampling = read(
        &json!({"seed": -3, "stop": ["", "x"], "n": 2, "top_k": -1}),
        "",
    )
    .unwrap();
    assert_eq!(s.seed, Some(Seed((-3i64) as u64)));
    assert_eq!(s.stop, Some(StopStrings(vec!["x".into()])));
    assert_eq!((s.n, s.top_k), (Some(Count(2)), Some(Int(-1))));
}

#[test]
fn messages_reach_the_template_as_sent() {
    let body: ChatBody = read_owned(
        json!({"messages": [
            {"role": "assistant", "tool_calls": [{"id": "c1"}], "reasoning_content": "hm"},
            {"role": "tool", "content": "42", "tool_call_id": "c1", "name": "f"},
            {"role": "user", "content": [{"type": "text", "text": "hi", "cache": {"a": 1}}]},
        ], "unknown_field": {"nested": [1, 2]}}),
        "",
    )
    .unwrap();
    let values: Vec<Value> = body
        .messages
        .unwrap()
        .0
        .into_iter()
        .map(Message::into_template_value)
        .collect();
    assert_eq!(
        values,
        vec![
            json!({"role": "assistant", "content": "", "tool_calls": [{"id": "c1"}], "reasoning_content": "hm"}),
            json!({"role": "tool", "content": "42", "tool_call_id": "c1", "name": "f"}),
            json!({"role": "user", "content": [{"type": "text", "text": "hi", "cache": {"a": 1}}]}),
        ]
    );
}

#[test]
fn deep_values_in_free_fields_are_read_without_recursion_trouble() {
    // As deep as the body parser allows (128), in fields kept as JSON values.
    let mut deep = json!(1);
    for _ in 0..120 {
        deep = json!([deep]);
    }
    let body = json!({"messages": [{"role": "user", "content": "x", "extra": deep.clone()}],
                      "tools": deep.clone(), "other": deep});
    let parsed = crate::api::parse_object(body.to_string().as_bytes()).unwrap();
    let chat: ChatBody = read_owned(Value::Object(parsed), "").unwrap();
    assert!(chat.tools.is_some());
}
