//! Tests against the real SmolLM2 GGUF (fetched with `scripts/fetch-model.sh`; set
//! `SGL_TEST_GGUF` to use another copy) and llama.cpp's tokenizations of it.

use std::sync::{Arc, OnceLock};

use serde_json::json;

use super::*;

fn gguf_path() -> String {
    std::env::var("SGL_TEST_GGUF").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../.cache/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
        )
        .to_string()
    })
}

/// The SmolLM2 tokenizer, loaded once; `None` (and the test skips) without the model file.
/// Also used by the grammar tests.
pub(crate) fn smollm2() -> Option<Arc<Tokenizer>> {
    static TOKENIZER: OnceLock<Option<Arc<Tokenizer>>> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| {
            let path = gguf_path();
            if !std::path::Path::new(&path).is_file() {
                eprintln!("skipping: no GGUF at {path} (run scripts/fetch-model.sh)");
                return None;
            }
            let tokenizer =
                Tokenizer::from_dir_or_file(std::path::Path::new(&path)).expect("load tokenizer");
            Some(Arc::new(tokenizer))
        })
        .clone()
}

#[test]
fn tokenizer_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tokenizer>();
    assert_send_sync::<ChatTemplate>();
    assert_send_sync::<DecodeStream>();
}

#[test]
fn smollm2_metadata() {
    let Some(tok) = smollm2() else { return };
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(tok.bos_token_id(), Some(1));
    assert_eq!(tok.eos_token_ids().first(), Some(&2));
    assert!(
        tok.eos_token_ids().contains(&0),
        "<|endoftext|> ends generation too"
    );
    assert_eq!(tok.token_to_id("<|im_start|>"), Some(1));
    assert_eq!(tok.id_to_token(2).as_deref(), Some("<|im_end|>"));
    assert!(tok.is_special(1));
    assert!(!tok.is_special(17));
    assert!(tok.chat_template().is_some());
}

#[test]
fn smollm2_special_tokens_encode_whole_and_no_bos() {
    let Some(tok) = smollm2() else { return };
    assert_eq!(tok.encode("<|im_start|>", true).expect("encode"), vec![1]);
    let ids = tok
        .encode("<|im_start|>user\nHi<|im_end|>", true)
        .expect("encode");
    assert_eq!(ids.first(), Some(&1));
    assert_eq!(ids.last(), Some(&2));
    assert_eq!(
        tok.decode(&ids, false).expect("decode"),
        "<|im_start|>user\nHi<|im_end|>"
    );
    assert_eq!(tok.decode(&ids, true).expect("decode"), "user\nHi");
}

fn reference() -> serde_json::Value {
    let text = include_str!("../../tests/data/tokenizer/smollm2_reference.json");
    serde_json::from_str(text).expect("reference JSON parses")
}

fn ids_of(value: &serde_json::Value) -> Vec<u32> {
    value
        .as_array()
        .expect("ids array")
        .iter()
        .map(|v| v.as_u64().expect("id") as u32)
        .collect()
}

