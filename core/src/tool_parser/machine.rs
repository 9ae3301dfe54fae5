//! The parsing state machine shared by all formats. It is fed text piece by piece and
//! writes normal text and call deltas; parsing a complete output is the same machine fed
//! once, in a mode that decides each call only when its object is complete.

use std::mem::take;

use super::json::{JsonScanner, match_call_header, read_call_object};
use super::{StreamDelta, ToolCallDelta, ToolSpec};

/// The format-specific parts of a parser.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dialect {
    /// Calls start at `<|python_tag|>` or at a `{` that opens the output; `;` separates calls.
    Llama3,
    /// Calls follow `[TOOL_CALLS]` as a JSON array (or one object); an output that opens
    /// with `[{` is read the same way, for detokenizers that drop the marker.
    Mistral,
    /// Each call is one `<tool_call>` ... `</tool_call>` block.
    Qwen25,
}

const PYTHON_TAG: &str = "<|python_tag|>";
const QWEN_END: &str = "</tool_call>";

impl Dialect {
    fn start_marker(self) -> &'static str {
        match self {
            Dialect::Llama3 => PYTHON_TAG,
            Dialect::Mistral => "[TOOL_CALLS]",
            Dialect::Qwen25 => "<tool_call>",
        }
    }
}

#[derive(Debug, Default)]
enum State {
    /// Normal text, watching for a start marker.
    #[default]
    Text,
    /// After a start marker (or Llama's `;`): whitespace, then a call object (or, for
    /// Mistral, the `[` of the calls array).
    Open,
    /// Inside Mistral's calls array, after `[` or `,`: whitespace, then a call object.
    ArrayItem,
    /// Inside a call object.
    Object(Box<CallObject>),
    /// After a call object: whitespace, then the format's closer or separator.
    After { in_array: bool },
}

#[derive(Debug)]
struct CallObject {
    scanner: JsonScanner,
    /// The object's text so far.
    text: String,
    in_array: bool,
    phase: Phase,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Streaming and nothing sent yet: the usual `{"name": .., "arguments": {` start may
    /// still match.
    Header,
    /// Decided when the object is complete.
    Whole,
    /// The call's first delta is sent (`index` is `None` when the function is unknown and
    /// the call is being dropped); argument characters are streamed until `closed`.
    Args { index: Option<usize>, closed: bool },
}

/// Zero-length steps allowed in a row; each one changes the state, and a few always
/// suffice. Exceeding it would mean a bug, which is then contained by treating the rest of
/// the piece as text rather than looping.
const MAX_IDLE_STEPS: usize = 8;

#[derive(Debug)]
pub(super) struct Machine {
    dialect: Dialect,
    streaming: bool,
    state: State,
    /// Input not consumed yet (a possible marker start, or text awaiting more input).
    pending: String,
    /// Whitespace after the last normal text, sent once more text follows.
    held_ws: String,
    /// The whitespace that was held when the current call attempt began, given back if the
    /// attempt turns out to be text.
    ws_before_call: String,
    /// Text of the current call attempt before its object (marker, `[`, whitespace), given
    /// back as text if the attempt fails.
    raw: String,
    /// The last thing was a call: whitespace up to the next text is dropped.
    after_call: bool,
    /// Nothing but whitespace so far.
    at_start: bool,
    next_index: usize,
    out: StreamDelta,
}

impl Machine {
    /// `streaming`: send a call's name and arguments as soon as they are known; otherwise
    /// each call is decided when its object is complete.
    pub(super) fn new(dialect: Dialect, streaming: bool) -> Self {
        Self {
            dialect,
            streaming,
            state: State::Text,
            pending: String::new(),
            held_ws: String::new(),
            ws_before_call: String::new(),
            raw: String::new(),
            after_call: false,
            at_start: true,
            next_index: 0,
            out: StreamDelta::default(),
        }
    }

