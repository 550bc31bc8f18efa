//! MD5 of many short keys at once: eight keys per AVX2 pass, one per 32-bit lane.
//!
//! The cleaner digests every record key twice per round (the offset-map pass and the recopy
//! pass, as Kafka's `Cleaner` does with `MessageDigest`), and MD5 is a chain of dependent 32-bit
//! steps a core runs one at a time: it was ~21% of a compaction's CPU. Eight independent keys fill
//! eight lanes of the same steps. Only keys of at most 55 bytes (one 64-byte block once padded,
//! RFC 1321) take the lanes; longer keys, CPUs without AVX2 and other architectures use the md-5
//! crate, whose digests these equal bit for bit (tested on every length 0-64 and random keys).

use md5::{Digest, Md5};

pub const DIGEST_BYTES: usize = 16;

/// The longest key that fits one padded block (64 bytes - 0x80 - 8-byte length).
const ONE_BLOCK_MAX: usize = 55;

/// One digest with the md-5 crate (any length).
#[inline(always)]
pub fn digest_one(key: &[u8]) -> [u8; DIGEST_BYTES] {
    Md5::digest(key).into()
}

/// `out[i] = MD5(keys[i])` for every key; `out` is cleared first.
pub fn digest_all(keys: &[&[u8]], out: &mut Vec<[u8; DIGEST_BYTES]>) {
    out.clear();
    out.reserve(keys.len());
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is present (checked just above).
            unsafe { avx2::digest_all(keys, out) };
            return;
        }
    }
    out.extend(keys.iter().map(|key| digest_one(key)));
}

/// Per-step shift amounts (RFC 1321).
const S: [u32; 64] = [
    7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 5, 9, 14, 20, 5, 9, 14, 20, 5, 9, 14, 20, 5, 9, 14, 20,
    4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23, 6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15,
    21,
];

/// Per-step constants, floor(abs(sin(i + 1)) * 2^32) (RFC 1321).
const K: [u32; 64] = [
    0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee, 0xf57c0faf, 0x4787c62a, 0xa8304613, 0xfd469501, 0x698098d8,
    0x8b44f7af, 0xffff5bb1, 0x895cd7be, 0x6b901122, 0xfd987193, 0xa679438e, 0x49b40821, 0xf61e2562, 0xc040b340,
    0x265e5a51, 0xe9b6c7aa, 0xd62f105d, 0x02441453, 0xd8a1e681, 0xe7d3fbc8, 0x21e1cde6, 0xc33707d6, 0xf4d50d87,
    0x455a14ed, 0xa9e3e905, 0xfcefa3f8, 0x676f02d9, 0x8d2a4c8a, 0xfffa3942, 0x8771f681, 0x6d9d6122, 0xfde5380c,
    0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70, 0x289b7ec6, 0xeaa127fa, 0xd4ef3085, 0x04881d05, 0xd9d4d039,
    0xe6db99e5, 0x1fa27cf8, 0xc4ac5665, 0xf4292244, 0x432aff97, 0xab9423a7, 0xfc93a039, 0x655b59c3, 0x8f0ccc92,
    0xffeff47d, 0x85845dd1, 0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1, 0xf7537e82, 0xbd3af235, 0x2ad7d2bb,
    0xeb86d391,
];

const INIT: [u32; 4] = [0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476];

/// The message word step `i` reads (RFC 1321's four rounds).
const fn word_of(i: usize) -> usize {
    match i / 16 {
        0 => i,
        1 => (5 * i + 1) % 16,
        2 => (3 * i + 5) % 16,
        _ => (7 * i) % 16,
    }
}

