//! The request bodies, stated once as serde types.
//!
//! A body is first parsed into a JSON object (`super::parse_object`: at most 128 levels
//! deep, duplicate keys keep the last value, as SGLang's and OpenAI's Python servers do), then
//! read into these types with [`read`], whose errors name the field path
//! (`` `messages[2].content`: invalid type: integer `5`, expected a string or a list of
//! parts ``). Unknown fields are ignored, as SGLang does and OpenAI clients rely on (they send
//! extra fields through `extra_body`). JSON `null` counts as absent everywhere.
//!
//! The sampling fields are read from the same object as two types, [`CommonSampling`] and
//! the dialect's own ([`NativeSampling`] for `/generate`'s `sampling_params`,
//! [`OpenAiSampling`] for the top level of the OpenAI bodies), each ignoring what the other
//! reads. Values (ranges, limits, conflicts) are checked by `super::validate` on these types.

mod values;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

pub use values::{
    CompletionPrompt, Count, InputIds, Int, List, LogitBias, Number, Object, OneOrMany, Seed,
    StopStrings, TokenId, TokenIds,
};

use sgl_core::error::{EngineError, Result};

/// `prefix` joined with a field path as `serde_path_to_error` prints it (`.` is the root).
fn join_path(prefix: &str, path: &str) -> String {
    match (prefix, path) {
        (p, ".") => p.to_string(),
        ("", path) => path.to_string(),
        (p, path) if path.starts_with('[') => format!("{p}{path}"),
        (p, path) => format!("{p}.{path}"),
    }
}

fn field_error(prefix: &str, e: serde_path_to_error::Error<serde_json::Error>) -> EngineError {
    let field = join_path(prefix, &e.path().to_string());
    let inner = e.into_inner();
    if field.is_empty() {
        return EngineError::bad_request(format!("the request body: {inner}"));
    }
    EngineError::bad_param(&field, format!("`{field}`: {inner}"))
}

/// Reads `value` as a `T`; `prefix` names where `value` sits in the body (empty at the top).
pub fn read<'de, T: Deserialize<'de>>(value: &'de Value, prefix: &str) -> Result<T> {
    serde_path_to_error::deserialize(value).map_err(|e| field_error(prefix, e))
}

/// [`read`], taking the value (its strings move instead of being copied).
pub fn read_owned<T: DeserializeOwned>(value: Value, prefix: &str) -> Result<T> {
    serde_path_to_error::deserialize(value).map_err(|e| field_error(prefix, e))
}

/// Sampling fields with the same name and meaning on every route.
#[derive(Debug, Default, Deserialize)]
pub struct CommonSampling {
    pub temperature: Option<Number>,
    pub top_p: Option<Number>,
    pub top_k: Option<Int>,
    pub min_p: Option<Number>,
    pub stop: Option<StopStrings>,
    pub stop_token_ids: Option<TokenIds>,
    pub ignore_eos: Option<bool>,
    pub skip_special_tokens: Option<bool>,
    pub seed: Option<Seed>,
    pub sampling_seed: Option<Seed>,
    pub n: Option<Count>,
    pub frequency_penalty: Option<Number>,
    pub presence_penalty: Option<Number>,
    pub repetition_penalty: Option<Number>,
    pub no_stop_trim: Option<bool>,
    pub spaces_between_special_tokens: Option<bool>,
    pub logit_bias: Option<LogitBias>,
    pub regex: Option<String>,
    pub ebnf: Option<String>,
    /// Custom logit processors' parameters: refused unless absent.
    pub custom_params: Option<Value>,
}

/// `/generate`'s own `sampling_params` fields.
#[derive(Debug, Default, Deserialize)]
pub struct NativeSampling {
    pub max_new_tokens: Option<Count>,
    pub min_new_tokens: Option<Count>,
    /// A JSON schema as a string or as the schema itself (checked by `validate`).
    pub json_schema: Option<Value>,
}

/// The OpenAI routes' own sampling fields.
#[derive(Debug, Default, Deserialize)]
pub struct OpenAiSampling {
    pub max_completion_tokens: Option<Count>,
    pub max_tokens: Option<Count>,
    pub min_tokens: Option<Count>,
    pub response_format: Option<ResponseFormat>,
    /// Refused unless 1.
    pub best_of: Option<Value>,
    /// Refused unless "".
    pub suffix: Option<Value>,
}

/// OpenAI's `response_format`.
#[derive(Debug, Default, Deserialize)]
#[serde(expecting = "an object with a `type`")]
pub struct ResponseFormat {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub json_schema: Option<JsonSchemaFormat>,
}

/// `response_format.json_schema`.
#[derive(Debug, Default, Deserialize)]
#[serde(expecting = "an object: {\"name\": ..., \"schema\": {...}}")]
pub struct JsonSchemaFormat {
    pub name: Option<String>,
    pub strict: Option<bool>,
    pub schema: Option<Value>,
}

