//! FP8 checkpoints as the Hub publishes them (compressed-tensors, fbgemm_fp8), read on the
//! CPU: the e4m3 weights times their scales must be exactly the values a float checkpoint of
//! the same numbers gives, so the logits are the same bits. The FP8 bytes here are written by
//! this test's own encoder (nearest e4m3 value, ties to the even code), independent of the
//! engine's code. Other quantization schemes are refused by name before any tensor is read.
//! KV-cache scales (`kv_cache_scheme`) are read with an FP8 KV cache, which only the GPU has:
//! the CPU serves such a checkpoint with its f32 cache and leaves the scales unused.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use safetensors::Dtype;
use safetensors::tensor::TensorView;
use serde_json::{Value, json};
use sgl_core::backend::cpu::CpuBackend;
use sgl_core::backend::{Backend, SeqInput};

const HIDDEN: usize = 128;
const FFN: usize = 256;
const LAYERS: usize = 2;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;

/// The 126 finite positive e4m3 values by code (code 0x7f is NaN), built from the bit fields.
fn e4m3_table() -> Vec<f32> {
    (0u32..0x7f)
        .map(|c| {
            let (e, m) = (c >> 3, c & 7);
            if e == 0 {
                m as f32 / 512.0
            } else {
                f32::from_bits(((e + 120) << 23) | (m << 20))
            }
        })
        .collect()
}

/// The code of the e4m3 value nearest to `x` (ties to the even code), saturating at ±448.
fn encode(table: &[f32], x: f32) -> u8 {
    let a = x.abs();
    let mut best = 0usize;
    for (c, &v) in table.iter().enumerate() {
        let (d, db) = ((v - a).abs(), (table[best] - a).abs());
        if d < db || (d == db && c % 2 == 0) {
            best = c;
        }
    }
    best as u8 | if x < 0.0 { 0x80 } else { 0 }
}

fn decode(table: &[f32], c: u8) -> f32 {
    let v = table[(c & 0x7f) as usize];
    if c & 0x80 != 0 { -v } else { v }
}

/// Deterministic values in (-scale, scale).
fn random(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(1);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = ((s >> 33) as f64 / (1u64 << 31) as f64) as f32;
            (u * 2.0 - 1.0) * scale
        })
        .collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
        .collect()
}

/// How the FP8 folder stores its scales.
#[derive(Clone, Copy)]
enum Scales {
    /// compressed-tensors, one bf16 scale per output row (`[out, 1]`), dynamic activations.
    ChannelBf16,
    /// fbgemm_fp8's layout but one f32 scale per tensor (`[1]`), with a static input scale.
    TensorF32,
}

struct Tensors(Vec<(String, Dtype, Vec<usize>, Vec<u8>)>);

impl Tensors {
    fn add(&mut self, name: String, dtype: Dtype, shape: Vec<usize>, data: Vec<u8>) {
        self.0.push((name, dtype, shape, data));
    }

    fn write(&self, path: &Path) {
        let views: Vec<(String, TensorView)> = self
            .0
            .iter()
            .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        let meta: Option<HashMap<String, String>> =
            Some([("format".to_string(), "pt".to_string())].into());
        safetensors::serialize_to_file(views, meta, path).unwrap();
    }
}

