//! The bodies of the fuzz targets: what each does with one input. The cargo-fuzz binaries in
//! `fuzz_targets/` call these, and so does the engine's stable test `engine/tests/fuzz_replay.rs`
//! (which includes this file), replaying the checked-in seeds in `corpus-seeds/<target>/`
//! without nightly. Each must give a result or an error for any input, never a panic, a
//! stack overflow or an allocation the input alone asks for.

use std::io::Write;
use std::sync::OnceLock;

use serde_json::Value;
use sgl_core::tokenizer::ChatTemplate;
use sgl_core::tool_parser::{ToolParserKind, ToolSpec};
use sgl_engine::api::parse_object;
use sgl_engine::api::schema::{self, ChatBody, CompletionBody, GenerateBody, Message};
use sgl_engine::api::validate::{Dialect, parse_sampling};

/// What a fuzz target does with one input.
pub type Target = fn(&[u8]);

/// The targets by name, as `cargo fuzz list` and `corpus-seeds/` name them.
pub const TARGETS: [(&str, Target); 5] = [
    ("request_body", request_body),
    ("gbnf", gbnf),
    ("tool_calls", tool_calls),
    ("chat_template", chat_template),
    ("model_file", model_file),
];

/// A request body as `/generate` and the OpenAI routes read it: any bytes give a parsed
/// request or an error.
pub fn request_body(data: &[u8]) {
    let Ok(body) = parse_object(data) else {
        return;
    };
    let body = Value::Object(body);
    let _ = parse_sampling(&body, "", Dialect::OpenAi);
    match body.get("sampling_params") {
        Some(params @ Value::Object(_)) => {
            let _ = parse_sampling(params, "sampling_params", Dialect::Native);
        }
        Some(Value::Array(list)) => {
            for params in list {
                let _ = parse_sampling(params, "sampling_params[0]", Dialect::Native);
            }
        }
        _ => {}
    }
    let _ = schema::read::<GenerateBody>(&body, "");
    let _ = schema::read::<CompletionBody>(&body, "");
    if let Ok(chat) = schema::read_owned::<ChatBody>(body, "") {
        let _: Vec<Value> = chat
            .messages
            .map(|m| m.0)
            .unwrap_or_default()
            .into_iter()
            .map(Message::into_template_value)
            .collect();
    }
}

/// The GBNF/EBNF grammar converter on any text (requests choose the nesting depth). Bytes
/// that are not UTF-8 are skipped, as libFuzzer's `&str` targets skip them.
pub fn gbnf(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = sgl_core::grammar::gbnf_to_lark(text);
    }
}

/// The tool-call parsers on any model output, whole and streamed in pieces: the first byte
/// picks the parser and the piece length.
pub fn tool_calls(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let kind = ToolParserKind::ALL[usize::from(pick) % ToolParserKind::ALL.len()];
    let piece = usize::from(pick / 3 % 16) + 1;
    let tools = [
        ToolSpec {
            name: "get_weather".into(),
            description: None,
            parameters: Some(serde_json::json!({
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                "required": ["city"]
            })),
            strict: None,
        },
        ToolSpec {
            name: "noop".into(),
            description: None,
            parameters: None,
            strict: None,
        },
    ];
    let _ = kind.parser().parse_complete(text, &tools);
    let mut parser = kind.parser();
    let mut at = 0;
    while at < text.len() {
        let mut end = (at + piece).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        let _ = parser.parse_increment(&text[at..end], &tools);
        at = end;
    }
    let _ = parser.finish(&tools);
}

/// SmolLM2's template (ChatML) and a Llama-3.1-style one that walks tools and tool calls.
const TEMPLATES: [&str; 2] = [
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
    "{{ bos_token }}{% if tools %}{% for t in tools %}{{ t | tojson(indent=4) }}\n{% endfor %}{% endif %}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n{% if m.tool_calls %}{% for c in m.tool_calls %}{\"name\": \"{{ c.function.name }}\", \"parameters\": {{ c.function.arguments | tojson }}}{% endfor %}{% elif m.content is string %}{{ m['content'] | trim }}{% else %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endif %}<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}",
];

fn templates() -> &'static [ChatTemplate] {
    static T: OnceLock<Vec<ChatTemplate>> = OnceLock::new();
    T.get_or_init(|| {
        TEMPLATES
            .iter()
            .map(|s| {
                ChatTemplate::new(s, Some("<s>".into()), Some("</s>".into()))
                    .expect("the fixed templates compile")
            })
            .collect()
    })
}

/// A conversation (`messages`, `tools`, `chat_template_kwargs`) as JSON, rendered by both
/// templates: a prompt or an error.
pub fn chat_template(data: &[u8]) {
    let Ok(Value::Object(req)) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let Some(Value::Array(messages)) = req.get("messages") else {
        return;
    };
    let tools = match req.get("tools") {
        Some(Value::Array(t)) => Some(t.as_slice()),
        _ => None,
    };
    let extra = match req.get("chat_template_kwargs") {
        Some(Value::Object(m)) => m.clone(),
        _ => serde_json::Map::new(),
    };
    for t in templates() {
        let _ = t.render_with(messages, true, tools, &extra);
    }
}

/// A model file of any bytes (a hostile or damaged download), loaded as a GGUF model
/// (header, metadata, tokenizer, weights) and as a one-file safetensors folder.
pub fn model_file(data: &[u8]) {
    let Ok(dir) = tempfile::tempdir() else {
        return;
    };
    let gguf = dir.path().join("model.gguf");
    let Ok(mut f) = std::fs::File::create(&gguf) else {
        return;
    };
    if f.write_all(data).is_err() {
        return;
    }
    if let Ok(model) = sgl_core::model::load(&gguf)
        && let Some(content) = model.gguf()
    {
        let _ = sgl_core::tokenizer::Tokenizer::from_gguf(content);
    }
    let st = dir.path().join("model.safetensors");
    if std::fs::write(&st, data).is_ok() {
        let _ = sgl_core::model::tensors::SafetensorsFiles::open(&[st]);
    }
}
