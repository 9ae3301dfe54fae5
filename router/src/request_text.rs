//! Reads the routing text out of generation request bodies, rejecting malformed ones.
//!
//! The text is the whole prompt: `text` (or `input_ids`) of `/generate`, `prompt` of
//! `/v1/completions`, and every message of `/v1/chat/completions`, in order, with its role.
//! A batch (a list of prompts) is joined into one text.

use serde_json::Value;

use crate::error::{Result, RouterError};

/// The generation endpoints whose bodies the router reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GenerationRoute {
    Generate,
    Completions,
    ChatCompletions,
}

impl GenerationRoute {
    pub fn path(self) -> &'static str {
        match self {
            Self::Generate => "/generate",
            Self::Completions => "/v1/completions",
            Self::ChatCompletions => "/v1/chat/completions",
        }
    }
}

/// What the router needs from a generation request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedRequest {
    pub text: String,
    pub stream: bool,
}

fn bad(msg: impl Into<String>) -> RouterError {
    RouterError::BadRequest(msg.into())
}

/// Parses and checks `body` for `route`.
pub fn parse_request(route: GenerationRoute, body: &[u8]) -> Result<ParsedRequest> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| bad(format!("the body is not valid JSON: {e}")))?;
    let Value::Object(obj) = &value else {
        return Err(bad("the body must be a JSON object"));
    };
    let stream = match obj.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("`stream` must be a boolean")),
    };
    let text = match route {
        GenerationRoute::Generate => match (obj.get("text"), obj.get("input_ids")) {
            (Some(t), _) if !t.is_null() => prompt_text(t, "text")?,
            (_, Some(ids)) if !ids.is_null() => prompt_text(ids, "input_ids")?,
            _ => return Err(bad("`text` or `input_ids` is required")),
        },
        GenerationRoute::Completions => match obj.get("prompt") {
            Some(p) if !p.is_null() => prompt_text(p, "prompt")?,
            _ => return Err(bad("`prompt` is required")),
        },
        GenerationRoute::ChatCompletions => match obj.get("messages") {
            Some(Value::Array(messages)) if !messages.is_empty() => chat_text(messages)?,
            Some(Value::Array(_)) => return Err(bad("`messages` must not be empty")),
            Some(_) => return Err(bad("`messages` must be an array of messages")),
            None => return Err(bad("`messages` is required")),
        },
    };
    Ok(ParsedRequest { text, stream })
}

/// A prompt: a string, a list of strings, a list of token ids, or a list of such lists.
fn prompt_text(v: &Value, field: &str) -> Result<String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(items) if items.iter().all(Value::is_number) => ids_text(items, field),
        Value::Array(items) => {
            let parts = items
                .iter()
                .map(|item| match item {
                    Value::String(s) => Ok(s.clone()),
                    Value::Array(ids) => ids_text(ids, field),
                    _ => Err(bad(format!(
                        "`{field}` must be a string, a list of strings or a list of token ids"
                    ))),
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(parts.join("\n"))
        }
        _ => Err(bad(format!(
            "`{field}` must be a string, a list of strings or a list of token ids"
        ))),
    }
}

/// Token ids as text (`"1 2 3"`), so that shared id prefixes are shared text prefixes.
fn ids_text(ids: &[Value], field: &str) -> Result<String> {
    let mut out = String::with_capacity(ids.len() * 6);
    for (i, id) in ids.iter().enumerate() {
        let Some(n) = id.as_u64() else {
            return Err(bad(format!(
                "`{field}` token ids must be non-negative integers"
            )));
        };
        if i > 0 {
            out.push(' ');
        }
        out.push_str(&n.to_string());
    }
    Ok(out)
}