/// The padded single block of a key of at most 55 bytes, as 16 little-endian words.
#[inline(always)]
fn one_block(key: &[u8]) -> [u32; 16] {
    debug_assert!(key.len() <= ONE_BLOCK_MAX);
    let mut block = [0u8; 64];
    block[..key.len()].copy_from_slice(key);
    block[key.len()] = 0x80;
    block[56..].copy_from_slice(&((key.len() as u64) * 8).to_le_bytes());
    let mut words = [0u32; 16];
    for (word, bytes) in words.iter_mut().zip(block.chunks_exact(4)) {
        *word = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    }
    words
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use core::arch::x86_64::*;

    const LANES: usize = 8;

    /// `digest_all` with eight one-block keys per pass.
    #[target_feature(enable = "avx2")]
    pub unsafe fn digest_all(keys: &[&[u8]], out: &mut Vec<[u8; DIGEST_BYTES]>) {
        // lanes filled with the next one-block keys; a longer key is digested on its own, in order
        let mut lane_keys: [usize; LANES] = [0; LANES];
        let mut filled = 0usize;
        let start = out.len();
        out.resize(start + keys.len(), [0u8; DIGEST_BYTES]);
        for (index, key) in keys.iter().enumerate() {
            if key.len() > ONE_BLOCK_MAX {
                out[start + index] = digest_one(key);
                continue;
            }
            lane_keys[filled] = index;
            filled += 1;
            if filled == LANES {
                pass(keys, &lane_keys, LANES, &mut out[start..]);
                filled = 0;
            }
        }
        if filled > 0 {
            pass(keys, &lane_keys, filled, &mut out[start..]);
        }
    }

    /// Digest `keys[lane_keys[..used]]` in one pass (unused lanes digest the empty key).
    #[target_feature(enable = "avx2")]
    unsafe fn pass(keys: &[&[u8]], lane_keys: &[usize; LANES], used: usize, out: &mut [[u8; DIGEST_BYTES]]) {
        // words[w][lane]: word w of each lane's block
        let mut words = [[0u32; LANES]; 16];
        for lane in 0..LANES {
            let block = one_block(if lane < used { keys[lane_keys[lane]] } else { b"" });
            for (w, word) in block.iter().enumerate() {
                words[w][lane] = *word;
            }
        }
        let m: [__m256i; 16] = core::array::from_fn(|w| _mm256_loadu_si256(words[w].as_ptr() as *const __m256i));
        let mut a = _mm256_set1_epi32(INIT[0] as i32);
        let mut b = _mm256_set1_epi32(INIT[1] as i32);
        let mut c = _mm256_set1_epi32(INIT[2] as i32);
        let mut d = _mm256_set1_epi32(INIT[3] as i32);
        let ones = _mm256_set1_epi32(-1);
        for i in 0..64 {
            let f = match i / 16 {
                0 => _mm256_or_si256(_mm256_and_si256(b, c), _mm256_andnot_si256(b, d)),
                1 => _mm256_or_si256(_mm256_and_si256(d, b), _mm256_andnot_si256(d, c)),
                2 => _mm256_xor_si256(_mm256_xor_si256(b, c), d),
                _ => _mm256_xor_si256(c, _mm256_or_si256(b, _mm256_xor_si256(d, ones))),
            };
            let sum = _mm256_add_epi32(
                _mm256_add_epi32(f, a),
                _mm256_add_epi32(_mm256_set1_epi32(K[i] as i32), m[word_of(i)]),
            );
            let shift = S[i] as i32;
            let rotated = _mm256_or_si256(
                _mm256_sllv_epi32(sum, _mm256_set1_epi32(shift)),
                _mm256_srlv_epi32(sum, _mm256_set1_epi32(32 - shift)),
            );
            a = d;
            d = c;
            c = b;
            b = _mm256_add_epi32(b, rotated);
        }
        let state = [
            _mm256_add_epi32(a, _mm256_set1_epi32(INIT[0] as i32)),
            _mm256_add_epi32(b, _mm256_set1_epi32(INIT[1] as i32)),
            _mm256_add_epi32(c, _mm256_set1_epi32(INIT[2] as i32)),
            _mm256_add_epi32(d, _mm256_set1_epi32(INIT[3] as i32)),
        ];
        let mut lanes = [[0u32; LANES]; 4];
        for (word, vector) in lanes.iter_mut().zip(state) {
            _mm256_storeu_si256(word.as_mut_ptr() as *mut __m256i, vector);
        }
        for lane in 0..used {
            let digest = &mut out[lane_keys[lane]];
            for (w, word) in lanes.iter().enumerate() {
                digest[w * 4..w * 4 + 4].copy_from_slice(&word[lane].to_le_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expected(keys: &[&[u8]]) -> Vec<[u8; DIGEST_BYTES]> {
        keys.iter().map(|key| digest_one(key)).collect()
    }

    #[test]
    fn every_length_up_to_two_blocks_equals_the_md5_crate() {
        let bytes: Vec<u8> = (0..=200u8).map(|b| b.wrapping_mul(37).wrapping_add(11)).collect();
        let keys: Vec<&[u8]> = (0..=130).map(|n| &bytes[..n]).collect();
        let mut out = Vec::new();
        digest_all(&keys, &mut out);
        assert_eq!(out, expected(&keys));
    }

    #[test]
    fn rfc_1321_vectors() {
        let keys: [&[u8]; 3] = [b"", b"abc", b"message digest"];
        let mut out = Vec::new();
        digest_all(&keys, &mut out);
        let hex: Vec<String> = out.iter().map(|d| d.iter().map(|b| format!("{b:02x}")).collect()).collect();
        assert_eq!(hex, ["d41d8cd98f00b204e9800998ecf8427e", "900150983cd24fb0d6963f7d28e17f72",
                         "f96b697d7cb7938d525a2f31aaf161d0"]);
    }

    #[test]
    fn mixed_lengths_keep_their_order() {
        let long = vec![7u8; 300];
        let mut keys: Vec<&[u8]> = Vec::new();
        for i in 0..50 {
            keys.push(if i % 7 == 3 { &long[..56 + i] } else { &long[..i % 20] });
        }
        let mut out = vec![[1u8; DIGEST_BYTES]; 3]; // cleared first
        digest_all(&keys, &mut out);
        assert_eq!(out, expected(&keys));
    }
}
