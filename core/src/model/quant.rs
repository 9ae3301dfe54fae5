//! How a checkpoint says its weights are already quantized: the `quantization_config` of its
//! `config.json`. The FP8 layouts the Hub publishes for Llama-family models are read; every
//! other scheme is refused by name before a tensor is read, instead of failing later on a
//! tensor type or a missing name.
//!
//! What is read, and how it maps onto the engine's FP8 weights (e4m3 values, one f32 scale
//! per output row; activations quantized per token at run time):
//! - `compressed-tensors` with format `float-quantized` (or `naive-quantized`) whose groups
//!   quantize weights to 8-bit floats per channel or per tensor (`weight_scale` of shape
//!   `[out, 1]` or a single value; a per-tensor scale is repeated for every row);
//! - `fbgemm_fp8` (per-channel `weight_scale`);
//! - `fp8` as written by the FP8 converters before compressed-tensors (per-tensor
//!   `weight_scale`), but not its block-wise form (`weight_block_size`).
//!
//! Static activation scales (`input_scale`, a group's `dynamic: false`) are not used: the
//! engine always scales activations per token, which is at least as accurate; fbgemm's
//! activation upper bound is not applied either.
//!
//! KV-cache scales: a compressed-tensors `kv_cache_scheme` (8-bit float, one static scale per
//! tensor) says that every attention layer brings a K and a V scale
//! (`model.layers.N.self_attn.k_scale` / `v_scale`, or the older names that
//! `model::llama::LlamaTensors::kv_scales` also reads). With an FP8 KV cache
//! (`--kv-cache-dtype fp8_e4m3|fp8_e5m2`, on the GPU) the pool stores `k / k_scale` and
//! `v / v_scale` and attention multiplies them back, as SGLang and vLLM do; a checkpoint
//! without them gets scales of 1. A bf16 cache does not use them.

use std::fmt;
use std::path::Path;

use serde_json::Value;

use crate::error::{EngineError, Result};

/// The quantization declared by a Hugging Face `config.json`.
pub fn read(path: &Path) -> Result<CheckpointQuant> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| EngineError::Load(format!("cannot read {}: {e}", path.display())))?;
    let v: Value = serde_json::from_str(&text)
        .map_err(|e| EngineError::Load(format!("{}: {e}", path.display())))?;
    CheckpointQuant::from_config(&v)
        .map_err(|e| EngineError::Load(format!("{}: {e}", path.display())))
}

/// The FP8 layouts read from checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fp8Format {
    CompressedTensors,
    Fbgemm,
    /// `quant_method: "fp8"` with per-tensor scales.
    Fp8,
}

impl Fp8Format {
    /// The `quant_method` value.
    pub fn method(self) -> &'static str {
        match self {
            Fp8Format::CompressedTensors => "compressed-tensors",
            Fp8Format::Fbgemm => "fbgemm_fp8",
            Fp8Format::Fp8 => "fp8",
        }
    }
}

/// The quantization a checkpoint brings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CheckpointQuant {
    /// Plain float weights (or a GGUF file, which carries its own block formats).
    #[default]
    None,
    /// Linear layers stored as e4m3 with a `weight_scale` beside each weight.
    Fp8 {
        format: Fp8Format,
        /// The checkpoint carries KV-cache scales (`kv_cache_scheme`).
        kv_scales: bool,
    },
}

impl CheckpointQuant {
    pub fn is_fp8(self) -> bool {
        matches!(self, CheckpointQuant::Fp8 { .. })
    }

    /// Whether the checkpoint declares KV-cache scales (`kv_cache_scheme`): then every
    /// attention layer must bring its K and V scales.
    pub fn kv_scales(self) -> bool {
        matches!(
            self,
            CheckpointQuant::Fp8 {
                kv_scales: true,
                ..
            }
        )
    }

    /// Reads `config.json`'s `quantization_config` (absent or null: no quantization).
    pub fn from_config(config: &Value) -> Result<Self, String> {
        match config.get("quantization_config") {
            None | Some(Value::Null) => Ok(CheckpointQuant::None),
            Some(q) => parse(q),
        }
    }
}

impl fmt::Display for CheckpointQuant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckpointQuant::None => f.write_str("none"),
            CheckpointQuant::Fp8 { format, .. } => write!(f, "FP8 ({})", format.method()),
        }
    }
}

/// The FP8 formats this engine reads, for error messages.
const SERVED: &str = "FP8 checkpoints in the compressed-tensors (float-quantized, per-channel or per-tensor weight scales), fbgemm_fp8 or per-tensor fp8 layouts";

fn refuse(what: String) -> String {
    format!("this checkpoint's quantization is not supported: {what} (served: {SERVED})")
}