/// Two folders of one tiny Llama (SmolLM2's tokenizer): `fp8` with e4m3 linear weights and
/// their scales, `reference` with those weights' values in f32. Returns (fp8, reference).
/// A `quant_config` with a `kv_cache_scheme` also gets each layer's KV-cache scales
/// (`self_attn.k_scale` 0.05, `v_scale` 3.0) in the FP8 folder.
fn write_pair(root: &Path, scales: Scales, quant_config: Value) -> (PathBuf, PathBuf) {
    let table = e4m3_table();
    let (fp8_dir, ref_dir) = (root.join("fp8"), root.join("reference"));
    let mut f = std::fs::File::open(common::model_path()).unwrap();
    let content = candle_core::quantized::gguf_file::Content::read(&mut f).unwrap();
    let tok = sgl_core::tokenizer::Tokenizer::from_gguf(&content).unwrap();
    let vocab = tok.vocab_size();
    let config = json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": HIDDEN, "intermediate_size": FFN, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "vocab_size": vocab,
        "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    });
    for (dir, quantized) in [(&fp8_dir, true), (&ref_dir, false)] {
        std::fs::create_dir_all(dir).unwrap();
        tok.inner().save(dir.join("tokenizer.json"), false).unwrap();
        std::fs::write(
            dir.join("tokenizer_config.json"),
            json!({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}).to_string(),
        )
        .unwrap();
        let mut c = config.clone();
        if quantized {
            c["quantization_config"] = quant_config.clone();
        }
        std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
    }
    let (mut fp8, mut reference) = (Tensors(Vec::new()), Tensors(Vec::new()));
    let embed = bf16_bytes(&random(vocab * HIDDEN, 7, 0.5));
    for t in [&mut fp8, &mut reference] {
        t.add(
            "model.embed_tokens.weight".into(),
            Dtype::BF16,
            vec![vocab, HIDDEN],
            embed.clone(),
        );
        t.add(
            "model.norm.weight".into(),
            Dtype::BF16,
            vec![HIDDEN],
            bf16_bytes(&vec![1.0; HIDDEN]),
        );
    }
    let head_dim = HIDDEN / HEADS;
    let mut seed = 10;
    let kv_scales = quant_config["kv_cache_scheme"].is_object();
    for i in 0..LAYERS {
        if kv_scales {
            for (name, scale) in [("k_scale", 0.05f32), ("v_scale", 3.0)] {
                fp8.add(
                    format!("model.layers.{i}.self_attn.{name}"),
                    Dtype::F32,
                    vec![1],
                    f32_bytes(&[scale]),
                );
            }
        }
        for norm in ["input_layernorm", "post_attention_layernorm"] {
            let ones = bf16_bytes(
                &random(HIDDEN, seed, 0.2)
                    .iter()
                    .map(|v| 1.0 + v)
                    .collect::<Vec<_>>(),
            );
            seed += 1;
            for t in [&mut fp8, &mut reference] {
                t.add(
                    format!("model.layers.{i}.{norm}.weight"),
                    Dtype::BF16,
                    vec![HIDDEN],
                    ones.clone(),
                );
            }
        }
        for (name, rows, cols) in [
            ("self_attn.q_proj", HEADS * head_dim, HIDDEN),
            ("self_attn.k_proj", KV_HEADS * head_dim, HIDDEN),
            ("self_attn.v_proj", KV_HEADS * head_dim, HIDDEN),
            ("self_attn.o_proj", HIDDEN, HEADS * head_dim),
            ("mlp.gate_proj", FFN, HIDDEN),
            ("mlp.up_proj", FFN, HIDDEN),
            ("mlp.down_proj", HIDDEN, FFN),
        ] {
            seed += 1;
            // Rows of different magnitudes, so per-row scales differ.
            let mut w = random(rows * cols, seed, 0.1);
            for (r, row) in w.chunks_mut(cols).enumerate() {
                row.iter_mut()
                    .for_each(|v| *v *= 0.25 + (r % 7) as f32 * 0.3);
            }
            let amax = |v: &[f32]| v.iter().fold(0f32, |m, x| m.max(x.abs()));
            let row_scales: Vec<f32> = match scales {
                Scales::ChannelBf16 => w
                    .chunks(cols)
                    // rounded to bf16 first: the checkpoint stores the scale in bf16
                    .map(|r| half::bf16::from_f32(amax(r) / 448.0).to_f32())
                    .collect(),
                Scales::TensorF32 => vec![amax(&w) / 448.0; rows],
            };
            let mut codes = Vec::with_capacity(w.len());
            let mut values = Vec::with_capacity(w.len());
            for (row, &s) in w.chunks(cols).zip(&row_scales) {
                for &x in row {
                    let c = encode(&table, x / s);
                    codes.push(c);
                    values.push(decode(&table, c) * s);
                }
            }
            let p = format!("model.layers.{i}.{name}");
            fp8.add(
                format!("{p}.weight"),
                Dtype::F8_E4M3,
                vec![rows, cols],
                codes,
            );
            match scales {
                Scales::ChannelBf16 => fp8.add(
                    format!("{p}.weight_scale"),
                    Dtype::BF16,
                    vec![rows, 1],
                    bf16_bytes(&row_scales),
                ),
                Scales::TensorF32 => {
                    fp8.add(
                        format!("{p}.weight_scale"),
                        Dtype::F32,
                        vec![1],
                        f32_bytes(&row_scales[..1]),
                    );
                    fp8.add(
                        format!("{p}.input_scale"),
                        Dtype::F32,
                        vec![1],
                        f32_bytes(&[0.02]),
                    );
                }
            }
            reference.add(
                format!("{p}.weight"),
                Dtype::F32,
                vec![rows, cols],
                f32_bytes(&values),
            );
        }
    }
    fp8.write(&fp8_dir.join("model.safetensors"));
    reference.write(&ref_dir.join("model.safetensors"));
    (fp8_dir, ref_dir)
}

