//! Pool of KV-cache token slots (page size 1).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::CacheError;

/// Free token slots `0..capacity`, handed out lowest first.
///
/// Lowest first keeps the slots in use packed at the bottom of the cache, and keeps a
/// sequence's rows close together: a batch decoding together takes one slot per sequence per
/// step from the bottom of the free range, so each sequence's new rows sit one batch apart,
/// however long the server has run. (Reusing the most recently freed slots first instead
/// scatters them: requests that finish together free interleaved slots, and the next batch
/// then gets rows a batch × batch apart, which the attention reads far more slowly.)
///
/// A per-slot flag makes double frees and foreign slots detectable in O(1): a bad `free` is
/// rejected as a whole and leaves the pool unchanged.
#[derive(Debug, Clone)]
pub struct KvPool {
    /// Free slots, smallest on top.
    free_list: BinaryHeap<Reverse<u32>>,
    /// `is_free[slot]` mirrors membership in `free_list`.
    is_free: Vec<bool>,
}

impl KvPool {
    /// A pool with every slot free. Capacities above `u32::MAX` are clamped (slots are `u32`).
    pub fn new(capacity: usize) -> Self {
        let capacity = if capacity > u32::MAX as usize {
            tracing::warn!(capacity, "KV pool capacity clamped to u32::MAX slots");
            u32::MAX as usize
        } else {
            capacity
        };
        let mut pool = Self {
            free_list: BinaryHeap::new(),
            is_free: vec![true; capacity],
        };
        pool.fill_free_list();
        pool
    }

    fn fill_free_list(&mut self) {
        // Ascending order is already a valid min-heap.
        let all: Vec<Reverse<u32>> = (0..self.is_free.len() as u32).map(Reverse).collect();
        self.free_list = BinaryHeap::from(all);
    }

    /// Total number of slots.
    pub fn capacity(&self) -> usize {
        self.is_free.len()
    }

    /// Number of free slots.
    pub fn available(&self) -> usize {
        self.free_list.len()
    }

    /// Number of slots handed out and not yet returned.
    pub fn used(&self) -> usize {
        self.capacity() - self.available()
    }

    /// Whether `slot` is currently free (false for out-of-range slots).
    pub fn is_free(&self, slot: u32) -> bool {
        self.is_free.get(slot as usize).copied().unwrap_or(false)
    }

    /// Take the `n` lowest free slots (ascending), or none at all if fewer than `n` are free.
    pub fn alloc(&mut self, n: usize) -> Option<Vec<u32>> {
        if n > self.free_list.len() {
            return None;
        }
        let mut slots = Vec::with_capacity(n);
        while slots.len() < n {
            let Some(Reverse(s)) = self.free_list.pop() else {
                break;
            };
            self.is_free[s as usize] = false;
            slots.push(s);
        }
        Some(slots)
    }

    /// Return slots to the pool. A slot that is out of range, already free, or listed twice
    /// rejects the whole call: the error is logged and returned and the pool is unchanged.
    pub fn free(&mut self, slots: &[u32]) -> Result<(), CacheError> {
        for (i, &slot) in slots.iter().enumerate() {
            let err = match self.is_free.get(slot as usize) {
                None => Some(CacheError::SlotOutOfRange {
                    slot,
                    capacity: self.capacity(),
                }),
                Some(true) => Some(CacheError::DoubleFree { slot }),
                Some(false) => None,
            };
            if let Some(err) = err {
                // Undo the marks of this call; those slots were all allocated before it.
                for &s in &slots[..i] {
                    self.is_free[s as usize] = false;
                }
                tracing::error!(error = %err, "rejected KV slot free");
                return Err(err);
            }
            self.is_free[slot as usize] = true;
        }
        self.free_list.extend(slots.iter().map(|&s| Reverse(s)));
        Ok(())
    }

    /// Mark every slot free (for a full flush when no request holds slots).
    pub fn reset(&mut self) {
        self.is_free.fill(true);
        self.fill_free_list();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_is_all_or_nothing() {
        let mut pool = KvPool::new(4);
        assert_eq!(pool.alloc(3), Some(vec![0, 1, 2]));
        assert_eq!(pool.alloc(2), None);
        assert_eq!(pool.available(), 1);
        assert_eq!(pool.used(), 3);
        assert_eq!(pool.alloc(0), Some(vec![]));
        assert_eq!(pool.alloc(1), Some(vec![3]));
        assert_eq!(pool.available(), 0);
    }

    #[test]
    fn freed_slots_are_reused_lowest_first() {
        let mut pool = KvPool::new(8);
        let a = pool.alloc(6).expect("room");
        assert_eq!(a, vec![0, 1, 2, 3, 4, 5]);
        pool.free(&[a[4], a[1], a[2]]).expect("valid free");
        assert_eq!(pool.available(), 5);
        assert_eq!(pool.alloc(2), Some(vec![1, 2]));
        assert_eq!(pool.alloc(3), Some(vec![4, 6, 7]));
        assert_eq!(pool.available(), 0);
    }

    #[test]
    fn bad_frees_are_rejected_without_changing_the_pool() {
        let mut pool = KvPool::new(4);
        let a = pool.alloc(2).expect("room");
        assert_eq!(
            pool.free(&[a[0], 9]),
            Err(CacheError::SlotOutOfRange {
                slot: 9,
                capacity: 4
            })
        );
        assert_eq!(
            pool.free(&[a[0], 3]),
            Err(CacheError::DoubleFree { slot: 3 })
        );
        assert_eq!(
            pool.free(&[a[0], a[0]]),
            Err(CacheError::DoubleFree { slot: a[0] })
        );
        assert_eq!(pool.available(), 2);
        assert!(!pool.is_free(a[0]));
        pool.free(&a).expect("valid free");
        assert_eq!(pool.available(), 4);
        assert_eq!(
            pool.free(&a[..1]),
            Err(CacheError::DoubleFree { slot: a[0] })
        );
        assert_eq!(pool.available(), 4);
    }

    #[test]
    fn reset_frees_everything() {
        let mut pool = KvPool::new(5);
        let _ = pool.alloc(5);
        pool.reset();
        assert_eq!(pool.available(), 5);
        assert_eq!(pool.alloc(5), Some(vec![0, 1, 2, 3, 4]));
    }
}
