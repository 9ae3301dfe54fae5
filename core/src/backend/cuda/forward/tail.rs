//! A prefill pass's last layer on the rows that need logits only. Every row's K and V of the
//! last layer go to the pool (later passes attend to them), but its attention output, o_proj,
//! MLP and norms feed nothing but the LM head, which reads only the rows that need logits (a
//! prompt's last token; every token with prompt logprobs). So after the last layer's K/V store
//! those rows are gathered, and attention (their queries against every key of their
//! sequences), o_proj, the post-attention norm and the MLP run on them alone: for a 1024-token
//! prompt about 1/32 of the pass's work is left out. `SGL_DISABLE_LOGIT_ROWS_ONLY=1` runs the
//! last layer on every row (for comparisons).

use half::bf16;
use sgl_kernels::{Dptr, PrefillSeq};

use super::{AttnInputs, CudaBackend};
use crate::backend::SeqInput;
use crate::backend::cuda::cuda_err;
use crate::error::Result;

/// The host-side inputs of the tail's attention: each sequence's queries are its last
/// `num_logits` positions (after a "prefix" of every earlier position), its keys all of them.
pub(super) struct TailPlan {
    /// Query rows per sequence (the logit rows, gathered in order).
    pub q_indptr: Vec<i32>,
    /// Positions before each sequence's first gathered row.
    pub prefix: Vec<i32>,
    /// Prefill attention's work list over the gathered rows.
    pub tiles: Vec<i32>,
    /// 0..n: where the head finds the gathered rows.
    pub ident: Vec<i32>,
}

impl TailPlan {
    /// `work`: prefill attention's work list for sequences (the pass's planner).
    pub fn new(batch: &[SeqInput<'_>], work: impl FnOnce(&[PrefillSeq]) -> Vec<i32>) -> Self {
        let mut q_indptr = vec![0i32];
        let mut prefix = Vec::with_capacity(batch.len());
        let mut seqs = Vec::with_capacity(batch.len());
        for q in batch {
            let len = q.tokens.len();
            let n = q.num_logits.min(len);
            let before = q.start_pos + len - n;
            seqs.push(PrefillSeq {
                q_len: n,
                prefix: before,
            });
            q_indptr.push(q_indptr[q_indptr.len() - 1] + n as i32);
            prefix.push(before as i32);
        }
        let n = q_indptr[q_indptr.len() - 1];
        TailPlan {
            q_indptr,
            prefix,
            tiles: work(&seqs),
            ident: (0..n).collect(),
        }
    }
}

/// Device addresses of the tail's inputs (uploaded with the pass's other inputs).
#[derive(Clone, Copy)]
pub(super) struct Tail {
    /// The pass's rows that need logits, in order.
    pub rows: Dptr<i32>,
    /// 0..n.
    pub ident: Dptr<i32>,
    pub n: usize,
    /// Prefill attention over the gathered queries.
    pub attn: AttnInputs,
}

impl CudaBackend {
    /// Whether a prefill pass of `tokens` rows, `logit_rows` of them needing logits, runs its
    /// last layer on those rows only: not for the decode layer form (its passes are small and
    /// graph-captured) and not under `--enable-deterministic-inference` (the last layer's
    /// GEMMs would then see a row count that depends on the batch); and only where the
    /// gathered queries fit the gate/up scratch they borrow (always for Llama-family shapes,
    /// whose MLP is wider than q, k and v together). The same answer on every rank.
    pub(super) fn logit_rows_only(&self, tokens: usize, logit_rows: usize) -> bool {
        let c = &self.cfg;
        let qkv_w = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim;
        self.logit_rows_only
            && logit_rows < tokens
            && logit_rows * qkv_w <= self.scratch.tokens * 2 * c.intermediate_size
            && !self.fused_norm(tokens)
            && !self.opts.deterministic
    }

    /// The tail's gathers, after the last layer's K/V store: the rows of `qkv` (queries
    /// rotated and scaled) that need logits into `q_out` (n x `qkv_w`), and the residual
    /// stream's into the first n rows of `x` (through `tmp`: a gather in place could overwrite
    /// a row before it is read).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gather_tail(
        &self,
        tail: &Tail,
        x: Dptr<bf16>,
        qkv: Dptr<bf16>,
        q_out: Dptr<bf16>,
        tmp: Dptr<bf16>,
        qkv_w: usize,
        h: usize,
    ) -> Result<()> {
        let s = &self.stream;
        let k = &self.kernels;
        // SAFETY: q_out holds n x qkv_w and tmp n x h values (the scratch's gate_up and normed
        // hold a pass's rows at wider widths); rows index the pass's rows, ident 0..n.
        unsafe {
            k.gather_rows(s, q_out, qkv, tail.rows, tail.n, qkv_w)
                .map_err(cuda_err)?;
            k.gather_rows(s, tmp, x, tail.rows, tail.n, h)
                .map_err(cuda_err)?;
            k.gather_rows(s, x, tmp, tail.ident, tail.n, h)
                .map_err(cuda_err)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::TailPlan;
    use crate::backend::SeqInput;
    use sgl_kernels::{PrefillSeq, prefill_tiles};

    #[test]
    fn tail_plan_takes_each_sequences_logit_rows_after_its_other_positions() {
        let slots: Vec<u32> = (0..100).collect();
        let toks: Vec<u32> = (0..70).collect();
        let seq = |start: usize, len: usize, num_logits: usize| SeqInput {
            tokens: &toks[..len],
            start_pos: start,
            kv_slots: &slots[..start + len],
            num_logits,
            prompt: true,
        };
        // a prompt's last token, a chunk that needs no logits after a cached prefix, a prompt
        // with every row's logits (prompt logprobs), and more logits asked than tokens run
        let batch = [seq(0, 5, 1), seq(3, 4, 0), seq(0, 70, 70), seq(10, 2, 5)];
        let mut planned = Vec::new();
        let p = TailPlan::new(&batch, |s| {
            planned = s.to_vec();
            prefill_tiles(&s.iter().map(|q| q.q_len).collect::<Vec<_>>())
        });
        assert_eq!(p.q_indptr, vec![0, 1, 1, 71, 73]);
        assert_eq!(p.prefix, vec![4, 7, 0, 10]);
        let ps = |q_len, prefix| PrefillSeq { q_len, prefix };
        assert_eq!(
            planned,
            vec![ps(1, 4), ps(0, 7), ps(70, 0), ps(2, 10)],
            "the work list is planned over the gathered rows"
        );
        let one = 1 << 16;
        assert_eq!(
            p.tiles,
            vec![0, 0, one, 0, 2, 0, one, 0, 2, 64, one, 0, 3, 0, one, 0]
        );
        assert_eq!(p.ident, (0..73).collect::<Vec<i32>>());
    }
}
