//! Where repacked weights live: [`WeightBuf`], a buffer that starts as a `Vec` while a matrix
//! is repacked and may then move into a [`WeightArena`], one mapping shared by a model's
//! matrices and backed by 2 MiB pages.
//!
//! A decode step reads every weight once. Small models have many small matrices (SmolLM2
//! 135M: 210 of 0.1-0.7 MiB); allocated one by one, none holds a whole 2 MiB page, so the
//! huge-page advice of [`crate::hugepages`] never applies and every 4 KiB of weights costs a
//! TLB miss. Packed one after another into an arena, in the order the forward pass reads them,
//! they sit on huge pages and stream as one run of memory.

use std::fmt;
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::Arc;

/// Element types a [`WeightBuf`] may hold: plain numbers, valid for any bit pattern, with no
/// drop code, so that their bytes can be copied into an arena.
pub trait WeightElem: Copy + Send + Sync + 'static + private::Sealed {}

mod private {
    /// Keeps [`super::WeightElem`] to the types below.
    pub trait Sealed {}
}

macro_rules! weight_elems {
    ($($t:ty),*) => {
        $(
            impl private::Sealed for $t {}
            impl WeightElem for $t {}
        )*
    };
}
weight_elems!(u8, i8, u16, i16, u32, f32);

/// Alignment of every buffer in an arena: a cache line.
const ALIGN: usize = 64;

/// The largest buffer an arena takes. Larger ones keep their own allocation, which holds
/// whole huge pages of its own (advised when it was reserved): moving them would briefly
/// hold two copies, raising the process's peak memory by the largest matrix (Gemma 3's
/// embeddings: 170 MiB).
const ADOPT_MAX: usize = 8 << 20;

/// Address space reserved per arena mapping when the buffers to come are not known: pages
/// are only backed once written, so what is reserved and not used costs nothing.
const MAPPING: usize = 256 << 20;

/// A huge-page-aligned run of an anonymous mapping (`memmap2`) that arena buffers point
/// into; unmapped when the last buffer and the arena are dropped. Linux only: elsewhere there
/// is no huge-page advice to gain from, and [`Mapping::new`] declines (the buffers stay where
/// they are).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
struct Mapping {
    /// The first huge-page boundary of `map`.
    base: NonNull<u8>,
    /// Bytes from `base` to the end of `map`'s aligned run.
    len: usize,
    /// The mapping itself, owned here so that it lives as long as `base` is used.
    #[cfg(target_os = "linux")]
    _map: memmap2::MmapMut,
}

// SAFETY: the mapping is plain memory owned by this value; the buffers that point into it
// only read it after it was written (see `WeightArena::place`), and nothing mutates it
// through a shared reference.
unsafe impl Send for Mapping {}
// SAFETY: as above: shared access is read-only.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// A new mapping of at least `len` bytes, asked to be backed by huge pages; `None` when
    /// the system refuses the memory, and off Linux.
    fn new(len: usize) -> Option<Mapping> {
        #[cfg(target_os = "linux")]
        {
            use crate::hugepages::HUGE_PAGE as HUGE;
            let len = len.checked_next_multiple_of(HUGE)?;
            // One huge page more than asked for, to start at a huge-page boundary.
            let mut map = memmap2::MmapMut::map_anon(len.checked_add(HUGE)?).ok()?;
            let skip = (map.as_ptr() as usize).next_multiple_of(HUGE) - map.as_ptr() as usize;
            if let Err(e) = map.advise_range(memmap2::Advice::HugePage, skip, len) {
                // THP off or compiled out: only speed is lost.
                tracing::debug!(len, error = %e, "no huge pages for the weight arena");
            }
            let base = NonNull::new(map[skip..].as_mut_ptr())?;
            Some(Mapping {
                base,
                len,
                _map: map,
            })
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = len;
            None
        }
    }
}

