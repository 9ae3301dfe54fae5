//! Pool of KV-cache token slots (page size 1).

use super::CacheError;

/// Free list of token slots `0..capacity`.
///
/// A per-slot flag makes double frees and foreign slots detectable in O(1): a bad `free` is
/// rejected as a whole and leaves the pool unchanged.
#[derive(Debug, Clone)]
pub struct KvPool {
    /// Free slots; `alloc` takes from the end, `free` pushes to the end, so recently freed
    /// slots are reused first.
    free_list: Vec<u32>,
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
            free_list: Vec::with_capacity(capacity),
            is_free: vec![true; capacity],
        };
        pool.fill_free_list();
        pool
    }

    fn fill_free_list(&mut self) {
        self.free_list.clear();
        // Reversed so that a fresh pool hands out 0, 1, 2, ...
        self.free_list.extend((0..self.is_free.len() as u32).rev());
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

    /// Take `n` slots, or none at all if fewer than `n` are free.
    pub fn alloc(&mut self, n: usize) -> Option<Vec<u32>> {
        if n > self.free_list.len() {
            return None;
        }
        let mut slots = self.free_list.split_off(self.free_list.len() - n);
        slots.reverse();
        for &s in &slots {
            self.is_free[s as usize] = false;
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
        self.free_list.extend_from_slice(slots);
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
    fn free_returns_slots_and_reuses_them_first() {
        let mut pool = KvPool::new(8);
        let a = pool.alloc(4).expect("room");
        pool.free(&a[1..3]).expect("valid free");
        assert_eq!(pool.available(), 6);
        let b = pool.alloc(2).expect("room");
        let mut b_sorted = b.clone();
        b_sorted.sort_unstable();
        assert_eq!(b_sorted, vec![1, 2]);
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
