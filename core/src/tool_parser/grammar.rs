//! Grammars that force tool calls, for `tool_choice: "required"` or a named function.
//!
//! The grammar is llguidance's Lark syntax: the format's fixed text as string literals and
//! each function's call object as an embedded JSON Schema (`%json {...}`) whose `name` is a
//! constant and whose arguments follow the function's `parameters`. The JSON is written
//! compactly with `", "` and `": "` separators (the spacing chat templates show the model),
//! so the model cannot pad it with whitespace.
//!
//! Markers are written as plain text (`[TOOL_CALLS]`, `<tool_call>`); where the tokenizer
//! has them as special tokens the model spells them with ordinary tokens, and the
//! detokenized text, which is what the parsers read, is the same.

use super::{ToolChoice, ToolParserKind, ToolSpec};

/// The grammar that makes the output of format `parser` consist of tool calls only, as
/// `choice` asks: one or more calls to any of `tools` for [`ToolChoice::Required`], exactly
/// one call to the named function for [`ToolChoice::Function`].
///
/// Returns `None` for `auto` and `none` (no constraint), for an unknown parser name, and
/// when no tool qualifies (no tools, or a named function that is not among them; the
/// request checks in [`ToolChoice::parse`] reject those first).
pub fn constraint_grammar(parser: &str, tools: &[ToolSpec], choice: &ToolChoice) -> Option<String> {
    parser
        .parse::<ToolParserKind>()
        .ok()?
        .constraint_grammar(tools, choice)
}

impl ToolParserKind {
    /// [`constraint_grammar`] for this format.
    pub fn constraint_grammar(self, tools: &[ToolSpec], choice: &ToolChoice) -> Option<String> {
        let (selected, several): (Vec<&ToolSpec>, bool) = match choice {
            ToolChoice::Auto | ToolChoice::None => return None,
            ToolChoice::Required => (tools.iter().collect(), true),
            ToolChoice::Function(name) => (vec![tools.iter().find(|t| &t.name == name)?], false),
        };
        if selected.is_empty() {
            return None;
        }
        let lit = |s: &str| serde_json::to_string(s).unwrap_or_default();
        let mut out = String::new();
        match self {
            ToolParserKind::Qwen25 => {
                out.push_str(if several {
                    "start: tool_call (\"\\n\" tool_call)*\n"
                } else {
                    "start: tool_call\n"
                });
                out.push_str(&format!(
                    "tool_call: {} call {}\n",
                    lit("<tool_call>\n"),
                    lit("\n</tool_call>")
                ));
            }
            ToolParserKind::Mistral => {
                let more = if several {
                    format!(" ({} call)*", lit(", "))
                } else {
                    String::new()
                };
                out.push_str(&format!(
                    "start: {} call{more} {}\n",
                    lit("[TOOL_CALLS] ["),
                    lit("]")
                ));
            }
            ToolParserKind::Llama3 => {
                if several {
                    out.push_str(&format!("start: call ({} call)*\n", lit("; ")));
                } else {
                    out.push_str("start: call\n");
                }
            }
        }
        let alternatives: Vec<String> = (0..selected.len()).map(|i| format!("fn_{i}")).collect();
        out.push_str(&format!("call: {}\n", alternatives.join(" | ")));
        let arguments_key = match self {
            ToolParserKind::Llama3 => "parameters",
            ToolParserKind::Mistral | ToolParserKind::Qwen25 => "arguments",
        };
        for (i, tool) in selected.iter().enumerate() {
            out.push_str(&format!(
                "fn_{i}: %json {}\n",
                call_schema(tool, arguments_key)
            ));
        }
        Some(out)
    }
}

/// The JSON Schema of one call object, written by hand so that `name` comes first whatever
/// the JSON map order.
pub(super) fn call_schema(tool: &ToolSpec, arguments_key: &str) -> String {
    let name = serde_json::to_string(&tool.name).unwrap_or_default();
    let arguments = serde_json::to_string(&tool.arguments_schema()).unwrap_or_default();
    format!(
        "{{\"type\": \"object\", \"properties\": {{\"name\": {{\"const\": {name}}}, \"{arguments_key}\": {arguments}}}, \
         \"required\": [\"name\", \"{arguments_key}\"], \"additionalProperties\": false, \
         \"x-guidance\": {{\"whitespace_flexible\": false, \"item_separator\": \", \", \"key_separator\": \": \"}}}}"
    )
}
