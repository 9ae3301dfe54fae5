//! Tool (function) calls in model output, for SGLang's `--tool-call-parser` formats.
//!
//! Three output formats are understood, named as SGLang names them:
//!
//! | name      | what the model writes                                                        |
//! |-----------|------------------------------------------------------------------------------|
//! | `llama3`  | `{"name": "f", "parameters": {...}}`, optionally after `<|python_tag|>`; several calls separated by `;` |
//! | `mistral` | `[TOOL_CALLS] [{"name": "f", "arguments": {...}}, ...]`                      |
//! | `qwen25`  | `<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>`, repeated     |
//!
//! All three accept either `arguments` or `parameters` as the arguments key.
//!
//! # Using it
//!
//! * Request side: [`ToolSpec::parse_list`] reads the OpenAI `tools` field and
//!   [`ToolChoice::parse`] the `tool_choice` field, both with errors that name the offending
//!   field. [`constraint_grammar`] turns `tool_choice: "required"` or a named function into
//!   an llguidance Lark grammar that forces the output into the parser's exact format.
//! * Response side: [`parser_for`] (or [`ToolParserKind::parser`]) gives a fresh
//!   [`ToolParser`] per request. Non-streaming responses call
//!   [`ToolParser::parse_complete`]; streaming responses call
//!   [`ToolParser::parse_increment`] with each piece of decoded text and
//!   [`ToolParser::finish`] once when generation ends.
//! * `POST /function_call`: [`function_call_response`] maps the request body to the response
//!   body.
//!
//! The detokenizer must keep the format's marker text (`<|python_tag|>`, `[TOOL_CALLS]`,
//! `<tool_call>`) in the text given to the parser: decode with special tokens kept, or at
//! least these ones.
//!
//! # Rules shared by all formats
//!
//! * Calls to a function that is not in `tools` are dropped (as SGLang does): they appear
//!   neither as calls nor as text, and take no call index.
//! * A call whose JSON is malformed, or that is not a call object at all (no string `name`,
//!   arguments that are not an object), is returned as normal text, marker included.
//! * A call's `arguments` is the exact JSON text the model wrote for the arguments object
//!   (whitespace included), or `{}` when the model gave none. When the model wrote the
//!   arguments as a JSON string holding an object, the string's content is used.
//! * Text outside calls is normal text, verbatim, except for the whitespace around calls:
//!   whitespace after a call is dropped, and whitespace before a call is kept only when
//!   more normal text follows (`A\n<call>\nB` gives `A\nB`; `A\n<call>\n` gives `A`).
//!
//! # Streaming
//!
//! [`ToolParser::parse_increment`] returns, per piece of text, the normal text that can be
//! shown now and the tool-call deltas, as OpenAI streams them: the first delta of a call
//! carries its `index` (0, 1, ... in the order the calls appear), `id` and `name`; later
//! deltas carry only argument fragments. Text that could still turn out to be (the start
//! of) a call marker, and whitespace that may precede a call, is held back until the next
//! piece decides it. A call's name is sent once its `"name"` and the opening brace of its
//! arguments object have been seen; its arguments are then streamed as they arrive, and
//! their concatenation equals the arguments [`ToolParser::parse_complete`] gives for the
//! whole text. With `llama3`, an output that opens with `{` is held back until that object
//! is complete, as it may be a call written without `<|python_tag|>`; likewise with
//! `mistral` for an output that opens with `[{`. A call written in another key order (arguments before name, extra keys in
//! between, arguments given as a string) is sent in one delta once its object is complete.
//!
//! Streaming differs from [`ToolParser::parse_complete`] only where the output goes wrong
//! after a call's name has been sent: if generation stops inside the arguments (length
//! limit), the call keeps the fragments sent so far; if the arguments become malformed
//! JSON, the call keeps the fragments sent up to the error and the rest of the output is
//! normal text. Each fragment sent is always a valid continuation of a JSON prefix.

mod grammar;
mod json;
mod machine;
mod native;
mod spec;
#[cfg(test)]
mod tests;

use std::fmt;
use std::str::FromStr;

use crate::error::EngineError;

pub use grammar::constraint_grammar;
pub use native::{function_call_response, function_call_response_with_default};
pub use spec::{ToolChoice, ToolSpec};

use machine::{Dialect, Machine};

/// One tool call found in a complete model output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// `call_` followed by 24 random hex digits.
    pub id: String,
    /// The function's name, one of the request's tools.
    pub name: String,
    /// The arguments object as JSON text.
    pub arguments: String,
    /// Position of the function in the request's `tools` list.
    pub tool_index: usize,
}

/// A complete model output split into normal text and tool calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedOutput {
    /// Text outside tool calls (the OpenAI `content`).
    pub normal_text: String,
    /// Calls in the order the model wrote them.
    pub calls: Vec<ToolCall>,
}

/// What one piece of streamed text adds to the response.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamDelta {
    /// Normal text that can be sent now (may be empty).
    pub normal_text: String,
    /// Tool-call deltas, at most one per call index, in call order.
    pub calls: Vec<ToolCallDelta>,
}

impl StreamDelta {
    /// Whether there is nothing to send.
    pub fn is_empty(&self) -> bool {
        self.normal_text.is_empty() && self.calls.is_empty()
    }
}

