//! Key hashes of the producers' partitioners (`materializer/group/routing.py` is the API).
//!
//! * `murmur2`: Kafka's `Utils.murmur2` (clients `org.apache.kafka.common.utils.Utils`), the hash
//!   of Java's `BuiltInPartitioner.partitionForKey` and of librdkafka's `murmur2`/`murmur2_random`
//!   partitioners (`rd_murmur2`): MurmurHash2 with seed 0x9747b28c, little-endian 4-byte words,
//!   Java's signed 32-bit result.
//! * `fnv1a`: librdkafka's `rd_fnv1a` (`fnv1a`/`fnv1a_random` partitioners, Sarama's
//!   `NewHashPartitioner`): 32-bit FNV-1a, then the absolute value of the signed result (i32::MIN
//!   stays 0x80000000, as the C code leaves it).

const MURMUR2_SEED: u32 = 0x9747_b28c;
const MURMUR2_M: u32 = 0x5bd1_e995;
const MURMUR2_R: u32 = 24;

/// Kafka's `Utils.murmur2(data)` (a signed 32-bit int, as Java returns it).
pub fn murmur2(data: &[u8]) -> i32 {
    // Java: `int h = seed ^ length` (a Java array's length is an int)
    let mut h = MURMUR2_SEED ^ (data.len() as u32);
    let mut words = data.chunks_exact(4);
    for word in &mut words {
        let mut k = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
        k = k.wrapping_mul(MURMUR2_M);
        k ^= k >> MURMUR2_R;
        k = k.wrapping_mul(MURMUR2_M);
        h = h.wrapping_mul(MURMUR2_M) ^ k;
    }
    let tail = words.remainder();
    // Java's `switch (length % 4)` falls through from case 3 to case 1
    if tail.len() == 3 {
        h ^= (tail[2] as u32) << 16;
    }
    if tail.len() >= 2 {
        h ^= (tail[1] as u32) << 8;
    }
    if !tail.is_empty() {
        h ^= tail[0] as u32;
        h = h.wrapping_mul(MURMUR2_M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(MURMUR2_M);
    h ^= h >> 15;
    h as i32
}

const FNV1A_OFFSET_BASIS: u32 = 0x811c_9dc5;
const FNV1A_PRIME: u32 = 0x0100_0193;

/// librdkafka's `rd_fnv1a(data)` (an unsigned 32-bit int).
pub fn fnv1a(data: &[u8]) -> u32 {
    let mut h = FNV1A_OFFSET_BASIS;
    for &byte in data {
        h ^= byte as u32;
        h = h.wrapping_mul(FNV1A_PRIME);
    }
    (h as i32).wrapping_abs() as u32
}
