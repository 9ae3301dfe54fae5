//! The OpenAI request fields `tools` and `tool_choice`.

use serde::{Deserialize, Serialize, Serializer};
use serde_json::{Map, Value, json};

use crate::error::EngineError;

/// One function the model may call: an OpenAI `{"type": "function", "function": {...}}`
/// tool. Deserialises from that shape with the checks of [`ToolSpec::from_json`] and
/// serialises back to it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "Value")]
pub struct ToolSpec {
    pub name: String,
    pub description: Option<String>,
    /// JSON Schema of the arguments object; `None` when the request gave none (the
    /// function takes no arguments).
    pub parameters: Option<Value>,
    /// OpenAI's `strict` flag, kept for the template; constrained decoding is governed by
    /// `tool_choice` alone.
    pub strict: Option<bool>,
}

fn err(field: &str, message: impl std::fmt::Display) -> EngineError {
    EngineError::bad_param(field, format!("`{field}` {message}"))
}

fn describe(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// `map[key]`, with JSON `null` counted as absent.
fn field<'a>(map: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    map.get(key).filter(|v| !v.is_null())
}

impl ToolSpec {
    /// Reads one OpenAI tool object. `path` names it in error messages (`tools[2]`).
    pub fn from_json(value: &Value, path: &str) -> Result<Self, EngineError> {
        let Value::Object(tool) = value else {
            return Err(err(
                path,
                format!(
                    "must be a tool object {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {}",
                    describe(value)
                ),
            ));
        };
        match field(tool, "type") {
            None => {}
            Some(Value::String(t)) if t == "function" => {}
            Some(Value::String(t)) => {
                return Err(err(
                    &format!("{path}.type"),
                    format!("`{t}` is not supported (only \"function\")"),
                ));
            }
            Some(v) => {
                return Err(err(
                    &format!("{path}.type"),
                    format!("must be \"function\", got {}", describe(v)),
                ));
            }
        }
        let fpath = format!("{path}.function");
        let function = match field(tool, "function") {
            Some(Value::Object(f)) => f,
            Some(v) => {
                return Err(err(
                    &fpath,
                    format!("must be an object with a `name`, got {}", describe(v)),
                ));
            }
            None => return Err(err(&fpath, "is required")),
        };
        let name = match field(function, "name") {
            Some(Value::String(n)) if !n.is_empty() => n.clone(),
            Some(Value::String(_)) => return Err(err(&format!("{fpath}.name"), "is empty")),
            Some(v) => {
                return Err(err(
                    &format!("{fpath}.name"),
                    format!("must be a string, got {}", describe(v)),
                ));
            }
            None => return Err(err(&format!("{fpath}.name"), "is required")),
        };
        let description = match field(function, "description") {
            None => None,
            Some(Value::String(d)) => Some(d.clone()),
            Some(v) => {
                return Err(err(
                    &format!("{fpath}.description"),
                    format!("must be a string, got {}", describe(v)),
                ));
            }
        };
        let parameters = match field(function, "parameters") {
            None => None,
            Some(p @ Value::Object(_)) => Some(p.clone()),
            Some(v) => {
                return Err(err(
                    &format!("{fpath}.parameters"),
                    format!("must be a JSON Schema object, got {}", describe(v)),
                ));
            }
        };
        let strict = match field(function, "strict") {
            None => None,
            Some(Value::Bool(b)) => Some(*b),
            Some(v) => {
                return Err(err(
                    &format!("{fpath}.strict"),
                    format!("must be a boolean, got {}", describe(v)),
                ));
            }
        };
        Ok(Self {
            name,
            description,
            parameters,
            strict,
        })
    }

    /// Reads the `tools` field: a list of tool objects with distinct function names.
    /// `null` reads as no tools.
    pub fn parse_list(value: &Value) -> Result<Vec<ToolSpec>, EngineError> {
        let items = match value {
            Value::Null => return Ok(Vec::new()),
            Value::Array(items) => items,
            v => {
                return Err(err(
                    "tools",
                    format!("must be a list of tool objects, got {}", describe(v)),
                ));
            }
        };
        let mut tools: Vec<ToolSpec> = Vec::with_capacity(items.len());
        // Name -> index of its first definition: one look-up per tool, however many.
        let mut seen: std::collections::HashMap<String, usize> =
            std::collections::HashMap::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let tool = ToolSpec::from_json(item, &format!("tools[{i}]"))?;
            if let Some(&first) = seen.get(&tool.name) {
                return Err(err(
                    &format!("tools[{i}].function.name"),
                    format!("`{}` is already defined by tools[{first}]", tool.name),
                ));
            }
            seen.insert(tool.name.clone(), i);
            tools.push(tool);
        }
        Ok(tools)
    }

    /// The OpenAI tool object, as chat templates expect to see it in `tools`.
    pub fn to_json(&self) -> Value {
        let mut function = Map::new();
        function.insert("name".into(), Value::from(self.name.clone()));
        if let Some(d) = &self.description {
            function.insert("description".into(), Value::from(d.clone()));
        }
        if let Some(p) = &self.parameters {
            function.insert("parameters".into(), p.clone());
        }
        if let Some(s) = self.strict {
            function.insert("strict".into(), Value::from(s));
        }
        json!({"type": "function", "function": function})
    }

    /// The arguments schema: `parameters`, with `"type": "object"` added when it names no
    /// type of its own, or an object with no properties when `parameters` was not given.
    pub fn arguments_schema(&self) -> Value {
        match &self.parameters {
            Some(Value::Object(schema)) => {
                let composed = ["type", "$ref", "anyOf", "oneOf", "allOf", "enum", "const"]
                    .iter()
                    .any(|k| schema.contains_key(*k));
                let mut schema = schema.clone();
                if !composed {
                    schema.insert("type".into(), Value::from("object"));
                }
                Value::Object(schema)
            }
            _ => json!({"type": "object", "properties": {}, "additionalProperties": false}),
        }
    }
}

