use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;

fn tools() -> Vec<ToolSpec> {
    ToolSpec::parse_list(&json!([
        {"type": "function", "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["c", "f"]}
            }, "required": ["city"]}
        }},
        {"type": "function", "function": {
            "name": "search",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}
        }}
    ]))
    .expect("valid tools")
}

/// A call as (name, arguments, tool_index), ids left out.
type Call = (String, String, usize);

fn call(name: &str, arguments: &str, tool_index: usize) -> Call {
    (name.to_owned(), arguments.to_owned(), tool_index)
}

fn complete(kind: ToolParserKind, text: &str) -> (String, Vec<Call>) {
    let out = kind.parser().parse_complete(text, &tools());
    for c in &out.calls {
        assert!(c.id.starts_with("call_") && c.id.len() == 29, "{}", c.id);
    }
    let calls = out
        .calls
        .into_iter()
        .map(|c| (c.name, c.arguments, c.tool_index))
        .collect();
    (out.normal_text, calls)
}

/// Streams `text` in pieces of the given sizes (in characters, cycled), checking the
/// OpenAI delta rules on the way, and returns what a client would assemble.
fn streamed(kind: ToolParserKind, text: &str, sizes: &[usize]) -> (String, Vec<Call>) {
    let tools = tools();
    let mut parser = kind.parser();
    let chars: Vec<char> = text.chars().collect();
    let mut deltas = Vec::new();
    let mut pos = 0;
    let mut i = 0;
    while pos < chars.len() {
        let n = sizes
            .get(i % sizes.len().max(1))
            .copied()
            .unwrap_or(1)
            .max(1);
        let piece: String = chars[pos..(pos + n).min(chars.len())].iter().collect();
        deltas.push(parser.parse_increment(&piece, &tools));
        pos += n;
        i += 1;
    }
    deltas.push(parser.finish(&tools));

    let mut normal = String::new();
    let mut calls: Vec<(String, Call)> = Vec::new();
    for d in deltas {
        normal.push_str(&d.normal_text);
        let mut seen = Vec::new();
        for c in d.calls {
            assert!(
                !seen.contains(&c.index),
                "one delta per call index per piece"
            );
            seen.push(c.index);
            if c.index == calls.len() {
                let id = c.id.expect("first delta has an id");
                let name = c.name.expect("first delta has a name");
                let tool_index = c.tool_index.expect("first delta has the tool index");
                calls.push((id, (name, c.arguments, tool_index)));
            } else {
                assert!(c.index < calls.len(), "call indexes are consecutive");
                assert!(
                    c.id.is_none() && c.name.is_none(),
                    "id and name are sent once"
                );
                calls[c.index].1.1.push_str(&c.arguments);
            }
        }
    }
    let ids: Vec<&String> = calls.iter().map(|(id, _)| id).collect();
    for (i, id) in ids.iter().enumerate() {
        assert!(id.starts_with("call_"));
        assert!(!ids[..i].contains(id), "ids are distinct");
    }
    (normal, calls.into_iter().map(|(_, c)| c).collect())
}

/// Parses `text` whole, one character at a time, and in several chunkings; all must agree.
fn check(kind: ToolParserKind, text: &str) -> (String, Vec<Call>) {
    let whole = complete(kind, text);
    for sizes in [&[1][..], &[2], &[3], &[7], &[1, 5, 2, 11], &[64]] {
        assert_eq!(
            streamed(kind, text, sizes),
            whole,
            "sizes {sizes:?} on {text:?}"
        );
    }
    for (_, args, _) in &whole.1 {
        assert!(
            serde_json::from_str::<Value>(args).is_ok_and(|v| v.is_object()),
            "arguments are a JSON object: {args}"
        );
    }
    whole
}

const QWEN_ONE: &str = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>";
const QWEN_TWO: &str = "Let me check both.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich 😀\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"a \\\"quoted\\\" } brace\"}}\n</tool_call>";

