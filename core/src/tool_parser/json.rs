//! JSON helpers for the tool-call parsers: an incremental validator that is fed one
//! character at a time, and readers for the fields of a complete call object.

use serde_json::Value;

/// Deepest nesting accepted (serde_json's own recursion limit).
const MAX_DEPTH: usize = 128;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Container {
    Object,
    Array,
}

/// What the next structural character must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// A value (after `:` or after `,` in an array); also the start of the text.
    Value,
    /// A value or `]` (just after `[`).
    ValueOrClose,
    /// A key string (after `,` in an object).
    Key,
    /// A key string or `}` (just after `{`).
    KeyOrClose,
    Colon,
    CommaOrClose,
    /// The top-level value is complete.
    Done,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Escape {
    None,
    /// After `\`.
    Backslash,
    /// Inside `\uXXXX`: digits read so far and their value; `low` when this is the second
    /// half of a surrogate pair.
    Hex {
        digits: u8,
        value: u32,
        low: bool,
    },
    /// After a high surrogate: a `\` must follow.
    PairBackslash,
    /// After a high surrogate and `\`: a `u` must follow.
    PairU,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Number {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    Exp,
    ExpSign,
    ExpDigits,
}

impl Number {
    fn is_complete(self) -> bool {
        matches!(
            self,
            Number::Zero | Number::Int | Number::Frac | Number::ExpDigits
        )
    }

    fn next(self, c: char) -> Option<Number> {
        use Number::*;
        match (self, c) {
            (Minus, '0') => Some(Zero),
            (Minus, '1'..='9') => Some(Int),
            (Int, '0'..='9') => Some(Int),
            (Zero | Int, '.') => Some(Dot),
            (Zero | Int | Frac, 'e' | 'E') => Some(Exp),
            (Dot | Frac, '0'..='9') => Some(Frac),
            (Exp, '+' | '-') => Some(ExpSign),
            (Exp | ExpSign | ExpDigits, '0'..='9') => Some(ExpDigits),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Token {
    None,
    Str { key: bool, escape: Escape },
    Num(Number),
    Literal { word: &'static str, at: usize },
}

/// The character was not valid JSON at this point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SyntaxError;

/// Validates one JSON value fed a character at a time, as strictly as serde_json does
/// (string escapes, surrogate pairs, control characters, number grammar, nesting limit).
#[derive(Debug, Clone)]
pub(super) struct JsonScanner {
    stack: Vec<Container>,
    expect: Expect,
    token: Token,
}

impl Default for JsonScanner {
    fn default() -> Self {
        Self {
            stack: Vec::new(),
            expect: Expect::Value,
            token: Token::None,
        }
    }
}

fn is_json_ws(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

impl JsonScanner {
    /// Open containers right now (the top-level object counts as 1).
    pub(super) fn depth(&self) -> usize {
        self.stack.len()
    }

    /// Whether the top-level value is complete.
    pub(super) fn is_done(&self) -> bool {
        self.expect == Expect::Done
    }

    /// Feeds the next character. After an error the scanner must not be used again.
    pub(super) fn push(&mut self, c: char) -> Result<(), SyntaxError> {
        match self.token {
            Token::Str { key, escape } => return self.string_char(key, escape, c),
            Token::Num(n) => match n.next(c) {
                Some(next) => {
                    self.token = Token::Num(next);
                    return Ok(());
                }
                None if n.is_complete() => {
                    self.token = Token::None;
                    self.value_done();
                }
                None => return Err(SyntaxError),
            },
            Token::Literal { word, at } => {
                if word[at..].starts_with(c) {
                    let at = at + c.len_utf8();
                    if at == word.len() {
                        self.token = Token::None;
                        self.value_done();
                    } else {
                        self.token = Token::Literal { word, at };
                    }
                    return Ok(());
                }
                return Err(SyntaxError);
            }
            Token::None => {}
        }
        if is_json_ws(c) {
            return Ok(());
        }
        match self.expect {
            Expect::Done => Err(SyntaxError),
            Expect::ValueOrClose if c == ']' => self.close(Container::Array),
            Expect::Value | Expect::ValueOrClose => self.start_value(c),
            Expect::KeyOrClose if c == '}' => self.close(Container::Object),
            Expect::Key | Expect::KeyOrClose if c == '"' => {
                self.token = Token::Str {
                    key: true,
                    escape: Escape::None,
                };
                Ok(())
            }
            Expect::Colon if c == ':' => {
                self.expect = Expect::Value;
                Ok(())
            }
            Expect::CommaOrClose => match (c, self.stack.last()) {
                (',', Some(Container::Object)) => {
                    self.expect = Expect::Key;
                    Ok(())
                }
                (',', Some(Container::Array)) => {
                    self.expect = Expect::Value;
                    Ok(())
                }
                ('}', _) => self.close(Container::Object),
                (']', _) => self.close(Container::Array),
                _ => Err(SyntaxError),
            },
            Expect::Key | Expect::KeyOrClose | Expect::Colon => Err(SyntaxError),
        }
    }

    fn start_value(&mut self, c: char) -> Result<(), SyntaxError> {
        let open = |this: &mut Self, container, expect| {
            if this.stack.len() >= MAX_DEPTH {
                return Err(SyntaxError);
            }
            this.stack.push(container);
            this.expect = expect;
            Ok(())
        };
        match c {
            '{' => open(self, Container::Object, Expect::KeyOrClose),
            '[' => open(self, Container::Array, Expect::ValueOrClose),
            '"' => {
                self.token = Token::Str {
                    key: false,
                    escape: Escape::None,
                };
                Ok(())
            }
            '-' => {
                self.token = Token::Num(Number::Minus);
                Ok(())
            }
            '0' => {
                self.token = Token::Num(Number::Zero);
                Ok(())
            }
            '1'..='9' => {
                self.token = Token::Num(Number::Int);
                Ok(())
            }
            't' | 'f' | 'n' => {
                let word = match c {
                    't' => "true",
                    'f' => "false",
                    _ => "null",
                };
                self.token = Token::Literal { word, at: 1 };
                Ok(())
            }
            _ => Err(SyntaxError),
        }
    }

    fn close(&mut self, container: Container) -> Result<(), SyntaxError> {
        if self.stack.last() != Some(&container) {
            return Err(SyntaxError);
        }
        self.stack.pop();
        self.value_done();
        Ok(())
    }

    fn value_done(&mut self) {
        self.expect = if self.stack.is_empty() {
            Expect::Done
        } else {
            Expect::CommaOrClose
        };
    }

    fn string_char(&mut self, key: bool, escape: Escape, c: char) -> Result<(), SyntaxError> {
        let next = match escape {
            Escape::None => match c {
                '"' => {
                    self.token = Token::None;
                    if key {
                        self.expect = Expect::Colon;
                    } else {
                        self.value_done();
                    }
                    return Ok(());
                }
                '\\' => Escape::Backslash,
                c if (c as u32) < 0x20 => return Err(SyntaxError),
                _ => Escape::None,
            },
            Escape::Backslash => match c {
                '"' | '\\' | '/' | 'b' | 'f' | 'n' | 'r' | 't' => Escape::None,
                'u' => Escape::Hex {
                    digits: 0,
                    value: 0,
                    low: false,
                },
                _ => return Err(SyntaxError),
            },
            Escape::Hex { digits, value, low } => {
                let digit = c.to_digit(16).ok_or(SyntaxError)?;
                let value = value * 16 + digit;
                if digits < 3 {
                    Escape::Hex {
                        digits: digits + 1,
                        value,
                        low,
                    }
                } else {
                    match (low, value) {
                        (false, 0xD800..=0xDBFF) => Escape::PairBackslash,
                        (false, 0xDC00..=0xDFFF) => return Err(SyntaxError),
                        (false, _) => Escape::None,
                        (true, 0xDC00..=0xDFFF) => Escape::None,
                        (true, _) => return Err(SyntaxError),
                    }
                }
            }
            Escape::PairBackslash if c == '\\' => Escape::PairU,
            Escape::PairU if c == 'u' => Escape::Hex {
                digits: 0,
                value: 0,
                low: true,
            },
            Escape::PairBackslash | Escape::PairU => return Err(SyntaxError),
        };
        self.token = Token::Str { key, escape: next };
        Ok(())
    }
}

/// Splits a JSON string token off the front of `s` (which starts with `"`): returns the
/// token, quotes included, and the rest.
fn take_string(s: &str) -> Option<(&str, &str)> {
    let body = s.strip_prefix('"')?;
    let mut escaped = false;
    for (i, c) in body.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => return s.split_at_checked(i + 2),
            _ => {}
        }
    }
    None
}

fn decode_string(token: &str) -> Option<String> {
    serde_json::from_str(token).ok()
}

/// The arguments keys a call object may use.
pub(super) fn is_arguments_key(key: &str) -> bool {
    matches!(key, "arguments" | "parameters")
}

/// Matches the start of a call object written in the usual order, up to and including the
/// brace that opens the arguments object: `{"name": "<name>", "arguments": {`. `prefix`
/// must already be known to be a valid JSON prefix. Returns the function name.
pub(super) fn match_call_header(prefix: &str) -> Option<String> {
    let rest = prefix.strip_prefix('{')?.trim_start_matches(is_json_ws);
    let (key, rest) = take_string(rest)?;
    if decode_string(key)? != "name" {
        return None;
    }
    let rest = rest
        .trim_start_matches(is_json_ws)
        .strip_prefix(':')?
        .trim_start_matches(is_json_ws);
    let (name, rest) = take_string(rest)?;
    let name = decode_string(name)?;
    let rest = rest
        .trim_start_matches(is_json_ws)
        .strip_prefix(',')?
        .trim_start_matches(is_json_ws);
    let (key, rest) = take_string(rest)?;
    if !is_arguments_key(&decode_string(key)?) {
        return None;
    }
    let rest = rest
        .trim_start_matches(is_json_ws)
        .strip_prefix(':')?
        .trim_start_matches(is_json_ws);
    (rest == "{" && !name.is_empty()).then_some(name)
}

/// Reads a complete call object: its name and arguments text, or `None` when it is not a
/// valid call object (see the module documentation for the rules).
pub(super) fn read_call_object(text: &str) -> Option<(String, String)> {
    let value: Value = serde_json::from_str(text).ok()?;
    let fields = value.as_object()?;
    let name = fields.get("name")?.as_str()?;
    if name.is_empty() {
        return None;
    }
    let key = ["arguments", "parameters"]
        .into_iter()
        .find(|k| fields.contains_key(*k));
    let arguments = match key.and_then(|k| fields.get(k).map(|v| (k, v))) {
        None | Some((_, Value::Null)) => "{}".to_owned(),
        Some((key, Value::Object(_))) => top_level_value(text, key)?.to_owned(),
        Some((_, Value::String(inner))) => {
            let inner = inner.trim();
            match serde_json::from_str::<Value>(inner) {
                Ok(Value::Object(_)) => inner.to_owned(),
                _ => return None,
            }
        }
        Some(_) => return None,
    };
    Some((name.to_owned(), arguments))
}

/// The text of the value of `key` in a valid JSON object (the last one when the key
/// repeats, as serde_json keeps the last).
fn top_level_value<'a>(object: &'a str, key: &str) -> Option<&'a str> {
    let mut found = None;
    let mut rest = object
        .trim_start_matches(is_json_ws)
        .strip_prefix('{')?
        .trim_start_matches(is_json_ws);
    while !rest.starts_with('}') {
        let (k, after_key) = take_string(rest)?;
        let value_start = after_key
            .trim_start_matches(is_json_ws)
            .strip_prefix(':')?
            .trim_start_matches(is_json_ws);
        let value_len = value_length(value_start)?;
        let (value, after_value) = value_start.split_at_checked(value_len)?;
        if decode_string(k).as_deref() == Some(key) {
            found = Some(value);
        }
        let after_value = after_value.trim_start_matches(is_json_ws);
        rest = match after_value.strip_prefix(',') {
            Some(r) => r.trim_start_matches(is_json_ws),
            None => after_value,
        };
        if rest.is_empty() {
            return None;
        }
    }
    found
}

/// Byte length of the JSON value at the start of `s` (which is valid JSON).
fn value_length(s: &str) -> Option<usize> {
    let first = s.chars().next()?;
    match first {
        '"' => take_string(s).map(|(token, _)| token.len()),
        '{' | '[' => {
            let mut depth = 0usize;
            let mut in_string = false;
            let mut escaped = false;
            for (i, c) in s.char_indices() {
                if in_string {
                    match c {
                        _ if escaped => escaped = false,
                        '\\' => escaped = true,
                        '"' => in_string = false,
                        _ => {}
                    }
                    continue;
                }
                match c {
                    '"' => in_string = true,
                    '{' | '[' => depth += 1,
                    '}' | ']' => {
                        depth = depth.checked_sub(1)?;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
            }
            None
        }
        _ => Some(
            s.find(|c: char| is_json_ws(c) || matches!(c, ',' | '}' | ']'))
                .unwrap_or(s.len()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(text: &str) -> Result<bool, SyntaxError> {
        let mut s = JsonScanner::default();
        for c in text.chars() {
            s.push(c)?;
        }
        Ok(s.is_done())
    }

    #[test]
    fn scanner_agrees_with_serde_json() {
        let cases = [
            r#"{}"#,
            r#"{"a": 1}"#,
            r#"{"a": [1, 2.5e-3, -0, true, false, null, "x\u00e9\n"], "b": {"c": {}}}"#,
            r#"{"s": "\ud83d\ude00"}"#,
            r#"{"s": "\ud83d"}"#,
            r#"{"s": "\ude00"}"#,
            r#"{"n": 01}"#,
            r#"{"n": 1.}"#,
            r#"{"n": -}"#,
            r#"{"n": 1e}"#,
            r#"{"a" 1}"#,
            r#"{"a": 1,}"#,
            r#"{"a": [1,]}"#,
            r#"{"a": tru}"#,
            r#"{"a": "x	"}"#,
            r#"{"a": "\x"}"#,
            r#"{"a": 1]"#,
            r#"[1, {"a": []}]"#,
        ];
        for case in cases {
            let ours = scan(case) == Ok(true);
            let theirs = serde_json::from_str::<Value>(case).is_ok();
            assert_eq!(ours, theirs, "{case}");
        }
    }

    #[test]
    fn scanner_rejects_deep_nesting() {
        let deep = "[".repeat(MAX_DEPTH + 1);
        assert!(scan(&deep).is_err());
    }

    #[test]
    fn header_matching() {
        assert_eq!(
            match_call_header(r#"{"name": "get_weather", "arguments": {"#).as_deref(),
            Some("get_weather")
        );
        assert_eq!(
            match_call_header("{ \"name\" :\"a\\\"b\",\n\"parameters\":{").as_deref(),
            Some("a\"b")
        );
        assert_eq!(match_call_header(r#"{"arguments": {"#), None);
        assert_eq!(match_call_header(r#"{"name": "f", "x": {"#), None);
        assert_eq!(match_call_header(r#"{"name": "f", "arguments": ["#), None);
        assert_eq!(match_call_header(r#"{"name": "", "arguments": {"#), None);
    }

    #[test]
    fn call_objects() {
        let read = |t: &str| read_call_object(t);
        assert_eq!(
            read(r#"{"name": "f", "arguments": {"a": [1, "}"]} }"#),
            Some(("f".into(), r#"{"a": [1, "}"]}"#.into()))
        );
        assert_eq!(
            read(r#"{"parameters": {"x": 1}, "name": "f"}"#),
            Some(("f".into(), r#"{"x": 1}"#.into()))
        );
        assert_eq!(read(r#"{"name": "f"}"#), Some(("f".into(), "{}".into())));
        assert_eq!(
            read(r#"{"name": "f", "arguments": "{\"a\": 1}"}"#),
            Some(("f".into(), r#"{"a": 1}"#.into()))
        );
        assert_eq!(read(r#"{"name": "f", "arguments": "oops"}"#), None);
        assert_eq!(read(r#"{"name": "f", "arguments": [1]}"#), None);
        assert_eq!(read(r#"{"name": 3, "arguments": {}}"#), None);
        assert_eq!(read(r#"{"name": "f", "arguments": {"#), None);
        assert_eq!(
            read(r#"{"n": -1.5e3, "name": "f", "z": "\"", "arguments": {}}"#),
            Some(("f".into(), "{}".into()))
        );
    }
}