fn compressed_tensors() -> Value {
    json!({
        "quant_method": "compressed-tensors", "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {"type": "float", "num_bits": 8, "strategy": "channel",
                        "symmetric": true, "dynamic": false, "observer": "minmax"},
            "input_activations": {"type": "float", "num_bits": 8, "strategy": "token",
                                  "symmetric": true, "dynamic": true},
            "output_activations": null}},
        "ignore": ["lm_head"], "kv_cache_scheme": null,
    })
}

/// Logits of every step of a greedy run: the prompt, then `steps` generated tokens.
fn greedy_logits(dir: &Path, prompt: &[u32], steps: usize) -> Vec<Vec<f32>> {
    let model = sgl_core::model::load(dir).unwrap();
    let mut backend = CpuBackend::with_capacity(&model, 256, 256).unwrap();
    let (mut tokens, mut start) = (prompt.to_vec(), 0);
    let mut out = Vec::new();
    for _ in 0..steps {
        let slots: Vec<u32> = (0..(start + tokens.len()) as u32).collect();
        let logits = backend
            .forward(&[SeqInput {
                tokens: &tokens,
                start_pos: start,
                kv_slots: &slots,
                num_logits: 1,
                prompt: true,
            }])
            .unwrap();
        let next = sgl_core::sampling::argmax(&logits);
        out.push(logits);
        start += tokens.len();
        tokens = vec![next];
    }
    out
}

fn same_logits(fp8: &Path, reference: &Path) {
    let prompt = [1u32, 422, 1032, 314, 2114, 28, 253];
    let (a, b) = (
        greedy_logits(fp8, &prompt, 6),
        greedy_logits(reference, &prompt, 6),
    );
    for (step, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_eq!(x.len(), y.len());
        let differ = x
            .iter()
            .zip(y)
            .filter(|(p, q)| p.to_bits() != q.to_bits())
            .count();
        assert_eq!(
            differ,
            0,
            "step {step}: {differ} of {} logits differ",
            x.len()
        );
    }
    // The weights do matter: the logits are not flat.
    let spread =
        a[0].iter().fold(f32::MIN, |m, v| m.max(*v)) - a[0].iter().fold(f32::MAX, |m, v| m.min(*v));
    assert!(spread > 0.1, "logit spread {spread}");
}

#[test]
fn compressed_tensors_per_channel_fp8_is_the_float_checkpoint_of_its_values() {
    let root = tempfile::tempdir().unwrap();
    let (fp8, reference) = write_pair(root.path(), Scales::ChannelBf16, compressed_tensors());
    same_logits(&fp8, &reference);
}

fn kv_cache_scheme() -> Value {
    json!({"num_bits": 8, "type": "float", "symmetric": true, "group_size": null,
           "strategy": "tensor", "block_structure": null, "dynamic": false,
           "observer": "minmax"})
}

fn with_kv_scales() -> Value {
    let mut c = compressed_tensors();
    c["kv_cache_scheme"] = kv_cache_scheme();
    c
}

/// The CPU's KV cache is f32, which takes no scales (as SGLang leaves them unused with a
/// bf16 cache): a checkpoint that brings them loads and gives the float checkpoint's logits.
#[test]
fn kv_cache_scales_are_unused_by_the_cpus_f32_cache() {
    let root = tempfile::tempdir().unwrap();
    let (fp8, reference) = write_pair(root.path(), Scales::ChannelBf16, with_kv_scales());
    let model = sgl_core::model::load(&fp8).unwrap();
    assert!(model.quant.kv_scales(), "{:?}", model.quant);
    assert!(model.tensors().contains("model.layers.1.self_attn.v_scale"));
    same_logits(&fp8, &reference);
}

#[test]
fn per_tensor_fp8_scales_with_static_input_scales_read_the_same_way() {
    let root = tempfile::tempdir().unwrap();
    let config = json!({"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
                        "modules_to_not_convert": ["lm_head"]});
    let (fp8, reference) = write_pair(root.path(), Scales::TensorF32, config);
    same_logits(&fp8, &reference);
}

