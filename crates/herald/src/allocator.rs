//! herald's allocator: mimalloc for small blocks, the system's for large ones.
//!
//! Every message allocates its block and frame and frees the ones it replaces: mimalloc does
//! that for about half of glibc's instructions (docs/performance.md). But mimalloc keeps freed
//! large blocks for reuse, and herald's memory bounds are promises: with mimalloc alone, a
//! burst of large images leaves the server over the bound `crates/herald/tests/cli.rs` holds it
//! to. glibc gives large blocks back to the system (mapped apart, or trimmed from the top of
//! its heap). So each size goes where it costs least.

use std::alloc::{GlobalAlloc, Layout, System};

use mimalloc::MiMalloc;

/// Blocks of this size and above go to the system allocator.
const LARGE: usize = 64 * 1024;

pub struct SplitBySize;

fn is_large(size: usize) -> bool {
    size >= LARGE
}

// SAFETY: each block is freed (or resized) by the allocator that made it: the choice depends
// on the size only, and `dealloc` and `realloc` are given the size the block was made with.
unsafe impl GlobalAlloc for SplitBySize {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if is_large(layout.size()) {
            unsafe { System.alloc(layout) }
        } else {
            unsafe { MiMalloc.alloc(layout) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if is_large(layout.size()) {
            unsafe { System.alloc_zeroed(layout) }
        } else {
            unsafe { MiMalloc.alloc_zeroed(layout) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if is_large(layout.size()) {
            unsafe { System.dealloc(ptr, layout) }
        } else {
            unsafe { MiMalloc.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        match (is_large(layout.size()), is_large(new_size)) {
            (true, true) => unsafe { System.realloc(ptr, layout, new_size) },
            (false, false) => unsafe { MiMalloc.realloc(ptr, layout, new_size) },
            // Crossing the line: a new block from the other allocator, and a copy.
            _ => unsafe {
                let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
                let new = self.alloc(new_layout);
                if !new.is_null() {
                    std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                    self.dealloc(ptr, layout);
                }
                new
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block keeps its bytes across resizes that cross the line, both ways.
    #[test]
    fn resizing_across_the_line_keeps_the_bytes() {
        let small = 1000;
        let large = 3 * LARGE;
        unsafe {
            let layout = Layout::from_size_align(small, 8).unwrap();
            let p = SplitBySize.alloc(layout);
            assert!(!p.is_null());
            for i in 0..small {
                *p.add(i) = i as u8;
            }
            let p = SplitBySize.realloc(p, layout, large);
            assert!(!p.is_null());
            for i in 0..small {
                assert_eq!(*p.add(i), i as u8);
            }
            for i in small..large {
                *p.add(i) = 7;
            }
            let p = SplitBySize.realloc(p, Layout::from_size_align(large, 8).unwrap(), 500);
            assert!(!p.is_null());
            for i in 0..500 {
                assert_eq!(*p.add(i), i as u8);
            }
            SplitBySize.dealloc(p, Layout::from_size_align(500, 8).unwrap());

            let zeroed = Layout::from_size_align(large, 64).unwrap();
            let z = SplitBySize.alloc_zeroed(zeroed);
            assert!(!z.is_null() && (z as usize).is_multiple_of(64));
            assert!((0..large).all(|i| *z.add(i) == 0));
            SplitBySize.dealloc(z, zeroed);
        }
    }
}