/// `POST /generate`, less `sampling_params`' fields (read per entry, see [`read`]).
#[derive(Debug, Default, Deserialize)]
pub struct GenerateBody {
    pub text: Option<OneOrMany<String>>,
    pub input_ids: Option<InputIds>,
    /// An object, or in a batch a list with one object (or null) per prompt.
    pub sampling_params: Option<Value>,
    pub rid: Option<OneOrMany<String>>,
    pub return_logprob: Option<OneOrMany<bool>>,
    pub logprob_start_len: Option<OneOrMany<Int>>,
    pub top_logprobs_num: Option<OneOrMany<Count>>,
    pub return_text_in_logprobs: Option<bool>,
    pub stream: Option<bool>,
    /// Features this engine does not have: refused unless absent (or neutral).
    pub return_hidden_states: Option<Value>,
    pub image_data: Option<Value>,
    pub lora_path: Option<Value>,
    pub input_embeds: Option<Value>,
    pub custom_logit_processor: Option<Value>,
}

/// `stream_options`.
#[derive(Debug, Default, Deserialize)]
#[serde(expecting = "an object: {\"include_usage\": true}")]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

/// `POST /v1/completions`, less the sampling fields.
#[derive(Debug, Default, Deserialize)]
pub struct CompletionBody {
    pub prompt: Option<CompletionPrompt>,
    pub model: Option<String>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub echo: Option<bool>,
    /// Alternatives per token, 0..=5.
    pub logprobs: Option<Count>,
}

/// `POST /v1/chat/completions`, less the sampling fields.
#[derive(Debug, Default, Deserialize)]
pub struct ChatBody {
    pub messages: Option<Messages>,
    pub model: Option<String>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<Count>,
    /// Read by the tool parser module, which names its own fields in errors.
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub chat_template_kwargs: Option<Object>,
}

/// `messages`.
#[derive(Debug, Default)]
pub struct Messages(pub Vec<Message>);

impl<'de> Deserialize<'de> for Messages {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Messages;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of message objects")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<Messages, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
                while let Some(m) = seq.next_element()? {
                    out.push(m);
                }
                Ok(Messages(out))
            }
        }
        d.deserialize_seq(V)
    }
}

/// One chat message. Fields other than these go to the chat template as they came.
#[derive(Debug, Default)]
pub struct Message {
    pub role: Option<String>,
    pub content: Option<MessageContent>,
    pub tool_calls: Option<List>,
    pub rest: Map<String, Value>,
}

impl<'de> Deserialize<'de> for Message {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Message;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object with `role` and `content`")
            }
            // By hand rather than `#[serde(flatten)]`, which buffers every other field once
            // more before it reaches `rest`.
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Message, A::Error> {
                let mut m = Message::default();
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "role" => m.role = map.next_value()?,
                        "content" => m.content = map.next_value()?,
                        "tool_calls" => m.tool_calls = map.next_value()?,
                        _ => {
                            let v: Value = map.next_value()?;
                            m.rest.insert(key, v);
                        }
                    }
                }
                Ok(m)
            }
        }
        d.deserialize_map(V)
    }
}

/// A message's `content`: text, or a list of parts.
#[derive(Debug)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

impl<'de> Deserialize<'de> for MessageContent {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = MessageContent;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string or a list of parts")
            }
            fn visit_str<E: serde::de::Error>(
                self,
                v: &str,
            ) -> std::result::Result<Self::Value, E> {
                Ok(MessageContent::Text(v.to_string()))
            }
            fn visit_string<E: serde::de::Error>(
                self,
                v: String,
            ) -> std::result::Result<Self::Value, E> {
                Ok(MessageContent::Text(v))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
                while let Some(p) = seq.next_element()? {
                    out.push(p);
                }
                Ok(MessageContent::Parts(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// One part of a message's `content` list.
#[derive(Debug, Default)]
pub struct ContentPart {
    pub kind: Option<String>,
    pub text: Option<String>,
    pub rest: Map<String, Value>,
}

impl<'de> Deserialize<'de> for ContentPart {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = ContentPart;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a content part object: {\"type\": \"text\", \"text\": ...}")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<ContentPart, A::Error> {
                let mut p = ContentPart::default();
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "type" => p.kind = map.next_value()?,
                        "text" => p.text = map.next_value()?,
                        _ => {
                            let v: Value = map.next_value()?;
                            p.rest.insert(key, v);
                        }
                    }
                }
                Ok(p)
            }
        }
        d.deserialize_map(V)
    }
}

impl ContentPart {
    fn into_value(self) -> Value {
        let mut m = self.rest;
        if let Some(kind) = self.kind {
            m.insert("type".into(), Value::String(kind));
        }
        if let Some(text) = self.text {
            m.insert("text".into(), Value::String(text));
        }
        Value::Object(m)
    }
}

impl Message {
    /// The message as the chat template sees it: as sent, except that a missing or null
    /// `content` (an assistant turn that only made tool calls) is `""`, as SGLang passes it,
    /// so that templates without tool support can still concatenate it.
    pub fn into_template_value(self) -> Value {
        let mut m = self.rest;
        if let Some(role) = self.role {
            m.insert("role".into(), Value::String(role));
        }
        let content = match self.content {
            None => Value::from(""),
            Some(MessageContent::Text(t)) => Value::String(t),
            Some(MessageContent::Parts(parts)) => {
                Value::Array(parts.into_iter().map(ContentPart::into_value).collect())
            }
        };
        m.insert("content".into(), content);
        if let Some(List(calls)) = self.tool_calls {
            m.insert("tool_calls".into(), Value::Array(calls));
        }
        Value::Object(m)
    }
}

#[cfg(test)]
mod tests;