fn serve_check(dir: &Path, extra: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sgl-engine"))
        .args(["serve", "--check", "--model-path"])
        .arg(dir)
        .args(extra)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn serve_names_the_checkpoint_quantization_or_refuses_the_scheme() {
    let root = tempfile::tempdir().unwrap();
    let (fp8, _) = write_pair(root.path(), Scales::ChannelBf16, compressed_tensors());
    let (ok, text) = serve_check(&fp8, &["--device", "cpu"]);
    assert!(ok, "{text}");
    assert!(
        text.contains("weights: FP8 (compressed-tensors), dequantized to f32 on the CPU"),
        "{text}"
    );
    let config_path = fp8.join("config.json");
    let original = std::fs::read_to_string(&config_path).unwrap();
    let int8 = {
        let mut c = compressed_tensors();
        c["config_groups"]["group_0"]["weights"] =
            json!({"type": "int", "num_bits": 8, "strategy": "channel", "symmetric": true});
        c
    };
    let cases: [(Value, &[&str], &str); 6] = [
        (
            json!({"quant_method": "gptq", "bits": 4, "group_size": 128}),
            &[],
            "quant_method \"gptq\" (served: FP8",
        ),
        (
            json!({"quant_method": "awq", "bits": 4}),
            &[],
            "quant_method \"awq\"",
        ),
        (
            json!({"quant_method": "fp8", "weight_block_size": [128, 128]}),
            &[],
            "block-wise",
        ),
        (int8, &[], "stores weights as 8-bit int"),
        (
            {
                let mut c = compressed_tensors();
                c["kv_cache_scheme"] = json!({"type": "float", "num_bits": 8,
                                              "strategy": "attn_head"});
                c
            },
            &[],
            "kv_cache_scheme scales the KV cache per attn_head",
        ),
        // The CPU has no FP8 KV cache, so none to apply a checkpoint's KV scales to.
        (
            with_kv_scales(),
            &["--device", "cpu", "--kv-cache-dtype", "fp8_e4m3"],
            "run on the GPU (--device cuda)",
        ),
    ];
    for (quant, extra, want) in cases {
        let mut c: Value = serde_json::from_str(&original).unwrap();
        c["quantization_config"] = quant;
        std::fs::write(&config_path, c.to_string()).unwrap();
        let (ok, text) = serve_check(&fp8, extra);
        assert!(!ok, "{want}: accepted:\n{text}");
        assert!(text.contains(want), "should say {want:?}:\n{text}");
    }
    // KV-cache scales are accepted: with the CPU's f32 cache (unused), and with a GPU's FP8
    // cache, which applies them (a build without CUDA says only that it has none).
    let mut c: Value = serde_json::from_str(&original).unwrap();
    c["quantization_config"] = with_kv_scales();
    std::fs::write(&config_path, c.to_string()).unwrap();
    let (ok, text) = serve_check(&fp8, &["--device", "cpu"]);
    assert!(ok, "{text}");
    assert!(text.contains("weights: FP8 (compressed-tensors)"), "{text}");
    let (ok, text) = serve_check(&fp8, &["--device", "cuda", "--kv-cache-dtype", "fp8_e4m3"]);
    assert!(!text.contains("KV-cache scales"), "{text}");
    assert!(
        ok || text.contains("built without CUDA support"),
        "an FP8 KV cache with the checkpoint's scales should be served:\n{text}"
    );
    std::fs::write(&config_path, original).unwrap();
}

#[tokio::test]
async fn an_fp8_checkpoint_is_served_over_http_on_the_cpu() {
    let root = tempfile::tempdir().unwrap();
    let (fp8, reference) = write_pair(root.path(), Scales::ChannelBf16, compressed_tensors());
    let body = json!({"text": "The capital of France is",
                      "sampling_params": {"temperature": 0, "max_new_tokens": 8}});
    let mut texts = Vec::new();
    for dir in [&fp8, &reference] {
        let s = common::Server::start_model("fp8-ckpt", dir, &["--device", "cpu"]);
        let (status, out) = s.post("/generate", &body).await;
        assert_eq!(status, 200, "{out}");
        let (_, info) = s.get("/get_server_info").await;
        // On the CPU the weights are served dequantized: no FP8 arithmetic is claimed.
        assert_eq!(info["quantization"], Value::Null, "{info}");
        texts.push(out["text"].as_str().unwrap().to_string());
    }
    assert_eq!(texts[0], texts[1]);
    assert!(!texts[0].is_empty());
}