#[test]
fn qwen25_single_call() {
    let (text, calls) = check(ToolParserKind::Qwen25, QWEN_ONE);
    assert_eq!(text, "");
    assert_eq!(
        calls,
        [call("get_weather", r#"{"city": "Paris", "unit": "c"}"#, 0)]
    );
}

#[test]
fn qwen25_text_and_several_calls() {
    let (text, calls) = check(ToolParserKind::Qwen25, QWEN_TWO);
    assert_eq!(text, "Let me check both.");
    assert_eq!(
        calls,
        [
            call("get_weather", "{\"city\": \"Zürich 😀\"}", 0),
            call("search", r#"{"q": "a \"quoted\" } brace"}"#, 1),
        ]
    );
}

#[test]
fn qwen25_text_around_calls() {
    let text = format!("Before.\n{QWEN_ONE}\nAfter.\n");
    assert_eq!(check(ToolParserKind::Qwen25, &text).0, "Before.\nAfter.\n");
    // A lookalike of the marker is text.
    let (text, calls) = check(ToolParserKind::Qwen25, "a <tool_cal b <tool> c <");
    assert_eq!(text, "a <tool_cal b <tool> c <");
    assert!(calls.is_empty());
    let (text, calls) = check(ToolParserKind::Qwen25, "plain answer, no tools\n");
    assert_eq!(text, "plain answer, no tools\n");
    assert!(calls.is_empty());
}

#[test]
fn qwen25_other_shapes_of_call_objects() {
    // Arguments first, extra keys, arguments given as a string, no arguments.
    let text = "<tool_call>\n{\"arguments\": {\"q\": \"x\"}, \"name\": \"search\"}\n</tool_call>\
        <tool_call>{\"name\": \"search\", \"id\": 7, \"arguments\": {\"q\": \"y\"}}</tool_call>\
        <tool_call>{\"name\": \"search\", \"arguments\": \"{\\\"q\\\": \\\"z\\\"}\"}</tool_call>\
        <tool_call>{\"name\": \"search\"}</tool_call>\
        <tool_call>{\"name\": \"search\", \"arguments\": {\"q\": \"w\"}, \"extra\": [1, {}]}</tool_call>";
    let (normal, calls) = check(ToolParserKind::Qwen25, text);
    assert_eq!(normal, "");
    assert_eq!(
        calls,
        [
            call("search", r#"{"q": "x"}"#, 1),
            call("search", r#"{"q": "y"}"#, 1),
            call("search", r#"{"q": "z"}"#, 1),
            call("search", "{}", 1),
            call("search", r#"{"q": "w"}"#, 1),
        ]
    );
}

#[test]
fn qwen25_malformed_json_is_text() {
    let cases = [
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": Paris}}\n</tool_call>",
        "<tool_call>\nnot json at all\n</tool_call>",
        "<tool_call>\n{\"name\": 5, \"arguments\": {}}\n</tool_call>",
        "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"search\", \"arguments\": [1, 2]}\n</tool_call>",
    ];
    for case in cases {
        let (text, calls) = complete(ToolParserKind::Qwen25, case);
        assert_eq!(text, case, "{case}");
        assert!(calls.is_empty(), "{case}");
    }
    // Errors seen before the call's name is sent are text when streaming too.
    for case in &cases[1..] {
        assert_eq!(
            streamed(ToolParserKind::Qwen25, case, &[1]),
            (case.to_string(), vec![])
        );
    }
    // A good call after a malformed one is still found.
    let text = format!("<tool_call>\n{{oops}}\n</tool_call>\n{QWEN_ONE}");
    let (normal, calls) = check(ToolParserKind::Qwen25, &text);
    assert_eq!(normal, "<tool_call>\n{oops}\n</tool_call>");
    assert_eq!(calls.len(), 1);
}

#[test]
fn qwen25_truncated_call() {
    let text = "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par";
    // Whole output: not a complete call, so text.
    assert_eq!(
        complete(ToolParserKind::Qwen25, text),
        (text.to_owned(), vec![])
    );
    // Streaming: the call was already announced and keeps what was sent.
    let (normal, calls) = streamed(ToolParserKind::Qwen25, text, &[1]);
    assert_eq!(normal, "Sure.");
    assert_eq!(calls, [call("get_weather", "{\"city\": \"Par", 0)]);
    // Truncated before the name was known: text.
    let text = "Sure.\n<tool_call>\n{\"name\": \"get_wea";
    assert_eq!(
        streamed(ToolParserKind::Qwen25, text, &[1]),
        (text.to_owned(), vec![])
    );
}

#[test]
fn unknown_functions_are_dropped() {
    let text = "<tool_call>\n{\"name\": \"launch_rockets\", \"arguments\": {\"n\": 3}}\n</tool_call>\n\
        <tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"ok\"}}\n</tool_call>\n\
        <tool_call>\n{\"arguments\": {}, \"name\": \"nope\"}\n</tool_call>";
    let (normal, calls) = check(ToolParserKind::Qwen25, text);
    assert_eq!(normal, "");
    assert_eq!(calls, [call("search", r#"{"q": "ok"}"#, 1)]);

    let text = "[TOOL_CALLS] [{\"name\": \"nope\", \"arguments\": {}}, {\"name\": \"search\", \"arguments\": {}}]";
    assert_eq!(
        check(ToolParserKind::Mistral, text).1,
        [call("search", "{}", 1)]
    );
    // No tools at all: every call is dropped.
    let out = ToolParserKind::Llama3
        .parser()
        .parse_complete(r#"{"name": "search", "parameters": {}}"#, &[]);
    assert_eq!(out, ParsedOutput::default());
}

#[test]
fn mistral_calls() {
    let text = "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}, {\"name\": \"search\", \"arguments\": {\"q\": \"[x]\"}}]";
    let (normal, calls) = check(ToolParserKind::Mistral, text);
    assert_eq!(normal, "");
    assert_eq!(
        calls,
        [
            call("get_weather", r#"{"city": "Oslo"}"#, 0),
            call("search", r#"{"q": "[x]"}"#, 1)
        ]
    );
    // Text before, a single object instead of an array, no space after the marker.
    let text = "Checking.\n[TOOL_CALLS]{\"name\": \"search\", \"arguments\": {\"q\": 1}}";
    assert_eq!(
        check(ToolParserKind::Mistral, text),
        (
            "Checking.".to_owned(),
            vec![call("search", r#"{"q": 1}"#, 1)]
        )
    );
    // The marker dropped by the detokenizer: an output opening with an array of calls.
    let text = " [{\"name\": \"search\", \"arguments\": {\"q\": \"x\"}}]";
    assert_eq!(check(ToolParserKind::Mistral, text).1.len(), 1);
    // A JSON array that is not calls is text.
    for text in [
        "[1, 2, 3]",
        "[{\"a\": 1}]",
        "[TOOL_CALLS] nothing",
        "[TOOL_CALLS] [oops]",
    ] {
        assert_eq!(
            check(ToolParserKind::Mistral, text),
            (text.to_owned(), vec![])
        );
    }
}

#[test]
fn llama3_calls() {
    let text = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}";
    assert_eq!(
        check(ToolParserKind::Llama3, text),
        (
            String::new(),
            vec![call("get_weather", r#"{"city": "Rome"}"#, 0)]
        )
    );
    let text = "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}; {\"name\": \"search\", \"arguments\": {\"q\": \"a;b\"}}";
    assert_eq!(
        check(ToolParserKind::Llama3, text).1,
        [
            call("get_weather", r#"{"city": "Rome"}"#, 0),
            call("search", r#"{"q": "a;b"}"#, 1)
        ]
    );
    // Text before the python tag; a tag after the separator.
    let text = "I will look.<|python_tag|>{\"name\": \"search\", \"parameters\": {}};<|python_tag|>{\"name\": \"search\", \"parameters\": {\"q\": \"2\"}}";
    let (normal, calls) = check(ToolParserKind::Llama3, text);
    assert_eq!(normal, "I will look.");
    assert_eq!(calls.len(), 2);
    // JSON that is not a call, and JSON after text without the tag, are text.
    for text in [
        "{\"answer\": 42}",
        "The JSON is {\"name\": \"search\", \"parameters\": {}}",
    ] {
        assert_eq!(
            check(ToolParserKind::Llama3, text),
            (text.to_owned(), vec![])
        );
    }
    let text = "{\"name\": \"search\", \"parameters\": {\"q\": }}";
    assert_eq!(
        complete(ToolParserKind::Llama3, text),
        (text.to_owned(), vec![])
    );
}

#[test]
fn streaming_sends_name_before_arguments_complete() {
    let tools = tools();
    let mut parser = ToolParserKind::Qwen25.parser();
    let d = parser.parse_increment("Hi <tool", &tools);
    assert_eq!(d.normal_text, "Hi");
    assert!(d.calls.is_empty());
    let d = parser.parse_increment(
        "_call>\n{\"name\": \"search\", \"arguments\": {\"q\"",
        &tools,
    );
    assert_eq!(d.normal_text, "");
    assert_eq!(d.calls.len(), 1);
    assert_eq!(d.calls[0].name.as_deref(), Some("search"));
    assert_eq!(d.calls[0].arguments, "{\"q\"");
    let d = parser.parse_increment(": \"x\"}}\n</tool_call>", &tools);
    assert_eq!(d.calls.len(), 1);
    assert_eq!(d.calls[0].id, None);
    assert_eq!(d.calls[0].arguments, ": \"x\"}");
    assert!(parser.finish(&tools).is_empty());
}

#[test]
fn random_chunkings_agree_with_whole_parse() {
    use rand::{Rng, SeedableRng};
    let inputs = [
        (ToolParserKind::Qwen25, QWEN_TWO),
        (ToolParserKind::Qwen25, QWEN_ONE),
        (
            ToolParserKind::Mistral,
            "ok [TOOL_CALLS] [ {\"name\": \"search\", \"arguments\": {\"q\": [1, {\"a\": null}]}} , {\"name\": \"get_weather\", \"arguments\": {\"city\": \"é\"}} ]",
        ),
        (
            ToolParserKind::Llama3,
            "  {\"name\": \"search\", \"parameters\": {\"q\": \"\\u00e9\\n\"}} ; {\"parameters\": {}, \"name\": \"search\"}",
        ),
    ];
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for (kind, text) in inputs {
        let whole = complete(kind, text);
        assert!(!whole.1.is_empty());
        for _ in 0..200 {
            let sizes: Vec<usize> = (0..16).map(|_| rng.random_range(1..=9)).collect();
            assert_eq!(streamed(kind, text, &sizes), whole, "{sizes:?}");
        }
    }
}

proptest! {
    #[test]
    fn chunking_never_changes_the_result(
        kind in prop::sample::select(ToolParserKind::ALL.to_vec()),
        sizes in prop::collection::vec(1usize..12, 1..20),
        pre in "[a-z .\n]{0,12}",
        post in "[a-z .\n]{0,12}",
        city in "[a-zA-Z é\"\\\\{}\\[\\]]{0,10}",
    ) {
        let city = serde_json::to_string(&city).expect("a string");
        let object = match kind {
            ToolParserKind::Llama3 => format!("{{\"name\": \"get_weather\", \"parameters\": {{\"city\": {city}}}}}"),
            _ => format!("{{\"name\": \"get_weather\", \"arguments\": {{\"city\": {city}}}}}"),
        };
        let text = match kind {
            ToolParserKind::Qwen25 => format!("{pre}<tool_call>\n{object}\n</tool_call>{post}"),
            ToolParserKind::Mistral => format!("{pre}[TOOL_CALLS] [{object}]{post}"),
            ToolParserKind::Llama3 => format!("{pre}<|python_tag|>{object}{post}"),
        };
        let whole = complete(kind, &text);
        prop_assert_eq!(whole.1.len(), 1);
        prop_assert_eq!(&whole.1[0].1, &format!("{{\"city\": {city}}}"));
        prop_assert_eq!(streamed(kind, &text, &sizes), whole);
    }

    #[test]
    fn no_panic_on_arbitrary_output(
        kind in prop::sample::select(ToolParserKind::ALL.to_vec()),
        pieces in prop::collection::vec(prop::sample::select(vec![
            "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "{", "}", "[", "]",
            "\"name\"", "\"arguments\"", "\"parameters\"", ":", ",", ";", "\"search\"", "\"",
            "\\", "\n", " ", "x", "1", "é", "😀", "<tool", "[TOOL", "<|py", "\\u00", "null",
        ]), 0..40),
        sizes in prop::collection::vec(1usize..6, 1..8),
    ) {
        let text: String = pieces.concat();
        let (_, calls) = complete(kind, &text);
        for (_, args, _) in &calls {
            prop_assert!(serde_json::from_str::<Value>(args).is_ok());
        }
        let (_, streamed_calls) = streamed(kind, &text, &sizes);
        prop_assert!(streamed_calls.len() >= calls.len());
    }
}

#[test]
fn tool_spec_validation() {
    let err = |v: Value| ToolSpec::parse_list(&v).expect_err("invalid").to_string();
    assert_eq!(
        err(json!([{"type": "retrieval", "function": {"name": "f"}}])),
        "`tools[0].type` `retrieval` is not supported (only \"function\")"
    );
    assert_eq!(
        err(json!([{"type": "function", "function": {"description": "x"}}])),
        "`tools[0].function.name` is required"
    );
    assert_eq!(
        err(json!([{"type": "function"}])),
        "`tools[0].function` is required"
    );
    assert_eq!(
        err(json!([{"function": {"name": "f", "parameters": "x"}}])),
        "`tools[0].function.parameters` must be a JSON Schema object, got a string"
    );
    assert_eq!(
        err(json!([{"function": {"name": "f"}}, {"function": {"name": "f"}}])),
        "`tools[1].function.name` `f` is already defined by tools[0]"
    );
    assert_eq!(
        err(json!({"name": "f"})),
        "`tools` must be a list of tool objects, got an object"
    );
    let e = ToolSpec::parse_list(&json!([3])).expect_err("invalid");
    assert!(matches!(e, EngineError::BadRequest { param: Some(ref p), .. } if p == "tools[0]"));

    // `type` may be left out; serde reads the same shape.
    let tools = ToolSpec::parse_list(&json!([{"function": {"name": "f", "description": null}}]))
        .expect("valid");
    assert_eq!(tools[0].name, "f");
    assert_eq!(
        tools[0].to_json(),
        json!({"type": "function", "function": {"name": "f"}})
    );
    let tool: ToolSpec = serde_json::from_value(
        json!({"type": "function", "function": {"name": "g", "parameters": {"type": "object"}}}),
    )
    .expect("valid");
    assert_eq!(tool.parameters, Some(json!({"type": "object"})));
    assert_eq!(
        serde_json::to_value(&tool).expect("serialises"),
        tool.to_json()
    );
    assert!(serde_json::from_value::<ToolSpec>(json!({"type": "function"})).is_err());
    assert_eq!(
        ToolSpec::parse_list(&Value::Null).expect("null is no tools"),
        vec![]
    );
}

#[test]
fn tool_choice_validation() {
    let tools = tools();
    let parse = |v: Option<Value>| ToolChoice::parse(v.as_ref(), &tools);
    assert_eq!(parse(None).expect("ok"), ToolChoice::Auto);
    assert_eq!(ToolChoice::parse(None, &[]).expect("ok"), ToolChoice::None);
    assert_eq!(parse(Some(json!("auto"))).expect("ok"), ToolChoice::Auto);
    assert_eq!(parse(Some(json!("none"))).expect("ok"), ToolChoice::None);
    assert_eq!(
        parse(Some(json!("required"))).expect("ok"),
        ToolChoice::Required
    );
    let named = json!({"type": "function", "function": {"name": "search"}});
    assert_eq!(
        parse(Some(named.clone())).expect("ok"),
        ToolChoice::Function("search".into())
    );
    assert_eq!(ToolChoice::Function("search".into()).to_json(), named);
    let msg = |v: Value, tools: &[ToolSpec]| {
        ToolChoice::parse(Some(&v), tools)
            .expect_err("invalid")
            .to_string()
    };
    assert_eq!(
        msg(
            json!({"type": "function", "function": {"name": "nope"}}),
            &tools
        ),
        "`tool_choice.function.name` names `nope`, which is not one of the tools (get_weather, search)"
    );
    assert_eq!(
        msg(json!("required"), &[]),
        "`tool_choice` is \"required\" but `tools` is empty: give at least one tool"
    );
    assert!(
        msg(json!("sometimes"), &tools)
            .starts_with("`tool_choice` `sometimes` is not a valid choice")
    );
    assert_eq!(
        msg(json!({"type": "code_interpreter"}), &tools),
        "`tool_choice.type` `code_interpreter` is not supported (only \"function\")"
    );
    assert_eq!(
        msg(json!({"type": "function", "function": {}}), &tools),
        "`tool_choice.function.name` is required"
    );
    assert!(serde_json::from_value::<ToolChoice>(json!("required")).is_ok());
    assert!(serde_json::from_value::<ToolChoice>(json!(1)).is_err());
}

#[test]
fn parser_names() {
    for kind in ToolParserKind::ALL {
        assert_eq!(parser_for(kind.name()).expect("known").kind(), kind);
        assert_eq!(kind.to_string(), kind.name());
    }
    let err = parser_for("hermes").err().expect("unknown");
    assert_eq!(
        err.to_string(),
        "unknown tool call parser `hermes` (supported: llama3, mistral, qwen25)"
    );
    use clap::ValueEnum;
    assert_eq!(
        <ToolParserKind as ValueEnum>::from_str("qwen25", false).expect("clap name"),
        ToolParserKind::Qwen25
    );
}

#[test]
fn function_call_endpoint() {
    let body = json!({
        "text": format!("Let me see.\n{QWEN_ONE}"),
        "tool_call_parser": "qwen25",
        "tools": tools().iter().map(ToolSpec::to_json).collect::<Vec<_>>(),
    });
    assert_eq!(
        function_call_response(&body).expect("ok"),
        json!({
            "normal_text": "Let me see.",
            "calls": [{"tool_index": 0, "name": "get_weather", "parameters": "{\"city\": \"Paris\", \"unit\": \"c\"}"}]
        })
    );
    let mut no_parser = body.clone();
    no_parser["tool_call_parser"] = Value::Null;
    assert!(function_call_response(&no_parser).is_err());
    assert_eq!(
        function_call_response_with_default(&no_parser, Some(ToolParserKind::Qwen25)).expect("ok")
            ["calls"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    let e = function_call_response(&json!({"tool_call_parser": "qwen25"})).expect_err("no text");
    assert_eq!(
        e.to_string(),
        "`text` is required (the model output to parse)"
    );
    let e = function_call_response(&json!({"text": "", "tool_call_parser": "x"})).expect_err("bad");
    assert!(
        matches!(e, EngineError::BadRequest { param: Some(ref p), .. } if p == "tool_call_parser")
    );
    let e = function_call_response(
        &json!({"text": "", "tool_call_parser": "qwen25", "tools": [{"type": "x"}]}),
    )
    .expect_err("bad tools");
    assert!(e.to_string().starts_with("`tools[0].type`"));
}

#[test]
fn openai_json_shapes() {
    let out = ToolParserKind::Qwen25
        .parser()
        .parse_complete(QWEN_ONE, &tools());
    let c = &out.calls[0];
    assert_eq!(
        c.to_openai_json(),
        json!({"id": c.id, "type": "function", "function": {"name": "get_weather", "arguments": c.arguments}})
    );
    let first = ToolCallDelta {
        index: 0,
        id: Some("call_1".into()),
        name: Some("f".into()),
        arguments: String::new(),
        tool_index: Some(0),
    };
    assert_eq!(
        first.to_openai_json(),
        json!({"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}})
    );
    let later = ToolCallDelta {
        index: 0,
        arguments: "{\"a\"".into(),
        ..ToolCallDelta::default()
    };
    assert_eq!(
        later.to_openai_json(),
        json!({"index": 0, "function": {"arguments": "{\"a\""}})
    );
}

mod grammars {
    use super::*;

    fn schema_text(tool: &ToolSpec, key: &str) -> String {
        format!(
            "{{\"type\": \"object\", \"properties\": {{\"name\": {{\"const\": {}}}, \"{key}\": {}}}, \"required\": [\"name\", \"{key}\"], \"additionalProperties\": false, \"x-guidance\": {{\"whitespace_flexible\": false, \"item_separator\": \", \", \"key_separator\": \": \"}}}}",
            serde_json::to_string(&tool.name).expect("string"),
            serde_json::to_string(&tool.arguments_schema()).expect("schema"),
        )
    }

    #[test]
    fn grammar_text() {
        let tools = tools();
        let named = ToolChoice::Function("get_weather".into());
        assert_eq!(
            constraint_grammar("qwen25", &tools, &named).expect("grammar"),
            format!(
                "start: tool_call\ntool_call: \"<tool_call>\\n\" call \"\\n</tool_call>\"\ncall: fn_0\nfn_0: %json {}\n",
                schema_text(&tools[0], "arguments")
            )
        );
        assert_eq!(
            constraint_grammar("mistral", &tools, &ToolChoice::Required).expect("grammar"),
            format!(
                "start: \"[TOOL_CALLS] [\" call (\", \" call)* \"]\"\ncall: fn_0 | fn_1\nfn_0: %json {}\nfn_1: %json {}\n",
                schema_text(&tools[0], "arguments"),
                schema_text(&tools[1], "arguments")
            )
        );
        assert_eq!(
            constraint_grammar("llama3", &tools, &ToolChoice::Function("search".into()))
                .expect("grammar"),
            format!(
                "start: call\ncall: fn_0\nfn_0: %json {}\n",
                schema_text(&tools[1], "parameters")
            )
        );
        assert!(
            constraint_grammar("llama3", &tools, &ToolChoice::Required)
                .expect("grammar")
                .starts_with("start: call (\"; \" call)*\ncall: fn_0 | fn_1\n")
        );
        assert_eq!(
            constraint_grammar("qwen25", &tools, &ToolChoice::Auto),
            None
        );
        assert_eq!(
            constraint_grammar("qwen25", &tools, &ToolChoice::None),
            None
        );
        assert_eq!(
            constraint_grammar("qwen25", &[], &ToolChoice::Required),
            None
        );
        assert_eq!(
            constraint_grammar("hermes", &tools, &ToolChoice::Required),
            None
        );
        assert_eq!(
            constraint_grammar("qwen25", &tools, &ToolChoice::Function("nope".into())),
            None
        );
        // Every embedded schema is valid JSON.
        let grammar = constraint_grammar("qwen25", &tools, &ToolChoice::Required).expect("grammar");
        for line in grammar.lines() {
            if let Some((_, schema)) = line.split_once("%json ") {
                let v: Value = serde_json::from_str(schema).expect("schema JSON");
                assert_eq!(v["required"], json!(["name", "arguments"]));
            }
        }
    }

    #[test]
    fn arguments_schema_defaults() {
        let tools = ToolSpec::parse_list(&json!([
            {"function": {"name": "none"}},
            {"function": {"name": "untyped", "parameters": {"properties": {"a": {}}}}},
            {"function": {"name": "union", "parameters": {"anyOf": [{"type": "object"}]}}},
        ]))
        .expect("valid");
        assert_eq!(
            tools[0].arguments_schema(),
            json!({"type": "object", "properties": {}, "additionalProperties": false})
        );
        assert_eq!(
            tools[1].arguments_schema(),
            json!({"type": "object", "properties": {"a": {}}})
        );
        assert_eq!(
            tools[2].arguments_schema(),
            json!({"anyOf": [{"type": "object"}]})
        );
    }

    /// Runs `grammar` over `text` with a one-byte-per-token vocabulary.
    fn accepts(grammar: &str, text: &str) -> bool {
        use llguidance::api::TopLevelGrammar;
        use llguidance::{Matcher, ParserFactory};
        let env = llguidance::toktrie::ApproximateTokEnv::single_byte_env();
        let factory = ParserFactory::new_simple(&env).expect("factory");
        let parser = factory.create_parser(TopLevelGrammar::from_lark(grammar.to_owned()));
        let mut matcher = Matcher::new(parser);
        assert!(!matcher.is_error(), "{:?}\n{grammar}", matcher.get_error());
        let tokens: Vec<u32> = text.bytes().map(u32::from).collect();
        matcher.consume_tokens(&tokens).is_ok() && matcher.is_accepting().unwrap_or(false)
    }

    #[test]
    fn grammars_compile_and_force_the_parsers_format() {
        let tools = tools();
        let weather = ToolChoice::Function("get_weather".into());
        let cases: [(ToolParserKind, &str, &str); 3] = [
            (
                ToolParserKind::Qwen25,
                "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
                "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"Paris\"}}\n</tool_call>",
            ),
            (
                ToolParserKind::Mistral,
                "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}]",
                "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"c\"}}]",
            ),
            (
                ToolParserKind::Llama3,
                "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
                "{\"name\": \"get_weather\", \"parameters\": {\"city\": 3}}",
            ),
        ];
        for (kind, good, bad) in cases {
            let grammar = kind.constraint_grammar(&tools, &weather).expect("grammar");
            assert!(accepts(&grammar, good), "{kind}: {good}\n{grammar}");
            assert!(!accepts(&grammar, bad), "{kind}: {bad}");
            assert!(!accepts(&grammar, &format!("Sure! {good}")), "{kind}");
            // What the grammar lets through is what the parser reads.
            let out = kind.parser().parse_complete(good, &tools);
            assert_eq!(out.calls.len(), 1, "{kind}");
            assert_eq!(out.normal_text, "");
        }
        let required = ToolChoice::Required;
        let two = [
            (
                ToolParserKind::Qwen25,
                "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"A\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"b\"}}\n</tool_call>",
            ),
            (
                ToolParserKind::Mistral,
                "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"A\"}}, {\"name\": \"search\", \"arguments\": {\"q\": \"b\"}}]",
            ),
            (
                ToolParserKind::Llama3,
                "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"A\"}}; {\"name\": \"search\", \"parameters\": {\"q\": \"b\"}}",
            ),
        ];
        for (kind, text) in two {
            let grammar = kind.constraint_grammar(&tools, &required).expect("grammar");
            assert!(accepts(&grammar, text), "{kind}: {text}\n{grammar}");
            assert!(!accepts(&grammar, ""), "{kind}: at least one call");
            assert_eq!(kind.parser().parse_complete(text, &tools).calls.len(), 2);
        }
    }
}

#[test]
fn duplicate_names_among_many_tools_are_found_in_one_pass() {
    // 150,000 tools: the pairwise check took over a minute here; a set takes milliseconds.
    let n = 150_000;
    let mut tools: Vec<Value> = (0..n)
        .map(|i| json!({"type": "function", "function": {"name": format!("tool_{i}")}}))
        .collect();
    assert_eq!(
        ToolSpec::parse_list(&Value::Array(tools.clone()))
            .map(|t| t.len())
            .ok(),
        Some(n)
    );
    tools.push(json!({"type": "function", "function": {"name": "tool_7"}}));
    let e = ToolSpec::parse_list(&Value::Array(tools)).expect_err("duplicate");
    assert_eq!(
        e.to_string(),
        format!("`tools[{n}].function.name` `tool_7` is already defined by tools[7]")
    );
}
