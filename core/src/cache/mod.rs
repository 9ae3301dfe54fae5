//! KV-cache bookkeeping: which slots of the backend's KV arrays are free, and which token
//! prefixes they hold.
//!
//! The KV tensors live in the backend, indexed by slot (one slot per token, page size 1). This
//! module only manages slot indices:
//! - [`KvPool`] hands out and takes back slots;
//! - [`RadixCache`] (SGLang's RadixAttention) remembers the slots of finished and running
//!   requests' tokens in a radix tree keyed by token ids, so later requests that share a prefix
//!   reuse those slots instead of recomputing them, and evicts least-recently-used leaves when
//!   the pool runs short.
//!
//! Ownership rule: every slot is in exactly one place — the pool's free list, the tree, or a
//! running request (the part of its tokens the tree does not hold).

mod kv_pool;
mod radix;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

pub use kv_pool::KvPool;
pub use radix::{MatchResult, NodeId, RadixCache};

/// Misuse of the pool or the tree. These are scheduler bugs, never caused by request input;
/// they are reported instead of corrupting the bookkeeping.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheError {
    #[error("KV slot {slot} is out of range (pool capacity {capacity})")]
    SlotOutOfRange { slot: u32, capacity: usize },
    #[error("KV slot {slot} freed twice")]
    DoubleFree { slot: u32 },
    #[error("radix node {0:?} does not exist (evicted or never created)")]
    InvalidNode(NodeId),
    #[error("radix node {0:?} is not locked")]
    NotLocked(NodeId),
    #[error("radix cache has {protected} locked tokens; cannot reset while requests run")]
    Locked { protected: usize },
    #[error("{tokens} tokens but {slots} KV slots")]
    LengthMismatch { tokens: usize, slots: usize },
    #[error("request tokens do not extend the prefix held by its locked radix node")]
    PrefixMismatch,
}

impl CacheError {
    /// Short, stable name of the failure kind, for metric labels.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::SlotOutOfRange { .. } => "slot_out_of_range",
            Self::DoubleFree { .. } => "double_free",
            Self::InvalidNode(_) => "invalid_node",
            Self::NotLocked(_) => "not_locked",
            Self::Locked { .. } => "locked",
            Self::LengthMismatch { .. } => "length_mismatch",
            Self::PrefixMismatch => "prefix_mismatch",
        }
    }
}
