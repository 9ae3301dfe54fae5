//! CUDA graphs for decode: one per padded batch size, captured on first use and replayed with
//! the batch's inputs uploaded to the fixed buffer they read.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaGraph, CudaSlice, CudaStream, sys};
use sgl_kernels::{Dptr, dptr};

use super::super::{CudaBackend, cuda_err};
use super::{AttnInputs, Inputs, zeros};
use crate::backend::SeqInput;
use crate::error::{EngineError, Result};
use crate::model::config::ModelConfig;

/// A captured graph, owned by one backend.
pub(in crate::backend::cuda) struct Graph(CudaGraph);

// SAFETY: a CUDA graph is not tied to the thread that captured it; it is only replayed
// through `&mut CudaBackend`, so never from two threads at once.
unsafe impl Send for Graph {}

/// Decode graphs, one per padded batch size, and the fixed input buffer they read.
pub(in crate::backend::cuda) struct Graphs {
    pub max_bs: usize,
    graphs: HashMap<usize, Graph>,
    /// [ids max_bs | positions max_bs | slots max_bs | kv_indptr max_bs + 1 | kv_indices ...]
    meta: CudaSlice<i32>,
    pub(super) index_cap: usize,
}

impl Graphs {
    pub fn new(
        s: &Arc<CudaStream>,
        max_bs: usize,
        capacity: usize,
        _cfg: &ModelConfig,
    ) -> Result<Self> {
        let index_cap = if max_bs == 0 { 0 } else { 2 * capacity + 65536 };
        Ok(Graphs {
            max_bs,
            graphs: HashMap::new(),
            meta: zeros(s, 4 * max_bs + 1 + index_cap)?,
            index_cap,
        })
    }

    /// Drop every captured graph (they are captured again on next use).
    pub fn clear(&mut self) {
        self.graphs.clear();
    }

    pub(super) fn bucket(&self, bs: usize) -> Option<usize> {
        if bs == 0 || bs > self.max_bs {
            return None;
        }
        let b = if bs <= 8 {
            bs.next_power_of_two()
        } else {
            bs.next_multiple_of(16)
        };
        Some(b.min(self.max_bs))
    }
}

impl CudaBackend {
    /// Decode through the graph of padded batch size `bs` (captured on first use).
    pub(super) fn run_graph(&mut self, batch: &[SeqInput<'_>], bs: usize) -> Result<Vec<usize>> {
        let s = self.stream.clone();
        let max_bs = self.graphs.max_bs;
        let spare = self.capacity as i32;
        let mut meta = vec![0i32; 4 * max_bs + 1];
        let mut indices = Vec::new();
        let (ids_o, pos_o, slot_o, ptr_o, idx_o) =
            (0, max_bs, 2 * max_bs, 3 * max_bs, 4 * max_bs + 1);
        for i in 0..bs {
            if let Some(q) = batch.get(i) {
                meta[ids_o + i] = q.tokens[0] as i32;
                meta[pos_o + i] = q.start_pos as i32;
                meta[slot_o + i] = q.kv_slots[q.start_pos] as i32;
                indices.extend(q.kv_slots.iter().map(|&x| x as i32));
            } else {
                // padding row: token 0 at position 0, attending to (and writing) the spare slot
                meta[slot_o + i] = spare;
                indices.push(spare);
            }
            meta[ptr_o + i + 1] = indices.len() as i32;
        }
        let m = dptr(&self.graphs.meta, &s);
        self.upload(m, &meta)?;
        self.upload(m.add(idx_o), &indices)?;
        let seqs: Vec<usize> = (0..batch.len()).collect();
        self.apply_prev(m.add(ids_o), &seqs)?;
        if !self.graphs.graphs.contains_key(&bs) {
            let g = self.capture(bs)?;
            self.graphs.graphs.insert(bs, Graph(g));
        }
        let Some(g) = self.graphs.graphs.get(&bs) else {
            return Err(EngineError::Internal(
                "decode graph missing after capture".into(),
            ));
        };
        g.0.launch().map_err(cuda_err)?;
        Ok(batch
            .iter()
            .enumerate()
            .filter(|(_, q)| q.num_logits > 0)
            .map(|(i, _)| i)
            .collect())
    }

    pub(super) fn graph_inputs(&self, bs: usize) -> Result<Inputs> {
        let max_bs = self.graphs.max_bs;
        let m = dptr(&self.graphs.meta, &self.stream);
        // A graph serves every context length; its attention splits are planned for
        // `SGL_DECODE_GRAPH_PLAN_LEN` keys (default: the model's longest context).
        let plan_len = std::env::var("SGL_DECODE_GRAPH_PLAN_LEN")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(self.cfg.max_position_embeddings);
        let plan = self.decode_splits(bs, plan_len)?;
        // SAFETY: ids are stored as i32 bit patterns of valid token ids.
        let ids = unsafe { Dptr::<u32>::from_raw(m.addr()) };
        Ok(Inputs {
            tokens: bs,
            ids,
            positions: m.add(max_bs),
            slots: m.add(2 * max_bs),
            attn: AttnInputs::Decode {
                batch: bs,
                plan,
                kv_indptr: m.add(3 * max_bs),
                kv_indices: m.add(4 * max_bs + 1),
            },
            tail: None,
        })
    }

    pub(super) fn capture(&self, bs: usize) -> Result<CudaGraph> {
        let s = &self.stream;
        let inputs = self.graph_inputs(bs)?;
        // Warm up once outside capture: cuBLASLt plans are made then, not inside the graph.
        self.layers(&inputs)?;
        let x = dptr(&self.scratch.x, s);
        let d = (!self.fused_norm(bs)).then(|| dptr(&self.scratch.delta, s));
        let n = dptr(&self.scratch.normed, s);
        // Only rank 0 computes logits (tensor parallelism), unless the vocabulary is split.
        let logits = self.computes_logits();
        if logits {
            self.head(x, d, n, bs, 0)?;
        }
        self.wait_stream()?;
        s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(cuda_err)?;
        let body = self.layers(&inputs).and_then(|_| {
            if logits {
                self.head(x, d, n, bs, 0)
            } else {
                Ok(())
            }
        });
        let graph = s
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(cuda_err);
        body?;
        graph?.ok_or_else(|| EngineError::Internal("empty decode graph".into()))
    }
}