    pub(super) fn feed(&mut self, text: &str, tools: &[ToolSpec]) -> StreamDelta {
        self.pending.push_str(text);
        let input = take(&mut self.pending);
        let mut pos = 0;
        let mut idle = 0;
        while let Some(rest) = input.get(pos..).filter(|r| !r.is_empty()) {
            match self.step(rest, tools) {
                Some(0) => {
                    idle += 1;
                    if idle > MAX_IDLE_STEPS {
                        self.state = State::Text;
                        self.text_out(rest);
                        pos = input.len();
                        break;
                    }
                }
                Some(n) => {
                    idle = 0;
                    pos += n;
                }
                None => break,
            }
        }
        self.pending = input.get(pos..).unwrap_or_default().to_owned();
        take(&mut self.out)
    }

    /// Ends the input: what is still held back is decided with no more text to come.
    pub(super) fn finish(&mut self, _tools: &[ToolSpec]) -> StreamDelta {
        let rest = take(&mut self.pending);
        match take(&mut self.state) {
            State::Text => self.text_out(&rest),
            State::Open | State::ArrayItem => {
                self.raw.push_str(&rest);
                self.release();
            }
            State::Object(obj) => {
                if !matches!(obj.phase, Phase::Args { .. }) {
                    self.raw.push_str(&obj.text);
                    self.raw.push_str(&rest);
                    self.release();
                }
                // Otherwise the call stopped inside its arguments (length limit): it keeps
                // what was sent.
            }
            // An unfinished closer after a complete call is dropped with it.
            State::After { .. } => {}
        }
        if !self.after_call {
            self.out.normal_text.push_str(&self.held_ws);
        }
        self.held_ws.clear();
        self.state = State::Text;
        take(&mut self.out)
    }

    /// One step on `rest` (never empty). Returns the bytes consumed, or `None` when more
    /// input is needed to decide.
    fn step(&mut self, rest: &str, tools: &[ToolSpec]) -> Option<usize> {
        match &self.state {
            State::Text => self.step_text(rest),
            State::Open => self.step_open(rest),
            State::ArrayItem => self.step_array_item(rest),
            State::Object(_) => self.step_object(rest, tools),
            State::After { in_array } => {
                let in_array = *in_array;
                self.step_after(rest, in_array)
            }
        }
    }

    fn step_text(&mut self, rest: &str) -> Option<usize> {
        if self.at_start && self.dialect != Dialect::Qwen25 {
            let trimmed = rest.trim_start();
            let ws = rest.len() - trimmed.len();
            if ws > 0 {
                self.text_out(&rest[..ws]);
                return Some(ws);
            }
            self.at_start = false;
            match (self.dialect, trimmed.chars().next()) {
                (Dialect::Llama3, Some('{')) => {
                    self.begin_attempt("");
                    self.start_object(false);
                    return Some(0);
                }
                (Dialect::Mistral, Some('['))
                    if !trimmed.starts_with(self.dialect.start_marker()) =>
                {
                    if self.dialect.start_marker().starts_with(trimmed) {
                        // Maybe the marker itself: wait for more.
                        self.at_start = true;
                        return None;
                    }
                    self.begin_attempt("[");
                    self.state = State::ArrayItem;
                    return Some(1);
                }
                _ => {}
            }
        }
        let marker = self.dialect.start_marker();
        if let Some(at) = rest.find(marker) {
            self.text_out(&rest[..at]);
            self.begin_attempt(marker);
            self.state = State::Open;
            return Some(at + marker.len());
        }
        let keep = partial_suffix(rest, marker);
        let send = rest.len() - keep;
        if send == 0 {
            return None;
        }
        self.text_out(&rest[..send]);
        Some(send)
    }

