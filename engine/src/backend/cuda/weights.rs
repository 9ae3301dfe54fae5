//! Llama-family weights from safetensors onto the GPU, in bf16. q/k/v are fused into one
//! `[q + k + v, hidden]` matrix and gate/up into one `[2 * intermediate, hidden]` matrix, so a
//! layer runs four GEMMs.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;
use safetensors::{Dtype, SafeTensors};
use sgl_kernels::{Dptr, dptr};

use crate::error::{EngineError, Result};
use crate::model::config::ModelConfig;

pub(crate) struct Layer {
    pub input_norm: CudaSlice<bf16>,
    pub qkv: CudaSlice<bf16>,
    pub o: CudaSlice<bf16>,
    pub post_norm: CudaSlice<bf16>,
    pub gate_up: CudaSlice<bf16>,
    pub down: CudaSlice<bf16>,
}

pub(crate) struct Weights {
    pub embed: CudaSlice<bf16>,
    pub layers: Vec<Layer>,
    pub norm: CudaSlice<bf16>,
    /// None when tied to the embedding.
    pub lm_head: Option<CudaSlice<bf16>>,
    pub bytes: usize,
}

impl Weights {
    pub fn lm_head_ptr(&self, s: &CudaStream) -> Dptr<bf16> {
        dptr(self.lm_head.as_ref().unwrap_or(&self.embed), s)
    }
}

fn load_err(e: impl std::fmt::Display) -> EngineError {
    EngineError::Load(e.to_string())
}

/// The safetensors files of a model folder (sharded or not).
fn shard_paths(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| EngineError::Load(format!("cannot read {}: {e}", dir.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    v.sort();
    if v.is_empty() {
        return Err(EngineError::Load(format!(
            "no .safetensors files in {}",
            dir.display()
        )));
    }
    Ok(v)
}

/// bf16 bytes of a tensor (converted from f16/f32 when the checkpoint is stored so).
fn to_bf16_bytes(dtype: Dtype, data: &[u8], name: &str) -> Result<Vec<bf16>> {
    let v = match dtype {
        Dtype::BF16 => data
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]))
            .collect(),
        Dtype::F16 => data
            .chunks_exact(2)
            .map(|c| bf16::from_f32(half::f16::from_le_bytes([c[0], c[1]]).to_f32()))
            .collect(),
        Dtype::F32 => data
            .chunks_exact(4)
            .map(|c| bf16::from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect(),
        d => {
            return Err(EngineError::Load(format!(
                "{name}: dtype {d:?} is not supported"
            )));
        }
    };
    Ok(v)
}

struct Reader {
    maps: Vec<memmap2::Mmap>,
    index: HashMap<String, usize>,
}

impl Reader {
    fn open(dir: &Path) -> Result<Self> {
        let mut maps = Vec::new();
        let mut index = HashMap::new();
        for (i, p) in shard_paths(dir)?.into_iter().enumerate() {
            let f = std::fs::File::open(&p)
                .map_err(|e| EngineError::Load(format!("{}: {e}", p.display())))?;
            // SAFETY: the checkpoint is read-only input; a file changed under us while loading
            // gives wrong weights, not memory unsafety beyond what the mapping itself allows.
            let m = unsafe { memmap2::Mmap::map(&f) }
                .map_err(|e| EngineError::Load(format!("{}: {e}", p.display())))?;
            let st = SafeTensors::deserialize(&m)
                .map_err(|e| EngineError::Load(format!("{}: {e}", p.display())))?;
            for name in st.names() {
                index.insert(name.to_string(), i);
            }
            maps.push(m);
        }
        Ok(Reader { maps, index })
    }

    /// The tensor's bf16 values, checked against the expected shape.
    fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<bf16>> {
        let i = *self
            .index
            .get(name)
            .ok_or_else(|| EngineError::Load(format!("tensor {name} missing from checkpoint")))?;
        let st = SafeTensors::deserialize(&self.maps[i]).map_err(load_err)?;
        let t = st.tensor(name).map_err(load_err)?;
        if t.shape() != shape {
            return Err(EngineError::Load(format!(
                "tensor {name} has shape {:?}, expected {shape:?}",
                t.shape()
            )));
        }
        to_bf16_bytes(t.dtype(), t.data(), name)
    }

    fn has(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }
}

fn upload(s: &Arc<CudaStream>, parts: &[Vec<bf16>]) -> Result<CudaSlice<bf16>> {
    let n: usize = parts.iter().map(|p| p.len()).sum();
    let mut d = s.alloc_zeros::<bf16>(n).map_err(load_err)?;
    let mut off = 0;
    for p in parts {
        let mut view = d.slice_mut(off..off + p.len());
        s.memcpy_htod(p, &mut view).map_err(load_err)?;
        off += p.len();
    }
    Ok(d)
}

pub(super) fn load(dir: &Path, cfg: &ModelConfig, s: &Arc<CudaStream>) -> Result<Weights> {
    let r = Reader::open(dir)?;
    let (h, hd) = (cfg.hidden_size, cfg.head_dim);
    let (q_out, kv_out) = (cfg.num_heads * hd, cfg.num_kv_heads * hd);
    let inter = cfg.intermediate_size;
    let mut bytes = 0usize;
    let mut up = |parts: &[Vec<bf16>]| -> Result<CudaSlice<bf16>> {
        bytes += parts.iter().map(|p| p.len() * 2).sum::<usize>();
        upload(s, parts)
    };
    let embed = up(&[r.get("model.embed_tokens.weight", &[cfg.vocab_size, h])?])?;
    let mut layers = Vec::with_capacity(cfg.num_layers);
    for l in 0..cfg.num_layers {
        let p = format!("model.layers.{l}");
        if r.has(&format!("{p}.self_attn.q_proj.bias")) {
            return Err(EngineError::Load(
                "q/k/v projection biases (Qwen2-style) are not supported by the CUDA backend yet"
                    .into(),
            ));
        }
        let qkv = up(&[
            r.get(&format!("{p}.self_attn.q_proj.weight"), &[q_out, h])?,
            r.get(&format!("{p}.self_attn.k_proj.weight"), &[kv_out, h])?,
            r.get(&format!("{p}.self_attn.v_proj.weight"), &[kv_out, h])?,
        ])?;
        let o = up(&[r.get(&format!("{p}.self_attn.o_proj.weight"), &[h, q_out])?])?;
        let gate_up = up(&[
            r.get(&format!("{p}.mlp.gate_proj.weight"), &[inter, h])?,
            r.get(&format!("{p}.mlp.up_proj.weight"), &[inter, h])?,
        ])?;
        let down = up(&[r.get(&format!("{p}.mlp.down_proj.weight"), &[h, inter])?])?;
        let input_norm = up(&[r.get(&format!("{p}.input_layernorm.weight"), &[h])?])?;
        let post_norm = up(&[r.get(&format!("{p}.post_attention_layernorm.weight"), &[h])?])?;
        layers.push(Layer {
            input_norm,
            qkv,
            o,
            post_norm,
            gate_up,
            down,
        });
    }
    let norm = up(&[r.get("model.norm.weight", &[h])?])?;
    let lm_head = if r.has("lm_head.weight") && !cfg.tie_word_embeddings {
        Some(up(&[r.get("lm_head.weight", &[cfg.vocab_size, h])?])?)
    } else {
        None
    };
    Ok(Weights {
        embed,
        layers,
        norm,
        lm_head,
        bytes,
    })
}