/// The weight buffers of a model, packed one after another (cache-line aligned) into shared
/// mappings backed by huge pages. [`crate::QMatrix::move_into`] moves a matrix's buffers in; the
/// mappings stay alive as long as any buffer in them does.
pub struct WeightArena {
    /// Bytes to reserve per mapping (at least; more for a larger buffer).
    mapping_len: usize,
    current: Option<Arc<Mapping>>,
    /// Bytes of `current` in use.
    used: usize,
}

impl Default for WeightArena {
    fn default() -> Self {
        WeightArena::new()
    }
}

impl fmt::Debug for WeightArena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WeightArena")
            .field("mapped", &self.current.as_ref().map_or(0, |m| m.len))
            .field("used", &self.used)
            .finish()
    }
}

impl WeightArena {
    /// An empty arena; mappings are made as buffers come.
    pub fn new() -> WeightArena {
        WeightArena::with_mapping_len(MAPPING)
    }

    /// An empty arena reserving `len` bytes per mapping.
    fn with_mapping_len(len: usize) -> WeightArena {
        WeightArena {
            mapping_len: len,
            current: None,
            used: 0,
        }
    }

    /// Moves `buf` into the arena (a no-op for one already in an arena, empty, or larger than
    /// [`ADOPT_MAX`]). When no memory can be mapped it stays where it is: the arena only
    /// changes where weights live, never their values.
    pub(crate) fn adopt<T: WeightElem>(&mut self, buf: &mut WeightBuf<T>) {
        if buf.arena.is_some()
            || buf.heap.is_empty()
            || std::mem::size_of_val(&buf.heap[..]) > ADOPT_MAX
        {
            return;
        }
        if let Some(placed) = self.place(&buf.heap) {
            buf.arena = Some(placed);
            buf.heap = Vec::new();
        }
    }

    /// A copy of `v` in the arena, in a new mapping when the current one is full.
    fn place<T: WeightElem>(&mut self, v: &[T]) -> Option<ArenaSlice<T>> {
        let bytes = std::mem::size_of_val(v);
        let at = self.used.next_multiple_of(ALIGN);
        let fits = self
            .current
            .as_ref()
            .is_some_and(|m| at.checked_add(bytes).is_some_and(|end| end <= m.len));
        let (mapping, at) = if fits {
            (self.current.clone()?, at)
        } else {
            let m = Arc::new(Mapping::new(bytes.max(self.mapping_len))?);
            self.current = Some(m.clone());
            (m, 0)
        };
        // SAFETY: `at + bytes <= mapping.len` (checked above, or a fresh mapping at least
        // `bytes` long), so the destination lies inside the mapping; it is aligned to
        // `ALIGN` (the mapping's base is, and `at` is a multiple), enough for every
        // `WeightElem`; no other buffer overlaps it (the arena hands out each range once);
        // and `T: WeightElem` is a plain number type, valid to copy bytewise.
        let ptr = unsafe {
            let dst = mapping.base.as_ptr().add(at).cast::<T>();
            std::ptr::copy_nonoverlapping(v.as_ptr(), dst, v.len());
            NonNull::new_unchecked(dst)
        };
        self.used = at + bytes;
        Some(ArenaSlice {
            ptr,
            len: v.len(),
            _mapping: mapping,
        })
    }
}

/// A read-only run of `T` inside an arena mapping; a clone shares it (it is never written).
#[derive(Clone)]
pub struct ArenaSlice<T> {
    ptr: NonNull<T>,
    len: usize,
    _mapping: Arc<Mapping>,
}

// SAFETY: the slice is immutable after `WeightArena::place` wrote it, and `T: WeightElem` is
// `Send + Sync`; the mapping is kept alive by the `Arc`.
unsafe impl<T: WeightElem> Send for ArenaSlice<T> {}
// SAFETY: as above.
unsafe impl<T: WeightElem> Sync for ArenaSlice<T> {}

/// A buffer of repacked weights: a `Vec` while a matrix is built, then possibly a slice of a
/// [`WeightArena`]. Reads go through `Deref` to `[T]`; [`WeightBuf::vec_mut`] gives a `Vec`
/// to change (copying out of the arena first, if need be). A clone copies a `Vec` and shares
/// an arena slice.
#[derive(Clone)]
pub struct WeightBuf<T: WeightElem> {
    /// The values when not in an arena (empty when they are).
    heap: Vec<T>,
    /// The values' place in an arena.
    arena: Option<ArenaSlice<T>>,
}

