//! Hugging Face chat templates rendered with minijinja.
//!
//! transformers renders `chat_template` with Jinja2 (`trim_blocks`, `lstrip_blocks`, the
//! loop-controls extension) and adds `raise_exception`, `strftime_now` and its own `tojson`
//! (no HTML escaping, non-ASCII kept). This module sets minijinja up the same way, with
//! Python's string and dict methods (`.strip()`, `.startswith()`, `.items()`...) from
//! minijinja-contrib's pycompat.

use std::fmt;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value};

use super::TokenizerError;

const TEMPLATE_NAME: &str = "chat_template";

/// How the template expects `message.content`: a plain string, or the OpenAI list of parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ContentFormat {
    String,
    Parts,
}

/// A compiled chat template.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
    content_format: ContentFormat,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("content_format", &self.content_format)
            .finish()
    }
}

/// Marks the error `raise_exception` returns, so its message reaches the user unchanged.
#[derive(Debug)]
struct RaisedException(String);

impl fmt::Display for RaisedException {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedException {}

impl ChatTemplate {
    /// Compiles `source`. `bos_token`/`eos_token` are the strings the template sees under
    /// those names.
    pub fn new(
        source: &str,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self, TokenizerError> {
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(|e| template_error(&e))?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(|e| template_error(&e))?;
        Ok(Self {
            env,
            source: source.to_owned(),
            bos_token,
            eos_token,
            content_format: detect_content_format(source),
        })
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders a conversation. `messages` are OpenAI-style objects; content given as a list
    /// of text parts is joined into one string unless the template itself walks the parts,
    /// and `tool_calls[].function.arguments` given as a JSON string is parsed to an object,
    /// as templates index into it.
    pub fn render(
        &self,
        messages: &[serde_json::Value],
        add_generation_prompt: bool,
        tools: Option<&[serde_json::Value]>,
    ) -> Result<String, TokenizerError> {
        self.render_with(
            messages,
            add_generation_prompt,
            tools,
            &serde_json::Map::new(),
        )
    }

    /// [`render`](Self::render) with extra template variables (`chat_template_kwargs`, e.g.
    /// `enable_thinking`). Extra variables never replace `messages`, `tools` or
    /// `add_generation_prompt`.
    pub fn render_with(
        &self,
        messages: &[serde_json::Value],
        add_generation_prompt: bool,
        tools: Option<&[serde_json::Value]>,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, TokenizerError> {
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| json_to_value(&self.prepare_message(m)))
            .collect();
        let tools = match tools {
            Some(tools) => Value::from(tools.iter().map(json_to_value).collect::<Vec<_>>()),
            None => Value::from(()),
        };
        let mut ctx: Vec<(String, Value)> = extra
            .iter()
            .map(|(k, v)| (k.clone(), json_to_value(v)))
            .collect();
        ctx.retain(|(k, _)| {
            !matches!(
                k.as_str(),
                "messages" | "tools" | "add_generation_prompt" | "bos_token" | "eos_token"
            )
        });
        ctx.push(("messages".into(), Value::from(messages)));
        ctx.push(("tools".into(), tools));
        ctx.push((
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        ));
        if !extra.contains_key("documents") {
            ctx.push(("documents".into(), Value::from(())));
        }
        ctx.push((
            "bos_token".into(),
            Value::from(self.bos_token.clone().unwrap_or_default()),
        ));
        ctx.push((
            "eos_token".into(),
            Value::from(self.eos_token.clone().unwrap_or_default()),
        ));

        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| template_error(&e))?;
        template
            .render(Value::from_pairs(ctx))
            .map_err(|e| template_error(&e))
    }

    fn prepare_message(&self, message: &serde_json::Value) -> serde_json::Value {
        let serde_json::Value::Object(fields) = message else {
            return message.clone();
        };
        let mut fields = fields.clone();
        if self.content_format == ContentFormat::String
            && let Some(serde_json::Value::Array(parts)) = fields.get("content")
        {
            let text = parts
                .iter()
                .filter(|p| p.get("type").and_then(|t| t.as_str()) == Some("text"))
                .filter_map(|p| p.get("text").and_then(|t| t.as_str()))
                .collect::<Vec<_>>()
                .join(" ");
            fields.insert("content".into(), serde_json::Value::String(text));
        }
        if let Some(serde_json::Value::Array(calls)) = fields.get_mut("tool_calls") {
            for call in calls {
                if let Some(function) = call.get_mut("function")
                    && let Some(arguments) = function.get_mut("arguments")
                    && let Some(text) = arguments.as_str()
                {
                    // An empty string (sent by some clients for functions without
                    // arguments) is the empty object.
                    if text.trim().is_empty() {
                        *arguments = serde_json::Value::Object(serde_json::Map::new());
                    } else if let Ok(parsed @ serde_json::Value::Object(_)) =
                        serde_json::from_str::<serde_json::Value>(text)
                    {
                        *arguments = parsed;
                    }
                }
            }
        }
        serde_json::Value::Object(fields)
    }
}

/// Whether the template iterates over a message's content (`{% for part in message['content'] %}`),
/// in which case it gets the OpenAI list of parts unchanged.
fn detect_content_format(source: &str) -> ContentFormat {
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        let after = &rest[start + 2..];
        let end = after.find("%}").unwrap_or(after.len());
        let tag = after[..end].trim_start_matches(['-', '+']).trim_start();
        if let Some(head) = tag.strip_prefix("for ")
            && let Some((_, iterable)) = head.split_once(" in ")
            && iterable.contains("content")
        {
            return ContentFormat::Parts;
        }
        rest = &after[end..];
    }
    ContentFormat::String
}

/// Reads a template for `--chat-template`: a Jinja file, a `chat_template.json`
/// (`{"chat_template": "..."}`), or inline Jinja source.
pub(super) fn load_template_source(arg: &str) -> Result<String, TokenizerError> {
    let path = Path::new(arg);
    if path.is_file() {
        let text = std::fs::read_to_string(path).map_err(|source| TokenizerError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        if path.extension().is_some_and(|e| e == "json") {
            return template_from_json(path, &text);
        }
        return Ok(text);
    }
    if arg.contains("{%") || arg.contains("{{") {
        return Ok(arg.to_owned());
    }
    Err(TokenizerError::Template(format!(
        "chat template file {arg} does not exist (pass a path to a Jinja file or the template text itself)"
    )))
}

/// The template inside a `chat_template.json` or a `tokenizer_config.json`-shaped object:
/// a string, or a list of `{name, template}` of which "default" (else the first) is used.
pub(super) fn template_from_config(value: &serde_json::Value) -> Option<String> {
    match value.get("chat_template")? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(named) => {
            let template_of = |v: &serde_json::Value| {
                v.get("template")
                    .and_then(|t| t.as_str())
                    .map(str::to_owned)
            };
            named
                .iter()
                .find(|v| v.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(template_of)
                .or_else(|| named.first().and_then(template_of))
        }
        _ => None,
    }
}

fn template_from_json(path: &Path, text: &str) -> Result<String, TokenizerError> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| TokenizerError::InvalidFile {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    template_from_config(&value).ok_or_else(|| TokenizerError::InvalidFile {
        path: path.to_path_buf(),
        message: "no \"chat_template\" string in this JSON file".into(),
    })
}

fn template_error(err: &Error) -> TokenizerError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(err);
    while let Some(cause) = source {
        if let Some(raised) = cause.downcast_ref::<RaisedException>() {
            return TokenizerError::Template(raised.0.clone());
        }
        source = cause.source();
    }
    let mut message = format!("chat template error: {}", err.kind());
    if let Some(detail) = err.detail() {
        message.push_str(": ");
        message.push_str(detail);
    }
    if let Some(line) = err.line() {
        message.push_str(&format!(" (line {line})"));
    }
    TokenizerError::Template(message)
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.clone())
        .with_source(RaisedException(message)))
}

