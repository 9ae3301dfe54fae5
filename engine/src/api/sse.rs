//! Server-sent events as SGLang and OpenAI send them: `data: {json}` per chunk, then
//! `data: [DONE]`.
//!
//! While a stream waits (queued, or a long prompt), an empty line goes out every
//! [`KEEP_ALIVE`]. Not an SSE comment (`:`): SGLang's own clients (`bench_serving`, the
//! frontend) read every non-empty line as a `data:` payload and fail on a comment, and skip
//! empty lines; an empty line between events is also a no-op for any SSE parser.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde::Serialize;

use sgl_core::error::EngineError;

/// An empty line is sent when no chunk went out for this long. Besides keeping proxies from
/// closing an idle stream, the write is what tells the server that a client went away while
/// its request waited in the queue, so that the request is aborted.
const KEEP_ALIVE: Duration = Duration::from_secs(5);

/// One event's data: a single line (compact JSON or `[DONE]`).
pub struct Event(String);

/// Wrap a stream of events into an SSE response.
pub fn response<S>(events: S) -> Response
where
    S: Stream<Item = Event> + Send + 'static,
{
    response_with(events, KEEP_ALIVE)
}

fn response_with<S>(events: S, keep_alive: Duration) -> Response
where
    S: Stream<Item = Event> + Send + 'static,
{
    let body = async_stream::stream! {
        let mut events = std::pin::pin!(events);
        loop {
            // `next` is cancel-safe: a timeout loses no event.
            match tokio::time::timeout(keep_alive, events.next()).await {
                Ok(Some(Event(data))) => {
                    yield Ok::<Bytes, Infallible>(Bytes::from(format!("data: {data}\n\n")));
                }
                Ok(None) => break,
                Err(_) => yield Ok(Bytes::from_static(b"\n")),
            }
        }
    };
    let mut resp = Response::new(Body::from_stream(body));
    *resp.status_mut() = StatusCode::OK;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// `data: <json>`.
pub fn json<T: Serialize>(value: &T) -> Event {
    match serde_json::to_string(value) {
        Ok(s) => Event(s),
        // Serializing our own response types cannot fail; say so on the stream if it ever does.
        Err(e) => error(&EngineError::Internal(format!(
            "failed to serialize a chunk: {e}"
        ))),
    }
}

/// `data: {"error": {...}}` — how SGLang reports a failure once a stream has started.
pub fn error(e: &EngineError) -> Event {
    Event(e.body().to_string())
}

/// `data: [DONE]`.
pub fn done() -> Event {
    Event("[DONE]".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waits_send_empty_lines_and_events_one_data_line_each() {
        let events = async_stream::stream! {
            yield json(&serde_json::json!({"text": "a\nb"}));
            tokio::time::sleep(Duration::from_millis(130)).await;
            yield done();
        };
        let resp = response_with(events, Duration::from_millis(50));
        assert_eq!(resp.headers()[header::CONTENT_TYPE], "text/event-stream");
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .expect("body");
        let text = std::str::from_utf8(&body).expect("utf-8");
        let first = "data: {\"text\":\"a\\nb\"}\n\n";
        let last = "data: [DONE]\n\n";
        assert!(text.starts_with(first) && text.ends_with(last), "{text:?}");
        let between = &text[first.len()..text.len() - last.len()];
        assert!(
            !between.is_empty() && between.bytes().all(|b| b == b'\n'),
            "only empty lines while waiting: {text:?}"
        );
    }
}
