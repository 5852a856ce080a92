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

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    pub fn has_avx2_fma() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }

    pub fn has_f16c() -> bool {
        has_avx2_fma() && is_x86_feature_detected!("f16c")
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum(v: __m256) -> f32 {
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
}