/// Converts request JSON to a template value, keeping object key order.
pub(super) fn json_to_value(value: &serde_json::Value) -> Value {
    match value {
        serde_json::Value::Null => Value::from(()),
        serde_json::Value::Bool(b) => Value::from(*b),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        serde_json::Value::String(s) => Value::from(s.as_str()),
        serde_json::Value::Array(items) => {
            Value::from(items.iter().map(json_to_value).collect::<Vec<_>>())
        }
        serde_json::Value::Object(fields) => Value::from_pairs(
            fields
                .iter()
                .map(|(k, v)| (Value::from(k.as_str()), json_to_value(v))),
        ),
    }
}

/// `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`. A lone positional argument is `indent` when it is a
/// number (Jinja2's built-in signature) and `ensure_ascii` when it is a boolean.
fn tojson(value: &Value, positional: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let mut options = JsonOptions::default();
    match positional {
        Some(v) if v.kind() == ValueKind::Bool => options.ensure_ascii = v.is_true(),
        Some(v) if v.kind() == ValueKind::Number => {
            options.indent = v.as_usize().map(|n| " ".repeat(n));
        }
        Some(v) if v.is_none() => {}
        Some(v) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: unexpected argument {v}"),
            ));
        }
        None => {}
    }
    if let Some(ensure_ascii) = kwargs.get::<Option<bool>>("ensure_ascii")? {
        options.ensure_ascii = ensure_ascii;
    }
    if let Some(indent) = kwargs.get::<Option<Value>>("indent")? {
        options.indent = match indent.as_str() {
            Some(unit) => Some(unit.to_owned()),
            None => indent.as_usize().map(|n| " ".repeat(n)),
        };
    }
    if let Some(sort_keys) = kwargs.get::<Option<bool>>("sort_keys")? {
        options.sort_keys = sort_keys;
    }
    if let Some(separators) = kwargs.get::<Option<Vec<String>>>("separators")? {
        match separators.as_slice() {
            [item, key] => options.separators = Some((item.clone(), key.clone())),
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be a pair of strings",
                ));
            }
        }
    }
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(&mut out, value, &options, 0)?;
    Ok(Value::from_safe_string(out))
}

