//! The inner loops of the CPU backend: dot products of an f32 activation row
//! with a weight row in f32, bf16 or f16, and widening of 16-bit rows to f32.
//!
//! x86-64 with AVX2+FMA(+F16C) gets hand-written kernels (chosen at run time);
//! everything else gets the portable loops, which are also the reference the
//! SIMD kernels are tested against. Sums use four (portable) or four×8 (AVX2)
//! partial accumulators, so results differ from a sequential sum by rounding
//! only.

#[inline]
fn bf16_bits_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

#[inline]
fn f16_bits_to_f32(b: u16) -> f32 {
    half::f16::from_bits(b).to_f32()
}

fn dot_portable<T: Copy>(x: &[f32], w: &[T], conv: impl Fn(T) -> f32) -> f32 {
    let mut acc = [0.0f32; 4];
    let mut xc = x.chunks_exact(4);
    let mut wc = w.chunks_exact(4);
    for (xs, ws) in (&mut xc).zip(&mut wc) {
        for j in 0..4 {
            acc[j] += xs[j] * conv(ws[j]);
        }
    }
    let mut tail = 0.0;
    for (a, &b) in xc.remainder().iter().zip(wc.remainder()) {
        tail += a * conv(b);
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3]) + tail
}

/// How far ahead of a decode dot product's weight loads the kernels ask
/// for the weights' cache lines. A decode GEMV reads each weight byte
/// once, in order; the hardware prefetchers alone kept a core ~10 GB/s
/// behind what it can stream (the developers' 2-core Xeon, a 134 MB bf16
/// matrix: 19-22 GB/s on two threads, 29-30 with lines asked for 2 KB
/// ahead; int4 9.2 → 15-18 GB/s; 1 KB ahead was less, 4 KB the same).
#[cfg(target_arch = "x86_64")]
const PREFETCH_AHEAD: usize = 2048;

