//! The log cleaner's passes over one batch's records section (Kafka `Cleaner`): the offset map
//! pass (`buildOffsetMapForSegment`), the retain decision (`shouldRetainRecord`) and the recopy
//! of the kept records (`MemoryRecords.buildRetainedRecordsInto`).
//!
//! The Python `Cleaner` (module `cleaner` of the storage package) drives them batch by batch;
//! these only loop over bytes and touch no Python object, so its bindings (`storage/py.rs`) run
//! them with the GIL released.

use super::md5_lanes::digest_all;
use super::offset_map::SkimpyTable;
use super::records::{self, timestamp_of, walk, DecodeResult};

/// Keys-only walk of a records section fused with the map update: every keyed record with
/// `start <= offset < end` is put while `table` holds fewer than `max_entries` entries.
///
/// Returns `(visited, stopped, last_put_offset)`: records read before stopping (every record of
/// the batch when not stopped), whether a keyed record in range found the map at `max_entries`
/// (the round then ends there), and the offset of the last put (-1 if none). Framing is checked
/// for the whole batch before any entry is written: nothing is put on an error.
pub fn map_records(table: &mut SkimpyTable, data: &[u8], count: i64, base_offset: i64, start: i64, end: i64,
                   max_entries: usize) -> DecodeResult<(usize, bool, i64)> {
    let mut records: Vec<(i64, Option<&[u8]>)> = Vec::with_capacity(count.max(0) as usize);
    walk(data, count, false, |_, record| {
        let offset = base_offset.wrapping_add(record.offset_delta);
        let in_range = offset >= start && offset < end;
        records.push((offset, if in_range { record.key } else { None }));
        Ok(())
    })?;
    let keys: Vec<&[u8]> = records.iter().filter_map(|(_, key)| *key).collect();
    let mut digests = Vec::new();
    digest_all(&keys, &mut digests);
    for digest in &digests {
        table.prefetch(digest);
    }
    let mut digests = digests.iter();
    let mut last_put = -1i64;
    for (visited, (offset, key)) in records.iter().enumerate() {
        if key.is_some() {
            if table.entries >= max_entries {
                return Ok((visited, true, last_put));
            }
            table.put(digests.next().expect("a digest per key"), *offset)?;
            last_put = *offset;
        }
    }
    Ok((records.len(), false, last_put))
}

/// Kafka `Cleaner.shouldRetainRecord` for every record of a records section: the indices of the
/// records the cleaner keeps (ascending), whether a kept one is a tombstone, and how many null-key
/// records at or below `latest_offset` were dropped (Kafka's invalid records). A tombstone the
/// map keeps is dropped when `retain_deletes` is false (its batch's delete horizon has passed,
/// KIP-534) unless its offset is past `latest_offset`.
pub fn kept(table: &SkimpyTable, data: &[u8], count: i64, base_offset: i64, latest_offset: i64, retain_deletes: bool)
            -> DecodeResult<(Vec<u32>, bool, usize)> {
    // (offset, key to look up, null key, tombstone); no lookup past latest_offset
    let mut records: Vec<(i64, Option<&[u8]>, bool, bool)> = Vec::with_capacity(count.max(0) as usize);
    walk(data, count, false, |_, record| {
        let offset = base_offset.wrapping_add(record.offset_delta);
        let key = if offset > latest_offset { None } else { record.key };
        records.push((offset, key, record.key.is_none(), record.value.is_none()));
        Ok(())
    })?;
    let keys: Vec<&[u8]> = records.iter().filter_map(|record| record.1).collect();
    let mut digests = Vec::new();
    digest_all(&keys, &mut digests);
    for digest in &digests {
        table.prefetch(digest);
    }
    let mut digests = digests.iter();
    let mut kept = Vec::with_capacity(records.len());
    let mut contains_tombstones = false;
    let mut invalid = 0usize;
    for (index, (offset, key, null_key, tombstone)) in records.iter().enumerate() {
        let keep = match key {
            Some(_) => *offset >= table.get(digests.next().expect("a digest per key")),
            None if *offset > latest_offset => true,
            None => {
                debug_assert!(*null_key);
                invalid += 1;
                false
            }
        };
        if !keep {
            continue;
        }
        if *tombstone {
            if !retain_deletes && *offset <= latest_offset {
                continue;
            }
            contains_tombstones = true;
        }
        kept.push(index as u32);
    }
    Ok((kept, contains_tombstones, invalid))
}

/// The records section of a cleaned batch that keeps records `indices` (ascending) of `data`
/// (Kafka `MemoryRecords.buildRetainedRecordsInto`: same base offset, so offset deltas stay;
/// timestamps re-based on the new base timestamp). Key, value and headers are copied byte for byte.
///
/// The new base timestamp is `delete_horizon_ms` when given (KIP-534 puts the horizon there),
/// else the first kept record's timestamp. Returns `(section, base_timestamp, max_timestamp)`
/// (max of the kept records' timestamps, -1 when `indices` is empty). Errs on a framing error
/// or an index out of range.
pub fn encode_retained(data: &[u8], count: i64, base_timestamp: i64, log_append_time: Option<i64>, indices: &[usize],
                       delete_horizon_ms: Option<i64>) -> DecodeResult<(Vec<u8>, i64, i64)> {
    let mut kept: Vec<(i64, i64, usize, usize)> = Vec::with_capacity(indices.len()); // ts, offset delta, tail start, end
    let mut wanted = indices.iter().peekable();
    let mut start = 0usize;
    walk(data, count, false, |index, record| {
        let record_start = start;
        start = record.end;
        if wanted.peek() == Some(&&index) {
            wanted.next();
            // the tail (KeyLength onwards) starts after Length, Attributes and the two deltas
            let mut pos = record_start;
            records::read_varint(data, &mut pos)?;
            pos += 1;
            records::read_varint(data, &mut pos)?;
            records::read_varint(data, &mut pos)?;
            let timestamp = timestamp_of(base_timestamp, record.timestamp_delta, log_append_time);
            kept.push((timestamp, record.offset_delta, pos, record.end));
        }
        Ok(())
    })?;
    if let Some(index) = wanted.next() {
        return Err(format!("record index {index} is not below the record count {count}"));
    }
    let new_base = delete_horizon_ms.or_else(|| kept.first().map(|k| k.0)).unwrap_or(-1);
    let mut out = Vec::with_capacity(data.len());
    let mut body = Vec::with_capacity(64);
    let mut max_timestamp = -1i64;
    for (timestamp, offset_delta, tail_start, end) in kept {
        body.clear();
        body.push(0); // Attributes
        records::write_varint(&mut body, timestamp.wrapping_sub(new_base));
        records::write_varint(&mut body, offset_delta);
        body.extend_from_slice(&data[tail_start..end]);
        records::write_varint(&mut out, body.len() as i64);
        out.extend_from_slice(&body);
        max_timestamp = max_timestamp.max(timestamp);
    }
    Ok((out, new_base, max_timestamp))
}
