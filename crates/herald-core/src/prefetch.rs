//! A hint to the CPU to start loading memory that is about to be used.
//!
//! With many topics or many connections, what one message touches was last touched thousands of
//! messages earlier and has left the cache. Each such load stalls the core for a memory round
//! trip; when the address is known early, a prefetch lets several of those round trips overlap
//! with each other and with other work (docs/performance.md, "Cache misses").
//!
//! Hand-written: std has no portable prefetch. On targets other than x86-64 it does nothing.

/// The cache line size of the machines herald runs on (x86-64 and most ARM servers).
const LINE: usize = 64;

/// Starts loading every cache line that the `bytes` bytes at `p` touch. Never faults, whatever
/// `p` is: a stale or dangling address is harmless.
///
/// Each of those lines holds `p`, `p + 64`, `p + 128`, … or the last byte, so the number of
/// hints depends on `bytes` alone, not on where `p` falls in its line: every caller passes a
/// type's size, and the loop unrolls into one instruction per line, with no address arithmetic
/// or branch between them (it runs several times per delivery).
#[inline(always)]
pub fn prefetch<T>(p: *const T, bytes: usize) {
    let p = p.cast::<u8>();
    let bytes = bytes.max(1);
    for i in 0..bytes.div_ceil(LINE) {
        line(p.wrapping_add(i * LINE));
    }
    line(p.wrapping_add(bytes - 1));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_address_is_harmless() {
        // Null, unmapped, dangling and the top of the address space: a hint never faults.
        for addr in [0, 8, 0xdead_beef, usize::MAX - 100] {
            prefetch(std::ptr::without_provenance::<u8>(addr), 256);
        }
        let freed = Box::into_raw(Box::new([0u8; 100]));
        // SAFETY: `freed` came from `Box::into_raw` just above and is freed once.
        drop(unsafe { Box::from_raw(freed) });
        prefetch(freed, 100);
    }
}
