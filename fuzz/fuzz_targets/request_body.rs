//! A request body as `/generate` and the OpenAI routes read it: any bytes give a parsed
//! request or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use sgl_engine::api::parse_object;
use sgl_engine::api::schema::{self, ChatBody, CompletionBody, GenerateBody, Message};
use sgl_engine::api::validate::{Dialect, parse_sampling};

fuzz_target!(|data: &[u8]| {
    let Ok(body) = parse_object(data) else {
        return;
    };
    let body = Value::Object(body);
    let _ = parse_sampling(&body, "", Dialect::OpenAi);
    match body.get("sampling_params") {
        Some(params @ Value::Object(_)) => {
            let _ = parse_sampling(params, "sampling_params", Dialect::Native);
        }
        Some(Value::Array(list)) => {
            for params in list {
                let _ = parse_sampling(params, "sampling_params[0]", Dialect::Native);
            }
        }
        _ => {}
    }
    let _ = schema::read::<GenerateBody>(&body, "");
    let _ = schema::read::<CompletionBody>(&body, "");
    if let Ok(chat) = schema::read_owned::<ChatBody>(body, "") {
        let _: Vec<Value> = chat
            .messages
            .map(|m| m.0)
            .unwrap_or_default()
            .into_iter()
            .map(Message::into_template_value)
            .collect();
    }
});