impl TryFrom<Value> for ToolSpec {
    type Error = EngineError;

    fn try_from(value: Value) -> Result<Self, EngineError> {
        ToolSpec::from_json(&value, "tools[]")
    }
}

impl Serialize for ToolSpec {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_json().serialize(serializer)
    }
}

/// The OpenAI `tool_choice` field.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "Value")]
pub enum ToolChoice {
    /// The model decides (the default when tools are given).
    Auto,
    /// No calls: the tools are hidden from the model (the default without tools).
    None,
    /// At least one call, to any of the tools.
    Required,
    /// Exactly one call, to this function.
    Function(String),
}

impl ToolChoice {
    /// Reads `tool_choice` and checks it against `tools`. Absent (or `null`) means `auto`
    /// when there are tools and `none` otherwise.
    pub fn parse(value: Option<&Value>, tools: &[ToolSpec]) -> Result<Self, EngineError> {
        let choice = match value.filter(|v| !v.is_null()) {
            None if tools.is_empty() => ToolChoice::None,
            None => ToolChoice::Auto,
            Some(v) => ToolChoice::from_json(v)?,
        };
        choice.validate(tools)?;
        Ok(choice)
    }

    /// Reads the shape of a `tool_choice` value: `"auto"`, `"none"`, `"required"` or
    /// `{"type": "function", "function": {"name": ...}}`.
    pub fn from_json(value: &Value) -> Result<Self, EngineError> {
        const EXPECTED: &str = "(\"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}})";
        match value {
            Value::String(s) => match s.as_str() {
                "auto" => Ok(ToolChoice::Auto),
                "none" => Ok(ToolChoice::None),
                "required" => Ok(ToolChoice::Required),
                other => Err(err(
                    "tool_choice",
                    format!("`{other}` is not a valid choice {EXPECTED}"),
                )),
            },
            Value::Object(choice) => {
                match field(choice, "type") {
                    None => {}
                    Some(Value::String(t)) if t == "function" => {}
                    Some(v) => {
                        let shown = v
                            .as_str()
                            .map_or_else(|| describe(v).to_owned(), |t| format!("`{t}`"));
                        return Err(err(
                            "tool_choice.type",
                            format!("{shown} is not supported (only \"function\")"),
                        ));
                    }
                }
                let function = match field(choice, "function") {
                    Some(Value::Object(f)) => f,
                    Some(v) => {
                        return Err(err(
                            "tool_choice.function",
                            format!("must be an object with a `name`, got {}", describe(v)),
                        ));
                    }
                    None => return Err(err("tool_choice.function", "is required")),
                };
                match field(function, "name") {
                    Some(Value::String(n)) if !n.is_empty() => Ok(ToolChoice::Function(n.clone())),
                    Some(Value::String(_)) => Err(err("tool_choice.function.name", "is empty")),
                    Some(v) => Err(err(
                        "tool_choice.function.name",
                        format!("must be a string, got {}", describe(v)),
                    )),
                    None => Err(err("tool_choice.function.name", "is required")),
                }
            }
            v => Err(err(
                "tool_choice",
                format!(
                    "must be a string or an object {EXPECTED}, got {}",
                    describe(v)
                ),
            )),
        }
    }

    /// Checks the choice against the request's tools.
    pub fn validate(&self, tools: &[ToolSpec]) -> Result<(), EngineError> {
        match self {
            ToolChoice::Required if tools.is_empty() => Err(err(
                "tool_choice",
                "is \"required\" but `tools` is empty: give at least one tool",
            )),
            ToolChoice::Function(name) if !tools.iter().any(|t| &t.name == name) => {
                let known: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
                Err(err(
                    "tool_choice.function.name",
                    format!(
                        "names `{name}`, which is not one of the tools ({})",
                        if known.is_empty() {
                            "none given".to_owned()
                        } else {
                            known.join(", ")
                        }
                    ),
                ))
            }
            _ => Ok(()),
        }
    }

    /// Whether the output must be tool calls (`required` or a named function).
    pub fn forces_call(&self) -> bool {
        matches!(self, ToolChoice::Required | ToolChoice::Function(_))
    }

    /// Whether the chat template should see the tools (every choice except `none`).
    pub fn shows_tools(&self) -> bool {
        !matches!(self, ToolChoice::None)
    }

    /// The OpenAI JSON form.
    pub fn to_json(&self) -> Value {
        match self {
            ToolChoice::Auto => Value::from("auto"),
            ToolChoice::None => Value::from("none"),
            ToolChoice::Required => Value::from("required"),
            ToolChoice::Function(name) => {
                json!({"type": "function", "function": {"name": name}})
            }
        }
    }
}

impl TryFrom<Value> for ToolChoice {
    type Error = EngineError;

    fn try_from(value: Value) -> Result<Self, EngineError> {
        ToolChoice::from_json(&value)
    }
}

impl Serialize for ToolChoice {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_json().serialize(serializer)
    }
}
