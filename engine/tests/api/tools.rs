//! Tool calling on `/v1/chat/completions` with `--tool-call-parser qwen25`, and the function
//! call parsing routes. Forced calls (`tool_choice` required or named) are constrained by a
//! grammar, so even the small test model writes calls whose arguments follow the function's
//! `parameters` (checked with the `jsonschema` crate).

use serde_json::{Value, json};

use crate::common::sse_json;
use crate::{assert_error, outlines_server, server};

fn weather_parameters() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "unit": {"enum": ["celsius", "fahrenheit"]}
        },
        "required": ["city", "unit"],
        "additionalProperties": false
    })
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": weather_parameters()
        }},
        {"type": "function", "function": {
            "name": "get_time",
            "description": "Current time in a time zone",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 20}},
                           "required": ["zone"], "additionalProperties": false}
        }}
    ])
}

fn parameters_of(name: &str) -> Value {
    tools()
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == json!(name))
        .map(|t| t["function"]["parameters"].clone())
        .unwrap_or_else(|| panic!("no tool {name}"))
}

fn assert_arguments_valid(name: &str, arguments: &str) {
    let value: Value = serde_json::from_str(arguments)
        .unwrap_or_else(|e| panic!("{name}: arguments are not JSON ({e}): {arguments:?}"));
    let schema = parameters_of(name);
    let validator = jsonschema::validator_for(&schema).expect("test schema compiles");
    let errors: Vec<String> = validator
        .iter_errors(&value)
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{name}: {arguments} invalid: {errors:?}");
}

