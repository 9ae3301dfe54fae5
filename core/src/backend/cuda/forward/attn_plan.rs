//! Which form and work list a pass's attention takes: decode's split count, prefill's work list
//! (split key ranges, or the paired-head form over an FP8 pool), and whether a prefill pass of
//! fresh prompts over an FP8 pool reads its K and V from the qkv rows.

use half::bf16;
use sgl_kernels::{
    AttnShape, DecodeAttnPlan, Dptr, Kernels, KvDtype, LayerAttn, PrefillSeq, prefill_paired_work,
    prefill_tiles, prefill_work,
};

use super::super::{CudaBackend, DETERMINISTIC_DECODE_SPLITS};
use crate::backend::SeqInput;
use crate::error::{EngineError, Result};

impl CudaBackend {
    /// Decode attention's split count for a batch of `batch` sequences: planned for the
    /// batch's size and `plan_len` keys, within the partial buffers. Deterministic: a fixed
    /// count, so a sequence's splits (`len / splits` keys each) and the order their partial
    /// sums merge in depend on its length alone, not on the rest of the batch.
    pub(super) fn decode_splits(&self, batch: usize, plan_len: usize) -> Result<DecodeAttnPlan> {
        let cap = (self.scratch.partial_rows / batch.max(1)).max(1) as u32;
        if self.opts.deterministic {
            if cap < DETERMINISTIC_DECODE_SPLITS {
                return Err(EngineError::Internal(format!(
                    "deterministic decode of {batch} sequences needs {} partial rows, the buffers hold {}",
                    batch * DETERMINISTIC_DECODE_SPLITS as usize,
                    self.scratch.partial_rows
                )));
            }
            return Ok(DecodeAttnPlan {
                splits: DETERMINISTIC_DECODE_SPLITS,
                tensor_cores: false,
            });
        }
        let plan = self
            .kernels
            .decode_plan(batch, self.cfg.num_kv_heads, plan_len);
        let splits = plan.splits.min(cap);
        Ok(DecodeAttnPlan {
            splits,
            tensor_cores: plan.tensor_cores && splits == 1 && self.decode_tc,
        })
    }

    /// Prefill attention's work list for `seqs` ([`prefill_work`]: the key ranges of the
    /// longest query tiles split where the launch would otherwise wait on them, within the
    /// partial buffers). Under `--enable-deterministic-inference` none is split: a sequence's
    /// results must not depend on the rest of the batch (nor with `SGL_DISABLE_PREFILL_SPLIT=1`).
    pub(super) fn prefill_work(&self, seqs: &[PrefillSeq]) -> Vec<i32> {
        if self.opts.deterministic || !self.prefill_split {
            return prefill_tiles(&seqs.iter().map(|q| q.q_len).collect::<Vec<_>>());
        }
        let heads = self.cfg.num_heads.max(1);
        let parts = (self.scratch.partial_rows / 64).min(self.scratch.attn_counters.len() / heads);
        prefill_work(seqs, heads, self.kernels.prefill_slots(), parts)
    }

    /// Whether a prefill pass of `batch` reads K and V from its qkv rows: over an FP8 pool,
    /// when every sequence is a fresh prompt (nothing cached before it), attention uses the
    /// rows' bf16 K and V as computed (as SGLang's ragged prefill does) instead of their FP8
    /// bytes in the pool, which is faster (no per-tile widening) and closer to the bf16
    /// model; the pool is written as before for the steps after. Not under
    /// `--enable-deterministic-inference` (a prompt after a cached prefix must give the same
    /// results as the whole prompt) nor with `SGL_DISABLE_PREFILL_KV_ROWS=1`.
    pub(super) fn kv_rows(&self, batch: &[SeqInput<'_>]) -> bool {
        self.opts.kv != KvDtype::Bf16
            && self.prefill_kv_rows
            && !self.opts.deterministic
            && batch
                .iter()
                .all(|q| q.start_pos == 0 && q.kv_slots.len() == q.tokens.len())
    }

    /// The layers' prefill attention work list, and whether it is for the paired-head form
    /// ([`prefill_paired_work`]: an FP8 pool, an even group, and a list planned for that form
    /// needing no split; whole tiles in batch order where none may be split); else
    /// [`Self::prefill_work`]'s. Both forms give the same bits (`SGL_DISABLE_PREFILL_PAIRS=1`:
    /// never paired).
    pub(super) fn prefill_plan(&self, seqs: &[PrefillSeq], kv: KvDtype) -> (Vec<i32>, bool) {
        let (heads, kv_heads) = (self.cfg.num_heads, self.cfg.num_kv_heads);
        if !self.prefill_pairs {
            return (self.prefill_work(seqs), false);
        }
        if self.opts.deterministic || !self.prefill_split {
            // whole tiles, never split: either form takes them
            let paired = Kernels::prefill_pairs(kv, heads, kv_heads);
            return (self.prefill_work(seqs), paired);
        }
        let slots = self.kernels.prefill_paired_slots();
        match prefill_paired_work(seqs, kv, heads, kv_heads, slots) {
            Some(list) => (list, true),
            None => (self.prefill_work(seqs), false),
        }
    }

    /// A fresh prompt's K and V in the qkv rows (`qkv`, kept there by `rope_kv_store_with`)
    /// as a bf16 pool for prefill attention: the K and V parts' first rows, and the layer's
    /// shape over a bf16 pool (no scales). Token row r is then slot r x (group + 2), the
    /// indices [`AttnInputs::Prefill`] carries in `rows`.
    pub(super) fn rows_as_pool(
        qkv: Dptr<bf16>,
        shape: LayerAttn,
    ) -> (Dptr<u8>, Dptr<u8>, LayerAttn) {
        let sh = shape.shape;
        let k = qkv.add(sh.n_heads * sh.head_dim);
        let v = k.add(sh.n_kv_heads * sh.head_dim);
        let bf = AttnShape {
            kv: KvDtype::Bf16,
            ..sh
        };
        (k.cast(), v.cast(), LayerAttn::from(bf))
    }
}
