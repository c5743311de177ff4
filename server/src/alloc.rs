//! Allocator tuning for the `metcd` process (mimalloc is the global
//! allocator of the binary and of the benchmarks).
//!
//! Measured on the durable write path (docs/benchmarks.md): with mimalloc's
//! default purge delay, memory freed after each group commit (encode
//! buffers, DMA bounce buffers, Ready vectors) goes back to the OS and is
//! faulted in and zeroed again by the next batch: half of all CPU time in
//! `clear_page`. Keeping freed memory (it is reused by later allocations, so
//! RSS stays at the working set's peak) doubled throughput at 1000 writers.

/// mimalloc's `mi_option_purge_delay` (same number in v2 and v3).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
/// mimalloc's `mi_option_allow_large_os_pages`.
const MI_OPTION_ALLOW_LARGE_OS_PAGES: libmimalloc_sys::mi_option_t = 6;

/// Applies the tuning; call first thing in `main`.
pub fn tune() {
    tune_for_startup();
    keep_freed_memory();
}

/// The tuning for a server's start-up: freed memory still goes back to the
/// OS (recovery's one-off buffers), until [`release_freed_memory`] ends
/// start-up.
pub fn tune_for_startup() {
    // SAFETY: plain option setter of the C allocator; valid option id, no
    // pointers involved, callable at any time.
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_ALLOW_LARGE_OS_PAGES, 0);
    }
}

/// Keeps freed memory for reuse, unless the operator set mimalloc's own
/// `MIMALLOC_PURGE_DELAY` (milliseconds before freed memory goes back to
/// the OS), which mimalloc read at start and which is left in force.
fn keep_freed_memory() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: as in `tune_for_startup`.
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1);
    }
}

/// Ends start-up: returns the memory freed so far to the OS now, then keeps
/// freed memory for reuse from here on (the write path's setting). Freed
/// pages are only scheduled for purging while purging is on, so it must
/// stay on until here.
pub fn release_freed_memory() {
    // SAFETY: a collection of the allocator's own free memory (this
    // thread's heap and the arenas'); no pointers, callable at any time.
    unsafe {
        libmimalloc_sys::mi_collect(true);
    }
    keep_freed_memory();
}