/// Our encoding equals llama.cpp's for every reference string, and decodes back.
#[test]
fn smollm2_matches_llama_cpp() {
    let Some(tok) = smollm2() else { return };
    let reference = reference();
    let cases = reference["encodings"].as_array().expect("encodings");
    assert!(cases.len() >= 30);
    let mut failures = Vec::new();
    for case in cases {
        let text = case["text"].as_str().expect("text");
        let expected = ids_of(&case["ids"]);
        let ids = tok.encode(text, true).expect("encode");
        if ids != expected {
            failures.push(format!(
                "{text:?}\n  ours:      {ids:?}\n  llama.cpp: {expected:?}"
            ));
            continue;
        }
        let decoded = tok.decode(&ids, false).expect("decode");
        assert_eq!(
            decoded,
            case["decoded"].as_str().expect("decoded"),
            "decode of {text:?}"
        );
        assert_eq!(decoded, text, "round trip of {text:?}");
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn smollm2_chat_template_matches_reference() {
    let Some(tok) = smollm2() else { return };
    let template = tok.chat_template().expect("SmolLM2 has a chat template");
    let reference = reference();
    let chats = reference["chats"].as_object().expect("chats");
    for name in [
        "system_and_user",
        "user_only",
        "multi_turn",
        "multi_turn_generation_prompt",
    ] {
        let chat = &chats[name];
        let messages = chat["messages"].as_array().expect("messages");
        let add_generation_prompt = chat["add_generation_prompt"].as_bool().expect("flag");
        let rendered = template
            .render(messages, add_generation_prompt, None)
            .expect("render");
        assert_eq!(
            rendered,
            chat["rendered"].as_str().expect("rendered"),
            "{name}"
        );
        assert_eq!(
            tok.encode(&rendered, true).expect("encode"),
            ids_of(&chat["ids"]),
            "{name}"
        );
    }
}

#[test]
fn smollm2_template_inserts_default_system_prompt() {
    let Some(tok) = smollm2() else { return };
    let template = tok.chat_template().expect("template");
    let out = template
        .render(&[json!({"role": "user", "content": "Hi"})], true, None)
        .expect("render");
    assert_eq!(
        out,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let without_prompt = template
        .render(&[json!({"role": "user", "content": "Hi"})], false, None)
        .expect("render");
    assert!(without_prompt.ends_with("<|im_start|>user\nHi<|im_end|>\n"));
}

#[test]
fn content_parts_are_joined_for_string_templates() {
    let Some(tok) = smollm2() else { return };
    let template = tok.chat_template().expect("template");
    let parts = json!({"role": "user", "content": [
        {"type": "text", "text": "Hello"},
        {"type": "text", "text": "there"}
    ]});
    let out = template
        .render(
            &[json!({"role": "system", "content": "S"}), parts],
            false,
            None,
        )
        .expect("render");
    assert_eq!(
        out,
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHello there<|im_end|>\n"
    );
}

#[test]
fn raise_exception_becomes_template_error() {
    let template = ChatTemplate::new(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}ok",
        None,
        None,
    )
    .expect("compiles");
    let err = template
        .render(&[json!({"role": "assistant", "content": "x"})], false, None)
        .expect_err("raises");
    match err {
        TokenizerError::Template(message) => {
            assert_eq!(message, "Conversation must start with user")
        }
        other => panic!("unexpected error {other:?}"),
    }
    let ok = template
        .render(&[json!({"role": "user", "content": "x"})], false, None)
        .expect("renders");
    assert_eq!(ok, "ok");
}

#[test]
fn syntax_errors_name_the_problem() {
    let err = ChatTemplate::new("{% for m in messages %}{{ m.content }}", None, None)
        .expect_err("unclosed for");
    let message = err.to_string();
    assert!(message.contains("chat template"), "{message}");
}

#[test]
fn hf_template_features() {
    // Python string methods, loop controls, tojson, bos/eos, tools, trim/lstrip blocks,
    // tool-call arguments given as a JSON string, strftime_now.
    let source = r#"{{ bos_token }}
{% for m in messages %}
    {% if m.role == 'system' %}{% continue %}{% endif %}
    {{ m.role.upper() }}: {{ m.content.strip() }}{% if m.content.startswith('Q') %} (question){% endif %}

    {% if m.tool_calls %}{% for c in m.tool_calls %}{{ c.function.name }}({{ c.function.arguments | tojson }}) city={{ c.function.arguments.city }}
{% endfor %}{% endif %}
{% endfor %}
{% if tools %}TOOLS={{ tools | tojson }}
{% endif %}
{{ eos_token }}|{{ strftime_now('%Y') | length }}|{{ 'a,b'.split(',') | join('+') }}"#;
    let template =
        ChatTemplate::new(source, Some("<s>".into()), Some("</s>".into())).expect("compiles");
    let messages = [
        json!({"role": "system", "content": "skip me"}),
        json!({"role": "user", "content": "  Question?  "}),
        json!({"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "weather", "arguments": "{\"city\": \"Zürich\"}"}}
        ]}),
    ];
    // Keys in sorted order: serde_json (without its preserve_order feature) sorts them.
    let tools = [json!({"function": {"name": "weather"}, "type": "function"})];
    let out = template
        .render(&messages, true, Some(&tools))
        .expect("renders");
    // Jinja2 with transformers' settings renders exactly this (see make_reference.py).
    assert_eq!(
        out,
        "<s>\n    USER: Question?\n    ASSISTANT: \nweather({\"city\": \"Zürich\"}) city=Zürich\n\
         TOOLS=[{\"function\": {\"name\": \"weather\"}, \"type\": \"function\"}]\n</s>|4|a+b"
    );
    // Without tools the template sees none, not undefined.
    let none = ChatTemplate::new("{{ tools is none }}", None, None).expect("compiles");
    assert_eq!(none.render(&[], false, None).expect("renders"), "True");
}

