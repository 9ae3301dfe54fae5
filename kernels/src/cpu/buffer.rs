//! Large buffers on transparent huge pages.
//!
//! A decode step streams through every weight matrix (about 100 MB for a small model) and, in
//! batches, through the KV cache rows of every sequence. With 4 KiB pages nearly every page of
//! that costs a TLB miss and a page walk, which the kernels' prefetches trigger on the critical
//! path; 2 MiB pages remove almost all of them (a batch-16 decode step of SmolLM2-135M runs
//! about 15% faster).
//!
//! A huge page only backs a 2 MiB-aligned 2 MiB range of a mapping, so buffers smaller than
//! that (most weight matrices of a small model) share large mappings ("chunks"), handed out
//! front to back and unmapped when the last buffer in them is dropped. Buffers of a chunk's
//! size or more get a mapping of their own.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};

/// Size of a huge page on x86-64 and most Linux configurations.
const HUGE_PAGE: usize = 2 << 20;
/// Size of a shared mapping.
const CHUNK_BYTES: usize = 32 << 20;
/// Alignment of buffers in a shared mapping (a cache line).
const ALIGN: usize = 64;

/// Zeroed bytes on memory advised (on Linux) to use transparent huge pages; on the heap where
/// no mapping can be made, or for buffers too small to matter.
pub struct HugeBytes {
    storage: Storage,
    len: usize,
}

enum Storage {
    /// Bytes `offset..offset + len` of a shared mapping, which no other buffer overlaps.
    Shared {
        chunk: Arc<Chunk>,
        offset: usize,
    },
    Own(memmap2::MmapMut),
    Heap(Vec<u8>),
}

/// A shared mapping. Buffers reach their bytes through `base`, each its own range.
struct Chunk {
    map: memmap2::MmapMut,
    base: *mut u8,
}

// SAFETY: `base` points into `map`, which lives as long as the chunk; every `HugeBytes` in a
// chunk reads and writes only its own range (handed out once, see `HugeBytes::zeroed`), through
// `&self`/`&mut self` of that `HugeBytes`, so sharing the chunk across threads is sound.
unsafe impl Send for Chunk {}
unsafe impl Sync for Chunk {}

/// The chunk buffers are currently taken from, and how much of it is taken.
static CURRENT: Mutex<Option<(Arc<Chunk>, usize)>> = Mutex::new(None);

fn advise(map: &memmap2::MmapMut) {
    // Only advice: without transparent huge pages the mapping keeps 4 KiB pages.
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::HugePage);
    #[cfg(not(target_os = "linux"))]
    let _ = map;
}

impl HugeBytes {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> HugeBytes {
        let storage = if len < 4096 {
            Storage::Heap(vec![0; len])
        } else if len >= CHUNK_BYTES {
            match memmap2::MmapMut::map_anon(len) {
                Ok(map) => {
                    advise(&map);
                    Storage::Own(map)
                }
                Err(_) => Storage::Heap(vec![0; len]),
            }
        } else {
            match take_shared(len) {
                Some((chunk, offset)) => Storage::Shared { chunk, offset },
                None => Storage::Heap(vec![0; len]),
            }
        };
        HugeBytes { storage, len }
    }

    /// A copy of `bytes`.
    pub(crate) fn copy_of(bytes: &[u8]) -> HugeBytes {
        let mut out = HugeBytes::zeroed(bytes.len());
        out.copy_from_slice(bytes);
        out
    }
}

/// A fresh (zeroed, never handed out) range of `len < CHUNK_BYTES` bytes of a shared mapping.
fn take_shared(len: usize) -> Option<(Arc<Chunk>, usize)> {
    let mut current = CURRENT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((chunk, used)) = current.as_mut() {
        let offset = used.next_multiple_of(ALIGN);
        if offset + len <= chunk.map.len() {
            *used = offset + len;
            return Some((chunk.clone(), offset));
        }
    }
    let mut map = memmap2::MmapMut::map_anon(CHUNK_BYTES.max(HUGE_PAGE)).ok()?;
    advise(&map);
    let base = map.as_mut_ptr();
    let chunk = Arc::new(Chunk { map, base });
    *current = Some((chunk.clone(), len));
    Some((chunk, 0))
}

impl Deref for HugeBytes {
    type Target = [u8];

    #[inline]
    fn deref(&self) -> &[u8] {
        match &self.storage {
            // SAFETY: `offset..offset + len` lies inside the chunk's mapping (checked when it
            // was handed out), which outlives `self`; only this buffer uses that range.
            Storage::Shared { chunk, offset } => unsafe {
                std::slice::from_raw_parts(chunk.base.add(*offset), self.len)
            },
            Storage::Own(map) => &map[..self.len],
            Storage::Heap(v) => v,
        }
    }
}

impl DerefMut for HugeBytes {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.storage {
            // SAFETY: as in `deref`; `&mut self` makes this the only live view of the range.
            Storage::Shared { chunk, offset } => unsafe {
                std::slice::from_raw_parts_mut(chunk.base.add(*offset), self.len)
            },
            Storage::Own(map) => &mut map[..self.len],
            Storage::Heap(v) => v,
        }
    }
}

impl Clone for HugeBytes {
    fn clone(&self) -> HugeBytes {
        HugeBytes::copy_of(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_zeroed_disjoint_and_cloned_by_value() {
        // Heap-sized, shared-chunk-sized (several, so some share a chunk) and own-mapping-sized.
        let sizes = [100, 5000, 3 << 20, 70_000, 1 << 20, CHUNK_BYTES + 10];
        let mut bufs: Vec<HugeBytes> = sizes.iter().map(|&n| HugeBytes::zeroed(n)).collect();
        for (i, b) in bufs.iter_mut().enumerate() {
            assert_eq!(b.len(), sizes[i]);
            assert!(b.iter().all(|&x| x == 0), "buffer {i} not zeroed");
            b.fill(i as u8 + 1);
        }
        for (i, b) in bufs.iter().enumerate() {
            assert!(
                b.iter().all(|&x| x == i as u8 + 1),
                "buffer {i} overwritten"
            );
        }
        let mut copy = bufs[1].clone();
        copy[0] = 0xaa;
        assert_eq!(bufs[1][0], 2);
        assert_eq!(&copy[1..], &bufs[1][1..]);
        let from = HugeBytes::copy_of(&[1, 2, 3]);
        assert_eq!(&from[..], &[1, 2, 3]);
    }
}