fn parse(q: &Value) -> Result<CheckpointQuant, String> {
    let method = q
        .get("quant_method")
        .and_then(Value::as_str)
        .ok_or_else(|| refuse("quantization_config has no quant_method".into()))?;
    let kv_scheme = q.get("kv_cache_scheme").filter(|v| !v.is_null());
    if let Some(k) = kv_scheme {
        kv_cache_scheme(k)?;
    }
    let kv_scales = kv_scheme.is_some();
    let format = match method {
        "compressed-tensors" => {
            compressed_tensors(q)?;
            Fp8Format::CompressedTensors
        }
        "fbgemm_fp8" => Fp8Format::Fbgemm,
        "fp8" => {
            if q.get("weight_block_size").is_some_and(|v| !v.is_null()) {
                return Err(refuse(format!(
                    "fp8 with block-wise weight scales (weight_block_size {})",
                    q["weight_block_size"]
                )));
            }
            Fp8Format::Fp8
        }
        other => return Err(refuse(format!("quant_method {other:?}"))),
    };
    Ok(CheckpointQuant::Fp8 { format, kv_scales })
}

/// Checks that every group of a compressed-tensors config stores 8-bit float weights with
/// per-channel or per-tensor scales (and 8-bit float activations, if any).
fn compressed_tensors(q: &Value) -> Result<(), String> {
    let format = q.get("format").and_then(Value::as_str).unwrap_or("");
    if !matches!(format, "float-quantized" | "naive-quantized") {
        return Err(refuse(format!("compressed-tensors format {format:?}")));
    }
    let groups = q
        .get("config_groups")
        .and_then(Value::as_object)
        .filter(|g| !g.is_empty())
        .ok_or_else(|| refuse("compressed-tensors config without config_groups".into()))?;
    for (name, g) in groups {
        let w = g
            .get("weights")
            .filter(|w| !w.is_null())
            .ok_or_else(|| refuse(format!("group {name} quantizes no weights")))?;
        float8(name, "weights", w, &["channel", "tensor"])?;
        if let Some(a) = g.get("input_activations").filter(|a| !a.is_null()) {
            float8(name, "input_activations", a, &["token", "tensor"])?;
        }
        if g.get("output_activations").is_some_and(|a| !a.is_null()) {
            return Err(refuse(format!("group {name} quantizes output activations")));
        }
    }
    Ok(())
}

/// The KV-cache scheme read: 8-bit floats with one static, symmetric scale per tensor (per
/// layer for K and for V), as compressed-tensors writes it.
fn kv_cache_scheme(k: &Value) -> Result<(), String> {
    let kind = k.get("type").and_then(Value::as_str).unwrap_or("?");
    let bits = k.get("num_bits").and_then(Value::as_u64).unwrap_or(0);
    let strategy = k
        .get("strategy")
        .and_then(Value::as_str)
        .unwrap_or("tensor");
    if kind != "float" || bits != 8 {
        return Err(refuse(format!(
            "kv_cache_scheme stores the KV cache as {bits}-bit {kind}"
        )));
    }
    if strategy != "tensor" {
        return Err(refuse(format!(
            "kv_cache_scheme scales the KV cache per {strategy} (read: one scale per tensor)"
        )));
    }
    if k.get("dynamic").and_then(Value::as_bool) == Some(true) {
        return Err(refuse(
            "kv_cache_scheme with dynamic scales (read: static scales stored in the checkpoint)"
                .into(),
        ));
    }
    if k.get("symmetric").and_then(Value::as_bool) == Some(false) {
        return Err(refuse("kv_cache_scheme quantizes asymmetrically".into()));
    }
    Ok(())
}