#[test]
fn chat_template_from_file_and_inline() {
    let Some(tok) = smollm2() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("template.jinja");
    std::fs::write(
        &path,
        "{% for m in messages %}[{{ m.role }}] {{ m.content }}{{ eos_token }}\n{% endfor %}",
    )
    .expect("write");
    let template = tok
        .load_chat_template(path.to_str().expect("utf-8 path"))
        .expect("load");
    let mut tok = (*tok).clone();
    tok.set_chat_template(template);
    let out = tok
        .chat_template()
        .expect("set")
        .render(&[json!({"role": "user", "content": "Hi"})], true, None)
        .expect("render");
    assert_eq!(out, "[user] Hi<|im_end|>\n");

    let inline = tok
        .load_chat_template("{{ messages[0].content }}")
        .expect("inline");
    assert_eq!(
        inline
            .render(&[json!({"role": "user", "content": "x"})], false, None)
            .expect("render"),
        "x"
    );
    let missing = tok
        .load_chat_template("/no/such/template.jinja")
        .expect_err("missing");
    assert!(missing.to_string().contains("does not exist"), "{missing}");
}

fn stream_all(tok: &Arc<Tokenizer>, ids: &[u32], skip_special_tokens: bool) -> Vec<String> {
    let mut stream = DecodeStream::new(tok.clone(), skip_special_tokens);
    let mut chunks: Vec<String> = ids
        .iter()
        .map(|&id| stream.step(id).expect("step"))
        .collect();
    chunks.push(stream.flush());
    chunks
}

#[test]
fn decode_stream_concatenates_to_decode() {
    let Some(tok) = smollm2() else { return };
    let texts = [
        "emoji: 😀🎉👍🏽 family 👨‍👩‍👧 done",
        "中文测试：你好，世界！日本語のテキスト 한국어",
        "Café crème brûlée — “quotes” … 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝑥²",
        "def f(x):\n    return x  +  1\n\n\n",
        "<|im_start|>assistant\nHello there!<|im_end|>",
    ];
    for text in texts {
        let ids = tok.encode(text, false).expect("encode");
        for skip in [false, true] {
            let chunks = stream_all(&tok, &ids, skip);
            for chunk in &chunks {
                assert!(
                    !chunk.contains('\u{FFFD}'),
                    "replacement char in {chunk:?} of {text:?}"
                );
            }
            assert_eq!(
                chunks.concat(),
                tok.decode(&ids, skip).expect("decode"),
                "{text:?}"
            );
        }
    }
}

#[test]
fn decode_stream_holds_split_characters() {
    let Some(tok) = smollm2() else { return };
    // "😀" is F0 9F 98 80; encode it as four single-byte tokens so every step but the last
    // holds an incomplete character.
    let byte_ids: Vec<u32> = "😀".bytes().map(|b| byte_token_id(&tok, b)).collect();
    let mut stream = DecodeStream::new(tok.clone(), false);
    let hi = tok.encode("Hi", false).expect("encode");
    assert_eq!(stream.step(hi[0]).expect("step"), "Hi");
    for &id in &byte_ids[..3] {
        assert_eq!(stream.step(id).expect("step"), "");
    }
    assert_eq!(stream.step(byte_ids[3]).expect("step"), "😀");
    assert_eq!(stream.flush(), "");

    // Generation that stops mid-character: flush gives what is pending, lossily.
    let mut stream = DecodeStream::new(tok.clone(), false);
    assert_eq!(stream.step(byte_ids[0]).expect("step"), "");
    assert_eq!(stream.step(byte_ids[1]).expect("step"), "");
    assert_eq!(stream.flush(), "\u{FFFD}");
}

