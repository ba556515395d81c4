//! Small kernel-side helpers shared by every program of the object (the route detector, the
//! forwarding watch, the log rate limit), so each exists once.
use aya_ebpf::{helpers::bpf_ktime_get_ns, maps::PerCpuArray};

/// The value of a `u32` global that the loader may override (`EbpfLoader::override_global`).
/// Read volatile: the compiler would otherwise fold the default into the code.
#[inline(always)]
pub fn global_u32(v: &'static u32) -> u32 {
    // SAFETY: reading a static, which is valid and aligned for the program's whole life.
    unsafe { core::ptr::read_volatile(v) }
}

/// As [`global_u32`] for a `u64` global.
#[inline(always)]
pub fn global_u64(v: &'static u64) -> u64 {
    // SAFETY: as above.
    unsafe { core::ptr::read_volatile(v) }
}

/// `index`, hidden from the compiler so that the bounds check of the `get`/`get_mut` it feeds
/// stays in the program. An index the compiler knows to be in range (an enum's discriminant)
/// gets no check of its own, and the verifier then needs the range of the register holding
/// it, which Linux 6.1's loses when the compiler reloads the unchecked byte the enum was
/// decoded from. Each use costs the verifier a branch: only where 6.1 needs it.
#[inline(always)]
pub fn opaque_index(index: usize) -> usize {
    // SAFETY: reading a local.
    unsafe { core::ptr::read_volatile(&raw const index) }
}

/// Zero `*v` with one 8-byte store per word. Left to itself the compiler merges zero stores
/// next to byte fields into a `memset` call, which the object's builtins run a byte at a time
/// (~5 instructions a byte); volatile stores stay as written.
///
/// # Safety
/// All-zero bytes must be a valid `T` (integers, byte arrays, `MaybeUninit`).
#[inline(always)]
pub unsafe fn zero_words<T>(v: &mut T) {
    const { assert!(core::mem::size_of::<T>().is_multiple_of(8) && core::mem::align_of::<T>() >= 8) };
    let p = core::ptr::from_mut(v).cast::<u64>();
    for k in 0..core::mem::size_of::<T>() / 8 {
        // SAFETY: `v` is valid for writes of a `T`, 8-aligned and a whole number of words long
        // (checked above); zeros are a valid `T` (the caller's promise).
        unsafe { p.add(k).write_volatile(0) };
    }
}

/// Copy `*src` to `*dst` a 4-byte word at a time. Between two map values the compiler cannot
/// rule out overlap and calls `memmove`, which the object's builtins run a byte at a time.
///
/// # Safety
/// `T` must be plain data (integers and byte arrays, no padding the program relies on).
#[inline(always)]
pub unsafe fn copy_words<T>(dst: &mut T, src: &T) {
    const { assert!(core::mem::size_of::<T>().is_multiple_of(4) && core::mem::align_of::<T>() >= 4) };
    let (d, s) = (core::ptr::from_mut(dst).cast::<u32>(), core::ptr::from_ref(src).cast::<u32>());
    for k in 0..core::mem::size_of::<T>() / 4 {
        // SAFETY: both valid for a `T`, 4-aligned and a whole number of words long (checked
        // above); a word-by-word copy of plain data is the value.
        unsafe { d.add(k).write_volatile(s.add(k).read_volatile()) };
    }
}

/// Current kernel time, ns (`bpf_ktime_get_ns`: CLOCK_MONOTONIC, not counting suspend).
#[inline(always)]
pub fn now_ns() -> u64 {
    // SAFETY: helper without arguments.
    unsafe { bpf_ktime_get_ns() }
}

/// This CPU's slot `index` of a per-CPU array, writable; `None` past the array's end.
#[inline(always)]
#[expect(clippy::mut_from_ref, reason = "a per-CPU map slot is this CPU's own memory (see SAFETY)")]
pub fn per_cpu_slot<T>(map: &'static PerCpuArray<T>, index: u32) -> Option<&'static mut T> {
    // SAFETY: the pointer is this CPU's copy of an element that exists, valid for the
    // program's run; no other CPU writes it and the program does not run twice at once on one
    // CPU (TC, socket filter and tracing programs all run with preemption/migration off).
    map.get_ptr_mut(index).map(|p| unsafe { &mut *p })
}