    fn step_open(&mut self, rest: &str) -> Option<usize> {
        let trimmed = rest.trim_start_matches(is_json_ws);
        let ws = rest.len() - trimmed.len();
        if ws > 0 {
            self.raw.push_str(&rest[..ws]);
            return Some(ws);
        }
        if self.dialect == Dialect::Llama3 {
            if rest.starts_with(PYTHON_TAG) {
                self.raw.push_str(PYTHON_TAG);
                return Some(PYTHON_TAG.len());
            }
            if PYTHON_TAG.starts_with(rest) {
                return None;
            }
        }
        match rest.chars().next() {
            Some('{') => self.start_object(false),
            Some('[') if self.dialect == Dialect::Mistral => {
                self.raw.push('[');
                self.state = State::ArrayItem;
                return Some(1);
            }
            _ => self.release(),
        }
        Some(0)
    }

    fn step_array_item(&mut self, rest: &str) -> Option<usize> {
        let trimmed = rest.trim_start_matches(is_json_ws);
        let ws = rest.len() - trimmed.len();
        if ws > 0 {
            self.raw.push_str(&rest[..ws]);
            return Some(ws);
        }
        match rest.chars().next() {
            Some('{') => self.start_object(true),
            Some(']') => {
                // An empty (or trailing-comma) calls array: no call, nothing to show.
                self.call_finished();
                self.state = State::Text;
                return Some(1);
            }
            _ => self.release(),
        }
        Some(0)
    }

    fn step_object(&mut self, rest: &str, tools: &[ToolSpec]) -> Option<usize> {
        let State::Object(mut obj) = take(&mut self.state) else {
            return Some(0);
        };
        let mut consumed = 0;
        for c in rest.chars() {
            let before = obj.scanner.depth();
            if obj.scanner.push(c).is_err() {
                self.object_failed(*obj);
                return Some(consumed);
            }
            consumed += c.len_utf8();
            obj.text.push(c);
            let after = obj.scanner.depth();
            match obj.phase {
                Phase::Header if before == 1 && after == 2 => {
                    obj.phase = match match_call_header(&obj.text).filter(|_| c == '{') {
                        Some(name) => {
                            let index = self.begin_call(name, tools);
                            if let Some(index) = index {
                                self.push_arguments(index, "{");
                            }
                            Phase::Args {
                                index,
                                closed: false,
                            }
                        }
                        None => Phase::Whole,
                    };
                }
                Phase::Args {
                    index,
                    closed: false,
                } if before >= 2 => {
                    if let Some(index) = index {
                        let mut buf = [0u8; 4];
                        self.push_arguments(index, c.encode_utf8(&mut buf));
                    }
                    if after < 2 {
                        obj.phase = Phase::Args {
                            index,
                            closed: true,
                        };
                    }
                }
                _ => {}
            }
            if obj.scanner.is_done() {
                self.object_done(*obj, tools);
                return Some(consumed);
            }
        }
        self.state = State::Object(obj);
        Some(consumed).filter(|n| *n > 0)
    }

    fn step_after(&mut self, rest: &str, in_array: bool) -> Option<usize> {
        let trimmed = rest.trim_start();
        let ws = rest.len() - trimmed.len();
        if ws > 0 {
            return Some(ws);
        }
        match self.dialect {
            Dialect::Qwen25 => {
                if rest.starts_with(QWEN_END) {
                    self.state = State::Text;
                    return Some(QWEN_END.len());
                }
                if QWEN_END.starts_with(rest) {
                    return None;
                }
            }
            Dialect::Mistral if in_array => match rest.chars().next() {
                Some(',') => {
                    self.begin_attempt(",");
                    self.state = State::ArrayItem;
                    return Some(1);
                }
                Some(']') => {
                    self.state = State::Text;
                    return Some(1);
                }
                _ => {}
            },
            Dialect::Mistral => {}
            Dialect::Llama3 => {
                if rest.starts_with(';') {
                    self.begin_attempt(";");
                    self.state = State::Open;
                    return Some(1);
                }
            }
        }
        // Anything else after a call is normal text.
        self.state = State::Text;
        Some(0)
    }

    fn start_object(&mut self, in_array: bool) {
        self.state = State::Object(Box::new(CallObject {
            scanner: JsonScanner::default(),
            text: String::new(),
            in_array,
            phase: if self.streaming {
                Phase::Header
            } else {
                Phase::Whole
            },
        }));
    }

