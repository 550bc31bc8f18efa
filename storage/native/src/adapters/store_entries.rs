//! Latest state-store entry per `(partition, key)`, gathered from records sections for
//! rebuilding a store in bulk (a cold start's apply, `materializer/apply/store_loader.py`), sorted
//! in store-key order and written as RocksDB SST files (`sst.rs`) or handed back as lists by its
//! binding (`py.rs`). Touches no Python object: the binding runs it with the GIL released.

use std::mem::MaybeUninit;
use std::path::PathBuf;
use std::sync::Mutex;

use super::sst;
use super::BatchSpan;
use crate::storage::lz4_frame;
use crate::storage::records::{timestamp_of, walk, DecodeResult};

/// The v2 batch header (`DefaultRecordBatch`): its size and the fields `take_batches` reads.
const BATCH_HEADER_BYTES: usize = 61;
const BATCH_ATTRIBUTES_AT: usize = 21;
const BATCH_BASE_TIMESTAMP_AT: usize = 27;
const BATCH_MAX_TIMESTAMP_AT: usize = 35;
const BATCH_RECORDS_COUNT_AT: usize = 57;
const CODEC_MASK: i64 = 0x07;
const CODEC_NONE: i64 = 0;
const CODEC_LZ4: i64 = 3;
const TIMESTAMP_TYPE_FLAG: i64 = 0x08;

/// Latest state-store entry per `(partition, key)`, for rebuilding a store in bulk.
///
/// Keys are the store's data keys (`Int32 partition BE + key`); values the stored value
/// (`Int64 offset BE + Int64 timestamp ms BE + value`) or `None` for a tombstone, whose offset and
/// timestamp are kept too (`tombstones`: the store records where each key was deleted). Later records
/// replace earlier ones, as applying them in offset order would. Entries live in one byte arena
/// (no allocation per record); de-duplication happens once, in `sort_and_dedupe` (run by
/// `write_sst` and the binding's `take_*` methods when not yet done).
#[derive(Default)]
pub struct StoreEntries {
    arena: Vec<u8>,
    entries: Vec<StoreEntry>,
    /// `entries` holds only the latest entry of each key, in key order
    sorted: bool,
    /// where `take_batches` decompresses an lz4 records section (reused across batches)
    scratch: lz4_frame::Scratch,
    /// the arena and entries `sort_and_dedupe` replaced, kept to gather into the next time:
    /// a fresh page costs a page fault on first touch, which on a virtual machine made up a
    /// large part of a load's system time
    spare_arena: Vec<u8>,
    spare_entries: Vec<StoreEntry>,
}

#[derive(Clone, Copy)]
struct StoreEntry {
    key_start: usize,
    key_len: usize,
    value_start: usize,
    /// bytes of the value; with `TOMBSTONE` set, a tombstone's 16 bytes (offset, timestamp)
    value_len: usize,
}

/// The high bit of `StoreEntry::value_len`: the entry is a tombstone.
const TOMBSTONE: usize = 1 << (usize::BITS - 1);

fn is_tombstone(entry: &StoreEntry) -> bool {
    entry.value_len & TOMBSTONE != 0
}

fn value_bytes(entry: &StoreEntry) -> usize {
    entry.value_len & !TOMBSTONE
}

/// What `StoreEntries::sort_and_dedupe` sorts: a store entry's position and the parts of its
/// key that decide most comparisons without reading the arena.
struct SortKey {
    partition: u32,
    /// the 8 key bytes after the common prefix, zero-padded, big-endian
    window: u64,
    /// key bytes after the common prefix when at most 8 (all in `window`), else `u32::MAX`
    short_len: u32,
    index: u32,
}

/// Length of the prefix every key of `keys` shares (0 for none or no keys).
fn common_prefix_len<'a>(mut keys: impl Iterator<Item = &'a [u8]>) -> usize {
    let Some(first) = keys.next() else { return 0 };
    let mut common = first.len();
    for key in keys {
        common = first[..common].iter().zip(key).take_while(|(a, b)| a == b).count();
        if common == 0 {
            break;
        }
    }
    common
}

/// The 8 bytes of `key` after `skip`, zero-padded, as a big-endian number: ordering by it agrees
/// with ordering the keys by their bytes (equal windows are decided by the whole key).
fn window_after(key: &[u8], skip: usize) -> u64 {
    let mut window = [0u8; 8];
    let tail = key.get(skip..).unwrap_or(&[]);
    let n = tail.len().min(8);
    window[..n].copy_from_slice(&tail[..n]);
    u64::from_be_bytes(window)
}