/// Asks for the cache lines of `bytes` bytes (a multiple of 64) starting
/// [`PREFETCH_AHEAD`] past `p`. A prefetch never faults, so past a row's
/// end it asks for the next row (or nothing useful, harmlessly).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_ahead(p: *const u8, bytes: usize) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    for line in (0..bytes).step_by(64) {
        // SAFETY: prefetching is a hint; any address is allowed.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD + line).cast()) };
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::hsum;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::prefetch_ahead;

    pub fn has_avx2_fma() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }

    pub fn has_f16c() -> bool {
        has_avx2_fma() && is_x86_feature_detected!("f16c")
    }

    /// The sum of a vector's eight lanes (the SIMD kernels' last step).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn hsum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    /// Eight weights starting at `p`, widened to f32.
    pub trait Lanes {
        type Elem: Copy;
        unsafe fn load8(p: *const Self::Elem) -> __m256;
        fn scalar(e: Self::Elem) -> f32;
    }

    pub struct F32;
    pub struct Bf16;
    pub struct F16;

    impl Lanes for F32 {
        type Elem = f32;
        #[inline(always)]
        unsafe fn load8(p: *const f32) -> __m256 {
            unsafe { _mm256_loadu_ps(p) }
        }
        fn scalar(e: f32) -> f32 {
            e
        }
    }

    impl Lanes for Bf16 {
        type Elem = u16;
        #[inline(always)]
        unsafe fn load8(p: *const u16) -> __m256 {
            // bf16 is the top half of an f32: zero-extend and shift left 16.
            unsafe {
                let h = _mm_loadu_si128(p as *const __m128i);
                _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
            }
        }
        fn scalar(e: u16) -> f32 {
            super::bf16_bits_to_f32(e)
        }
    }

    impl Lanes for F16 {
        type Elem = u16;
        #[inline(always)]
        unsafe fn load8(p: *const u16) -> __m256 {
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
        }
        fn scalar(e: u16) -> f32 {
            super::f16_bits_to_f32(e)
        }
    }

    /// Caller guarantees AVX2+FMA (+F16C for `F16`) and `x.len() == w.len()`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot<L: Lanes>(x: &[f32], w: &[L::Elem]) -> f32 {
        let n = x.len();
        let (xp, wp) = (x.as_ptr(), w.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        unsafe {
            while i + 32 <= n {
                prefetch_ahead(wp.add(i).cast(), 32 * std::mem::size_of::<L::Elem>());
                for (j, a) in acc.iter_mut().enumerate() {
                    let o = i + 8 * j;
                    *a = _mm256_fmadd_ps(_mm256_loadu_ps(xp.add(o)), L::load8(wp.add(o)), *a);
                }
                i += 32;
            }
            while i + 8 <= n {
                acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(xp.add(i)), L::load8(wp.add(i)), acc[0]);
                i += 8;
            }
            let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
            let mut total = hsum(s);
            while i < n {
                total += x[i] * L::scalar(w[i]);
                i += 1;
            }
            total
        }
    }

    /// Σ x·w over one row of MXFP4 blocks (`x.len() == 32 · scales.len()`,
    /// `blocks.len() == 16 · scales.len()`). Codes are looked up as twice
    /// their value (integers −12..12) with `pshufb`, widened to f32, and
    /// each block's sum is scaled by 2^(s−127)/2 once.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_mxfp4(x: &[f32], blocks: &[u8], scales: &[u8]) -> f32 {
        let mut total = _mm256_setzero_ps();
        unsafe {
            for (g, &s) in scales.iter().enumerate() {
                if g % 4 == 0 {
                    prefetch_ahead(blocks.as_ptr().add(g * 16), 64);
                }
                let xp = x.as_ptr().add(g * 32);
                let mut acc = _mm256_setzero_ps();
                for (j, w) in mxfp4_twice(blocks.as_ptr().add(g * 16))
                    .into_iter()
                    .enumerate()
                {
                    acc = _mm256_fmadd_ps(_mm256_loadu_ps(xp.add(8 * j)), w, acc);
                }
                let scale = _mm256_set1_ps(super::e8m0(s) * 0.5);
                total = _mm256_fmadd_ps(acc, scale, total);
            }
            hsum(total)
        }
    }

    /// One block's 32 values at `p` (16 bytes) as twice their E2M1 values,
    /// in element order (element 2j is byte j's low nibble, 2j + 1 its
    /// high one), eight to a vector.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn mxfp4_twice(p: *const u8) -> [__m256; 4] {
        unsafe {
            let lut = _mm_loadu_si128(super::E2M1_TWICE.as_ptr().cast());
            let low4 = _mm_set1_epi8(0x0F);
            let bytes = _mm_loadu_si128(p.cast());
            let lo = _mm_and_si128(bytes, low4);
            let hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low4);
            let first = _mm_shuffle_epi8(lut, _mm_unpacklo_epi8(lo, hi));
            let second = _mm_shuffle_epi8(lut, _mm_unpackhi_epi8(lo, hi));
            [
                first,
                _mm_srli_si128(first, 8),
                second,
                _mm_srli_si128(second, 8),
            ]
            .map(|codes| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes)))
        }
    }

    /// [`super::decode_mxfp4`]: each block's doubled values times half its
    /// scale (both exact: the result is the scalar decoding's, but for the
    /// sign of a zero).
    #[target_feature(enable = "avx2")]
    pub unsafe fn decode_mxfp4(blocks: &[u8], scales: &[u8], out: &mut [f32]) {
        unsafe {
            for (g, &s) in scales.iter().enumerate() {
                let scale = _mm256_set1_ps(super::e8m0(s) * 0.5);
                let o = out.as_mut_ptr().add(g * 32);
                for (j, w) in mxfp4_twice(blocks.as_ptr().add(g * 16))
                    .into_iter()
                    .enumerate()
                {
                    _mm256_storeu_ps(o.add(8 * j), _mm256_mul_ps(w, scale));
                }
            }
        }
    }

    /// Caller guarantees AVX2 (+F16C for `F16`) and equal lengths.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn widen<L: Lanes>(w: &[L::Elem], out: &mut [f32]) {
        let n = out.len();
        let mut i = 0;
        unsafe {
            while i + 8 <= n {
                _mm256_storeu_ps(out.as_mut_ptr().add(i), L::load8(w.as_ptr().add(i)));
                i += 8;
            }
        }
        while i < n {
            out[i] = L::scalar(w[i]);
            i += 1;
        }
    }
}

