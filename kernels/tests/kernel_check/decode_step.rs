//! A Llama-3.1-8B-shaped decode step on the device: bit-identical eager, graph, PDL and norm forms.

use super::*;

/// One batch-1 decode step of a Llama-3.1-8B-shaped model on the device, for the PDL check and
/// `bench-decode`: per layer the RMSNorm-fused qkv GEMV, rope_kv_store, decode attention over
/// `ctx` cached keys (+ merge), the o GEMV adding into the residual, the RMSNorm-fused gate_up
/// GEMV with SwiGLU, the down GEMV adding into the residual; then the final norm and the LM
/// head. `fused: false` runs each norm as its own `add_rmsnorm` before a plain GEMV instead.
pub(crate) struct DecodeModel {
    pub(crate) layers: usize,
    pub(crate) vocab: usize,
    pub(crate) shape: AttnShape,
    pub(crate) plan: sgl_kernels::DecodeAttnPlan,
    pub(crate) qkv_w: CudaSlice<bf16>,
    pub(crate) o_w: CudaSlice<bf16>,
    pub(crate) gate_up_w: CudaSlice<bf16>,
    pub(crate) down_w: CudaSlice<bf16>,
    pub(crate) lm_head: CudaSlice<bf16>,
    /// 2 per layer (input, post-attention), then the final norm; hidden each
    pub(crate) norms: CudaSlice<bf16>,
    pub(crate) k_cache: CudaSlice<bf16>,
    pub(crate) v_cache: CudaSlice<bf16>,
    /// the residual stream the step starts from, and the one it updates
    pub(crate) x0: CudaSlice<bf16>,
    pub(crate) x: CudaSlice<bf16>,
    pub(crate) normed: CudaSlice<bf16>,
    pub(crate) qkv: CudaSlice<bf16>,
    pub(crate) attn: CudaSlice<bf16>,
    pub(crate) act: CudaSlice<bf16>,
    pub(crate) logits: CudaSlice<bf16>,
    pub(crate) positions: CudaSlice<i32>,
    pub(crate) slots: CudaSlice<i32>,
    pub(crate) inv_freq: CudaSlice<f32>,
    pub(crate) kv_indptr: CudaSlice<i32>,
    pub(crate) kv_indices: CudaSlice<i32>,
    pub(crate) partial_o: CudaSlice<f32>,
    pub(crate) partial_ml: CudaSlice<f32>,
    pub(crate) counters: CudaSlice<u32>,
    pub(crate) ws: GemvWorkspace,
}

/// How a decode step's attention runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum AttnForm {
    /// rope_kv_store, decode_attn, attn_merge_splits
    Separate,
    /// rope_kv_store, decode_attn_merged
    Merged,
    /// decode_attn_rope (RoPE, K/V store, attention and merge in one launch)
    Rope,
    /// left out (ablation)
    Skip,
}

/// Which parts of a decode step run: the full step, or an ablation of it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Variant {
    /// norms fused into the GEMVs, else add_rmsnorm before a plain GEMV
    pub(crate) fused: bool,
    /// without fused norms: leave the add_rmsnorm launches out (ablation)
    pub(crate) norms: bool,
    pub(crate) attn: AttnForm,
    /// the layers' GEMVs
    pub(crate) gemvs: bool,
    pub(crate) lm_head: bool,
}

impl Variant {
    pub(crate) const FULL: Variant = Variant {
        fused: true,
        norms: true,
        attn: AttnForm::Separate,
        gemvs: true,
        lm_head: true,
    };
    pub(crate) fn with_attn(self, attn: AttnForm) -> Self {
        Variant { attn, ..self }
    }
    pub(crate) fn separate_norms(self) -> Self {
        Variant {
            fused: false,
            ..self
        }
    }
    pub(crate) fn without_norms(self) -> Self {
        Variant {
            norms: false,
            ..self
        }
    }
    pub(crate) fn without_lm_head(self) -> Self {
        Variant {
            lm_head: false,
            ..self
        }
    }
    pub(crate) fn without_layer_gemvs(self) -> Self {
        Variant {
            gemvs: false,
            ..self
        }
    }
}

pub(crate) const HIDDEN: usize = 4096;
pub(crate) const INTER: usize = 14336;
pub(crate) const EPS: f32 = 1e-5;