#[derive(Default)]
struct JsonOptions {
    ensure_ascii: bool,
    /// The string repeated once per nesting level; `None` writes everything on one line.
    indent: Option<String>,
    separators: Option<(String, String)>,
    sort_keys: bool,
}

impl JsonOptions {
    /// Python's defaults: `", "` between items without indent, `","` with it; `": "` always.
    fn separators(&self) -> (String, String) {
        match &self.separators {
            Some(s) => s.clone(),
            None if self.indent.is_some() => (",".into(), ": ".into()),
            None => (", ".into(), ": ".into()),
        }
    }
}

fn write_json(
    out: &mut String,
    value: &Value,
    opts: &JsonOptions,
    depth: usize,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, value),
        ValueKind::String => {
            write_json_str(out, value.as_str().unwrap_or_default(), opts.ensure_ascii)
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, opts, depth, '[', ']', items.len(), |out, i| {
                write_json(out, &items[i], opts, depth + 1)
            })?;
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if opts.sort_keys {
                keys.sort_by_key(|k| k.to_string());
            }
            let (_, key_sep) = opts.separators();
            write_container(out, opts, depth, '{', '}', keys.len(), |out, i| {
                let key = &keys[i];
                match key.as_str() {
                    Some(s) => write_json_str(out, s, opts.ensure_ascii),
                    None => write_json_str(out, &key.to_string(), opts.ensure_ascii),
                }
                out.push_str(&key_sep);
                write_json(out, &value.get_item(key)?, opts, depth + 1)
            })?;
        }
        ValueKind::Bytes | ValueKind::Plain | ValueKind::Invalid => {
            write_json_str(out, &value.to_string(), opts.ensure_ascii)
        }
        // ValueKind is non-exhaustive.
        _ => write_json_str(out, &value.to_string(), opts.ensure_ascii),
    }
    Ok(())
}

