//! Device-style sampling for a backend that returns logits: [`HostSampling`] wraps it, runs the
//! pass, applies the logits edits and samples each row on the host with the same parameters
//! and uniform draws a GPU sampler gets. With overlap on, `launch_sample` still computes at
//! once (the CPU has no second engine to overlap with) but hands the tokens out one
//! `collect` later, so the scheduler's overlap bookkeeping runs exactly as on a GPU (tests).

use std::collections::VecDeque;

use super::{Backend, DeviceSampler, DeviceSampling, Overlap, SeqInput};
use crate::error::{EngineError, Result};
use crate::request::SamplingParams;
use crate::sampling::{argmax, sample_with};

pub struct HostSampling {
    inner: Box<dyn Backend>,
    overlap: bool,
    /// Tokens of launched passes not yet collected, oldest first.
    launched: VecDeque<Vec<u32>>,
}

impl HostSampling {
    pub fn new(inner: Box<dyn Backend>, overlap: bool) -> Self {
        HostSampling {
            inner,
            overlap,
            launched: VecDeque::new(),
        }
    }
}

impl Backend for HostSampling {
    fn forward(&mut self, batch: &[SeqInput<'_>]) -> Result<Vec<f32>> {
        self.inner.forward(batch)
    }

    fn recycle_logits(&mut self, logits: Vec<f32>) {
        self.inner.recycle_logits(logits);
    }

    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    fn kv_capacity(&self) -> usize {
        self.inner.kv_capacity()
    }

    fn describe(&self) -> String {
        format!(
            "{}, host sampling{}",
            self.inner.describe(),
            if self.overlap { ", overlap" } else { "" }
        )
    }

    fn device_sampler(&mut self) -> Option<&mut dyn DeviceSampler> {
        Some(self)
    }

    fn overlap(&mut self) -> Option<&mut dyn Overlap> {
        if self.overlap { Some(self) } else { None }
    }
}

impl HostSampling {
    /// Run the pass and sample its rows on the host, input tokens of `s.prev` taken from the
    /// newest launched pass.
    fn sample(&mut self, batch: &[SeqInput<'_>], s: DeviceSampling<'_>) -> Result<Vec<u32>> {
        // Input tokens taken from the previous pass (the newest launched).
        let mut tokens: Vec<Vec<u32>> = batch.iter().map(|q| q.tokens.to_vec()).collect();
        for (i, p) in s.prev.iter().enumerate() {
            let Some(j) = p else { continue };
            let prev = self
                .launched
                .back()
                .and_then(|t| t.get(*j as usize).copied());
            match (prev, tokens.get_mut(i)) {
                (Some(t), Some(seq)) if seq.len() == 1 => seq[0] = t,
                _ => {
                    return Err(EngineError::Internal(format!(
                        "sequence {i} takes token {j} of a previous pass that has none"
                    )));
                }
            }
        }
        let inputs: Vec<SeqInput<'_>> = batch
            .iter()
            .zip(&tokens)
            .map(|(q, t)| SeqInput { tokens: t, ..*q })
            .collect();
        let mut logits = self.inner.forward(&inputs)?;
        let v = self.inner.vocab_size();
        let rows = logits.len() / v.max(1);
        if rows != s.params.len() || batch.iter().any(|q| q.num_logits > 1) {
            return Err(EngineError::Internal(format!(
                "{rows} logits rows for {} sampling parameter sets",
                s.params.len()
            )));
        }
        for e in s.edits {
            let at = e.seq as usize * v + e.token as usize;
            if (e.token as usize) < v
                && let Some(l) = logits.get_mut(at)
            {
                *l = e.apply(*l);
            }
        }
        let out: Vec<u32> = s
            .params
            .iter()
            .zip(logits.chunks(v.max(1)))
            .map(|(p, row)| {
                if p.temperature <= 0.0 {
                    return argmax(row);
                }
                let params = SamplingParams {
                    temperature: p.temperature,
                    top_p: p.top_p,
                    top_k: p.top_k,
                    min_p: p.min_p,
                    ..SamplingParams::default()
                };
                sample_with(row, &params, p.uniform)
            })
            .collect();
        self.inner.recycle_logits(logits);
        Ok(out)
    }
}

impl DeviceSampler for HostSampling {
    fn forward_sample(
        &mut self,
        batch: &[SeqInput<'_>],
        s: DeviceSampling<'_>,
    ) -> Result<Vec<u32>> {
        self.sample(batch, s)
    }
}

impl Overlap for HostSampling {
    fn launch_sample(&mut self, batch: &[SeqInput<'_>], s: DeviceSampling<'_>) -> Result<()> {
        let out = self.sample(batch, s)?;
        self.launched.push_back(out);
        Ok(())
    }

    fn collect(&mut self) -> Result<Vec<u32>> {
        self.launched
            .pop_front()
            .ok_or_else(|| EngineError::Internal("no pass was launched".into()))
    }

    fn discard_launched(&mut self) {
        self.launched.clear();
    }
}
