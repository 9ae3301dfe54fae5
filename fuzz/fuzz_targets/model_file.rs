//! A model file of any bytes (a hostile or damaged download): GGUF header, metadata,
//! tokenizer and weights, or a safetensors header. An error, never a crash or an allocation
//! the file's claims alone ask for.
#![no_main]

use std::io::Write;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(dir) = tempfile::tempdir() else {
        return;
    };
    // The same bytes as a GGUF file and as a one-file safetensors folder.
    let gguf = dir.path().join("model.gguf");
    let Ok(mut f) = std::fs::File::create(&gguf) else {
        return;
    };
    if f.write_all(data).is_err() {
        return;
    }
    if let Ok(model) = sgl_engine::model::load(&gguf)
        && let Some(content) = model.gguf()
    {
        let _ = sgl_engine::tokenizer::Tokenizer::from_gguf(content);
    }
    let st = dir.path().join("model.safetensors");
    if std::fs::write(&st, data).is_ok() {
        let _ = sgl_engine::model::tensors::SafetensorsFiles::open(&[st]);
    }
});