/// Entries the gather of `StoreEntries::sort_and_dedupe` looks ahead: their arena bytes are
/// prefetched half that far ahead (the entry itself must arrive first).
const PREFETCH_ENTRIES: usize = 16;

/// A hint to load the cache line at `p` (no effect where the target has no such instruction).
#[inline(always)]
fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults, whatever the address
    unsafe {
        std::arch::x86_64::_mm_prefetch(p.cast::<i8>(), std::arch::x86_64::_MM_HINT_T0)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Below this many entries `StoreEntries::sort_and_dedupe` runs on one thread: starting threads
/// would cost more than they save.
const PARALLEL_SORT_MIN_ENTRIES: usize = 1 << 16;

/// Bytes an entry takes in the arena: its key, then its value (a tombstone's offset and timestamp).
fn entry_bytes(entry: &StoreEntry) -> usize {
    entry.key_len + value_bytes(entry)
}

/// The positions of `entries` by partition (the 4 bytes leading each store key), each in push
/// order, the partitions ascending (so in store-key order). A batch's records are pushed
/// together, so most entries continue the previous entry's partition.
fn by_partition(arena: &[u8], entries: &[StoreEntry]) -> Vec<Vec<u32>> {
    let mut groups: std::collections::BTreeMap<[u8; 4], Vec<u32>> = std::collections::BTreeMap::new();
    let mut current: Option<([u8; 4], Vec<u32>)> = None;
    for (i, entry) in entries.iter().enumerate() {
        let partition: [u8; 4] = arena[entry.key_start..entry.key_start + 4].try_into().expect("4 bytes");
        match &mut current {
            Some((p, positions)) if *p == partition => positions.push(i as u32),
            _ => {
                if let Some((p, positions)) = current.take() {
                    groups.insert(p, positions);
                }
                let mut positions = groups.remove(&partition).unwrap_or_default();
                positions.push(i as u32);
                current = Some((partition, positions));
            }
        }
    }
    if let Some((p, positions)) = current {
        groups.insert(p, positions);
    }
    groups.into_values().collect()
}

/// Of the entries at `positions` (in push order, which is offset order), the positions of the
/// latest entry of each key, in key order.
fn latest_order(arena: &[u8], entries: &[StoreEntry], positions: &[u32]) -> Vec<u32> {
    let key_of = |i: u32| {
        let e = &entries[i as usize];
        &arena[e.key_start..e.key_start + e.key_len]
    };
    // Sorting by the arena's bytes alone costs a cache miss per comparison. The keys of a
    // topic often share a prefix ("user-", "order:"), so each entry carries its partition,
    // the 8 key bytes after the common prefix and, when the key ends within them, its length:
    // those decide the order (a shorter key with the same zero-padded window is its prefix).
    // Only keys running past the window compare their whole bytes on a tie. Equal keys end
    // in push order, which is offset order, so the last of a run is the latest record.
    let common = common_prefix_len(positions.iter().map(|&i| &key_of(i)[4..]));
    let mut order: Vec<SortKey> = positions
        .iter()
        .map(|&i| {
            let key = key_of(i);
            let rest = key.len() - 4 - common;
            SortKey {
                partition: u32::from_be_bytes([key[0], key[1], key[2], key[3]]),
                window: window_after(&key[4..], common),
                short_len: if rest <= 8 { rest as u32 } else { u32::MAX },
                index: i,
            }
        })
        .collect();
    let cmp_keys = |a: &SortKey, b: &SortKey| {
        (a.partition, a.window).cmp(&(b.partition, b.window)).then_with(|| {
            if a.short_len != u32::MAX && b.short_len != u32::MAX {
                a.short_len.cmp(&b.short_len)
            } else {
                key_of(a.index).cmp(key_of(b.index))
            }
        })
    };
    // A stable radix sort by the fixed-width part (the window's ordering rule above) keeps
    // push order among equal parts; only runs of long keys sharing one window then need
    // their whole bytes compared (a stable sort again: equal keys stay in offset order).
    radsort::sort_by_key(&mut order, |k| (k.partition, k.window, k.short_len));
    let mut start = 0;
    while start < order.len() {
        let first = &order[start];
        let same = |k: &SortKey| (k.partition, k.window, k.short_len) == (first.partition, first.window, first.short_len);
        let end = start + 1 + order[start + 1..].iter().take_while(|k| same(k)).count();
        if first.short_len == u32::MAX && end - start > 1 {
            order[start..end].sort_by(|a, b| key_of(a.index).cmp(key_of(b.index)));
        }
        start = end;
    }
    (0..order.len())
        .filter(|&n| n + 1 == order.len() || cmp_keys(&order[n], &order[n + 1]).is_ne())
        .map(|n| order[n].index)
        .collect()
}

/// Copies the entries at `order` from `old` into `arena` (exactly their bytes) one after the
/// other and describes them in `kept`, positions counted from `base` (where `arena` starts in
/// the whole new arena). Each entry's bytes are prefetched a few entries ahead.
fn gather(old: &[u8], entries: &[StoreEntry], order: &[u32], arena: &mut [MaybeUninit<u8>],
          kept: &mut [MaybeUninit<StoreEntry>], base: usize) {
    let mut at = 0usize;
    for (n, &i) in order.iter().enumerate() {
        if let Some(&ahead) = order.get(n + PREFETCH_ENTRIES) {
            prefetch(std::ptr::from_ref(&entries[ahead as usize]).cast());
        }
        if let Some(&ahead) = order.get(n + PREFETCH_ENTRIES / 2) {
            let e = &entries[ahead as usize];
            for line in (e.key_start..e.key_start + entry_bytes(e)).step_by(64) {
                prefetch(old[line..].as_ptr());
            }
        }
        // an entry's value follows its key in the arena (`take_section` pushes them so): one copy
        let entry = entries[i as usize];
        debug_assert_eq!(entry.value_start, entry.key_start + entry.key_len);
        let bytes = entry_bytes(&entry);
        let (source, target) = (&old[entry.key_start..entry.key_start + bytes], &mut arena[at..at + bytes]);
        // SAFETY: both ranges were bounds-checked just above and have `bytes` bytes; the arenas differ
        unsafe { std::ptr::copy_nonoverlapping(source.as_ptr(), target.as_mut_ptr().cast::<u8>(), bytes) };
        kept[n].write(StoreEntry { key_start: base + at, key_len: entry.key_len, value_start: base + at + entry.key_len,
                                   value_len: entry.value_len });
        at += bytes;
    }
    // the caller marks the whole part initialized: it must be exactly the kept entries' bytes
    assert_eq!(at, arena.len(), "gathered bytes differ from the part's size");
    assert_eq!(order.len(), kept.len(), "gathered entries differ from the part's count");
}

/// One SST file's share of the rows `write_sst` writes: `(key, value or None for a delete)`.
type SstRow<'a> = (&'a [u8], Option<&'a [u8]>);

impl StoreEntries {
    /// Entries held: records taken since the last `reset` (fewer once `sort_and_dedupe` de-duplicated them).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Bytes held (entry bytes plus 32 per record).
    pub fn held_bytes(&self) -> usize {
        self.arena.len() + self.entries.len() * std::mem::size_of::<StoreEntry>()
    }

    /// The entries as `(key, value)`, `None` for a tombstone, in the order held: after
    /// `sort_and_dedupe`, the latest entry of every key in store-key order.
    pub fn entries(&self) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> {
        self.entries.iter().map(|e| (self.key_of(e), (!is_tombstone(e)).then(|| self.value_of(e))))
    }

    /// The tombstones as `(key, offset and timestamp)`: Int64 offset BE + Int64 timestamp ms BE
    /// (the store's tombstone record), in the order held (after `sort_and_dedupe`: the keys whose
    /// latest record is a tombstone, in store-key order).
    pub fn tombstones(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.entries.iter().filter(|e| is_tombstone(e)).map(|e| (self.key_of(e), self.value_of(e)))
    }

    /// `(puts, deletes)`: entries with a value, and tombstones (after `sort_and_dedupe`: keys
    /// whose latest record has a value, and those whose latest is a tombstone).
    pub fn counts(&self) -> (usize, usize) {
        let deletes = self.entries.iter().filter(|e| is_tombstone(e)).count();
        (self.entries.len() - deletes, deletes)
    }

    fn key_of(&self, entry: &StoreEntry) -> &[u8] {
        &self.arena[entry.key_start..entry.key_start + entry.key_len]
    }

    fn value_of(&self, entry: &StoreEntry) -> &[u8] {
        &self.arena[entry.value_start..entry.value_start + value_bytes(entry)]
    }

    /// Sorts by key and keeps the latest entry of each, copied into a new arena in key order
    /// (the old one is kept to gather into the next time).
    ///
    /// Each partition's entries (the partition leads every store key, so partitions are
    /// consecutive key ranges) are sorted on their own, on as many threads as there are cores
    /// when the entries are many: a cold start's last write and a rebuild then use the cores the
    /// log side leaves idle. The copy gathers each kept entry once, its bytes prefetched a few
    /// entries ahead; what reads the entries next (an SST write, the next chunk's sort) then
    /// walks the arena front to back instead of missing the cache on every key and value.
    pub fn sort_and_dedupe(&mut self) {
        if self.sorted {
            return;
        }
        let (old, entries) = (&self.arena, &self.entries);
        assert!(entries.len() < u32::MAX as usize, "more store entries than one chunk may hold");
        let threads = if entries.len() >= PARALLEL_SORT_MIN_ENTRIES {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            1
        };
        let groups = if threads > 1 { by_partition(old, entries) } else { vec![(0..entries.len() as u32).collect()] };
        // the groups of each thread: the largest first, each to the least loaded thread
        let mut by_size: Vec<usize> = (0..groups.len()).collect();
        by_size.sort_unstable_by_key(|&g| std::cmp::Reverse(groups[g].len()));
        let mut shares: Vec<(usize, Vec<usize>)> = vec![(0, Vec::new()); threads.min(groups.len()).max(1)];
        for g in by_size {
            let share = shares.iter_mut().min_by_key(|(load, _)| *load).expect("at least one share");
            share.0 += groups[g].len();
            share.1.push(g);
        }
        let in_parallel = |work: &(dyn Fn(usize) + Sync)| {
            if shares.len() == 1 {
                shares[0].1.iter().for_each(|&g| work(g));
            } else {
                std::thread::scope(|scope| {
                    for (_, share) in &shares {
                        scope.spawn(|| share.iter().for_each(|&g| work(g)));
                    }
                });
            }
        };
        // 1. each group's latest entries in key order, and their bytes
        let sorted: Vec<Mutex<(Vec<u32>, usize)>> = groups.iter().map(|_| Mutex::default()).collect();
        in_parallel(&|g| {
            let order = latest_order(old, entries, &groups[g]);
            let bytes = order.iter().map(|&i| entry_bytes(&entries[i as usize])).sum();
            *sorted[g].lock().expect("no sort thread panics") = (order, bytes);
        });
        let sorted: Vec<(Vec<u32>, usize)> =
            sorted.into_iter().map(|m| m.into_inner().expect("no sort thread panics")).collect();
        // 2. each group gathered into its own consecutive part of the new arena (groups ascend by partition)
        let total_bytes = sorted.iter().map(|(_, bytes)| bytes).sum();
        let total_entries = sorted.iter().map(|(order, _)| order.len()).sum();
        // gathered into the arena and entries the previous call replaced (their pages are mapped
        // already), left uninitialized until gathered into
        let mut arena = std::mem::take(&mut self.spare_arena);
        let mut kept = std::mem::take(&mut self.spare_entries);
        arena.clear();
        arena.reserve_exact(total_bytes);
        kept.clear();
        kept.reserve_exact(total_entries);
        let mut parts = Vec::with_capacity(sorted.len());
        let (mut arena_rest, mut kept_rest, mut base) =
            (&mut arena.spare_capacity_mut()[..total_bytes], &mut kept.spare_capacity_mut()[..total_entries], 0usize);
        for (order, bytes) in &sorted {
            let (bytes_part, arena_tail) = std::mem::take(&mut arena_rest).split_at_mut(*bytes);
            let (kept_part, kept_tail) = std::mem::take(&mut kept_rest).split_at_mut(order.len());
            parts.push(Mutex::new((bytes_part, kept_part, base)));
            (arena_rest, kept_rest, base) = (arena_tail, kept_tail, base + bytes);
        }
        in_parallel(&|g| {
            let mut part = parts[g].lock().expect("no gather thread panics");
            let (bytes_part, kept_part, base) = &mut *part;
            gather(old, entries, &sorted[g].0, bytes_part, kept_part, *base);
        });
        drop(parts);
        // SAFETY: the parts cover [0, total_bytes) and [0, total_entries) exactly, and each
        // `gather` wrote every byte and entry of its part (it asserts so)
        unsafe {
            arena.set_len(total_bytes);
            kept.set_len(total_entries);
        }
        self.spare_arena = std::mem::replace(&mut self.arena, arena);
        self.spare_entries = std::mem::replace(&mut self.entries, kept);
        self.sorted = true;
    }

    /// Empty, keeping the allocations: the next chunk of a load fills the same pages.
    pub fn reset(&mut self) {
        self.arena.clear();
        self.entries.clear();
        self.sorted = false;
    }

    /// Take the records of one batch's records section with `start <= offset < end`; null keys
    /// are skipped. Returns `(records_taken, null_keys, last_offset_taken)` (-1 when none);
    /// nothing of the batch is taken on a framing error.
    pub fn take_batch(&mut self, data: &[u8], batch: &BatchSpan) -> DecodeResult<(usize, usize, i64)> {
        self.sorted = false;
        self.take_section(data, batch)
    }

    /// Take the records with `start <= offset < end` of whole v2 batches (each exactly one batch
    /// with its 61-byte header) of `partition`, in order, lz4 records sections decompressed
    /// here. Stops at a batch of another codec, one this reader refuses, or once `held_bytes`
    /// reaches `held_limit` after a batch. Returns `(batches_taken, records_taken, null_keys,
    /// declined)`: `declined` is `None` when the batches were taken (all of them, or the first
    /// `batches_taken` when the limit was reached), else the reason the batch at index
    /// `batches_taken` was not (nothing of it is taken; the batches before it are).
    pub fn take_batches(&mut self, batches: &[&[u8]], partition: i32, start: i64, end: i64, held_limit: usize)
                        -> (usize, usize, usize, Option<String>) {
        self.sorted = false;
        let (mut records, mut null_keys) = (0usize, 0usize);
        for (index, batch) in batches.iter().enumerate() {
            match self.take_whole_batch(batch, partition, start, end) {
                Ok((taken, nulls)) => {
                    records += taken;
                    null_keys += nulls;
                }
                Err(reason) => return (index, records, null_keys, Some(reason)),
            }
            if self.held_bytes() >= held_limit {
                return (index + 1, records, null_keys, None);
            }
        }
        (batches.len(), records, null_keys, None)
    }

    /// Sort (`sort_and_dedupe`) and write the latest put of every key, in store-key order, to
    /// RocksDB SST files (`sst::write_sst`), the entries cut into `paths.len()` (at least one)
    /// consecutive key ranges of (nearly) equal entry counts, each file written by its own
    /// thread. With `write_deletes` each key whose latest record is a tombstone is written as a
    /// delete, except those of the partitions in `skip_deletes_of`. Files past the entries'
    /// count (all of them with none) are not written. Returns the entries written, or the
    /// first file that could not be written and why; the entries are kept either way.
    pub fn write_sst(&mut self, paths: &[PathBuf], compression: sst::Compression, block_size: usize,
                     write_deletes: bool, skip_deletes_of: &[i32]) -> Result<u64, (PathBuf, std::io::Error)> {
        self.sort_and_dedupe();
        // a store key leads with its partition, Int32 big-endian
        let skipped = |key: &[u8]| skip_deletes_of.iter().any(|p| key.starts_with(&p.to_be_bytes()));
        let rows: Vec<SstRow<'_>> =
            self.entries().filter(|(key, value)| value.is_some() || (write_deletes && !skipped(key))).collect();
        if rows.is_empty() {
            return Ok(0);
        }
        let per_file = rows.len().div_ceil(paths.len());
        let ranges: Vec<(&PathBuf, &[SstRow<'_>])> = paths.iter().zip(rows.chunks(per_file)).collect();
        if ranges.len() == 1 {
            let (file, range) = ranges[0];
            return sst::write_sst(file, range.iter().copied(), compression, block_size)
                .map_err(|e| (file.clone(), e));
        }
        std::thread::scope(|scope| {
            let writers: Vec<_> = ranges.iter().map(|&(file, range)| {
                scope.spawn(move || sst::write_sst(file, range.iter().copied(), compression, block_size)
                    .map_err(|e| (file.clone(), e)))
            }).collect();
            let mut total = 0;
            let mut failure = None;
            for writer in writers {
                match writer.join().expect("an SST writer thread panicked") {
                    Ok(count) => total += count,
                    Err(error) => failure = failure.or(Some(error)),
                }
            }
            failure.map_or(Ok(total), Err)
        })
    }

    /// Sort (`sort_and_dedupe`) and write each key whose latest record is a tombstone to one
    /// RocksDB SST file at `path` as a put of its offset and timestamp (`tombstones`), for the
    /// store's tombstone column family. Writes no file when there is none; keeps the entries.
    /// Returns the tombstones written, or why the file could not be written.
    pub fn write_tombstone_sst(&mut self, path: &PathBuf, compression: sst::Compression, block_size: usize)
                               -> std::io::Result<u64> {
        self.sort_and_dedupe();
        if self.tombstones().next().is_none() {
            return Ok(0);
        }
        sst::write_sst(path, self.tombstones().map(|(key, at)| (key, Some(at))), compression, block_size)
    }

    /// The body of `take_batch`; touches no Python object.
    fn take_section(&mut self, data: &[u8], batch: &BatchSpan) -> DecodeResult<(usize, usize, i64)> {
        let (arena_mark, entries_mark) = (self.arena.len(), self.entries.len());
        let mut null_keys = 0usize;
        let mut last = -1i64;
        let arena = &mut self.arena;
        let entries = &mut self.entries;
        let walked = walk(data, batch.count, false, |_, record| -> DecodeResult<()> {
            let offset = batch.base_offset.wrapping_add(record.offset_delta);
            if offset < batch.start || offset >= batch.end {
                return Ok(());
            }
            last = offset;
            let Some(key) = record.key else {
                null_keys += 1;
                return Ok(());
            };
            let key_start = arena.len();
            arena.extend_from_slice(&batch.partition.to_be_bytes());
            arena.extend_from_slice(key);
            let value_start = arena.len();
            arena.extend_from_slice(&offset.to_be_bytes());
            let timestamp = timestamp_of(batch.base_timestamp, record.timestamp_delta, batch.log_append_time);
            arena.extend_from_slice(&timestamp.to_be_bytes());
            let value_len = match record.value {
                Some(value) => {
                    arena.extend_from_slice(value);
                    16 + value.len()
                }
                None => 16 | TOMBSTONE,
            };
            entries.push(StoreEntry { key_start, key_len: 4 + key.len(), value_start, value_len });
            Ok(())
        });
        if let Err(message) = walked {
            self.arena.truncate(arena_mark);
            self.entries.truncate(entries_mark);
            return Err(message);
        }
        Ok((self.entries.len() - entries_mark, null_keys, last))
    }

    /// The body of `take_batches` for one whole v2 batch (header included): its header fields
    /// read here, its records section decompressed here when lz4. Returns `(records_taken,
    /// null_keys)`; nothing of the batch is taken on an error.
    fn take_whole_batch(&mut self, batch: &[u8], partition: i32, start: i64, end: i64) -> DecodeResult<(usize, usize)> {
        let Some(header) = batch.get(..BATCH_HEADER_BYTES) else {
            return Err(format!("batch of {} bytes is shorter than the {BATCH_HEADER_BYTES}-byte v2 header", batch.len()));
        };
        let field = |at: usize, n: usize| header[at..at + n].iter().fold(0i64, |acc, &b| (acc << 8) | i64::from(b));
        let attributes = field(BATCH_ATTRIBUTES_AT, 2);
        let count = field(BATCH_RECORDS_COUNT_AT, 4) as i32 as i64;
        if count == 0 {
            return Ok((0, 0));
        }
        if count < 0 {
            return Err(format!("found invalid record count {count} in magic v2 batch"));
        }
        let span = BatchSpan {
            count,
            base_offset: field(0, 8),
            base_timestamp: field(BATCH_BASE_TIMESTAMP_AT, 8),
            log_append_time: (attributes & TIMESTAMP_TYPE_FLAG != 0).then(|| field(BATCH_MAX_TIMESTAMP_AT, 8)),
            partition,
            start,
            end,
        };
        let body = &batch[BATCH_HEADER_BYTES..];
        let taken = match attributes & CODEC_MASK {
            CODEC_NONE => self.take_section(body, &span),
            CODEC_LZ4 => {
                let mut scratch = std::mem::take(&mut self.scratch);
                let taken = lz4_frame::decompress_into(body, &mut scratch).and_then(|()| self.take_section(scratch.bytes(), &span));
                self.scratch = scratch;
                taken
            }
            codec => Err(format!("records compressed with codec {codec} are decompressed by the caller")),
        };
        taken.map(|(records, null_keys, _)| (records, null_keys))
    }
}
