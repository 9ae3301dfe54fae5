//! Hugging Face tokenizer folders: `tokenizer.json`, with `tokenizer_config.json` (chat
//! template, BOS/EOS tokens), `chat_template.jinja` / `chat_template.json` and
//! `generation_config.json` (EOS ids) beside it. A `.gguf` path is read as GGUF.

use std::collections::HashSet;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use super::chat_template::template_from_config;
use super::{ChatTemplate, Tokenizer, TokenizerError};

pub(super) fn from_dir_or_file(path: &Path) -> Result<Tokenizer, TokenizerError> {
    if path.is_file()
        && path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        return from_gguf_file(path);
    }
    let (tokenizer_json, dir) = if path.is_dir() {
        (path.join("tokenizer.json"), path.to_path_buf())
    } else {
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        (path.to_path_buf(), dir)
    };
    if !tokenizer_json.is_file() {
        return Err(TokenizerError::NotFound(path.to_path_buf()));
    }
    let invalid = |message: String| TokenizerError::InvalidFile {
        path: tokenizer_json.clone(),
        message,
    };
    let mut inner =
        tokenizers::Tokenizer::from_file(&tokenizer_json).map_err(|e| invalid(e.to_string()))?;
    // Some tokenizer.json files carry the truncation/padding of a training setup; a server must
    // never cut or pad a prompt behind the user's back.
    inner
        .with_truncation(None)
        .map_err(|e| invalid(e.to_string()))?
        .with_padding(None);

    let config = read_json(&dir.join("tokenizer_config.json"))?;
    let generation = read_json(&dir.join("generation_config.json"))?;
    let token_id = |name: &str| -> Option<u32> {
        let text = config.as_ref().and_then(|c| token_text(c.get(name)?))?;
        inner.token_to_id(&text)
    };

    let bos_token_id = token_id("bos_token").or_else(|| {
        generation
            .as_ref()
            .and_then(|g| g.get("bos_token_id")?.as_u64())
            .and_then(|id| u32::try_from(id).ok())
    });
    let mut eos_token_ids: Vec<u32> = Vec::new();
    if let Some(id) = token_id("eos_token") {
        eos_token_ids.push(id);
    }
    if let Some(ids) = generation.as_ref().and_then(|g| g.get("eos_token_id")) {
        let ids: Vec<u64> = match ids {
            serde_json::Value::Array(items) => items.iter().filter_map(|v| v.as_u64()).collect(),
            other => other.as_u64().into_iter().collect(),
        };
        for id in ids.into_iter().filter_map(|id| u32::try_from(id).ok()) {
            if !eos_token_ids.contains(&id) {
                eos_token_ids.push(id);
            }
        }
    }

    let special_ids: HashSet<u32> = inner
        .get_added_tokens_decoder()
        .into_iter()
        .filter(|(_, token)| token.special)
        .map(|(id, _)| id)
        .collect();

    let bos_text = config
        .as_ref()
        .and_then(|c| token_text(c.get("bos_token")?));
    let eos_text = config
        .as_ref()
        .and_then(|c| token_text(c.get("eos_token")?));
    let chat_template = find_chat_template(&dir, config.as_ref())?
        .map(|source| ChatTemplate::new(&source, bos_text, eos_text))
        .transpose()?;

    Ok(Tokenizer {
        inner,
        manual_bos: None,
        manual_eos: None,
        bos_token_id,
        eos_token_ids,
        special_ids,
        chat_template,
    })
}

fn from_gguf_file(path: &Path) -> Result<Tokenizer, TokenizerError> {
    let io_error = |source| TokenizerError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io_error)?;
    let content = candle_core::quantized::gguf_file::Content::read(&mut BufReader::new(file))
        .map_err(|e| TokenizerError::InvalidFile {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    Tokenizer::from_gguf(&content)
}

/// A special token as tokenizer_config.json writes it: a string or `{"content": ...}`.
fn token_text(value: &serde_json::Value) -> Option<String> {
    match value {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(fields) => fields.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}

/// The chat template: `chat_template.jinja`, then `chat_template.json`, then the one in
/// `tokenizer_config.json` (the order transformers uses).
fn find_chat_template(
    dir: &Path,
    config: Option<&serde_json::Value>,
) -> Result<Option<String>, TokenizerError> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        return std::fs::read_to_string(&jinja)
            .map(Some)
            .map_err(|source| TokenizerError::Io {
                path: jinja,
                source,
            });
    }
    if let Some(value) = read_json(&dir.join("chat_template.json"))?
        && let Some(template) = template_from_config(&value)
    {
        return Ok(Some(template));
    }
    Ok(config.and_then(template_from_config))
}

/// Reads an optional JSON file: `None` when it does not exist.
fn read_json(path: &PathBuf) -> Result<Option<serde_json::Value>, TokenizerError> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|source| TokenizerError::Io {
        path: path.clone(),
        source,
    })?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| TokenizerError::InvalidFile {
            path: path.clone(),
            message: e.to_string(),
        })
}