/// One quantization argument: 8-bit, float, symmetric, one of `strategies`.
fn float8(group: &str, what: &str, a: &Value, strategies: &[&str]) -> Result<(), String> {
    let kind = a.get("type").and_then(Value::as_str).unwrap_or("?");
    let bits = a.get("num_bits").and_then(Value::as_u64).unwrap_or(0);
    let strategy = a.get("strategy").and_then(Value::as_str).unwrap_or("?");
    let symmetric = a.get("symmetric").and_then(Value::as_bool).unwrap_or(true);
    if kind != "float" || bits != 8 {
        return Err(refuse(format!(
            "group {group} stores {what} as {bits}-bit {kind}"
        )));
    }
    if !strategies.contains(&strategy) {
        return Err(refuse(format!(
            "group {group} scales {what} per {strategy} (read: {})",
            strategies.join(", ")
        )));
    }
    if !symmetric {
        return Err(refuse(format!(
            "group {group} quantizes {what} asymmetrically"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ct(weights: Value, acts: Value) -> Value {
        json!({"quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "config_groups": {"group_0": {
                "targets": ["Linear"], "weights": weights,
                "input_activations": acts, "output_activations": null}},
            "ignore": ["lm_head"],
            "kv_cache_scheme": null,
        }})
    }

    fn w(strategy: &str) -> Value {
        json!({"type": "float", "num_bits": 8, "strategy": strategy, "symmetric": true,
               "dynamic": false})
    }

    #[test]
    fn hub_fp8_layouts_are_read() {
        let dynamic = json!({"type": "float", "num_bits": 8, "strategy": "token",
                             "symmetric": true, "dynamic": true});
        let static_t = json!({"type": "float", "num_bits": 8, "strategy": "tensor",
                              "symmetric": true, "dynamic": false});
        for cfg in [ct(w("channel"), dynamic), ct(w("tensor"), static_t)] {
            assert_eq!(
                CheckpointQuant::from_config(&cfg),
                Ok(CheckpointQuant::Fp8 {
                    format: Fp8Format::CompressedTensors,
                    kv_scales: false
                })
            );
        }
        let fbgemm = json!({"quantization_config": {"quant_method": "fbgemm_fp8",
            "activation_scale_ub": 1200.0, "modules_to_not_convert": ["lm_head"]}});
        assert!(
            CheckpointQuant::from_config(&fbgemm)
                .expect("fbgemm")
                .is_fp8()
        );
        let fp8 = json!({"quantization_config": {"quant_method": "fp8",
            "activation_scheme": "static"}});
        assert!(CheckpointQuant::from_config(&fp8).expect("fp8").is_fp8());
        assert_eq!(
            CheckpointQuant::from_config(&json!({"hidden_size": 8})),
            Ok(CheckpointQuant::None)
        );
        let mut with_kv = ct(w("channel"), Value::Null);
        // as compressed-tensors writes it
        with_kv["quantization_config"]["kv_cache_scheme"] = json!({"type": "float",
            "num_bits": 8, "strategy": "tensor", "symmetric": true, "dynamic": false,
            "group_size": null, "block_structure": null, "observer": "minmax"});
        let q = CheckpointQuant::from_config(&with_kv);
        assert_eq!(
            q,
            Ok(CheckpointQuant::Fp8 {
                format: Fp8Format::CompressedTensors,
                kv_scales: true
            })
        );
        assert!(q.is_ok_and(CheckpointQuant::kv_scales));
        assert!(
            !CheckpointQuant::from_config(&ct(w("channel"), Value::Null))
                .is_ok_and(CheckpointQuant::kv_scales)
        );
    }

    #[test]
    fn other_schemes_are_refused_by_name() {
        let int4 = ct(
            json!({"type": "int", "num_bits": 4, "strategy": "group", "group_size": 128}),
            Value::Null,
        );
        let mut packed = ct(w("channel"), Value::Null);
        packed["quantization_config"]["format"] = json!("pack-quantized");
        let kv = |scheme: Value| {
            let mut c = ct(w("channel"), Value::Null);
            c["quantization_config"]["kv_cache_scheme"] = scheme;
            c
        };
        let cases = [
            (
                json!({"quantization_config": {"quant_method": "gptq", "bits": 4}}),
                "quant_method \"gptq\"",
            ),
            (
                json!({"quantization_config": {"quant_method": "awq"}}),
                "quant_method \"awq\"",
            ),
            (int4, "stores weights as 4-bit int"),
            (packed, "format \"pack-quantized\""),
            (ct(w("group"), Value::Null), "per group"),
            (
                json!({"quantization_config": {"quant_method": "fp8",
                    "weight_block_size": [128, 128]}}),
                "block-wise",
            ),
            (
                json!({"quantization_config": {"bits": 8}}),
                "no quant_method",
            ),
            (
                kv(
                    json!({"type": "float", "num_bits": 8, "strategy": "attn_head",
                          "symmetric": true, "dynamic": false}),
                ),
                "kv_cache_scheme scales the KV cache per attn_head",
            ),
            (
                kv(json!({"type": "int", "num_bits": 8, "strategy": "tensor"})),
                "kv_cache_scheme stores the KV cache as 8-bit int",
            ),
            (
                kv(json!({"type": "float", "num_bits": 8, "strategy": "tensor",
                          "dynamic": true})),
                "dynamic scales",
            ),
        ];
        for (cfg, want) in cases {
            let e = CheckpointQuant::from_config(&cfg).expect_err(want);
            assert!(e.contains(want), "{e:?} should name {want:?}");
            assert!(e.contains("served: FP8"), "{e:?} should say what is served");
        }
    }
}
