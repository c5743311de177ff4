//! Allocator tuning for the `metcd` process (mimalloc is the global
//! allocator of the binary and of the benchmarks).
//!
//! Measured on the durable write path (docs/benchmarks.md): with mimalloc's
//! default purge delay, memory freed after each group commit (encode
//! buffers, DMA bounce buffers, Ready vectors) goes back to the OS and is
//! faulted in and zeroed again by the next batch: half of all CPU time in
//! `clear_page`. Keeping freed memory (it is reused by later allocations, so
//! RSS stays at the working set's peak) doubled throughput at 1000 writers.

/// mimalloc's `mi_option_purge_delay` (v2 option numbering).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
/// mimalloc's `mi_option_allow_large_os_pages`.
const MI_OPTION_ALLOW_LARGE_OS_PAGES: libmimalloc_sys::mi_option_t = 6;

/// Applies the tuning; call first thing in `main`.
pub fn tune() {
    // SAFETY: plain option setters of the C allocator; valid option ids,
    // no pointers involved, callable at any time.
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1);
        libmimalloc_sys::mi_option_set(MI_OPTION_ALLOW_LARGE_OS_PAGES, 0);
    }
}
