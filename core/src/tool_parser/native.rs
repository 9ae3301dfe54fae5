//! JSON shapes of the results: SGLang's native function-call parsing endpoint (current
//! SGLang routes it as `POST /parse_function_call`; serving the same handler at
//! `/function_call` too costs nothing) and the OpenAI `tool_calls` entries.

use serde_json::{Map, Value, json};

use super::{ToolCall, ToolCallDelta, ToolParserKind, ToolSpec};
use crate::error::EngineError;

/// The `POST /function_call` endpoint: request body `{"text": "...", "tool_call_parser":
/// "qwen25", "tools": [...]}` to response body `{"normal_text": "...", "calls":
/// [{"tool_index": 0, "name": "...", "parameters": "<arguments JSON text>"}]}`.
/// `tool_index` is the function's position in `tools`. Errors are 400s naming the field.
pub fn function_call_response(body: &Value) -> Result<Value, EngineError> {
    function_call_response_with_default(body, None)
}

/// [`function_call_response`] where a body without `tool_call_parser` uses
/// `default_parser` (the server's `--tool-call-parser`).
pub fn function_call_response_with_default(
    body: &Value,
    default_parser: Option<ToolParserKind>,
) -> Result<Value, EngineError> {
    let Value::Object(fields) = body else {
        return Err(EngineError::bad_request(
            "the body must be a JSON object {\"text\": ..., \"tool_call_parser\": ..., \"tools\": [...]}",
        ));
    };
    let get = |key: &str| fields.get(key).filter(|v| !v.is_null());
    let text = match get("text") {
        Some(Value::String(t)) => t.as_str(),
        Some(_) => {
            return Err(EngineError::bad_param(
                "text",
                "`text` must be a string (the model output to parse)",
            ));
        }
        None => {
            return Err(EngineError::bad_param(
                "text",
                "`text` is required (the model output to parse)",
            ));
        }
    };
    let kind = match get("tool_call_parser") {
        Some(Value::String(name)) => name.parse::<ToolParserKind>()?,
        Some(_) => {
            return Err(EngineError::bad_param(
                "tool_call_parser",
                "`tool_call_parser` must be a string (llama3, mistral, qwen25)",
            ));
        }
        None => default_parser.ok_or_else(|| {
            EngineError::bad_param(
                "tool_call_parser",
                "`tool_call_parser` is required (llama3, mistral, qwen25): this server was started without --tool-call-parser",
            )
        })?,
    };
    let tools = ToolSpec::parse_list(get("tools").unwrap_or(&Value::Null))?;
    let parsed = kind.parser().parse_complete(text, &tools);
    let calls: Vec<Value> = parsed
        .calls
        .iter()
        .map(|c| json!({"tool_index": c.tool_index, "name": c.name, "parameters": c.arguments}))
        .collect();
    Ok(json!({"normal_text": parsed.normal_text, "calls": calls}))
}

impl ToolCall {
    /// The OpenAI `message.tool_calls[]` entry:
    /// `{"id", "type": "function", "function": {"name", "arguments"}}`.
    pub fn to_openai_json(&self) -> Value {
        json!({
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        })
    }
}

impl ToolCallDelta {
    /// The OpenAI streaming `delta.tool_calls[]` entry: `index` always; `id`, `type` and
    /// `function.name` on a call's first delta; `function.arguments` always.
    pub fn to_openai_json(&self) -> Value {
        let mut function = Map::new();
        if let Some(name) = &self.name {
            function.insert("name".into(), Value::from(name.clone()));
        }
        function.insert("arguments".into(), Value::from(self.arguments.clone()));
        let mut entry = Map::new();
        entry.insert("index".into(), Value::from(self.index));
        if let Some(id) = &self.id {
            entry.insert("id".into(), Value::from(id.clone()));
            entry.insert("type".into(), Value::from("function"));
        }
        entry.insert("function".into(), Value::Object(function));
        Value::Object(entry)
    }
}