pub fn dot_f32(x: &[f32], w: &[f32]) -> f32 {
    assert_eq!(x.len(), w.len());
    #[cfg(target_arch = "x86_64")]
    if x86::has_avx2_fma() {
        // SAFETY: features checked above; lengths equal.
        return unsafe { x86::dot::<x86::F32>(x, w) };
    }
    dot_portable(x, w, |v| v)
}

pub fn dot_bf16(x: &[f32], w: &[u16]) -> f32 {
    assert_eq!(x.len(), w.len());
    #[cfg(target_arch = "x86_64")]
    if x86::has_f16c() {
        // SAFETY: features checked above; lengths equal.
        return unsafe { x86::dot::<x86::Bf16>(x, w) };
    }
    dot_portable(x, w, bf16_bits_to_f32)
}

pub fn dot_f16(x: &[f32], w: &[u16]) -> f32 {
    assert_eq!(x.len(), w.len());
    #[cfg(target_arch = "x86_64")]
    if x86::has_f16c() {
        // SAFETY: features checked above; lengths equal.
        return unsafe { x86::dot::<x86::F16>(x, w) };
    }
    dot_portable(x, w, f16_bits_to_f32)
}

/// Twice each E2M1 value (integers, exact in i8), indexed by the 4-bit
/// code: what the SIMD MXFP4 kernels look codes up as (`pshufb`).
pub const E2M1_TWICE: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// The 16 E2M1 values, indexed by the 4-bit code (sign is the top bit).
pub const E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// E8M0 scale byte → 2^(s − 127), exactly (2^−127 is a subnormal; 255 is
/// 2^128 = inf, as torch.ldexp gives).
#[inline]
pub fn e8m0(s: u8) -> f32 {
    match s {
        0 => f32::from_bits(0x0040_0000),
        _ => f32::from_bits((s as u32) << 23),
    }
}

/// Decodes one 32-value MXFP4 block: byte j holds elements 2j (low nibble)
/// and 2j + 1 (high nibble). The definition [`decode_mxfp4`] vectorizes.
#[inline]
pub fn decode_mxfp4_block(bytes: &[u8], scale: u8, out: &mut [f32]) {
    let s = e8m0(scale);
    for (pair, &b) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = E2M1[(b & 0x0F) as usize] * s;
        pair[1] = E2M1[(b >> 4) as usize] * s;
    }
}

/// Decodes consecutive MXFP4 blocks (16 bytes and one scale each) into
/// `out`, 32 values a block: what a GEMM over MXFP4 weights widens its
/// rows with.
pub fn decode_mxfp4(blocks: &[u8], scales: &[u8], out: &mut [f32]) {
    assert!(blocks.len() == scales.len() * 16 && out.len() == scales.len() * 32);
    #[cfg(target_arch = "x86_64")]
    if x86::has_avx2_fma() {
        // SAFETY: features checked above; lengths checked.
        return unsafe { x86::decode_mxfp4(blocks, scales, out) };
    }
    for (g, o) in out.chunks_exact_mut(32).enumerate() {
        decode_mxfp4_block(&blocks[g * 16..g * 16 + 16], scales[g], o);
    }
}

/// Σ x·w over one row of MXFP4 blocks.
pub fn dot_mxfp4(x: &[f32], blocks: &[u8], scales: &[u8]) -> f32 {
    assert!(x.len() == scales.len() * 32 && blocks.len() == scales.len() * 16);
    #[cfg(target_arch = "x86_64")]
    if x86::has_avx2_fma() {
        // SAFETY: features checked above; lengths checked.
        return unsafe { x86::dot_mxfp4(x, blocks, scales) };
    }
    let mut buf = [0.0f32; 32];
    let mut total = 0.0;
    for (g, &s) in scales.iter().enumerate() {
        decode_mxfp4_block(&blocks[g * 16..g * 16 + 16], s, &mut buf);
        total += dot_portable(&x[g * 32..g * 32 + 32], &buf, |v| v);
    }
    total
}

pub fn bf16_to_f32(w: &[u16], out: &mut [f32]) {
    assert_eq!(w.len(), out.len());
    #[cfg(target_arch = "x86_64")]
    if x86::has_f16c() {
        // SAFETY: features checked above; lengths equal.
        return unsafe { x86::widen::<x86::Bf16>(w, out) };
    }
    for (o, &b) in out.iter_mut().zip(w) {
        *o = bf16_bits_to_f32(b);
    }
}

