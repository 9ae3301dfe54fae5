//! Test repositories: a tiny Llama checkpoint in safetensors (random weights, SmolLM2's real
//! tokenizer), sharded with an index, and a GGUF repository around the real SmolLM2 file.

use std::collections::HashMap;
use std::path::Path;

use safetensors::Dtype;
use safetensors::tensor::TensorView;
use serde_json::json;

pub const HIDDEN: usize = 128;
pub const FFN: usize = 256;
pub const LAYERS: usize = 2;
pub const HEADS: usize = 4;
pub const KV_HEADS: usize = 2;

/// Deterministic small values (a linear congruential generator), as bf16 bytes.
fn random_bf16(n: usize, seed: u64, scale: f32) -> Vec<u8> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut out = Vec::with_capacity(n * 2);
    for _ in 0..n {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let u = ((s >> 33) as f64 / (1u64 << 31) as f64) as f32; // [0, 1)
        out.extend_from_slice(&half::bf16::from_f32((u * 2.0 - 1.0) * scale).to_le_bytes());
    }
    out
}

fn ones_bf16(n: usize) -> Vec<u8> {
    half::bf16::from_f32(1.0).to_le_bytes().repeat(n)
}

/// Write a Hugging Face folder of a 2-layer Llama with random weights, SmolLM2's tokenizer
/// (taken from its GGUF), two safetensors shards and their index, plus files the engine does
/// not need (README, a PyTorch pickle) that a download must skip.
pub fn write_tiny_llama(dir: &Path, gguf: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let mut f = std::fs::File::open(gguf).unwrap();
    let content = candle_core::quantized::gguf_file::Content::read(&mut f).unwrap();
    let tok = sgl_core::tokenizer::Tokenizer::from_gguf(&content).unwrap();
    tok.inner().save(dir.join("tokenizer.json"), false).unwrap();
    let vocab = tok.vocab_size();
    let eos = tok.token_to_id("<|im_end|>").unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        json!({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}).to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.join("generation_config.json"),
        json!({"eos_token_id": eos}).to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.join("config.json"),
        json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": HIDDEN,
            "intermediate_size": FFN,
            "num_hidden_layers": LAYERS,
            "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS,
            "vocab_size": vocab,
            "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "tie_word_embeddings": true,
            "torch_dtype": "bfloat16",
        })
        .to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.join("README.md"),
        "# tiny-llama\nRandom weights for tests.\n",
    )
    .unwrap();
    std::fs::write(dir.join("pytorch_model.bin"), vec![7u8; 4096]).unwrap();

    let head_dim = HIDDEN / HEADS;
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>, usize)> = Vec::new();
    let mut seed = 1;
    let mut add = |name: String, shape: Vec<usize>, data: Vec<u8>, shard: usize| {
        tensors.push((name, shape, data, shard));
    };
    add(
        "model.embed_tokens.weight".into(),
        vec![vocab, HIDDEN],
        random_bf16(vocab * HIDDEN, 99, 0.5),
        1,
    );
    for i in 0..LAYERS {
        let shard = 1 + i % 2;
        let p = |s: &str| format!("model.layers.{i}.{s}");
        for (name, rows, cols) in [
            ("self_attn.q_proj.weight", HEADS * head_dim, HIDDEN),
            ("self_attn.k_proj.weight", KV_HEADS * head_dim, HIDDEN),
            ("self_attn.v_proj.weight", KV_HEADS * head_dim, HIDDEN),
            ("self_attn.o_proj.weight", HIDDEN, HEADS * head_dim),
            ("mlp.gate_proj.weight", FFN, HIDDEN),
            ("mlp.up_proj.weight", FFN, HIDDEN),
            ("mlp.down_proj.weight", HIDDEN, FFN),
        ] {
            seed += 1;
            add(
                p(name),
                vec![rows, cols],
                random_bf16(rows * cols, seed, 0.08),
                shard,
            );
        }
        add(
            p("input_layernorm.weight"),
            vec![HIDDEN],
            ones_bf16(HIDDEN),
            shard,
        );
        add(
            p("post_attention_layernorm.weight"),
            vec![HIDDEN],
            ones_bf16(HIDDEN),
            shard,
        );
    }
    add(
        "model.norm.weight".into(),
        vec![HIDDEN],
        ones_bf16(HIDDEN),
        2,
    );

    let shard_name = |s: usize| format!("model-{s:05}-of-00002.safetensors");
    let mut weight_map = serde_json::Map::new();
    let mut total = 0usize;
    for shard in 1..=2 {
        let views: Vec<(String, TensorView)> = tensors
            .iter()
            .filter(|t| t.3 == shard)
            .map(|(name, shape, data, _)| {
                (
                    name.clone(),
                    TensorView::new(Dtype::BF16, shape.clone(), data).unwrap(),
                )
            })
            .collect();
        for (name, _) in &views {
            weight_map.insert(name.clone(), json!(shard_name(shard)));
        }
        total += tensors
            .iter()
            .filter(|t| t.3 == shard)
            .map(|t| t.2.len())
            .sum::<usize>();
        let meta: Option<HashMap<String, String>> =
            Some([("format".to_string(), "pt".to_string())].into());
        safetensors::serialize_to_file(views, meta, &dir.join(shard_name(shard))).unwrap();
    }
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        json!({"metadata": {"total_size": total}, "weight_map": weight_map}).to_string(),
    )
    .unwrap();
}