fn chat_text(messages: &[Value]) -> Result<String> {
    let mut out = String::new();
    for (i, m) in messages.iter().enumerate() {
        let Value::Object(m) = m else {
            return Err(bad(format!("`messages[{i}]` must be an object")));
        };
        let role = match m.get("role") {
            Some(Value::String(r)) => r.as_str(),
            _ => return Err(bad(format!("`messages[{i}].role` must be a string"))),
        };
        out.push_str(role);
        out.push_str(": ");
        match m.get("content") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => out.push_str(s),
            Some(Value::Array(parts)) => {
                for part in parts {
                    push_content_part(&mut out, part, i)?;
                }
            }
            Some(_) => {
                return Err(bad(format!(
                    "`messages[{i}].content` must be a string or a list of parts"
                )));
            }
        }
        out.push('\n');
    }
    Ok(out)
}

fn push_content_part(out: &mut String, part: &Value, i: usize) -> Result<()> {
    let Value::Object(p) = part else {
        return Err(bad(format!(
            "`messages[{i}].content` parts must be objects"
        )));
    };
    if let Some(Value::String(t)) = p.get("text") {
        out.push_str(t);
    } else if let Some(url) = p.get("image_url") {
        // Images differ by URL; keep it so different images do not look like one prefix.
        let url = url.get("url").and_then(Value::as_str).or(url.as_str());
        out.push_str(url.unwrap_or("[image]"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use GenerationRoute::*;

    fn text(route: GenerationRoute, body: &str) -> String {
        parse_request(route, body.as_bytes()).unwrap().text
    }

    fn error(route: GenerationRoute, body: &str) -> String {
        match parse_request(route, body.as_bytes()) {
            Err(RouterError::BadRequest(m)) => m,
            other => panic!("expected a bad request, got {other:?}"),
        }
    }

    #[test]
    fn generate_accepts_text_batches_and_ids() {
        assert_eq!(text(Generate, r#"{"text": "hello"}"#), "hello");
        assert_eq!(text(Generate, r#"{"text": ["a", "b"]}"#), "a\nb");
        assert_eq!(text(Generate, r#"{"input_ids": [1, 22, 333]}"#), "1 22 333");
        assert_eq!(text(Generate, r#"{"input_ids": [[1, 2], [3]]}"#), "1 2\n3");
        let p = parse_request(Generate, br#"{"text": "x", "stream": true}"#).unwrap();
        assert!(p.stream);
    }

    #[test]
    fn chat_text_covers_every_message_not_only_the_first() {
        let body = r#"{"messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"},
                                         {"type": "image_url", "image_url": {"url": "http://img/1"}}]},
            {"role": "assistant", "content": null},
            {"role": "user", "content": "Second question"}
        ]}"#;
        assert_eq!(
            text(ChatCompletions, body),
            "system: Be brief.\nuser: Hihttp://img/1\nassistant: \nuser: Second question\n"
        );
    }

    #[test]
    fn completions_use_the_prompt() {
        assert_eq!(
            text(Completions, r#"{"model": "m", "prompt": "Once upon"}"#),
            "Once upon"
        );
        assert_eq!(text(Completions, r#"{"prompt": [5, 6]}"#), "5 6");
    }

    #[test]
    fn malformed_bodies_are_rejected_with_a_reason() {
        assert!(error(Generate, "{not json").contains("not valid JSON"));
        assert!(error(Generate, "[1, 2]").contains("JSON object"));
        assert!(error(Generate, r#"{"sampling_params": {}}"#).contains("`text` or `input_ids`"));
        assert!(error(Generate, r#"{"text": 5}"#).contains("`text` must be"));
        assert!(error(Generate, r#"{"input_ids": [1, -2]}"#).contains("non-negative"));
        assert!(error(Generate, r#"{"text": "a", "stream": "yes"}"#).contains("`stream`"));
        assert!(error(Completions, r#"{"model": "m"}"#).contains("`prompt` is required"));
        assert!(error(ChatCompletions, r#"{"messages": []}"#).contains("must not be empty"));
        assert!(error(ChatCompletions, r#"{"messages": "hi"}"#).contains("array"));
        assert!(error(ChatCompletions, r#"{"messages": [{"content": "x"}]}"#).contains("role"));
        assert!(
            error(
                ChatCompletions,
                r#"{"messages": [{"role": "user", "content": 3}]}"#
            )
            .contains("content")
        );
        assert!(error(ChatCompletions, "").contains("not valid JSON"));
    }
}
