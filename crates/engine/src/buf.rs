//! Page-aligned buffers, so that member IO can go through O_DIRECT without a bounce.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// A zeroed, page-aligned byte buffer (for O_DIRECT member IO without a bounce buffer).
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
    layout: Layout,
    /// Goes back to this thread's pool when dropped.
    pooled: bool,
}

/// The recycled buffers, shared by every thread: at most this many, of this many bytes in
/// all, each of at least `POOL_MIN_BYTES` (from which recycling pays: smaller ones cost
/// the allocator less than the lock).
const POOL_MAX: usize = 128;
const POOL_MAX_BYTES: usize = 64 << 20;
const POOL_MIN_BYTES: usize = 64 * 1024;

/// Buffers dropped for reuse. One pool for the process, not one per thread: a buffer often
/// drops on another thread than the one that took it (a sync item one thread reads and
/// another commits, a request one worker starts and another finishes), and per-thread
/// pools then fill on one side and run dry on the other, which allocates and faults in
/// fresh pages on every pass.
struct Pool {
    bufs: Vec<AlignedBuf>,
    bytes: usize,
}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    bufs: Vec::new(),
    bytes: 0,
});

fn pool() -> MutexGuard<'static, Pool> {
    POOL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Arrays alive in the process. When the last one goes, the pool gives its buffers back to
/// the allocator, so that an embedder done with its arrays does not keep their memory.
static POOL_USERS: AtomicUsize = AtomicUsize::new(0);

/// One array's share in [`POOL_USERS`], held for the array's life.
pub(crate) struct PoolUser(());

impl PoolUser {
    pub(crate) fn new() -> PoolUser {
        POOL_USERS.fetch_add(1, Ordering::SeqCst);
        PoolUser(())
    }
}

impl Drop for PoolUser {
    fn drop(&mut self) {
        if POOL_USERS.fetch_sub(1, Ordering::SeqCst) == 1 {
            // Taken out under the lock, freed after it.
            let bufs = {
                let mut p = pool();
                p.bytes = 0;
                std::mem::take(&mut p.bufs)
            };
            drop(bufs);
        }
    }
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
    /// Large buffers are recycled (the last one dropped of that size first, the one most
    /// likely still in a cache), which saves the zeroing and the page faults.
    pub fn scratch(len: usize) -> AlignedBuf {
        if len >= POOL_MIN_BYTES {
            let hit = {
                let mut p = pool();
                let hit = p
                    .bufs
                    .iter()
                    .rposition(|b| b.len == len)
                    .map(|i| p.bufs.remove(i));
                if hit.is_some() {
                    p.bytes -= len;
                }
                hit
            };
            if let Some(mut b) = hit {
                b.pooled = true;
                return b;
            }
        }
        let mut b = AlignedBuf::new(len);
        b.pooled = len >= POOL_MIN_BYTES;
        b
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
            let mut p = pool();
            if p.bufs.len() < POOL_MAX && p.bytes + back.len <= POOL_MAX_BYTES {
                p.bytes += back.len;
                p.bufs.push(back);
            }
            // Otherwise the allocation belongs to `back`, which frees it as it drops, after
            // the lock (`p`, declared later, drops first).
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A size no other test uses, so that the shared pool's buffer of it is this test's.
    const ODD: usize = POOL_MIN_BYTES + 7 * 4096;

    #[test]
    fn a_buffer_dropped_on_another_thread_is_reused() {
        // Counted as an array, so that no other test's last array empties the pool meanwhile.
        let _user = PoolUser::new();
        // A recycled buffer keeps what it held; a new one is zeroed.
        let mut b = AlignedBuf::scratch(ODD);
        b.fill(0xa5);
        let ptr = b.as_ptr();
        std::thread::spawn(move || drop(b)).join().unwrap();
        let again = AlignedBuf::scratch(ODD);
        assert_eq!(
            again.as_ptr(),
            ptr,
            "the buffer dropped elsewhere was not recycled"
        );
        assert!(
            again.iter().all(|&x| x == 0xa5),
            "a fresh buffer, not the recycled one"
        );
    }

    #[test]
    fn the_pool_keeps_at_most_its_bytes() {
        // Larger than the pool may hold in all: the second one dropped is freed.
        let size = POOL_MAX_BYTES / 2 + 4096;
        let (a, b) = (AlignedBuf::scratch(size), AlignedBuf::scratch(size));
        drop(a);
        drop(b);
        let p = pool();
        assert!(p.bytes <= POOL_MAX_BYTES && p.bufs.len() <= POOL_MAX);
        assert!(p.bufs.iter().filter(|b| b.len == size).count() <= 1);
        assert_eq!(p.bytes, p.bufs.iter().map(|b| b.len).sum::<usize>());
    }

    #[test]
    fn small_buffers_are_zeroed_and_not_pooled() {
        let b = AlignedBuf::scratch(4096);
        assert!(!b.pooled && b.iter().all(|&x| x == 0));
        assert_eq!(b.as_ptr() as usize % 4096, 0);
    }
}