impl DecodeModel {
    /// Weights tiled from a random pattern of 8 Mi + 13 elements (so rows differ), norms near
    /// 1, a random KV cache of `ctx` tokens whose last slot the step writes.
    pub(crate) fn new(
        k: &Kernels,
        s: &Arc<CudaStream>,
        rng: &mut Rng,
        layers: usize,
        vocab: usize,
        ctx: usize,
    ) -> R<Self> {
        let shape = AttnShape {
            n_heads: 32,
            n_kv_heads: 8,
            head_dim: 128,
            kv: KvDtype::Bf16,
        };
        let qkv_n = (shape.n_heads + 2 * shape.n_kv_heads) * shape.head_dim;
        let kv_row = shape.n_kv_heads * shape.head_dim;
        let pattern = s.clone_htod(&bf(&(0..(8usize << 20) + 13)
            .map(|_| 0.03 * rng.sym())
            .collect::<Vec<_>>()))?;
        let filled = |n: usize| -> R<CudaSlice<bf16>> {
            let d = s.alloc_zeros::<bf16>(n)?;
            let (base, src) = (dptr(&d, s), dptr(&pattern, s));
            let mut off = 0;
            while off < n {
                let len = pattern.len().min(n - off);
                // SAFETY: both ranges lie inside their allocations.
                unsafe {
                    cudarc::driver::result::memcpy_dtod_async(
                        base.add(off).addr(),
                        src.addr(),
                        len * 2,
                        s.cu_stream(),
                    )?
                };
                off += len;
            }
            Ok(d)
        };
        let norms = s.clone_htod(&bf(&(0..(2 * layers + 1) * HIDDEN)
            .map(|_| 1.0 + 0.2 * rng.sym())
            .collect::<Vec<_>>()))?;
        let kv = |rng: &mut Rng| -> R<CudaSlice<bf16>> {
            Ok(s.clone_htod(&bf(&(0..layers * ctx * kv_row)
                .map(|_| rng.sym())
                .collect::<Vec<_>>()))?)
        };
        let (k_cache, v_cache) = (kv(rng)?, kv(rng)?);
        let plan = k.decode_plan(1, shape.n_kv_heads, ctx);
        let parts = shape.n_heads * plan.splits as usize;
        let x0_host = bf(&(0..HIDDEN).map(|_| rng.sym()).collect::<Vec<_>>());
        Ok(DecodeModel {
            layers,
            vocab,
            shape,
            plan,
            qkv_w: filled(layers * qkv_n * HIDDEN)?,
            o_w: filled(layers * HIDDEN * HIDDEN)?,
            gate_up_w: filled(layers * 2 * INTER * HIDDEN)?,
            down_w: filled(layers * HIDDEN * INTER)?,
            lm_head: filled(vocab * HIDDEN)?,
            norms,
            k_cache,
            v_cache,
            x: s.clone_htod(&x0_host)?,
            x0: s.clone_htod(&x0_host)?,
            normed: s.alloc_zeros::<bf16>(HIDDEN)?,
            qkv: s.alloc_zeros::<bf16>(qkv_n)?,
            attn: s.alloc_zeros::<bf16>(HIDDEN)?,
            act: s.alloc_zeros::<bf16>(INTER)?,
            logits: s.alloc_zeros::<bf16>(vocab)?,
            positions: s.clone_htod(&[ctx as i32 - 1])?,
            slots: s.clone_htod(&[ctx as i32 - 1])?,
            inv_freq: s.clone_htod(&llama3_inv_freq(shape.head_dim))?,
            kv_indptr: s.clone_htod(&[0, ctx as i32])?,
            kv_indices: s.clone_htod(&(0..ctx as i32).collect::<Vec<_>>())?,
            partial_o: s.alloc_zeros::<f32>(parts * shape.head_dim)?,
            partial_ml: s.alloc_zeros::<f32>(parts * 2)?,
            counters: s.alloc_zeros::<u32>(shape.n_kv_heads)?,
            ws: k.gemv_workspace(s)?,
        })
    }

    /// Weight bytes one step streams (the GEMVs' matrices).
    pub(crate) fn weight_bytes(&self) -> usize {
        2 * (self.qkv_w.len()
            + self.o_w.len()
            + self.gate_up_w.len()
            + self.down_w.len()
            + self.lm_head.len())
    }

