//! Host memory kept for reuse by large transfers. A new allocation's pages are faulted in, and
//! zeroed by the kernel, on first touch, which costs about as much as the copy written into
//! them; a block that a dropped array gave back is already faulted in. Idle blocks are kept up
//! to a bound, oldest dropped first.

use std::alloc::{alloc, dealloc, Layout};
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Block sizes are multiples of this, and blocks start on a multiple of it: one huge page,
/// so that sizes that differ a little share blocks, and the kernel can back them with huge
/// pages.
pub const GRANULE: usize = 2 << 20;

/// Memory from the global allocator, `GRANULE`-aligned, freed when dropped.
struct Block {
    ptr: NonNull<u8>,
    capacity: usize,
}

// SAFETY: a Block owns its memory outright, like a Box<[u8]>.
unsafe impl Send for Block {}
// SAFETY: a shared Block gives out only its address.
unsafe impl Sync for Block {}

impl Block {
    fn layout(capacity: usize) -> Option<Layout> {
        Layout::from_size_align(capacity, GRANULE).ok()
    }

    fn new(capacity: usize) -> Option<Self> {
        let layout = Self::layout(capacity)?;
        // SAFETY: `capacity` is a nonzero multiple of GRANULE (see `HostPool::take`).
        let ptr = NonNull::new(unsafe { alloc(layout) })?;
        Some(Self { ptr, capacity })
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if let Some(layout) = Self::layout(self.capacity) {
            // SAFETY: allocated in `new` with this very layout, and freed once.
            unsafe { dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

/// Counters and bound of a pool, as `HostPool::stats` reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Requests served by an idle block.
    pub hits: u64,
    /// Requests served by a new allocation.
    pub misses: u64,
    pub idle_blocks: usize,
    pub idle_bytes: usize,
    /// The most idle bytes kept.
    pub limit: usize,
}

struct State {
    /// Idle blocks, the least recently given back first.
    idle: Vec<Block>,
    stats: PoolStats,
}

/// A bounded set of idle blocks, shared by every thread.
pub struct HostPool {
    state: Mutex<State>,
}

impl HostPool {
    /// A pool that keeps at most `limit` idle bytes.
    #[must_use]
    pub const fn new(limit: usize) -> Self {
        Self {
            state: Mutex::new(State {
                idle: Vec::new(),
                stats: PoolStats {
                    hits: 0,
                    misses: 0,
                    idle_blocks: 0,
                    idle_bytes: 0,
                    limit,
                },
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is consistent between statements, so a panic elsewhere leaves it usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// At least `len` bytes (`len` > 0), `GRANULE`-aligned, given back to the pool when the
    /// lease is dropped; `None` if the allocator has no memory to give.
    pub fn take(&'static self, len: usize) -> Option<Lease> {
        let capacity = len.max(1).checked_next_multiple_of(GRANULE)?;
        let reused = {
            let mut state = self.lock();
            let found = state.idle.iter().rposition(|b| b.capacity == capacity);
            let block = found.map(|i| state.idle.remove(i));
            if block.is_some() {
                state.stats.hits += 1;
                state.stats.idle_blocks -= 1;
                state.stats.idle_bytes -= capacity;
            } else {
                state.stats.misses += 1;
            }
            block
        };
        let block = match reused {
            Some(block) => block,
            None => Block::new(capacity)?,
        };
        Some(Lease {
            block: Some(block),
            len,
            pool: self,
        })
    }

    /// Keeps `block` idle, and frees the oldest idle blocks beyond the limit; a block larger
    /// than the limit is freed at once.
    fn give(&self, block: Block) {
        let evicted = {
            let mut state = self.lock();
            if block.capacity > state.stats.limit {
                drop(state);
                return;
            }
            state.stats.idle_blocks += 1;
            state.stats.idle_bytes += block.capacity;
            state.idle.push(block);
            Self::evict(&mut state)
        };
        // Freed outside the lock: unmapping large blocks takes a while.
        drop(evicted);
    }

    fn evict(state: &mut State) -> Vec<Block> {
        let mut evicted = Vec::new();
        let mut excess = state.stats.idle_bytes.saturating_sub(state.stats.limit);
        while excess > 0 && !state.idle.is_empty() {
            let block = state.idle.remove(0);
            excess = excess.saturating_sub(block.capacity);
            state.stats.idle_blocks -= 1;
            state.stats.idle_bytes -= block.capacity;
            evicted.push(block);
        }
        evicted
    }

    /// Sets the most idle bytes kept, freeing idle blocks beyond it (0 frees them all and
    /// keeps none).
    pub fn set_limit(&self, limit: usize) {
        let evicted = {
            let mut state = self.lock();
            state.stats.limit = limit;
            Self::evict(&mut state)
        };
        drop(evicted);
    }

    #[must_use]
    pub fn stats(&self) -> PoolStats {
        self.lock().stats
    }

    /// Sets the hit and miss counters back to zero.
    pub fn reset_counters(&self) {
        let mut state = self.lock();
        state.stats.hits = 0;
        state.stats.misses = 0;
    }
}

/// A block lent out by a pool: `len` bytes are the caller's to use until it is dropped.
pub struct Lease {
    block: Option<Block>,
    len: usize,
    pool: &'static HostPool,
}

impl Lease {
    /// The block's start, `GRANULE`-aligned; `len()` bytes from it are valid for reads and
    /// writes while the lease lives. Their contents are unspecified.
    #[must_use]
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.block
            .as_ref()
            .map_or(std::ptr::null_mut(), |b| b.ptr.as_ptr())
    }

    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(block) = self.block.take() {
            self.pool.give(block);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(limit: usize) -> &'static HostPool {
        Box::leak(Box::new(HostPool::new(limit)))
    }

    #[test]
    fn a_dropped_lease_is_reused_for_a_request_of_its_size_class() {
        let pool = pool(64 << 20);
        let first = pool.take(3 << 20).unwrap();
        let address = first.as_mut_ptr();
        assert_eq!(address as usize % GRANULE, 0);
        assert_eq!(first.len(), 3 << 20);
        drop(first);
        assert_eq!(pool.stats().idle_bytes, 4 << 20);
        // 3 MiB and 4 MiB both round up to 4 MiB.
        let second = pool.take(4 << 20).unwrap();
        assert_eq!(second.as_mut_ptr(), address);
        let stats = pool.stats();
        assert_eq!((stats.hits, stats.misses, stats.idle_blocks), (1, 1, 0));
        // Another size class gets a new block.
        let third = pool.take(5 << 20).unwrap();
        assert_ne!(third.as_mut_ptr(), address);
        assert_eq!(pool.stats().misses, 2);
    }

    #[test]
    fn idle_memory_stays_within_the_limit_and_the_oldest_goes_first() {
        let pool = pool(8 << 20);
        let leases: Vec<Lease> = (0..5).map(|_| pool.take(2 << 20).unwrap()).collect();
        let addresses: Vec<*mut u8> = leases.iter().map(Lease::as_mut_ptr).collect();
        drop(leases);
        let stats = pool.stats();
        assert_eq!((stats.idle_blocks, stats.idle_bytes), (4, 8 << 20));
        // The first given back was freed; the latest is reused first.
        let again = pool.take(2 << 20).unwrap();
        assert_eq!(again.as_mut_ptr(), addresses[4]);
        drop(again);
        // A block larger than the limit is never kept.
        drop(pool.take(16 << 20).unwrap());
        assert_eq!(pool.stats().idle_bytes, 8 << 20);
        pool.set_limit(2 << 20);
        assert_eq!(pool.stats().idle_bytes, 2 << 20);
        pool.set_limit(0);
        let stats = pool.stats();
        assert_eq!(
            (stats.idle_blocks, stats.idle_bytes, stats.limit),
            (0, 0, 0)
        );
        pool.reset_counters();
        assert_eq!((pool.stats().hits, pool.stats().misses), (0, 0));
    }

    #[test]
    fn leases_are_writable_and_shared_safely_between_threads() {
        let pool = pool(32 << 20);
        std::thread::scope(|scope| {
            for t in 0..4u8 {
                scope.spawn(move || {
                    for _ in 0..50 {
                        let lease = pool.take(1 << 20).unwrap();
                        // SAFETY: the lease's `len()` bytes are ours until it is dropped.
                        let bytes = unsafe {
                            std::slice::from_raw_parts_mut(lease.as_mut_ptr(), lease.len())
                        };
                        bytes.fill(t);
                        assert!(bytes.iter().all(|&b| b == t));
                    }
                });
            }
        });
        let stats = pool.stats();
        assert_eq!(stats.hits + stats.misses, 200);
        assert!(stats.idle_bytes <= 32 << 20);
        assert!(stats.misses <= 4, "{stats:?}");
    }
}