/// The id of the byte-level token for one byte (GPT-2's byte-to-character table).
fn byte_token_id(tok: &Tokenizer, byte: u8) -> u32 {
    byte_token(tok, byte).expect("byte token in vocab")
}

/// SmolLM2's vocabulary lacks a few byte tokens (0xC0, 0xF5..=0xFF, some controls...).
fn byte_token(tok: &Tokenizer, byte: u8) -> Option<u32> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let c = if printable(byte) {
        char::from(byte)
    } else {
        let offset = (0..byte).filter(|&b| !printable(b)).count() as u32;
        char::from_u32(256 + offset)?
    };
    tok.token_to_id(&c.to_string())
}

/// A Hugging Face folder for SmolLM2: tokenizer.json in the layout of the model's own file
/// (digits split one by one, then GPT-2's byte-level regex), tokenizer_config.json and
/// generation_config.json. Built from the GGUF vocabulary, as no model hub is reachable.
fn write_hf_folder(tok: &Tokenizer, dir: &std::path::Path) {
    let mut json: serde_json::Value =
        serde_json::from_str(&tok.inner().to_string(false).expect("serialize")).expect("json");
    json["pre_tokenizer"] = json!({"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": true},
        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
    ]});
    // Training leftovers that must not reach serving.
    json["truncation"] =
        json!({"direction": "Right", "max_length": 4, "strategy": "LongestFirst", "stride": 0});
    json["post_processor"] = json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true});
    std::fs::write(dir.join("tokenizer.json"), json.to_string()).expect("write tokenizer.json");
    let template = tok.chat_template().expect("template").source();
    let config = json!({
        "add_prefix_space": false,
        "bos_token": "<|im_start|>",
        "eos_token": {"content": "<|im_end|>", "special": true},
        "pad_token": "<|im_end|>",
        "chat_template": template,
        "tokenizer_class": "GPT2Tokenizer"
    });
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).expect("write config");
    let generation = json!({"bos_token_id": 1, "eos_token_id": [2, 0], "pad_token_id": 2});
    std::fs::write(dir.join("generation_config.json"), generation.to_string()).expect("write");
}

#[test]
fn hf_folder_tokenizes_like_llama_cpp() {
    let Some(gguf_tok) = smollm2() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    write_hf_folder(&gguf_tok, dir.path());
    for path in [dir.path().to_path_buf(), dir.path().join("tokenizer.json")] {
        let tok = Tokenizer::from_dir_or_file(&path).expect("load HF folder");
        assert_eq!(tok.vocab_size(), 49152);
        assert_eq!(tok.bos_token_id(), Some(1));
        assert_eq!(tok.eos_token_ids(), &[2, 0]);
        assert!(tok.is_special(2) && !tok.is_special(100));
        let reference = reference();
        for case in reference["encodings"].as_array().expect("encodings") {
            let text = case["text"].as_str().expect("text");
            let ids = tok.encode(text, true).expect("encode");
            assert_eq!(ids, ids_of(&case["ids"]), "{text:?}");
            assert_eq!(tok.decode(&ids, false).expect("decode"), text);
        }
        let chat = &reference["chats"]["user_only"];
        let rendered = tok
            .chat_template()
            .expect("template from tokenizer_config.json")
            .render(chat["messages"].as_array().expect("messages"), true, None)
            .expect("render");
        assert_eq!(rendered, chat["rendered"].as_str().expect("rendered"));
    }

    // chat_template.jinja beside tokenizer.json takes precedence over tokenizer_config.json.
    std::fs::write(dir.path().join("chat_template.jinja"), "{{ eos_token }}").expect("write");
    let tok = Tokenizer::from_dir_or_file(dir.path()).expect("load");
    let out = tok
        .chat_template()
        .expect("template")
        .render(&[], false, None)
        .expect("render");
    assert_eq!(out, "<|im_end|>");
}

#[test]
fn missing_or_broken_files_give_clear_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = Tokenizer::from_dir_or_file(dir.path()).expect_err("empty folder");
    assert!(matches!(err, TokenizerError::NotFound(_)), "{err}");
    assert!(err.to_string().contains("tokenizer.json"), "{err}");

    std::fs::write(dir.path().join("tokenizer.json"), "{not json").expect("write");
    let err = Tokenizer::from_dir_or_file(dir.path()).expect_err("broken file");
    assert!(matches!(err, TokenizerError::InvalidFile { .. }), "{err}");

    let gguf = dir.path().join("model.gguf");
    std::fs::write(&gguf, b"not a gguf").expect("write");
    let err = Tokenizer::from_dir_or_file(&gguf).expect_err("broken gguf");
    assert!(err.to_string().contains("model.gguf"), "{err}");
}