fn write_container(
    out: &mut String,
    opts: &JsonOptions,
    depth: usize,
    open: char,
    close: char,
    len: usize,
    mut item: impl FnMut(&mut String, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if len == 0 {
        out.push(close);
        return Ok(());
    }
    let (item_sep, _) = opts.separators();
    let indent = &opts.indent;
    for i in 0..len {
        if i > 0 {
            out.push_str(&item_sep);
        }
        if let Some(unit) = indent {
            out.push('\n');
            out.push_str(&unit.repeat(depth + 1));
        }
        item(out, i)?;
    }
    if let Some(unit) = indent {
        out.push('\n');
        out.push_str(&unit.repeat(depth));
    }
    out.push(close);
    Ok(())
}

fn write_number(out: &mut String, value: &Value) {
    if value.is_integer() {
        out.push_str(&value.to_string());
        return;
    }
    let Ok(f) = f64::try_from(value.clone()) else {
        out.push_str(&value.to_string());
        return;
    };
    if f.is_nan() {
        out.push_str("NaN");
    } else if f.is_infinite() {
        out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
    } else if f.fract() == 0.0 && f.abs() < 1e16 {
        out.push_str(&format!("{f:.1}"));
    } else {
        // Shortest round-trip digits, in scientific notation where Python's repr uses it
        // (exponent below -4 or from 16 on), spelled the Python way (1e+20, 1.5e-07).
        let scientific = format!("{f:e}");
        match scientific.split_once('e') {
            Some((mantissa, exp)) => match exp.parse::<i32>() {
                Ok(e) if (-4..16).contains(&e) => out.push_str(&format!("{f}")),
                Ok(e) => {
                    let sign = if e < 0 { '-' } else { '+' };
                    out.push_str(&format!("{mantissa}e{sign}{:02}", e.abs()));
                }
                Err(_) => out.push_str(&scientific),
            },
            None => out.push_str(&scientific),
        }
    }
}

fn write_json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `strftime_now(format)`: the current UTC time formatted with Python's `strftime` codes.
fn strftime_now(format: String) -> Result<Value, Error> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    Ok(Value::from(strftime(&format, secs)))
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Formats a Unix time (UTC) with the common `strftime` directives.
fn strftime(format: &str, unix_secs: i64) -> String {
    let days = unix_secs.div_euclid(86_400);
    let secs_of_day = unix_secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (secs_of_day / 3600, secs_of_day / 60 % 60, secs_of_day % 60);
    // 1970-01-01 was a Thursday (index 3 with Monday = 0).
    let weekday = (days + 3).rem_euclid(7) as usize;
    let day_of_year = days - days_from_civil(year, 1, 1) + 1;
    let month_name = MONTHS[(month - 1) as usize];
    let weekday_name = WEEKDAYS[weekday];

    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('e') => out.push_str(&format!("{day:>2}")),
            Some('H') => out.push_str(&format!("{hour:02}")),
            Some('I') => out.push_str(&format!("{:02}", (hour + 11) % 12 + 1)),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('M') => out.push_str(&format!("{minute:02}")),
            Some('S') => out.push_str(&format!("{second:02}")),
            Some('j') => out.push_str(&format!("{day_of_year:03}")),
            Some('B') => out.push_str(month_name),
            Some('b') | Some('h') => out.push_str(&month_name[..3]),
            Some('A') => out.push_str(weekday_name),
            Some('a') => out.push_str(&weekday_name[..3]),
            Some('w') => out.push_str(&((weekday + 1) % 7).to_string()),
            Some('u') => out.push_str(&(weekday + 1).to_string()),
            Some('F') => out.push_str(&format!("{year}-{month:02}-{day:02}")),
            Some('T') => out.push_str(&format!("{hour:02}:{minute:02}:{second:02}")),
            Some('Z') => out.push_str("UTC"),
            Some('z') => out.push_str("+0000"),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Gregorian date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_formats_known_dates() {
        // 2024-07-23 14:05:09 UTC, a Tuesday.
        let t = 1_721_743_509;
        assert_eq!(strftime("%d %b %Y", t), "23 Jul 2024");
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", t), "2024-07-23 14:05:09");
        assert_eq!(strftime("%A %B %j %I%p %%", t), "Tuesday July 205 02PM %");
        assert_eq!(strftime("%F", 0), "1970-01-01");
        assert_eq!(civil_from_days(days_from_civil(2000, 2, 29)), (2000, 2, 29));
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let t = ChatTemplate::new(
            "{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ s | tojson }}|{{ s | tojson(ensure_ascii=true) }}|{{ f | tojson }}",
            None,
            None,
        )
        .expect("compiles");
        let ctx = serde_json::json!({
            "x": {"a": {}, "b": [1, 2.5, null, true]},
            "s": "é<\"\n",
            "f": 1.0
        });
        let out = t
            .env
            .get_template(TEMPLATE_NAME)
            .and_then(|tpl| tpl.render(json_to_value(&ctx)))
            .expect("renders");
        assert_eq!(
            out,
            "{\"a\": {}, \"b\": [1, 2.5, null, true]}|{\n  \"a\": {},\n  \"b\": [\n    1,\n    2.5,\n    null,\n    true\n  ]\n}|\"é<\\\"\\n\"|\"\\u00e9<\\\"\\n\"|1.0"
        );
    }

    /// Messages of a tool-using conversation as an OpenAI client sends them: tools from
    /// the request, an assistant turn with `tool_calls` (arguments as a JSON string, as
    /// OpenAI returns them), and the `tool` answer with its `tool_call_id`.
    fn tool_conversation() -> (Vec<serde_json::Value>, Vec<serde_json::Value>) {
        let tools = crate::tool_parser::ToolSpec::parse_list(&serde_json::json!([{
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}
            }
        }]))
        .expect("valid tools");
        let tools = tools.iter().map(|t| t.to_json()).collect();
        let messages = vec![
            serde_json::json!({"role": "user", "content": "Weather in Paris?"}),
            serde_json::json!({"role": "assistant", "content": null, "tool_calls": [{
                "id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}
            }]}),
            serde_json::json!({"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"}),
        ];
        (messages, tools)
    }

    #[test]
    fn qwen25_style_template_with_tools() {
        // Modelled on Qwen2.5's layout: tools as JSON lines in the system turn, calls as
        // <tool_call> blocks, tool results as <tool_response> in a user turn.
        let source = r#"{%- if tools %}
{{- "<|im_start|>system\n# Tools\n\n<tools>" }}
{%- for tool in tools %}
{{- "\n" }}{{- tool | tojson }}
{%- endfor %}
{{- "\n</tools><|im_end|>\n" }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == "assistant" %}
{{- "<|im_start|>assistant" }}
{%- if message.content %}{{- "\n" + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- set call = tool_call.function if tool_call.function is defined else tool_call %}
{{- "\n<tool_call>\n{\"name\": \"" + call.name + "\", \"arguments\": " }}
{{- call.arguments | tojson }}
{{- "}\n</tool_call>" }}
{%- endfor %}
{{- "<|im_end|>\n" }}
{%- elif message.role == "tool" %}
{{- "<|im_start|>user\n<tool_response id=\"" + message.tool_call_id + "\">\n" }}
{{- message.content + "\n</tool_response><|im_end|>\n" }}
{%- else %}
{{- "<|im_start|>" + message.role + "\n" + message.content + "<|im_end|>\n" }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- "<|im_start|>assistant\n" }}
{%- endif %}"#;
        let (messages, tools) = tool_conversation();
        let t = ChatTemplate::new(source, None, None).expect("compiles");
        let out = t.render(&messages, true, Some(&tools)).expect("renders");
        let expected = concat!(
            "<|im_start|>system\n# Tools\n\n<tools>\n",
            r#"{"function": {"description": "Weather in a city", "name": "get_weather", "parameters": {"properties": {"city": {"type": "string"}}, "type": "object"}}, "type": "function"}"#,
            "\n</tools><|im_end|>\n",
            "<|im_start|>user\nWeather in Paris?<|im_end|>\n",
            "<|im_start|>assistant\n<tool_call>\n",
            r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#,
            "\n</tool_call><|im_end|>\n",
            "<|im_start|>user\n<tool_response id=\"call_1\">\n{\"temp\": 21}\n</tool_response><|im_end|>\n",
            "<|im_start|>assistant\n",
        );
        // serde_json may keep object keys in request order or sort them, depending on its
        // features; compare the key-order-free parts exactly and the tools line as JSON.
        let line = out.lines().nth(4).expect("tools line");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(line).expect("tools line is JSON"),
            tools[0]
        );
        let expected_line = expected.lines().nth(4).expect("tools line");
        assert_eq!(out.replace(line, ""), expected.replace(expected_line, ""));

        // The call block the template shows is what the qwen25 parser reads back.
        let shown = &out[out.find("<tool_call>").expect("call")..];
        let shown = &shown[..shown.find("<|im_end|>").expect("end")];
        let specs =
            crate::tool_parser::ToolSpec::parse_list(&serde_json::Value::from(tools.clone()))
                .expect("tools");
        let parsed = crate::tool_parser::parser_for("qwen25")
            .expect("parser")
            .parse_complete(shown, &specs);
        assert_eq!(parsed.calls.len(), 1);
        assert_eq!(parsed.calls[0].arguments, r#"{"city": "Paris"}"#);

        // An empty arguments string is the empty object.
        let mut empty = messages.clone();
        empty[1]["tool_calls"][0]["function"]["arguments"] = serde_json::json!("");
        assert!(
            t.render(&empty, true, Some(&tools))
                .expect("renders")
                .contains(r#"{"name": "get_weather", "arguments": {}}"#)
        );

        // Arguments given as an object render the same.
        let mut as_object = messages.clone();
        as_object[1]["tool_calls"][0]["function"]["arguments"] =
            serde_json::json!({"city": "Paris"});
        assert_eq!(
            t.render(&as_object, true, Some(&tools)).expect("renders"),
            out
        );
    }

    #[test]
    fn llama31_style_template_with_tools() {
        // Modelled on Llama 3.1's layout for custom tools: the tool list in the first user
        // turn, a call as one JSON object with "parameters", results in an ipython turn.
        let source = r#"{{- bos_token }}
{%- for message in messages %}
{%- if loop.first and tools %}
<|start_header_id|>user<|end_header_id|>

Answer with a JSON function call {"name": ..., "parameters": {...}}.

{% for t in tools %}
{{ t | tojson(indent=2) }}

{% endfor %}
{{ message.content | trim }}<|eot_id|>
{%- elif message.role == "assistant" and message.tool_calls %}
{%- if message.tool_calls | length != 1 %}
{{- raise_exception("one tool call per turn") }}
{%- endif %}
{%- set call = message.tool_calls[0].function %}
<|start_header_id|>assistant<|end_header_id|>

{"name": "{{ call.name }}", "parameters": {{ call.arguments | tojson }}}<|eot_id|>
{%- elif message.role == "tool" %}
<|start_header_id|>ipython<|end_header_id|>

{{ message.content | tojson if message.content is mapping else message.content }}<|eot_id|>
{%- else %}
<|start_header_id|>{{ message.role }}<|end_header_id|>

{{ message.content | trim }}<|eot_id|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
<|start_header_id|>assistant<|end_header_id|>

{% endif %}"#;
        let (messages, tools) = tool_conversation();
        let t =
            ChatTemplate::new(source, Some("<|begin_of_text|>".into()), None).expect("compiles");
        let out = t.render(&messages, true, Some(&tools)).expect("renders");
        assert!(out.starts_with(
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nAnswer with a JSON function call"
        ));
        let listed = out
            .find("{\n  \"")
            .and_then(|start| {
                out[start..]
                    .find("\n\n")
                    .map(|len| &out[start..start + len])
            })
            .expect("tool listed with indent");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(listed).expect("tool JSON"),
            tools[0]
        );
        assert!(out.ends_with(concat!(
            "Weather in Paris?<|eot_id|>",
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
            r#"{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>"#,
            "<|start_header_id|>ipython<|end_header_id|>\n\n{\"temp\": 21}<|eot_id|>",
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
        )));

        // The call the template shows is what the llama3 parser reads back.
        let specs =
            crate::tool_parser::ToolSpec::parse_list(&serde_json::Value::from(tools.clone()))
                .expect("tools");
        let parsed = crate::tool_parser::parser_for("llama3")
            .expect("parser")
            .parse_complete(
                r#"{"name": "get_weather", "parameters": {"city": "Paris"}}"#,
                &specs,
            );
        assert_eq!(parsed.calls.len(), 1);

        // The template's own errors reach the caller.
        let mut two = messages.clone();
        let call = two[1]["tool_calls"][0].clone();
        two[1]["tool_calls"] = serde_json::json!([call.clone(), call]);
        let err = t.render(&two, true, Some(&tools)).expect_err("raises");
        assert_eq!(
            err.to_string(),
            TokenizerError::Template("one tool call per turn".into()).to_string()
        );
    }

    #[test]
    fn content_format_detection() {
        assert_eq!(
            detect_content_format("{% for m in messages %}{{ m['content'] }}{% endfor %}"),
            ContentFormat::String
        );
        assert_eq!(
            detect_content_format(
                "{% for m in messages %}{%- for part in m['content'] %}{{ part.text }}{% endfor %}{% endfor %}"
            ),
            ContentFormat::Parts
        );
    }
}