impl<T: WeightElem> WeightBuf<T> {
    /// The buffer as a `Vec` to change, copied out of its arena if it was in one.
    pub fn vec_mut(&mut self) -> &mut Vec<T> {
        if let Some(a) = self.arena.take() {
            self.heap = a.to_vec();
        }
        &mut self.heap
    }

    /// Whether the buffer lives in an arena.
    pub fn in_arena(&self) -> bool {
        self.arena.is_some()
    }
}

impl<T: WeightElem> Deref for ArenaSlice<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: `ptr..ptr + len` was written by `WeightArena::place` and stays mapped
        // while `_mapping` lives; it is aligned for `T` and never written again.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: WeightElem> Deref for WeightBuf<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match &self.arena {
            Some(a) => a,
            None => &self.heap,
        }
    }
}

impl<T: WeightElem> From<Vec<T>> for WeightBuf<T> {
    fn from(v: Vec<T>) -> Self {
        WeightBuf {
            heap: v,
            arena: None,
        }
    }
}

impl<T: WeightElem + fmt::Debug> fmt::Debug for WeightBuf<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_os = "linux")]
    fn adopted_buffers_keep_their_values_and_alignment() {
        let mut arena = WeightArena::new();
        let mut a: WeightBuf<f32> = (0..1000).map(|i| i as f32 * 0.5).collect::<Vec<_>>().into();
        let mut b: WeightBuf<u8> = (0..77u8).collect::<Vec<_>>().into();
        let mut c: WeightBuf<u16> = vec![7u16; 3].into();
        let (wa, wb, wc) = (a.to_vec(), b.to_vec(), c.to_vec());
        arena.adopt(&mut a);
        arena.adopt(&mut b);
        arena.adopt(&mut c);
        assert!(a.in_arena() && b.in_arena() && c.in_arena());
        assert_eq!((&a[..], &b[..], &c[..]), (&wa[..], &wb[..], &wc[..]));
        for p in [
            a.as_ptr() as usize,
            b.as_ptr() as usize,
            c.as_ptr() as usize,
        ] {
            assert_eq!(p % ALIGN, 0);
        }
        // One after another in one mapping.
        assert_eq!(
            b.as_ptr() as usize - a.as_ptr() as usize,
            4000_usize.next_multiple_of(64)
        );
        // Buffers outlive the arena, and clones share the slice.
        drop(arena);
        let a2 = a.clone();
        assert_eq!(a2.as_ptr(), a.as_ptr());
        drop(a);
        assert_eq!(a2[999], 499.5);
        // Changing a buffer copies it out first.
        let mut c2 = c.clone();
        c2.vec_mut().push(9);
        assert_eq!((&c[..], &c2[..]), (&[7u16, 7, 7][..], &[7u16, 7, 7, 9][..]));
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_buffer_larger_than_a_mapping_gets_its_own() {
        let mut arena = WeightArena::with_mapping_len(4096);
        let mut small: WeightBuf<u8> = vec![1u8; 10].into();
        arena.adopt(&mut small);
        // Past the first mapping however the system rounds it (2 MiB pages on Linux).
        let n = (3 << 20) + 5;
        let mut big: WeightBuf<u8> = vec![2u8; n].into();
        arena.adopt(&mut big);
        let mut after: WeightBuf<u8> = vec![3u8; 100].into();
        arena.adopt(&mut after);
        assert!(small.in_arena() && big.in_arena() && after.in_arena());
        assert_eq!((big.len(), big[n - 1], small[9], after[99]), (n, 2, 1, 3));
        // The next buffer follows the big one in its mapping.
        assert_eq!(
            after.as_ptr() as usize - big.as_ptr() as usize,
            n.next_multiple_of(64)
        );
    }
}