pub fn f16_to_f32(w: &[u16], out: &mut [f32]) {
    assert_eq!(w.len(), out.len());
    #[cfg(target_arch = "x86_64")]
    if x86::has_f16c() {
        // SAFETY: features checked above; lengths equal.
        return unsafe { x86::widen::<x86::F16>(w, out) };
    }
    for (o, &b) in out.iter_mut().zip(w) {
        *o = f16_bits_to_f32(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize) -> (Vec<f32>, Vec<f32>) {
        let x = (0..n)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
            .collect();
        let w = (0..n)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) / 31.0)
            .collect();
        (x, w)
    }

    #[test]
    fn simd_dots_match_portable_on_odd_lengths() {
        for n in [1, 7, 8, 31, 33, 64, 257] {
            let (x, w) = data(n);
            let bf: Vec<u16> = w
                .iter()
                .map(|&v| half::bf16::from_f32(v).to_bits())
                .collect();
            let hf: Vec<u16> = w
                .iter()
                .map(|&v| half::f16::from_f32(v).to_bits())
                .collect();
            let close = |a: f32, b: f32| (a - b).abs() <= 1e-4 * (1.0 + b.abs());
            assert!(
                close(dot_f32(&x, &w), dot_portable(&x, &w, |v| v)),
                "f32 n={n}"
            );
            assert!(
                close(dot_bf16(&x, &bf), dot_portable(&x, &bf, bf16_bits_to_f32)),
                "bf16 n={n}"
            );
            assert!(
                close(dot_f16(&x, &hf), dot_portable(&x, &hf, f16_bits_to_f32)),
                "f16 n={n}"
            );
            let mut out = vec![0.0; n];
            bf16_to_f32(&bf, &mut out);
            assert!(out.iter().zip(&bf).all(|(&o, &b)| o == bf16_bits_to_f32(b)));
            f16_to_f32(&hf, &mut out);
            assert!(out.iter().zip(&hf).all(|(&o, &b)| o == f16_bits_to_f32(b)));
        }
    }

    #[test]
    fn mxfp4_dot_matches_decoding_every_code_and_scale() {
        // 4 blocks covering all 256 byte values and scales below, at and
        // above 2^0.
        let groups = 16;
        let blocks: Vec<u8> = (0..groups * 16).map(|i| (i * 7 % 256) as u8).collect();
        let scales: Vec<u8> = (0..groups).map(|g| 120 + g as u8).collect();
        let x: Vec<f32> = (0..groups * 32)
            .map(|i| ((i * 13 % 29) as f32 - 14.0) / 9.0)
            .collect();
        let mut expected = 0.0f64;
        let mut buf = [0.0f32; 32];
        for g in 0..groups {
            decode_mxfp4_block(&blocks[g * 16..g * 16 + 16], scales[g], &mut buf);
            for (j, w) in buf.iter().enumerate() {
                expected += x[g * 32 + j] as f64 * *w as f64;
            }
        }
        let got = dot_mxfp4(&x, &blocks, &scales) as f64;
        assert!(
            (got - expected).abs() < 1e-4 * (1.0 + expected.abs()),
            "{got} vs {expected}"
        );
        // Element order: byte 0x21 → (1.0 low, 0.5 high) scaled by 2^0.
        let mut one = [0.0f32; 32];
        decode_mxfp4_block(&[0x21; 16], 127, &mut one);
        assert_eq!((one[0], one[1]), (0.5, 1.0));
        // The vectorized decoding of a run of blocks gives every value the
        // scalar one gives (scales 0, 1 and 255 included: subnormal, inf).
        let scales: Vec<u8> = (0..groups)
            .map(|g| [0, 1, 120, 127, 200, 255][g % 6])
            .collect();
        let mut many = vec![0.0f32; groups * 32];
        decode_mxfp4(&blocks, &scales, &mut many);
        for g in 0..groups {
            decode_mxfp4_block(&blocks[g * 16..g * 16 + 16], scales[g], &mut buf);
            for (j, (&a, &b)) in many[g * 32..].iter().zip(&buf).enumerate() {
                assert!(
                    a == b || (a.is_nan() && b.is_nan()),
                    "block {g} value {j}: {a} vs {b}"
                );
            }
        }
    }
}
