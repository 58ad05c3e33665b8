//! Page-aligned buffers, so that member IO can go through O_DIRECT without a bounce.

use std::alloc::{alloc_zeroed, dealloc, Layout};

/// A zeroed, page-aligned byte buffer (for O_DIRECT member IO without a bounce buffer).
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
    layout: Layout,
    /// Goes back to this thread's pool when dropped.
    pooled: bool,
}

/// Buffers per thread kept for reuse, and the size from which pooling pays.
const POOL_MAX: usize = 64;
const POOL_MIN_BYTES: usize = 64 * 1024;

thread_local! {
    static POOL: std::cell::RefCell<Vec<AlignedBuf>> = const { std::cell::RefCell::new(Vec::new()) };
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes aligned to 4 KiB.
    pub fn new(len: usize) -> AlignedBuf {
        let layout = Layout::from_size_align(len.max(1), 4096).expect("buffer layout");
        // SAFETY: layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory allocating {len} bytes");
        AlignedBuf {
            ptr,
            len,
            layout,
            pooled: false,
        }
    }

    /// A buffer whose contents are unspecified (old data of an earlier buffer, never
    /// uninitialised memory), for callers that overwrite all of it, such as read targets.
    /// Large buffers are recycled per thread, which saves the zeroing and the page faults.
    pub fn scratch(len: usize) -> AlignedBuf {
        if len >= POOL_MIN_BYTES {
            let hit = POOL.with(|p| {
                let mut p = p.borrow_mut();
                p.iter()
                    .position(|b| b.len == len)
                    .map(|i| p.swap_remove(i))
            });
            if let Some(mut b) = hit {
                b.pooled = true;
                return b;
            }
        }
        let mut b = AlignedBuf::new(len);
        b.pooled = len >= POOL_MIN_BYTES;
        b
    }

    /// Half of this thread's recycled buffers, to seed a helper thread's pool
    /// ([`AlignedBuf::pool_fill`]) that works on buffers of the same sizes.
    pub(crate) fn pool_split() -> Vec<AlignedBuf> {
        POOL.with(|p| {
            let mut p = p.borrow_mut();
            let keep = p.len() - p.len() / 2;
            let mut moved = p.split_off(keep);
            moved.iter_mut().for_each(|b| b.pooled = true);
            moved
        })
    }

    /// Put buffers into this thread's pool (as far as it has room): each is recycled
    /// when dropped, and the pool keeps those it has room for.
    pub(crate) fn pool_fill(bufs: Vec<AlignedBuf>) {
        drop(bufs);
    }

    /// This thread's recycled buffers, taken out of its pool: a helper thread that ends
    /// hands them back to the thread that started it, whose pool they join when dropped.
    pub(crate) fn pool_drain() -> Vec<AlignedBuf> {
        let mut bufs = POOL.with(|p| std::mem::take(&mut *p.borrow_mut()));
        bufs.iter_mut().for_each(|b| b.pooled = true);
        bufs
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the length is zero.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes for the life of self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for len bytes and uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.pooled {
            let back = AlignedBuf {
                ptr: self.ptr,
                len: self.len,
                layout: self.layout,
                pooled: false,
            };
            let kept = POOL.try_with(|p| {
                let mut p = p.borrow_mut();
                if p.len() < POOL_MAX {
                    p.push(back);
                    None
                } else {
                    Some(back)
                }
            });
            // The allocation now belongs to `back`: kept in the pool, or freed when `back`
            // drops (pool full, or the thread is exiting and the closure was dropped).
            drop(kept);
            return;
        }
        // SAFETY: allocated in new() with this layout.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}