    /// Reset the residual stream to the step's input (a device copy, outside any graph).
    pub(crate) fn reset(&self, s: &CudaStream) -> R<()> {
        // SAFETY: x and x0 both hold HIDDEN elements.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(
                dptr(&self.x, s).addr(),
                dptr(&self.x0, s).addr(),
                HIDDEN * 2,
                s.cu_stream(),
            )?
        };
        Ok(())
    }

    /// `y = norm(x) · wᵀ`, fused or as add_rmsnorm then the GEMV (the norm left out where
    /// `v.norms` is off). Returns the launches made.
    ///
    /// # Safety
    /// y, w, norm and the scratch buffers cover the shapes (all of this model).
    #[allow(clippy::too_many_arguments)]
    unsafe fn norm_gemv(
        &self,
        k: &Kernels,
        s: &CudaStream,
        v: Variant,
        y: Dptr<bf16>,
        norm: Dptr<bf16>,
        w: Dptr<bf16>,
        n: usize,
        epi: GemvEpilogue,
    ) -> R<usize> {
        let x = dptr(&self.x, s);
        // SAFETY: as the caller guarantees.
        unsafe {
            if v.fused {
                k.gemv_rmsnorm(s, y, x, norm, EPS, w, 1, HIDDEN, n, epi, &self.ws)?;
                Ok(1)
            } else {
                let normed = dptr(&self.normed, s);
                if v.norms {
                    k.add_rmsnorm(s, normed, x, None, norm, 1, HIDDEN, EPS)?;
                }
                k.gemv(s, y, normed, w, 1, HIDDEN, n, epi, &self.ws)?;
                Ok(1 + usize::from(v.norms))
            }
        }
    }

    /// Launch one decode step (or the parts of it `v` keeps) on `s` (which may be capturing).
    /// Returns the launches made.
    pub(crate) fn step(&self, k: &Kernels, s: &CudaStream, v: Variant) -> R<usize> {
        use GemvEpilogue::*;
        let sh = self.shape;
        let qkv_n = (sh.n_heads + 2 * sh.n_kv_heads) * sh.head_dim;
        let kv_layer = self.k_cache.len() / self.layers;
        let q_dim = sh.n_heads * sh.head_dim;
        let (x, qkv, attn, act) = (
            dptr(&self.x, s),
            dptr(&self.qkv, s),
            dptr(&self.attn, s),
            dptr(&self.act, s),
        );
        let norms = dptr(&self.norms, s);
        let (positions, slots, inv_freq) = (
            dptr(&self.positions, s),
            dptr(&self.slots, s),
            dptr(&self.inv_freq, s),
        );
        let (ip, ix) = (dptr(&self.kv_indptr, s), dptr(&self.kv_indices, s));
        let (po, pml, cnt) = (
            dptr(&self.partial_o, s),
            dptr(&self.partial_ml, s),
            dptr(&self.counters, s),
        );
        let mut launches = 0;
        for l in 0..self.layers {
            let kc = dptr(&self.k_cache, s).add(l * kv_layer).cast::<u8>();
            let vc = dptr(&self.v_cache, s).add(l * kv_layer).cast::<u8>();
            let wq = dptr(&self.qkv_w, s).add(l * qkv_n * HIDDEN);
            let wo = dptr(&self.o_w, s).add(l * HIDDEN * q_dim);
            let wgu = dptr(&self.gate_up_w, s).add(l * 2 * INTER * HIDDEN);
            let wd = dptr(&self.down_w, s).add(l * HIDDEN * INTER);
            // SAFETY: every buffer was allocated for these shapes in `new`.
            unsafe {
                if v.gemvs {
                    let input = norms.add(2 * l * HIDDEN);
                    launches += self.norm_gemv(k, s, v, qkv, input, wq, qkv_n, Store)?;
                }
                if matches!(v.attn, AttnForm::Separate | AttnForm::Merged) {
                    k.rope_kv_store(s, qkv, kc, vc, positions, slots, inv_freq, 1, sh)?;
                    launches += 1;
                }
                match v.attn {
                    AttnForm::Separate => {
                        k.decode_attn(
                            s, self.plan, attn, q_dim, qkv, qkv_n, kc, vc, ip, ix, po, pml, 1, sh,
                        )?;
                        launches += 2;
                    }
                    AttnForm::Merged => {
                        k.decode_attn_merged(
                            s, self.plan, attn, q_dim, qkv, qkv_n, kc, vc, ip, ix, po, pml, cnt, 1,
                            sh,
                        )?;
                        launches += 1;
                    }
                    AttnForm::Rope => {
                        k.decode_attn_rope(
                            s, self.plan, attn, q_dim, qkv, kc, vc, positions, inv_freq, ip, ix,
                            po, pml, cnt, 1, sh,
                        )?;
                        launches += 1;
                    }
                    AttnForm::Skip => {}
                }
                if v.gemvs {
                    k.gemv(s, x, attn, wo, 1, q_dim, HIDDEN, Accumulate, &self.ws)?;
                    let post = norms.add((2 * l + 1) * HIDDEN);
                    launches += 1 + self.norm_gemv(k, s, v, act, post, wgu, 2 * INTER, SwiGlu)?;
                    k.gemv(s, x, act, wd, 1, INTER, HIDDEN, Accumulate, &self.ws)?;
                    launches += 1;
                }
            }
        }
        if v.lm_head {
            let logits = dptr(&self.logits, s);
            let final_norm = norms.add(2 * self.layers * HIDDEN);
            let lm = dptr(&self.lm_head, s);
            // SAFETY: as above.
            launches +=
                unsafe { self.norm_gemv(k, s, v, logits, final_norm, lm, self.vocab, Store)? };
        }
        Ok(launches)
    }

    /// The step captured into a CUDA graph on `s` (not the legacy default stream), and its
    /// launch count.
    pub(crate) fn capture(
        &self,
        k: &Kernels,
        s: &Arc<CudaStream>,
        v: Variant,
    ) -> R<(CudaGraph, usize)> {
        use cudarc::driver::sys;
        s.synchronize()?;
        s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        let body = self.step(k, s, v);
        let graph = s.end_capture(sys::CUgraphInstantiate_flags(0));
        let launches = body?;
        Ok((graph?.ok_or("empty decode graph")?, launches))
    }

    /// The step's outputs: logits and the final residual stream, as bf16 bit patterns.
    pub(crate) fn outputs(&self, s: &Arc<CudaStream>) -> R<Vec<u16>> {
        s.synchronize()?;
        let mut v: Vec<u16> = s
            .clone_dtoh(&self.logits)?
            .iter()
            .map(|x| x.to_bits())
            .collect();
        v.extend(s.clone_dtoh(&self.x)?.iter().map(|x| x.to_bits()));
        Ok(v)
    }
}

