//! Kafka's `SkimpyOffsetMap` (MD5 digest of each key -> latest offset, `slots` entries at most),
//! as open addressing over one byte buffer of 24-byte entries:
//!
//! ```text
//! Entry => Digest:16 bytes (MD5 of the key) Offset:Int64 (big-endian)
//! ```
//! An all-zero entry is an empty bucket, as in Kafka's. Same digests, same capacity and the same
//! "full" point as Kafka (`SkimpyOffsetMap.put`'s `entries < slots` requirement); the buckets grow
//! with the entries instead of being allocated whole (see `SkimpyTable`).

pub use super::md5_lanes::DIGEST_BYTES;
pub const ENTRY_BYTES: usize = DIGEST_BYTES + 8;

/// Ask Linux to back the 2 MiB-aligned part of `buffer` with transparent huge pages (only a
/// hint: ignored where THP is off, `never`, or not Linux). Every put and get lands on a random
/// slot of a table of up to 128 MiB, so with 4 KiB pages nearly every one is a TLB miss; with
/// 2 MiB pages the recopy pass's lookups ran about twice as fast (a 128 MiB map, 2 vCPU VM).
/// Called before the first write, so the pages are allocated huge when first touched.
#[cfg(target_os = "linux")]
fn advise_huge_pages(buffer: &[u8]) {
    const HUGE_PAGE: usize = 2 * 1024 * 1024;
    const MADV_HUGEPAGE: i32 = 14; // <linux/mman.h>, the same on every Linux architecture
    extern "C" {
        fn madvise(addr: *mut core::ffi::c_void, len: usize, advice: i32) -> i32;
    }
    let start = buffer.as_ptr() as usize;
    let aligned_start = (start + HUGE_PAGE - 1) & !(HUGE_PAGE - 1);
    let aligned_end = (start + buffer.len()) & !(HUGE_PAGE - 1);
    if aligned_end > aligned_start {
        // SAFETY: [aligned_start, aligned_end) lies inside `buffer`'s allocation, which outlives the
        // call; MADV_HUGEPAGE changes only how the kernel backs those pages, never their contents.
        // Its result is ignored: a kernel without THP answers EINVAL and nothing changes.
        unsafe {
            madvise(aligned_start as *mut core::ffi::c_void, aligned_end - aligned_start, MADV_HUGEPAGE);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_buffer: &[u8]) {}

/// The cleaner's offset map: digest -> latest offset, with Kafka's capacity of `slots` entries.
///
/// Kafka's `SkimpyOffsetMap` probes a buffer of `slots * 24` bytes allocated (and zeroed) whole,
/// up to 128 MiB. What the cleaner observes of it is only which digests it holds, their offsets
/// and its entry count (the round ends when it reaches `slots * load factor`; `put` refuses at
/// `slots`); where an entry sits is not observable. This table keeps those three exactly and
/// sizes its buckets to the entries: it starts small and doubles at 3/4 load while it stays within
/// an eighth of `slots`, then takes all `slots` buckets (Kafka's size), so a round of 200k keys
/// under a 128 MiB budget touches ~12 MiB instead of zeroing 128 MiB, and its lookups stay in the
/// caches. A growth holds the old buckets and the new ones at once: the last one, to `slots`,
/// holds at most `slots / 8` old buckets besides, so the budget is exceeded by at most 1/8 for that
/// moment. Linear probing from the digest's first 8 bytes (MD5 output: already uniform).
pub struct SkimpyTable {
    /// 24-byte buckets (digest, big-endian offset); all-zero is empty, as in Kafka's map
    bytes: Vec<u8>,
    buckets: usize,
    slots: usize,
    pub entries: usize,
}

/// MD5 of one key (a batch's keys: `md5_lanes::digest_all`).
#[inline(always)]
pub fn digest_of(key: &[u8]) -> [u8; DIGEST_BYTES] {
    super::md5_lanes::digest_one(key)
}

/// Buckets a table starts with (1.5 MiB of 24-byte entries), or `slots` when fewer.
const INITIAL_BUCKETS: usize = 1 << 16;

fn zeroed_buckets(buckets: usize) -> Vec<u8> {
    let bytes = vec![0u8; buckets * ENTRY_BYTES];
    advise_huge_pages(&bytes);
    bytes
}

impl SkimpyTable {
    pub fn new(slots: usize) -> Self {
        let buckets = slots.min(INITIAL_BUCKETS);
        SkimpyTable { bytes: zeroed_buckets(buckets), buckets, slots, entries: 0 }
    }

    /// Kafka's slot count: the most entries the map holds.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Kafka's buffer size for this map, `slots * 24` bytes: the budget, what the buckets take at
    /// most once grown (see the type's comment for the moment of the last growth).
    pub fn memory_bytes(&self) -> usize {
        self.slots * ENTRY_BYTES
    }

    /// The entries, each the digest then the big-endian offset, in digest order.
    pub fn sorted_entries(&self) -> Vec<u8> {
        let mut entries: Vec<&[u8]> = self.bytes.chunks_exact(ENTRY_BYTES).filter(|e| e.iter().any(|&b| b != 0)).collect();
        entries.sort_unstable();
        entries.concat()
    }

    #[inline(always)]
    fn home_of(&self, digest: &[u8; DIGEST_BYTES]) -> usize {
        let hash = u64::from_le_bytes([digest[0], digest[1], digest[2], digest[3], digest[4], digest[5], digest[6], digest[7]]);
        ((hash as u128 * self.buckets as u128) >> 64) as usize
    }

    #[inline(always)]
    fn is_empty(&self, position: usize) -> bool {
        self.bytes[position..position + ENTRY_BYTES].iter().all(|&b| b == 0)
    }

    /// The bucket (byte position) holding `digest`, else the first empty one of its probe where it
    /// would go; `None` when every bucket is taken by other digests (a map filled to `slots`).
    #[inline(always)]
    fn find(&self, digest: &[u8; DIGEST_BYTES]) -> Option<usize> {
        let mut bucket = self.home_of(digest);
        for _ in 0..self.buckets {
            let position = bucket * ENTRY_BYTES;
            if self.is_empty(position) || &self.bytes[position..position + DIGEST_BYTES] == digest {
                return Some(position);
            }
            bucket += 1;
            if bucket == self.buckets {
                bucket = 0;
            }
        }
        None
    }

    /// Hint the CPU to load `digest`'s home bucket: a batch's digests are prefetched before its
    /// lookups, so their cache misses overlap instead of each lookup waiting for its own (the
    /// lookups were ~90% stalls on that load). Only a hint: no effect on results.
    #[inline(always)]
    pub fn prefetch(&self, digest: &[u8; DIGEST_BYTES]) {
        #[cfg(target_arch = "x86_64")]
        {
            let position = self.home_of(digest) * ENTRY_BYTES;
            // SAFETY: `position` is a bucket's start inside `bytes`; a prefetch never faults or writes.
            unsafe {
                core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
                    self.bytes.as_ptr().add(position) as *const i8,
                );
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = digest;
    }

    /// The buckets after the next growth: twice as many while that stays within `slots / 8`,
    /// else all `slots` (see the type's comment on memory).
    fn grown_buckets(&self) -> usize {
        let doubled = self.buckets * 2;
        if doubled <= self.slots / 8 {
            doubled
        } else {
            self.slots
        }
    }

    /// Grow the buckets (`grown_buckets`) and place every entry again.
    fn grow(&mut self) {
        let grown = zeroed_buckets(self.grown_buckets());
        let old = std::mem::replace(&mut self.bytes, grown);
        self.buckets = self.bytes.len() / ENTRY_BYTES;
        for entry in old.chunks_exact(ENTRY_BYTES).filter(|e| e.iter().any(|&b| b != 0)) {
            let digest: &[u8; DIGEST_BYTES] = entry[..DIGEST_BYTES].try_into().expect("16 bytes");
            let position = self.find(digest).expect("a grown table has empty buckets");
            self.bytes[position..position + ENTRY_BYTES].copy_from_slice(entry);
        }
    }

    /// Store `offset` for `digest`; returns `Err` when a new entry would not fit (Kafka's check
    /// comes before the lookup, so a full map refuses even a key it holds).
    #[inline]
    pub fn put(&mut self, digest: &[u8; DIGEST_BYTES], offset: i64) -> Result<(), String> {
        if self.entries >= self.slots {
            return Err(format!(
                "Attempted to add a new entry to a full offset map, entries: {}, slots: {}",
                self.entries, self.slots
            ));
        }
        // entries < slots: below `slots` buckets the load stays <= 3/4, at `slots` one bucket is free
        let mut position = self.find(digest).expect("a map below its slots has an empty bucket");
        if self.is_empty(position) {
            if self.buckets < self.slots && (self.entries + 1) * 4 > self.buckets * 3 {
                self.grow();
                position = self.find(digest).expect("a grown table has empty buckets");
            }
            self.bytes[position..position + DIGEST_BYTES].copy_from_slice(digest);
            self.entries += 1;
        }
        self.bytes[position + DIGEST_BYTES..position + ENTRY_BYTES].copy_from_slice(&offset.to_be_bytes());
        Ok(())
    }

    /// The offset stored for `digest`, or -1.
    #[inline]
    pub fn get(&self, digest: &[u8; DIGEST_BYTES]) -> i64 {
        let position = match self.find(digest) {
            Some(position) if !self.is_empty(position) => position,
            _ => return -1,
        };
        let mut offset = [0u8; 8];
        offset.copy_from_slice(&self.bytes[position + DIGEST_BYTES..position + ENTRY_BYTES]);
        i64::from_be_bytes(offset)
    }

    /// Forget every entry; the buckets stay allocated (the next partition's round likely needs as many).
    pub fn clear(&mut self) {
        if self.entries > 0 {
            self.bytes.fill(0);
            self.entries = 0;
        }
    }
}
