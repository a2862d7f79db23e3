//! A hint to the CPU to start loading memory that is about to be used.
//!
//! With many topics or many connections, what one message touches was last touched thousands of
//! messages earlier and has left the cache. Each such load stalls the core for a memory round
//! trip; when the address is known early, a prefetch lets several of those round trips overlap
//! with each other and with other work (docs/performance.md, "Cache misses").
//!
//! Hand-written: std has no portable prefetch. On targets other than x86-64 it does nothing.

/// Starts loading the cache lines of the `bytes` bytes at `p`. Never faults, whatever `p` is:
/// a stale or dangling address is harmless.
#[inline(always)]
pub fn prefetch<T>(p: *const T, bytes: usize) {
    let p = p.cast::<u8>();
    let mut at = 0;
    while at < bytes {
        line(p.wrapping_add(at));
        at += 64;
    }
}

#[inline(always)]
fn line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing the program sees and never faults, even on an address
    // that is not mapped.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
