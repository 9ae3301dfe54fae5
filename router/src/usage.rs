//! Prompt and cached-prompt token counts read from the engines' responses as they pass
//! through, so that the router exports the service-wide prefix-cache signal
//! (`sgl_router_prompt_tokens_total`, `sgl_router_cached_tokens_total`) as its clients saw it:
//! the windowed hit rate of the whole service is `rate(cached) / rate(prompt)` on one router.
//!
//! Where the engines write the counts: native `/generate` in each output's `meta_info`
//! (`prompt_tokens`, `cached_tokens`; a batch answers an array, a stream repeats `meta_info`
//! in every event, cumulative, per `index`); the OpenAI routes in `usage` (`prompt_tokens`,
//! and `prompt_tokens_details.cached_tokens` when the engine runs with
//! `--enable-cache-report`; a stream carries `usage` only when the client asks for it with
//! `stream_options.include_usage`). A response without both counts adds nothing.

use std::collections::BTreeMap;

use serde_json::Value;

/// Longest non-streaming body parsed for its counts; a longer one is not counted.
const JSON_LIMIT: usize = 4 << 20;
/// Longest SSE line kept while it arrives; a longer one is skipped.
const LINE_LIMIT: usize = 1 << 20;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
}

/// Reads a response body chunk by chunk and yields its token counts at the end.
pub struct UsageScan {
    sse: bool,
    buf: Vec<u8>,
    overflow: bool,
    /// Streams: the last `meta_info` counts of each output `index`.
    native: BTreeMap<u64, Usage>,
    /// Streams: the last `usage` object seen (OpenAI's final usage event).
    openai: Option<Usage>,
}

/// The counts of one output, only when it reports both: a response that does not say how
/// many of its tokens were cached (OpenAI routes of an engine without
/// `--enable-cache-report`) is left out of both counters, so that their ratio stays a hit rate.
fn counts(v: &Value) -> Option<Usage> {
    if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
        return Some(Usage {
            prompt_tokens: u.get("prompt_tokens")?.as_u64()?,
            cached_tokens: u
                .pointer("/prompt_tokens_details/cached_tokens")?
                .as_u64()?,
        });
    }
    let m = v.get("meta_info")?;
    Some(Usage {
        prompt_tokens: m.get("prompt_tokens")?.as_u64()?,
        cached_tokens: m.get("cached_tokens")?.as_u64()?,
    })
}

fn add(a: Usage, b: Usage) -> Usage {
    Usage {
        prompt_tokens: a.prompt_tokens + b.prompt_tokens,
        cached_tokens: a.cached_tokens + b.cached_tokens,
    }
}

impl UsageScan {
    /// A scanner for a body of this content type; `None` for types that carry no counts.
    pub fn new(content_type: &str) -> Option<Self> {
        let sse = content_type.starts_with("text/event-stream");
        (sse || content_type.starts_with("application/json")).then(|| Self {
            sse,
            buf: Vec::new(),
            overflow: false,
            native: BTreeMap::new(),
            openai: None,
        })
    }

    pub fn feed(&mut self, chunk: &[u8]) {
        if !self.sse {
            if self.buf.len() + chunk.len() > JSON_LIMIT {
                self.overflow = true;
                self.buf = Vec::new();
            }
            if !self.overflow {
                self.buf.extend_from_slice(chunk);
            }
            return;
        }
        let mut rest = chunk;
        while let Some(pos) = rest.iter().position(|&b| b == b'\n') {
            if !self.overflow {
                self.buf.extend_from_slice(&rest[..pos]);
                let line = std::mem::take(&mut self.buf);
                self.event_line(&line);
            }
            self.buf.clear();
            self.overflow = false;
            rest = &rest[pos + 1..];
        }
        if self.buf.len() + rest.len() > LINE_LIMIT {
            self.overflow = true;
            self.buf.clear();
        } else if !self.overflow {
            self.buf.extend_from_slice(rest);
        }
    }

    fn event_line(&mut self, line: &[u8]) {
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        // Most events of a stream are tokens without counts: skip them unparsed.
        if !data.windows(13).any(|w| w == b"prompt_tokens") {
            return;
        }
        let Ok(v) = serde_json::from_slice::<Value>(data) else {
            return;
        };
        if v.get("usage").is_some_and(Value::is_object) {
            self.openai = counts(&v).or(self.openai);
        } else if let Some(u) = counts(&v) {
            let index = v.get("index").and_then(Value::as_u64).unwrap_or(0);
            self.native.insert(index, u);
        }
    }

    /// The counts of the whole body, if it had any.
    pub fn finish(mut self) -> Option<Usage> {
        if self.sse {
            if !self.overflow && !self.buf.is_empty() {
                let line = std::mem::take(&mut self.buf);
                self.event_line(&line);
            }
            return self
                .openai
                .or_else(|| self.native.values().copied().reduce(add));
        }
        if self.overflow {
            return None;
        }
        let v: Value = serde_json::from_slice(&self.buf).ok()?;
        match &v {
            Value::Array(items) => items.iter().filter_map(counts).reduce(add),
            _ => counts(&v),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(content_type: &str, chunks: &[&str]) -> Option<Usage> {
        let mut s = UsageScan::new(content_type).unwrap();
        for c in chunks {
            s.feed(c.as_bytes());
        }
        s.finish()
    }

    fn u(prompt_tokens: u64, cached_tokens: u64) -> Option<Usage> {
        Some(Usage {
            prompt_tokens,
            cached_tokens,
        })
    }

    #[test]
    fn non_streaming_bodies() {
        let native = r#"{"text":"x","meta_info":{"prompt_tokens":12,"cached_tokens":8}}"#;
        assert_eq!(
            scan("application/json", &[&native[..9], &native[9..]]),
            u(12, 8)
        );
        let batch = r#"[{"meta_info":{"prompt_tokens":5,"cached_tokens":0}},
                        {"meta_info":{"prompt_tokens":7,"cached_tokens":4}}]"#;
        assert_eq!(scan("application/json", &[batch]), u(12, 4));
        let openai = r#"{"choices":[],"usage":{"prompt_tokens":30,"completion_tokens":2,
                         "prompt_tokens_details":{"cached_tokens":16}}}"#;
        assert_eq!(
            scan("application/json; charset=utf-8", &[openai]),
            u(30, 16)
        );
        let no_report = r#"{"usage":{"prompt_tokens":30,"completion_tokens":2}}"#;
        assert_eq!(
            scan("application/json", &[no_report]),
            None,
            "no cache report"
        );
        assert_eq!(scan("application/json", &[r#"{"error":{}}"#]), None);
        assert_eq!(scan("application/json", &["not json"]), None);
        assert!(UsageScan::new("text/plain").is_none());
    }

    #[test]
    fn streams_count_the_last_event_of_each_output() {
        let native = [
            "data: {\"index\":0,\"text\":\"a\",\"meta_info\":{\"prompt_tokens\":9,\"cached_tokens\":3}}\n\n",
            "data: {\"index\":1,\"text\":\"b\",\"meta_info\":{\"prompt_tokens\":9,",
            "\"cached_tokens\":9}}\n\ndata: {\"index\":0,\"text\":\"ab\",\"meta_info\":{\"prompt_tokens\":9,\"cached_tokens\":3}}\n\n",
            "data: [DONE]\n\n",
        ];
        assert_eq!(scan("text/event-stream", &native), u(18, 12));
        let openai = [
            "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\n",
            "data: [DONE]",
        ];
        assert_eq!(scan("text/event-stream", &openai), u(40, 32));
        let without_usage = ["data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n"];
        assert_eq!(scan("text/event-stream", &without_usage), None);
    }
}
