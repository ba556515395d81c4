//! The agent's allocator, and giving freed memory back to the kernel.
//!
//! Start-up and every reload allocate far more than the agent keeps: the datastores' lists and
//! value trees (a 100,000-block IPAMBlock list is 120 MB of JSON, decoded in one piece), the
//! kernel BTF parsed by the route watch (about 20 MB), route dumps and plans. glibc's allocator
//! kept those freed chunks: `malloc_trim(0)` returned whole free pages, but at 100,000 IPAM
//! blocks 1.7 GB of its arenas were free against 0.2 GB in use, and 0.7 GB of the free part
//! stayed resident in pages shared with live objects (kube-100k, BENCHMARKS.md: steady RSS
//! 935 MB). [`Allocator`] (mimalloc) keeps small objects of one size together in pages of
//! their own and returns a page once it is empty: the same run held 313 MB, and planned in half
//! the time. The binaries (`routewarden`, the bench harness) install it with
//! `#[global_allocator]`; the library's tests run on the system allocator.

/// The allocator the binaries install: mimalloc (MIT; the C library is built from source by
/// `libmimalloc-sys`, no system package).
pub type Allocator = mimalloc::MiMalloc;

/// Set the allocator's options; the binaries call it first thing in `main`. Purge freed pages
/// at once (`purge_delay` 0; mimalloc's default waits 10 ms, and a thread that then stays idle
/// never purges them) and commit arena memory on demand (`arena_eager_commit` 0, for arenas
/// reserved from now on; the first one is reserved before `main`, so the image also sets
/// `MIMALLOC_ARENA_EAGER_COMMIT=0`, which mimalloc reads when it starts). Measured by
/// agent-footprint (10,000 routes, idle): 53.5 MB RSS with mimalloc's defaults, 47–48 MB
/// with this call, 36.4 MB with the variable too (glibc: 37.5 MB).
pub fn configure_allocator() {
    // `mi_option_t` values from mimalloc.h (`mi_option_e`, the same in its v2 and v3 sources
    // that libmimalloc-sys 0.1.49 bundles); its Rust bindings name neither.
    const ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;
    const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    // SAFETY: mi_option_set stores a value mimalloc reads on its next allocation or purge; it
    // has no preconditions and is thread-safe.
    unsafe {
        libmimalloc_sys::mi_option_set(ARENA_EAGER_COMMIT, 0);
        libmimalloc_sys::mi_option_set(PURGE_DELAY, 0);
    }
}

/// Give freed heap memory back to the kernel: mimalloc's `mi_collect(true)` (every empty page
/// of every thread's heap) and glibc's `malloc_trim(0)` (what the C libraries or the system
/// allocator freed; a no-op on other C libraries). Costs a walk of the free lists: call it after
/// bursts of work, not per operation.
pub fn release_free_heap() {
    // SAFETY: mi_collect only walks mimalloc's own heaps (the calling thread's, and abandoned
    // pages); it has no preconditions, and does nothing when mimalloc holds no memory.
    unsafe {
        libmimalloc_sys::mi_collect(true);
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only walks glibc's own arenas under their locks; it has no
        // preconditions and is safe to call from any thread at any time.
        unsafe {
            nix::libc::malloc_trim(0);
        }
    }
}