/// A SentencePiece ("llama") GGUF vocabulary: byte fallback, score-ordered merges, BOS added,
/// space prefix, user-defined and control tokens; ids from llama.cpp (`make_tiny_spm.py`).
#[test]
fn sentencepiece_gguf_matches_llama_cpp() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/tokenizer/tiny_spm.gguf"
    );
    let tok = Tokenizer::from_dir_or_file(std::path::Path::new(path)).expect("load tiny_spm.gguf");
    assert_eq!(tok.bos_token_id(), Some(1));
    assert_eq!(tok.eos_token_ids().first(), Some(&2));
    let reference: serde_json::Value = serde_json::from_str(include_str!(
        "../../tests/data/tokenizer/tiny_spm_reference.json"
    ))
    .expect("reference JSON");
    let mut failures = Vec::new();
    for case in reference["encodings"].as_array().expect("encodings") {
        let text = case["text"].as_str().expect("text");
        let expected = ids_of(&case["ids"]);
        let ids = tok.encode(text, true).expect("encode");
        if ids != expected {
            failures.push(format!(
                "{text:?}\n  ours:      {ids:?}\n  llama.cpp: {expected:?}"
            ));
            continue;
        }
        let decoded = tok.decode(&ids, false).expect("decode");
        assert_eq!(
            decoded,
            case["decoded"].as_str().expect("decoded"),
            "{text:?}"
        );
        let without_special = tok.decode(&ids, true).expect("decode");
        // A space prefix goes before the text after each added token, as in llama.cpp, so
        // only plain text round-trips exactly.
        if !text.contains("<|") {
            assert_eq!(without_special, text, "{text:?}");
        }

        let tok = Arc::new(tok.clone());
        let chunks = stream_all(&tok, &ids, true);
        assert_eq!(chunks.concat(), without_special, "streamed {text:?}");
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

mod streaming_properties {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Any text, one byte-level token per byte (every multi-byte character split):
        /// the chunks carry no U+FFFD and add up to the text.
        #[test]
        fn byte_tokens_stream_back_to_the_text(text in "\\PC{0,24}") {
            let Some(tok) = smollm2() else { return Ok(()) };
            let text: String = text
                .chars()
                // U+FFFD itself is held until the next token, like an incomplete character.
                .filter(|&c| c != char::REPLACEMENT_CHARACTER)
                .filter(|c| c.to_string().bytes().all(|b| byte_token(&tok, b).is_some()))
                .collect();
            let ids: Vec<u32> = text.bytes().filter_map(|b| byte_token(&tok, b)).collect();
            let chunks = stream_all(&tok, &ids, false);
            let clean = chunks.iter().all(|c| !c.contains(char::REPLACEMENT_CHARACTER));
            prop_assert!(clean, "replacement character in {:?}", chunks);
            prop_assert_eq!(chunks.concat(), text);
        }

        /// Arbitrary bytes, valid UTF-8 or not, mixed with whole-word and special tokens:
        /// the stream adds up to what decoding all ids at once gives.
        #[test]
        fn any_ids_stream_to_decode(
            pieces in proptest::collection::vec(
                prop_oneof![any::<u8>().prop_map(Some), Just(None)], 0..40),
            skip in any::<bool>(),
        ) {
            let Some(tok) = smollm2() else { return Ok(()) };
            // None stands for a few fixed non-byte tokens: a word, a space run, a special.
            let extra = [905u32, 333, 2];
            let ids: Vec<u32> = pieces
                .iter()
                .enumerate()
                .filter_map(|(i, p)| match p {
                    Some(b) => byte_token(&tok, *b),
                    None => Some(extra[i % extra.len()]),
                })
                .collect();
            let chunks = stream_all(&tok, &ids, skip);
            prop_assert_eq!(chunks.concat(), tok.decode(&ids, skip).expect("decode"));
        }
    }
}
