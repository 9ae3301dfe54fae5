//! A request body as `/generate` and the OpenAI routes read it: any bytes give a parsed
//! request or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sgl_engine::api::parse_object;
use sgl_engine::api::validate::{Dialect, Obj, parse_sampling};

fuzz_target!(|data: &[u8]| {
    let Ok(body) = parse_object(data) else {
        return;
    };
    let _ = parse_sampling(&Obj::new(&body), Dialect::OpenAi);
    if let Some(serde_json::Value::Object(params)) = body.get("sampling_params") {
        let _ = parse_sampling(&Obj::new(params), Dialect::Native);
    }
});
