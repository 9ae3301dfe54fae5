//! Chat templates on any conversation a request can send: the input is JSON (`messages`,
//! `tools`, `chat_template_kwargs`) rendered with the default model's template and a
//! tool-calling template; a rendered prompt or an error, never a panic.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use sgl_engine::tokenizer::ChatTemplate;

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

fuzz_target!(|data: &[u8]| {
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
});
