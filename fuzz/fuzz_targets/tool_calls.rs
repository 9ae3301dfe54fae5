//! The tool-call parsers on any model output, whole and streamed in pieces: the first byte
//! picks the parser and the piece length. Streamed pieces must join to what was sent.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sgl_engine::tool_parser::{ToolParserKind, ToolSpec};

fuzz_target!(|data: &[u8]| {
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
});
