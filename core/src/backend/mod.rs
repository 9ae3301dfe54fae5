//! The narrow interface between the scheduler and whatever runs the model.
//!
//! The scheduler owns KV slot *indices* (see [`crate::cache`]); a backend owns the KV *memory*
//! (one K and one V row per slot and layer) and runs forward passes over batches of sequences.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
mod error;
mod host_sampling;
mod load;

pub use error::BackendError;
pub use host_sampling::HostSampling;
pub use load::{KvCacheDtype, LoadOptions, detect_device, load};

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
    /// Whether `tokens` are prompt tokens (a prompt or a chunk of one, also a single token
    /// after a cached prefix) rather than a token being decoded. Backends that run decode
    /// passes in another form (the CUDA decode attention) keep a prompt token out of it where
    /// the form must not depend on the cache (`--enable-deterministic-inference`).
    pub prompt: bool,
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

/// An edit of one logits row before device sampling (penalties, `logit_bias`, the
/// `min_new_tokens` mask): `l = rep == 1 ? l : (l > 0 ? l / rep : l * rep); l += add`, for
/// token `token` of the row of the `seq`-th sampling sequence. At most one edit per
/// (sequence, token).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogitEdit {
    pub seq: u32,
    pub token: u32,
    pub rep: f32,
    pub add: f32,
}

impl LogitEdit {
    /// The edited value of logit `l`.
    pub fn apply(&self, l: f32) -> f32 {
        let l = if self.rep == 1.0 {
            l
        } else if l > 0.0 {
            l / self.rep
        } else {
            l * self.rep
        };
        l + self.add
    }
}

/// A pass that samples on the backend's device: per sampling sequence (those with
/// `num_logits` > 0, each exactly 1, in batch order) its parameters, and the logits edits.
#[derive(Debug, Clone, Copy)]
pub struct DeviceSampling<'a> {
    pub params: &'a [SampleInput],
    pub edits: &'a [LogitEdit],
    /// Overlapped passes: `prev[i] = Some(j)` means sequence `i`'s single input token is the
    /// `j`-th token sampled by the pass launched before this one (not yet known to the
    /// caller; its `tokens[0]` is a placeholder). Empty or all `None` otherwise.
    pub prev: &'a [Option<u32>],
}

pub trait Backend: Send {
    /// Run one forward pass. Returns, sequence after sequence, the logits of the last
    /// `num_logits` tokens of each (clamped to its token count), each row `vocab_size()` long.
    fn forward(&mut self, batch: &[SeqInput<'_>]) -> Result<Vec<f32>>;

    fn vocab_size(&self) -> usize;

    /// Hands back a logits buffer that [`Backend::forward`] returned and the caller is done
    /// with, so that the next pass can write into it instead of a freshly zeroed allocation
    /// (megabytes per batched step). Its contents do not matter.
    fn recycle_logits(&mut self, logits: Vec<f32>) {
        drop(logits);
    }

    /// Number of KV slots this backend allocated.
    fn kv_capacity(&self) -> usize;

    /// A short description for logs and /get_server_info (device, dtype).
    fn describe(&self) -> String;

    /// Sampling on the backend's own device, for a backend that can, so that the scheduler
    /// can skip copying logits out for requests that need nothing but a token.
    fn device_sampler(&mut self) -> Option<&mut dyn DeviceSampler> {
        None
    }

    /// Asynchronous passes, for a backend whose [`Overlap::launch_sample`] returns before the
    /// pass is done, so that the scheduler gains by preparing the next batch meanwhile
    /// (overlap scheduling). Such a backend also samples on its device.
    fn overlap(&mut self) -> Option<&mut dyn Overlap> {
        None
    }
}

/// What a backend that samples on its device does (see [`Backend::device_sampler`]).
pub trait DeviceSampler {
    /// Run one forward pass and sample one token for every sequence with `num_logits` > 0
    /// (each must have exactly 1), as `sampling` says (its `prev` empty). Tokens in order.
    fn forward_sample(
        &mut self,
        batch: &[SeqInput<'_>],
        sampling: DeviceSampling<'_>,
    ) -> Result<Vec<u32>>;
}

/// What a backend that overlaps passes with the host does (see [`Backend::overlap`]).
pub trait Overlap {
    /// Start what [`DeviceSampler::forward_sample`] does; its tokens come from the next
    /// [`Overlap::collect`]. At most one pass is launched and not yet collected, plus the one
    /// being launched: a pass may take input tokens from the previous one (`sampling.prev`).
    fn launch_sample(&mut self, batch: &[SeqInput<'_>], sampling: DeviceSampling<'_>)
    -> Result<()>;

    /// The tokens of the oldest launched pass not yet collected (waits for it).
    fn collect(&mut self) -> Result<Vec<u32>>;

    /// Forget every launched pass not yet collected (after a failure), waiting for the
    /// device to finish them.
    fn discard_launched(&mut self);
}
