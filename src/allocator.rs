//! The global allocator: mimalloc, asked the way C asks it.
//!
//! Not a module of the library (which forbids unsafe code): the `fencegate`
//! binary declares it, and the benchmarks and `examples/hyper_floor.rs`
//! include this file by path, so what they measure is what ships.

/// mimalloc, asked the way C asks it. The `mimalloc` crate passes every
/// allocation's alignment to `mi_malloc_aligned`, and mimalloc 3 sends an
/// alignment that every block has anyway down its slow, over-allocating path
/// when the block is over 1 KiB and not a power of two: about ten
/// allocations of every request (its boxed futures, hyper's buffers): a
/// measurable share of a fenced `PUT` (docs/perf-log.md). Word-aligned
/// requests, nearly all, go to plain `mi_malloc`: every mimalloc block is
/// word-aligned. Only larger alignments take the aligned calls.
pub struct Mimalloc;

/// The alignment every mimalloc block has, whatever its size.
const WORD: usize = std::mem::size_of::<usize>();

// SAFETY: each call hands mimalloc the size (and, above WORD, the alignment)
// of `layout` and returns what mimalloc returns: a block of at least that
// size aligned to at least `layout.align()` (mimalloc's blocks are all
// word-aligned), or null. Every block is freed with `mi_free`, which takes
// blocks from all of these calls, and resized with the call of its own kind.
unsafe impl std::alloc::GlobalAlloc for Mimalloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        use libmimalloc_sys::{mi_malloc, mi_malloc_aligned};
        // SAFETY: see the impl.
        unsafe {
            if layout.align() <= WORD {
                mi_malloc(layout.size()).cast()
            } else {
                mi_malloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        use libmimalloc_sys::{mi_zalloc, mi_zalloc_aligned};
        // SAFETY: see the impl.
        unsafe {
            if layout.align() <= WORD {
                mi_zalloc(layout.size()).cast()
            } else {
                mi_zalloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _layout: std::alloc::Layout) {
        // SAFETY: see the impl; `ptr` came from one of the calls above.
        unsafe { libmimalloc_sys::mi_free(ptr.cast()) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        use libmimalloc_sys::{mi_realloc, mi_realloc_aligned};
        // SAFETY: see the impl; `ptr` came from the call of the same kind.
        unsafe {
            if layout.align() <= WORD {
                mi_realloc(ptr.cast(), new_size).cast()
            } else {
                mi_realloc_aligned(ptr.cast(), new_size, layout.align()).cast()
            }
        }
    }
}
