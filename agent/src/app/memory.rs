//! Giving freed heap memory back to the kernel.
//!
//! Start-up and every reload allocate far more than the agent keeps: the file datastore's YAML
//! value trees (about 16 MB for 10,000 IPAM blocks, dropped once the typed objects are built),
//! the kernel BTF parsed twice by the route watch (about 20 MB), route dumps and plans. glibc's
//! allocator keeps freed chunks in its arenas and returns only the free space at the top of a
//! heap, so without help the resident size stays at the start-up peak (agent-footprint in
//! BENCHMARKS.md: 84.7 MB RSS, of which about 37 MB was free heap). `malloc_trim(0)` releases
//! the free pages of every arena (`MADV_DONTNEED`); the agent calls it once the work that
//! allocated them is done.

/// Release free heap pages to the kernel (glibc `malloc_trim(0)`; a no-op on other C
/// libraries). Costs a walk of the allocator's free lists: call it after bursts of work, not
/// per operation.
pub fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only walks glibc's own arenas under their locks; it has no
        // preconditions and is safe to call from any thread at any time.
        unsafe {
            nix::libc::malloc_trim(0);
        }
    }
}