/// A piece of one streamed tool call, shaped like an OpenAI `delta.tool_calls[]` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolCallDelta {
    /// The call's position in the response (0 for the first call).
    pub index: usize,
    /// Set on the call's first delta only.
    pub id: Option<String>,
    /// Set on the call's first delta only.
    pub name: Option<String>,
    /// The next fragment of the arguments JSON (may be empty, e.g. on the first delta).
    pub arguments: String,
    /// Position of the function in the request's `tools` list; set on the first delta only.
    pub tool_index: Option<usize>,
}

/// Splits model output into normal text and tool calls, for one output format.
///
/// A parser keeps streaming state: use one per response (and per choice when `n > 1`).
/// Neither method panics on any input.
pub trait ToolParser: Send {
    /// Parses a whole model output (non-streaming). Does not touch the streaming state.
    fn parse_complete(&self, text: &str, tools: &[ToolSpec]) -> ParsedOutput;

    /// Takes the next piece of streamed output and returns what can be sent for it.
    fn parse_increment(&mut self, delta: &str, tools: &[ToolSpec]) -> StreamDelta;

    /// Ends the stream: returns the text that was held back (an unfinished marker, trailing
    /// whitespace, a call that never completed). Call once, after the last
    /// [`parse_increment`](Self::parse_increment).
    fn finish(&mut self, tools: &[ToolSpec]) -> StreamDelta;

    /// The format this parser reads.
    fn kind(&self) -> ToolParserKind;
}

/// The `--tool-call-parser` names this server understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum ToolParserKind {
    /// Llama 3.1 / 3.2 JSON tool calls.
    #[value(name = "llama3")]
    Llama3,
    /// Mistral `[TOOL_CALLS] [...]`.
    #[value(name = "mistral")]
    Mistral,
    /// Qwen 2.5 `<tool_call>` blocks.
    #[value(name = "qwen25")]
    Qwen25,
}

impl ToolParserKind {
    /// All kinds, in the order error messages list them.
    pub const ALL: [ToolParserKind; 3] = [
        ToolParserKind::Llama3,
        ToolParserKind::Mistral,
        ToolParserKind::Qwen25,
    ];

    /// The SGLang name (`llama3`, `mistral`, `qwen25`).
    pub fn name(self) -> &'static str {
        match self {
            ToolParserKind::Llama3 => "llama3",
            ToolParserKind::Mistral => "mistral",
            ToolParserKind::Qwen25 => "qwen25",
        }
    }

    /// A fresh parser for this format.
    pub fn parser(self) -> Box<dyn ToolParser> {
        Box::new(FormatParser::new(self))
    }

    fn dialect(self) -> Dialect {
        match self {
            ToolParserKind::Llama3 => Dialect::Llama3,
            ToolParserKind::Mistral => Dialect::Mistral,
            ToolParserKind::Qwen25 => Dialect::Qwen25,
        }
    }
}

impl fmt::Display for ToolParserKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ToolParserKind {
    type Err = EngineError;

    /// Reads a parser name; the error is a 400 naming the `tool_call_parser` field.
    fn from_str(name: &str) -> Result<Self, EngineError> {
        ToolParserKind::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| {
                EngineError::bad_param(
                    "tool_call_parser",
                    format!(
                        "unknown tool call parser `{name}` (supported: {})",
                        ToolParserKind::ALL.map(ToolParserKind::name).join(", ")
                    ),
                )
            })
    }
}

/// A fresh parser for a `--tool-call-parser` / `tool_call_parser` name.
pub fn parser_for(name: &str) -> Result<Box<dyn ToolParser>, EngineError> {
    Ok(name.parse::<ToolParserKind>()?.parser())
}

/// The one parser implementation: the format-specific parts live in [`Dialect`].
struct FormatParser {
    kind: ToolParserKind,
    stream: Machine,
}

impl FormatParser {
    fn new(kind: ToolParserKind) -> Self {
        Self {
            kind,
            stream: Machine::new(kind.dialect(), true),
        }
    }
}

impl ToolParser for FormatParser {
    fn parse_complete(&self, text: &str, tools: &[ToolSpec]) -> ParsedOutput {
        let mut machine = Machine::new(self.kind.dialect(), false);
        let mut first = machine.feed(text, tools);
        let last = machine.finish(tools);
        first.normal_text.push_str(&last.normal_text);
        first.calls.extend(last.calls);
        assemble(first)
    }

    fn parse_increment(&mut self, delta: &str, tools: &[ToolSpec]) -> StreamDelta {
        self.stream.feed(delta, tools)
    }

    fn finish(&mut self, tools: &[ToolSpec]) -> StreamDelta {
        self.stream.finish(tools)
    }

    fn kind(&self) -> ToolParserKind {
        self.kind
    }
}

/// Joins the deltas of a whole output into complete calls.
fn assemble(delta: StreamDelta) -> ParsedOutput {
    let mut calls: Vec<ToolCall> = Vec::new();
    for d in delta.calls {
        match calls.get_mut(d.index) {
            Some(call) => call.arguments.push_str(&d.arguments),
            None => calls.push(ToolCall {
                id: d.id.unwrap_or_default(),
                name: d.name.unwrap_or_default(),
                arguments: d.arguments,
                tool_index: d.tool_index.unwrap_or_default(),
            }),
        }
    }
    ParsedOutput {
        normal_text: delta.normal_text,
        calls,
    }
}
