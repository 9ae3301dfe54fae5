//! Server-sent events as SGLang and OpenAI send them: `data: {json}` per chunk, then
//! `data: [DONE]`.

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use serde::Serialize;

use crate::error::EngineError;

/// A comment line is sent when no chunk went out for this long. Besides keeping proxies from
/// closing an idle stream, the write is what tells the server that a client went away while
/// its request waited in the queue, so that the request is aborted.
const KEEP_ALIVE: Duration = Duration::from_secs(5);

/// Wrap a stream of events into an SSE response.
pub fn response<S>(events: S) -> Response
where
    S: Stream<Item = Event> + Send + 'static,
{
    Sse::new(events.map(Ok::<_, Infallible>))
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response()
}

/// `data: <json>`.
pub fn json<T: Serialize>(value: &T) -> Event {
    match serde_json::to_string(value) {
        Ok(s) => Event::default().data(s),
        // Serializing our own response types cannot fail; say so on the stream if it ever does.
        Err(e) => error(&EngineError::Internal(format!(
            "failed to serialize a chunk: {e}"
        ))),
    }
}

/// `data: {"error": {...}}` — how SGLang reports a failure once a stream has started.
pub fn error(e: &EngineError) -> Event {
    let body = e.body();
    Event::default().data(body.to_string())
}

/// `data: [DONE]`.
pub fn done() -> Event {
    Event::default().data("[DONE]")
}
