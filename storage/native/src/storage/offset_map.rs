//! Kafka's `SkimpyOffsetMap`: open addressing over one byte buffer of 24-byte entries.
//!
//! ```text
//! Entry => Digest:16 bytes (MD5 of the key) Offset:Int64 (big-endian)
//! ```
//! An all-zero entry is an empty slot. The i-th probe for a digest reads the big-endian int32 at
//! byte `min(i, 12)` of the digest and adds `max(0, i - 12)` (int32 arithmetic); the slot is
//! `Utils.abs(probe) % slots` (`abs(Integer.MIN_VALUE) == 0`). Same capacity, same probe sequence
//! and the same "full" point as Kafka (`SkimpyOffsetMap.put`'s `entries < slots` requirement).

use md5::{Digest, Md5};

pub const DIGEST_BYTES: usize = 16;
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

pub struct SkimpyTable {
    bytes: Vec<u8>,
    slots: usize,
    pub entries: usize,
}

#[inline(always)]
pub fn digest_of(key: &[u8]) -> [u8; DIGEST_BYTES] {
    Md5::digest(key).into()
}

impl SkimpyTable {
    pub fn new(slots: usize) -> Self {
        let bytes = vec![0u8; slots * ENTRY_BYTES];
        advise_huge_pages(&bytes);
        SkimpyTable { bytes, slots, entries: 0 }
    }

    pub fn slots(&self) -> usize {
        self.slots
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn memory_bytes(&self) -> usize {
        self.bytes.len()
    }

    #[inline(always)]
    fn position_of(&self, digest: &[u8; DIGEST_BYTES], attempt: usize) -> usize {
        let window = attempt.min(DIGEST_BYTES - 4);
        let base = i32::from_be_bytes([digest[window], digest[window + 1], digest[window + 2], digest[window + 3]]);
        let extra = attempt.saturating_sub(DIGEST_BYTES - 4) as i32;
        let probe = base.wrapping_add(extra);
        let magnitude = if probe == i32::MIN { 0 } else { probe.unsigned_abs() as usize };
        (magnitude % self.slots) * ENTRY_BYTES
    }

    #[inline(always)]
    fn is_empty(&self, position: usize) -> bool {
        self.bytes[position..position + ENTRY_BYTES].iter().all(|&b| b == 0)
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
        let mut attempt = 0;
        let mut position = self.position_of(digest, attempt);
        while !self.is_empty(position) {
            if &self.bytes[position..position + DIGEST_BYTES] == digest {
                self.bytes[position + DIGEST_BYTES..position + ENTRY_BYTES].copy_from_slice(&offset.to_be_bytes());
                return Ok(());
            }
            attempt += 1;
            position = self.position_of(digest, attempt);
        }
        self.bytes[position..position + DIGEST_BYTES].copy_from_slice(digest);
        self.bytes[position + DIGEST_BYTES..position + ENTRY_BYTES].copy_from_slice(&offset.to_be_bytes());
        self.entries += 1;
        Ok(())
    }

    /// The offset stored for `digest`, or -1 (Kafka's `get`, with its `maxAttempts` guard).
    #[inline]
    pub fn get(&self, digest: &[u8; DIGEST_BYTES]) -> i64 {
        let max_attempts = self.slots + DIGEST_BYTES - 4;
        for attempt in 0..max_attempts {
            let position = self.position_of(digest, attempt);
            if self.is_empty(position) {
                return -1;
            }
            if &self.bytes[position..position + DIGEST_BYTES] == digest {
                let mut offset = [0u8; 8];
                offset.copy_from_slice(&self.bytes[position + DIGEST_BYTES..position + ENTRY_BYTES]);
                return i64::from_be_bytes(offset);
            }
        }
        -1
    }

    pub fn clear(&mut self) {
        self.bytes.fill(0);
        self.entries = 0;
    }
}
