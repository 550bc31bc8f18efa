//! One walk over the records section of a v2 batch (Kafka `DefaultRecord.readFrom`), and the
//! varint and timestamp rules every loop over records shares.
//!
//! ```text
//! Record => Length:Varint Attributes:Int8 TimestampDelta:Varlong OffsetDelta:Varint
//!           KeyLength:Varint Key:Bytes ValueLength:Varint Value:Bytes
//!           HeadersCount:Varint [HeaderKeyLength:Varint HeaderKey HeaderValueLength:Varint HeaderValue]
//! ```
//!
//! Every consumer (full decode, keys-only scan, Arrow columns, store entries) goes through
//! [`walk`], so the framing checks and their messages are written once and are the same as the
//! readable Python reference decoder's (`storage/record_reference.py`).

/// A decoding error; becomes a Python `ValueError` with this message.
pub type DecodeResult<T> = Result<T, String>;

/// One record, borrowing its key, value and headers from the records section.
pub struct RecordView<'a> {
    pub timestamp_delta: i64,
    pub offset_delta: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    /// `(header key bytes, header value)`; filled only when the walk collects headers.
    pub headers: Vec<(&'a [u8], Option<&'a [u8]>)>,
    /// Byte position just after the record in the records section.
    pub end: usize,
}

/// Zig-zag varint of up to 10 bytes at `*pos` (Kafka `ByteUtils.readVarlong`; storage/varint.py).
#[inline(always)]
pub fn read_varint(data: &[u8], pos: &mut usize) -> DecodeResult<i64> {
    let mut result: u64 = 0;
    let mut shift: u32 = 0;
    loop {
        let Some(&b) = data.get(*pos) else {
            return Err(format!("buffer of {} bytes ends inside a varint", data.len()));
        };
        *pos += 1;
        result |= u64::from(b & 0x7F) << shift;
        if b < 0x80 {
            return Ok(((result >> 1) as i64) ^ -((result & 1) as i64));
        }
        shift += 7;
        if shift >= 70 {
            return Err(format!("varint longer than 10 bytes ending at position {}", *pos));
        }
    }
}

/// Zig-zag varint of `value` appended to `out` (Kafka `ByteUtils.writeVarlong`).
pub fn write_varint(out: &mut Vec<u8>, value: i64) {
    let mut zigzag = ((value << 1) ^ (value >> 63)) as u64;
    while zigzag > 0x7F {
        out.push((zigzag as u8 & 0x7F) | 0x80);
        zigzag >>= 7;
    }
    out.push(zigzag as u8);
}

/// A record's timestamp in ms: the batch's base timestamp plus the record's delta, or
/// `log_append_time` for every record of a LogAppendTime batch (Kafka `DefaultRecord.readFrom`).
#[inline(always)]
pub fn timestamp_of(base_timestamp: i64, delta: i64, log_append_time: Option<i64>) -> i64 {
    log_append_time.unwrap_or_else(|| base_timestamp.wrapping_add(delta))
}

/// `size` bytes at `*pos` for a length field; `None` for a negative (null) length.
#[inline(always)]
fn read_bytes<'a>(data: &'a [u8], pos: &mut usize, size: i64, length: i64, record_end: usize) -> DecodeResult<Option<&'a [u8]>> {
    if size < 0 {
        return Ok(None);
    }
    let start = *pos;
    let stop = start.checked_add(size as usize).filter(|&s| s <= data.len()).ok_or_else(|| {
        format!(
            "invalid record size: expected to read {} bytes in record payload, but instead read {}",
            length,
            (length as i128) + (start as i128) + (size as i128) - (record_end as i128)
        )
    })?;
    *pos = stop;
    Ok(Some(&data[start..stop]))
}

/// Walk `count` records of `data`, calling `on_record(index, record)` for each.
///
/// Checks exactly what the Python reference does: Length against the bytes left, header count
/// and header key sizes not negative, each record ending where its Length says, and no bytes left
/// after `count` records. `collect_headers` fills [`RecordView::headers`].
pub fn walk<'a, F>(data: &'a [u8], count: i64, collect_headers: bool, mut on_record: F) -> DecodeResult<()>
where
    F: FnMut(usize, &RecordView<'a>) -> DecodeResult<()>,
{
    let end = data.len();
    let mut pos = 0usize;
    let mut view = RecordView { timestamp_delta: 0, offset_delta: 0, key: None, value: None, headers: Vec::new(), end: 0 };
    for index in 0..count.max(0) as usize {
        let length = read_varint(data, &mut pos)?;
        let remaining = (end - pos) as i64;
        if length < 0 || length > remaining {
            return Err(format!(
                "invalid record size: expected {length} bytes in record payload, but only {remaining} remain"
            ));
        }
        let record_end = pos + length as usize;
        pos += 1; // Attributes => Int8, unused
        view.timestamp_delta = read_varint(data, &mut pos)?;
        view.offset_delta = read_varint(data, &mut pos)?;
        let key_size = read_varint(data, &mut pos)?;
        view.key = read_bytes(data, &mut pos, key_size, length, record_end)?;
        let value_size = read_varint(data, &mut pos)?;
        view.value = read_bytes(data, &mut pos, value_size, length, record_end)?;
        view.headers.clear();
        let header_count = read_varint(data, &mut pos)?;
        if header_count < 0 {
            return Err(format!("found invalid number of record headers {header_count}"));
        }
        for _ in 0..header_count {
            let key_size = read_varint(data, &mut pos)?;
            if key_size < 0 {
                return Err(format!("invalid negative header key size {key_size}"));
            }
            let header_key = read_bytes(data, &mut pos, key_size, length, record_end)?.unwrap_or(&[]);
            let value_size = read_varint(data, &mut pos)?;
            let header_value = read_bytes(data, &mut pos, value_size, length, record_end)?;
            if collect_headers {
                view.headers.push((header_key, header_value));
            }
        }
        if pos != record_end {
            return Err(format!(
                "invalid record size: expected to read {} bytes in record payload, but instead read {}",
                length,
                (length as i128) + (pos as i128) - (record_end as i128)
            ));
        }
        view.end = record_end;
        on_record(index, &view)?;
    }
    if pos != end {
        return Err(format!("incorrect declared batch size, {} bytes remain after {} records", end - pos, count));
    }
    Ok(())
}