/// Programmatic dependent launch against plain launches: a 3-layer decode step (Llama-3.1-8B
/// layer shapes, 32000-token head, 300 cached keys) run eagerly without PDL is the reference
/// (one with fused norms, one with separate ones); eager with PDL, and CUDA graphs with and
/// without PDL (PDL with the trigger at the end of each block's work and right after the
/// wait; each graph replayed 8 times, GEMVs prefetching their whole weight slices into L2)
/// must give bit-identical logits and residual stream, for every attention form (rope_kv_store
/// then decode_attn and its merge, or decode_attn_merged; or decode_attn_rope). A kernel that
/// touched its predecessor's data before `griddepcontrol.wait` would show here as a difference.
pub(crate) fn check_pdl_decode(c: &mut Ctx) -> R<()> {
    let s = c.s.context().new_stream()?;
    let m = DecodeModel::new(&c.k, &s, &mut c.rng, 3, 32000, 300)?;
    let pdl_default = c.k.pdl();
    let early_default = c.k.pdl_early_trigger();
    c.k.set_pdl(true);
    let pdl_note = if c.k.pdl() {
        "PDL supported"
    } else {
        "no PDL before sm_90: plain launches only"
    };
    let mut want = Vec::new();
    for v in [Variant::FULL, Variant::FULL.separate_norms()] {
        c.k.set_pdl(false);
        m.reset(&s)?;
        m.step(&c.k, &s, v)?;
        want.push(m.outputs(&s)?);
    }
    for v in [
        Variant::FULL,
        Variant::FULL.separate_norms(),
        Variant::FULL.with_attn(AttnForm::Merged),
        Variant::FULL.with_attn(AttnForm::Rope),
        Variant::FULL.separate_norms().with_attn(AttnForm::Rope),
    ] {
        let want = &want[usize::from(!v.fused)];
        let finite = want
            .iter()
            .filter(|&&b| bf16::from_bits(b).is_finite())
            .count();
        let mut differ = 0usize;
        let mut runs = 0usize;
        for (pdl, early) in [(true, false), (true, true), (false, false)] {
            c.k.set_pdl(pdl);
            c.k.set_pdl_early_trigger(early, &s)?;
            if pdl {
                m.reset(&s)?;
                m.step(&c.k, &s, v)?;
                differ += diff_bits(&m.outputs(&s)?, want);
                runs += 1;
            }
            // graphs prefetch whole weight slices (results must not depend on it)
            let pf_default = c.k.gemv_prefetch();
            c.k.set_gemv_prefetch(u32::MAX);
            let g = m.capture(&c.k, &s, v);
            c.k.set_gemv_prefetch(pf_default);
            let (g, _) = g?;
            for _ in 0..8 {
                m.reset(&s)?;
                g.launch()?;
                differ += diff_bits(&m.outputs(&s)?, want);
                runs += 1;
            }
        }
        c.record(
            &format!(
                "decode step, {} norms, attention {:?}: eager/graph x PDL on (end/early trigger)/off vs eager without PDL, separate attention ({runs} runs, {differ} values differ, {finite} of {} finite; {pdl_note})",
                if v.fused { "fused" } else { "separate" },
                v.attn,
                want.len()
            ),
            if finite == want.len() {
                differ as f64 / want.len() as f64
            } else {
                f64::INFINITY
            },
            0.0,
        );
    }
    c.k.set_pdl(pdl_default);
    c.k.set_pdl_early_trigger(early_default, &s)?;
    Ok(())
}

pub(crate) fn diff_bits(a: &[u16], b: &[u16]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x != y).count()
}
