//! The narrow interface between the scheduler and whatever runs the model.
//!
//! The scheduler owns KV slot *indices* (see [`crate::cache`]); a backend owns the KV *memory*
//! (one K and one V row per slot and layer) and runs forward passes over batches of sequences.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

use crate::error::Result;

/// One sequence's part of a forward pass.
#[derive(Debug, Clone, Copy)]
pub struct SeqInput<'a> {
    /// Tokens to run now (a whole prompt, a chunk of one, or one decode token).
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`; positions before it are already in the KV cache.
    pub start_pos: usize,
    /// KV slots of positions `0..start_pos + tokens.len()`: the cached prefix's slots then the
    /// slots where the new tokens' K/V are written.
    pub kv_slots: &'a [u32],
    /// How many of this sequence's last tokens need logits: 1 for the next-token distribution,
    /// more for prompt logprobs, 0 for a prompt chunk that is not the last.
    pub num_logits: usize,
}

/// Sampling controls a backend may apply on its own device.
#[derive(Debug, Clone, Copy)]
pub struct SampleInput {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: i32,
    pub min_p: f32,
    /// A fresh uniform draw in [0, 1) from the request's generator.
    pub uniform: f32,
}

pub trait Backend: Send {
    /// Run one forward pass. Returns, sequence after sequence, the logits of the last
    /// `num_logits` tokens of each (clamped to its token count), each row `vocab_size()` long.
    fn forward(&mut self, batch: &[SeqInput<'_>]) -> Result<Vec<f32>>;

    fn vocab_size(&self) -> usize;

    /// Number of KV slots this backend allocated.
    fn kv_capacity(&self) -> usize;

    /// A short description for logs and /get_server_info (device, dtype).
    fn describe(&self) -> String;

    /// Whether [`Backend::forward_sample`] samples on the backend's own device, so that the
    /// scheduler can skip copying logits out for requests that need nothing but a token.
    fn samples_on_device(&self) -> bool {
        false
    }

    /// Run one forward pass and sample one token for every sequence with `num_logits` > 0
    /// (each must have exactly 1), with `params[i]` for the i-th of them. Tokens in order.
    fn forward_sample(
        &mut self,
        batch: &[SeqInput<'_>],
        params: &[SampleInput],
    ) -> Result<Vec<u32>> {
        let _ = (batch, params);
        Err(crate::error::EngineError::Internal(
            "this backend does not sample on its device".into(),
        ))
    }
}