fn chat(tool_choice: Value, extra: Value) -> Value {
    let mut body = json!({
        "model": "default",
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": tools(),
        "tool_choice": tool_choice,
        "temperature": 0,
        "max_tokens": 120,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn named(name: &str) -> Value {
    json!({"type": "function", "function": {"name": name}})
}

#[tokio::test]
async fn forced_tool_calls_follow_the_parameters() {
    let s = server();
    // A named function: exactly one call, then the request ends by itself.
    for (name, temperature) in [
        ("get_weather", 0.0),
        ("get_weather", 0.8),
        ("get_time", 0.0),
    ] {
        let (status, r) = s
            .post(
                "/v1/chat/completions",
                &chat(named(name), json!({"temperature": temperature, "seed": 3})),
            )
            .await;
        assert_eq!(status, 200, "{r}");
        let choice = &r["choices"][0];
        assert_eq!(choice["finish_reason"], json!("tool_calls"), "{r}");
        let message = &choice["message"];
        assert_eq!(message["role"], json!("assistant"));
        assert!(message["content"].is_null(), "{r}");
        let calls = message["tool_calls"].as_array().expect("tool_calls");
        assert_eq!(calls.len(), 1, "{r}");
        let call = &calls[0];
        assert_eq!(call["type"], json!("function"));
        assert!(call["id"].as_str().unwrap().starts_with("call_"), "{call}");
        assert_eq!(call["function"]["name"], json!(name));
        assert_arguments_valid(name, call["function"]["arguments"].as_str().unwrap());
        assert!(
            r["usage"]["completion_tokens"].as_u64().unwrap() < 120,
            "{r}"
        );
    }

    // "required": at least one call, each to one of the tools with valid arguments.
    let (status, r) = s
        .post("/v1/chat/completions", &chat(json!("required"), json!({})))
        .await;
    assert_eq!(status, 200, "{r}");
    let choice = &r["choices"][0];
    assert_eq!(choice["finish_reason"], json!("tool_calls"), "{r}");
    let calls = choice["message"]["tool_calls"].as_array().expect("calls");
    assert!(!calls.is_empty(), "{r}");
    for call in calls {
        let name = call["function"]["name"].as_str().unwrap();
        assert_arguments_valid(name, call["function"]["arguments"].as_str().unwrap());
    }
}

#[tokio::test]
async fn streamed_tool_call_fragments_join_to_valid_arguments() {
    let s = server();
    let chunks = sse_json(
        &s.post_sse(
            "/v1/chat/completions",
            &chat(named("get_weather"), json!({"stream": true})),
        )
        .await,
    );
    let mut arguments = String::new();
    let mut firsts = Vec::new();
    let mut content = String::new();
    for c in &chunks {
        let delta = &c["choices"][0]["delta"];
        if let Some(t) = delta["content"].as_str() {
            content.push_str(t);
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            assert_eq!(call["index"], json!(0), "{c}");
            if call.get("id").is_some() {
                firsts.push(call.clone());
            }
            arguments.push_str(call["function"]["arguments"].as_str().unwrap_or(""));
        }
    }
    assert_eq!(
        firsts.len(),
        1,
        "one first delta with id and name: {chunks:?}"
    );
    assert_eq!(firsts[0]["function"]["name"], json!("get_weather"));
    assert_eq!(firsts[0]["type"], json!("function"));
    assert!(content.is_empty(), "no normal text: {content:?}");
    assert_arguments_valid("get_weather", &arguments);
    let finish: Vec<&Value> = chunks
        .iter()
        .map(|c| &c["choices"][0]["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finish, vec![&json!("tool_calls")]);

    // The non-streamed call has the same arguments (greedy).
    let (status, r) = s
        .post(
            "/v1/chat/completions",
            &chat(named("get_weather"), json!({})),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(
        r["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
        json!(arguments)
    );
}

#[tokio::test]
async fn tool_conversations_and_choices() {
    let s = server();
    // A conversation with an assistant turn that made a call (content null) and the tool's
    // answer renders and runs.
    let body = json!({
        "model": "default",
        "messages": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{
                "id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}
            }]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 21}"}
        ],
        "tools": tools(),
        "temperature": 0,
        "max_tokens": 16,
    });
    let (status, r) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{r}");
    assert!(r["choices"][0]["message"].is_object(), "{r}");

    // tool_choice "none": plain text, no calls.
    let (status, r) = s
        .post(
            "/v1/chat/completions",
            &chat(json!("none"), json!({"max_tokens": 12})),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert!(r["choices"][0]["message"]["content"].is_string(), "{r}");
    assert!(
        r["choices"][0]["message"].get("tool_calls").is_none(),
        "{r}"
    );
    assert_ne!(r["choices"][0]["finish_reason"], json!("tool_calls"));

    // Bad tools and choices are 400s naming the field.
    let cases = [
        (
            chat(named("get_stock"), json!({})),
            "tool_choice.function.name",
            "get_stock",
        ),
        (
            chat(json!("sometimes"), json!({})),
            "tool_choice",
            "sometimes",
        ),
        (
            chat(json!("auto"), json!({"tools": [{"type": "function"}]})),
            "tools[0].function",
            "required",
        ),
        (
            chat(
                json!("auto"),
                json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]}),
            ),
            "tools[0].function.parameters",
            "JSON Schema",
        ),
        (
            chat(json!("required"), json!({"tools": []})),
            "tool_choice",
            "tools",
        ),
        (
            chat(
                named("get_weather"),
                json!({"response_format": {"type": "json_object"}}),
            ),
            "tool_choice",
            "cannot be combined",
        ),
    ];
    for (body, field, text) in cases {
        let (status, r) = s.post("/v1/chat/completions", &body).await;
        assert_error(status, &r, 400, text, field);
        assert_eq!(r["error"]["param"], json!(field), "{r}");
    }

    // Forced calls need a parser to read them back.
    let o = outlines_server();
    for choice in [json!("required"), named("get_weather")] {
        let (status, r) = o
            .post("/v1/chat/completions", &chat(choice.clone(), json!({})))
            .await;
        assert_error(status, &r, 400, "--tool-call-parser", &choice.to_string());
    }
    // Without a parser, tools with tool_choice auto are shown to the template and the output
    // stays text.
    let (status, r) = o
        .post(
            "/v1/chat/completions",
            &chat(json!("auto"), json!({"max_tokens": 8})),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert!(
        r["choices"][0]["message"].get("tool_calls").is_none(),
        "{r}"
    );
}

#[tokio::test]
async fn function_call_routes_parse_model_text() {
    let s = server();
    let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}\n</tool_call>";
    for route in ["/function_call", "/parse_function_call"] {
        // The server's --tool-call-parser is the default.
        for body in [
            json!({"text": text, "tools": tools()}),
            json!({"text": text, "tools": tools(), "tool_call_parser": "qwen25"}),
        ] {
            let (status, r) = s.post(route, &body).await;
            assert_eq!(status, 200, "{route}: {r}");
            assert_eq!(r["normal_text"], json!("Let me check."), "{r}");
            let calls = r["calls"].as_array().unwrap();
            assert_eq!(calls.len(), 2, "{r}");
            assert_eq!(calls[0]["name"], json!("get_weather"));
            assert_eq!(calls[0]["tool_index"], json!(0));
            assert_eq!(
                serde_json::from_str::<Value>(calls[0]["parameters"].as_str().unwrap()).unwrap(),
                json!({"city": "Paris", "unit": "celsius"})
            );
            assert_eq!(calls[1]["name"], json!("get_time"));
            assert_eq!(calls[1]["tool_index"], json!(1));
        }
    }
    // Another format, named in the body.
    let (status, r) = s
        .post(
            "/parse_function_call",
            &json!({"text": "[TOOL_CALLS] [{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}]",
                    "tools": tools(), "tool_call_parser": "mistral"}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["calls"][0]["name"], json!("get_time"), "{r}");
    // Errors name the field.
    let (status, r) = s
        .post(
            "/function_call",
            &json!({"text": text, "tools": tools(), "tool_call_parser": "gpt9"}),
        )
        .await;
    assert_error(status, &r, 400, "gpt9", "unknown parser");
    assert_eq!(r["error"]["param"], json!("tool_call_parser"));
    let (status, r) = s.post("/function_call", &json!({"tools": tools()})).await;
    assert_error(status, &r, 400, "text", "missing text");
    // Without --tool-call-parser the body must name one.
    let (status, r) = outlines_server()
        .post("/function_call", &json!({"text": text, "tools": tools()}))
        .await;
    assert_error(status, &r, 400, "--tool-call-parser", "no default parser");
}