    fn object_done(&mut self, obj: CallObject, tools: &[ToolSpec]) {
        if !matches!(obj.phase, Phase::Args { .. }) {
            let Some((name, arguments)) = read_call_object(&obj.text) else {
                self.raw.push_str(&obj.text);
                self.release();
                return;
            };
            if let Some(index) = self.begin_call(name, tools) {
                self.push_arguments(index, &arguments);
            }
        }
        self.call_finished();
        self.state = State::After {
            in_array: obj.in_array,
        };
    }

    fn object_failed(&mut self, obj: CallObject) {
        if matches!(obj.phase, Phase::Args { .. }) {
            // Only when streaming: the call was already sent and keeps its fragments; the
            // rest of the output is text.
            self.call_finished();
            self.state = State::Text;
        } else {
            self.raw.push_str(&obj.text);
            self.release();
        }
    }

    /// A call attempt starts with `opening` (a marker, `[`, `,` or `;`).
    fn begin_attempt(&mut self, opening: &str) {
        self.ws_before_call = take(&mut self.held_ws);
        self.raw.clear();
        self.raw.push_str(opening);
        self.at_start = false;
    }

    /// The attempt was not a call after all: its text is normal text.
    fn release(&mut self) {
        self.state = State::Text;
        self.at_start = false;
        let raw = take(&mut self.raw);
        self.held_ws = take(&mut self.ws_before_call);
        self.text_out(&raw);
    }

    /// A call (or an empty calls array) ended. The whitespace held before it separates the
    /// text before from any text after; at the end of the output it is dropped.
    fn call_finished(&mut self) {
        self.raw.clear();
        self.held_ws = take(&mut self.ws_before_call);
        self.after_call = true;
    }

    /// Sends a call's first delta, or returns `None` (dropping the call) when `name` is not
    /// one of `tools`.
    fn begin_call(&mut self, name: String, tools: &[ToolSpec]) -> Option<usize> {
        let tool_index = tools.iter().position(|t| t.name == name)?;
        let index = self.next_index;
        self.next_index += 1;
        self.out.calls.push(ToolCallDelta {
            index,
            id: Some(new_call_id()),
            name: Some(name),
            arguments: String::new(),
            tool_index: Some(tool_index),
        });
        Some(index)
    }

    fn push_arguments(&mut self, index: usize, fragment: &str) {
        match self.out.calls.last_mut() {
            Some(last) if last.index == index => last.arguments.push_str(fragment),
            _ => self.out.calls.push(ToolCallDelta {
                index,
                arguments: fragment.to_owned(),
                ..ToolCallDelta::default()
            }),
        }
    }

    /// Sends normal text, holding back trailing whitespace (kept only if more text follows,
    /// calls in between or not) and dropping whitespace that follows a call.
    fn text_out(&mut self, text: &str) {
        let body = text.trim_end();
        let tail = &text[body.len()..];
        if body.is_empty() {
            if !self.after_call {
                self.held_ws.push_str(tail);
            }
            return;
        }
        let body = if self.after_call {
            body.trim_start()
        } else {
            body
        };
        self.out.normal_text.push_str(&take(&mut self.held_ws));
        self.out.normal_text.push_str(body);
        self.held_ws.push_str(tail);
        self.after_call = false;
        self.at_start = false;
    }
}

fn is_json_ws(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

/// Length of the longest end of `text` that is a proper start of `marker` (ASCII).
fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len())
        .rev()
        .find(|&n| marker.get(..n).is_some_and(|prefix| text.ends_with(prefix)))
        .unwrap_or(0)
}

/// `call_` and 24 random hex digits, as SGLang makes call ids.
fn new_call_id() -> String {
    let hex = uuid::Uuid::new_v4().simple().to_string();
    format!("call_{}", hex.get(..24).unwrap_or(&hex))
}
