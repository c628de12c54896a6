//! The kernels against scalar references (the forward pass against candle's is in
//! `ferrograph-llm/tests/decoder_vs_candle.rs`, which needs the engine's tokenizer).
//!
//! - Property tests: for every GGUF block type with a kernel, random blocks and activations;
//!   the scalar kernel must match a float reference built straight from the GGUF block
//!   layout (dequantized weights times dequantized 8-bit activations), and the SIMD kernel
//!   must match the scalar one.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    clippy::explicit_counter_loop
)]

use ferrograph_kernels::{self as kernels, pool::Pool, GgufType, Isa, QAct, QMatrix, QK};
use proptest::prelude::*;

fn f16_bits(x: f32) -> u16 {
    // Round-toward-zero conversion of a normal value (enough for test scales).
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
    if x == 0.0 || exp <= 0 {
        return sign;
    }
    sign | ((exp.min(30) as u16) << 10) | (((b >> 13) & 0x3ff) as u16)
}

/// Reference dequantization straight from the GGUF block layouts.
fn dequant(ty: GgufType, data: &[u8]) -> Vec<f32> {
    let h = |b: &[u8], i: usize| kernels::f16_to_f32(u16::from_le_bytes([b[i], b[i + 1]]));
    let mut out = Vec::new();
    for blk in data.chunks_exact(ty.block_bytes()) {
        match ty {
            GgufType::Q4_0 | GgufType::Q4_1 => {
                let (d, m, qs) = if ty == GgufType::Q4_0 {
                    (h(blk, 0), None, &blk[2..18])
                } else {
                    (h(blk, 0), Some(h(blk, 2)), &blk[4..20])
                };
                let v = |q: u8| match m {
                    None => d * (q as f32 - 8.0),
                    Some(m) => d * q as f32 + m,
                };
                let lo: Vec<f32> = qs.iter().map(|b| v(b & 15)).collect();
                let hi: Vec<f32> = qs.iter().map(|b| v(b >> 4)).collect();
                out.extend(lo);
                out.extend(hi);
            }
            GgufType::Q5_0 | GgufType::Q5_1 => {
                let (d, m, o) = if ty == GgufType::Q5_0 {
                    (h(blk, 0), None, 2)
                } else {
                    (h(blk, 0), Some(h(blk, 2)), 4)
                };
                let qh = u32::from_le_bytes(blk[o..o + 4].try_into().unwrap());
                let qs = &blk[o + 4..o + 20];
                for i in 0..32 {
                    let nib = if i < 16 { qs[i] & 15 } else { qs[i - 16] >> 4 };
                    let q = nib as u32 | (((qh >> i) & 1) << 4);
                    out.push(match m {
                        None => d * (q as f32 - 16.0),
                        Some(m) => d * q as f32 + m,
                    });
                }
            }
            GgufType::Q8_0 => {
                let d = h(blk, 0);
                out.extend(blk[2..34].iter().map(|&b| d * (b as i8) as f32));
            }
            GgufType::Q4K => {
                let (d, dmin) = (h(blk, 0), h(blk, 2));
                let sc = &blk[4..16];
                let qs = &blk[16..144];
                let scale_min = |j: usize| -> (f32, f32) {
                    if j < 4 {
                        ((sc[j] & 63) as f32, (sc[j + 4] & 63) as f32)
                    } else {
                        (
                            ((sc[j + 4] & 15) | ((sc[j - 4] >> 6) << 4)) as f32,
                            ((sc[j + 4] >> 4) | ((sc[j] >> 6) << 4)) as f32,
                        )
                    }
                };
                for chunk in 0..4 {
                    let bytes = &qs[32 * chunk..32 * chunk + 32];
                    let (s1, m1) = scale_min(2 * chunk);
                    let (s2, m2) = scale_min(2 * chunk + 1);
                    out.extend(bytes.iter().map(|b| d * s1 * (b & 15) as f32 - dmin * m1));
                    out.extend(bytes.iter().map(|b| d * s2 * (b >> 4) as f32 - dmin * m2));
                }
            }
            GgufType::Q6K => {
                let (ql, qh, sc) = (&blk[0..128], &blk[128..192], &blk[192..208]);
                let d = h(blk, 208);
                let mut v = [0f32; 256];
                for i in 0..256 {
                    let half = i / 128;
                    let j = i % 128;
                    let l = j % 32;
                    let quarter = j / 32;
                    let lbyte = ql[64 * half + l + if quarter % 2 == 1 { 32 } else { 0 }];
                    let low = if quarter >= 2 { lbyte >> 4 } else { lbyte & 15 };
                    let high = (qh[32 * half + l] >> (2 * quarter)) & 3;
                    let q = (low | (high << 4)) as i32 - 32;
                    v[i] = d * (sc[i / 16] as i8) as f32 * q as f32;
                }
                out.extend(v);
            }
            GgufType::F32 | GgufType::F16 => unreachable!(),
        }
    }
    out
}

/// Random but well-formed block bytes: finite, moderate scales.
fn blocks(ty: GgufType, n: usize, seed: u64) -> Vec<u8> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut out = vec![0u8; n * ty.block_bytes()];
    for b in out.iter_mut() {
        *b = next() as u8;
    }
    let mut scale = |blk: &mut [u8], at: usize| {
        let v = (next() % 2000) as f32 / 2000.0 * 0.05 + 0.001;
        let v = if next() % 2 == 0 { v } else { -v };
        blk[at..at + 2].copy_from_slice(&f16_bits(v).to_le_bytes());
    };
    for blk in out.chunks_exact_mut(ty.block_bytes()) {
        match ty {
            GgufType::Q4_0 | GgufType::Q5_0 | GgufType::Q8_0 => scale(blk, 0),
            GgufType::Q4_1 | GgufType::Q5_1 | GgufType::Q4K => {
                scale(blk, 0);
                scale(blk, 2);
            }
            GgufType::Q6K => scale(blk, 208),
            _ => {}
        }
    }
    out
}

const TYPES: [GgufType; 7] = [
    GgufType::Q4_0,
    GgufType::Q4_1,
    GgufType::Q5_0,
    GgufType::Q5_1,
    GgufType::Q8_0,
    GgufType::Q4K,
    GgufType::Q6K,
];

fn check(ty: GgufType, rows: usize, cols: usize, x: &[f32], seed: u64) {
    let t = x.len() / cols;
    let data = blocks(ty, rows * cols / ty.block_elems(), seed);
    let w = QMatrix::from_gguf(ty, rows, cols, &data).unwrap();
    let dense = dequant(ty, &data);
    // Repacking keeps every value.
    let mut row = vec![0f32; cols];
    for r in 0..rows {
        assert!(w.dequantize_row(r, &mut row));
        for (a, b) in row.iter().zip(&dense[r * cols..(r + 1) * cols]) {
            assert!(
                (a - b).abs() <= 1e-6 * b.abs().max(1.0),
                "{ty:?} dequantize {a} vs {b}"
            );
        }
    }
    let mut act = QAct::default();
    act.quantize(x, cols);
    // Activations as the kernels see them.
    let xq: Vec<f32> = act
        .q
        .iter()
        .enumerate()
        .map(|(i, q)| *q as f32 * act.d[i / QK])
        .collect();
    let pool = Pool::new(2);
    let mut scalar = vec![0f32; t * rows];
    kernels::matmul_with(Isa::Scalar, &pool, &mut [(&w, &mut scalar[..])], &act);
    // Per output, the sum of the terms' magnitudes: rounding errors scale with it, not with
    // the result, which cancellation can make small.
    let mut mags = vec![0f64; t * rows];
    for ti in 0..t {
        for r in 0..rows {
            let wr = &dense[r * cols..(r + 1) * cols];
            let xr = &xq[ti * cols..(ti + 1) * cols];
            let want: f64 = wr.iter().zip(xr).map(|(a, b)| *a as f64 * *b as f64).sum();
            let mag: f64 = wr
                .iter()
                .zip(xr)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum();
            mags[ti * rows + r] = mag;
            let got = scalar[ti * rows + r] as f64;
            assert!(
                (got - want).abs() <= 1e-4 * mag + 1e-5,
                "{ty:?} scalar {got} vs reference {want} (row {r}, token {ti})"
            );
        }
    }
    for isa in Isa::ALL {
        if isa == Isa::Scalar || !kernels::isa_available(isa) {
            continue;
        }
        let mut simd = vec![0f32; t * rows];
        kernels::matmul_with(isa, &pool, &mut [(&w, &mut simd[..])], &act);
        for (i, (a, b)) in simd.iter().zip(&scalar).enumerate() {
            assert!(
                f64::from((a - b).abs()) <= 1e-4 * mags[i] + 1e-5,
                "{ty:?} {isa:?} {a} vs scalar {b} at {i}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn kernels_match_the_reference(
        ty in 0..TYPES.len(),
        rows in 1usize..20,
        super_blocks in 1usize..3,
        t in 1usize..7,
        seed in any::<u64>(),
        xs in proptest::collection::vec(-4.0f32..4.0, 512 * 6),
    ) {
        let cols = 256 * super_blocks;
        check(TYPES[ty], rows, cols, &xs[..t * cols], seed);
    }
}

/// Matrices of every block type with a multiple of 8 rows are interleaved at load; every token
/// count of a tile (1 to 4) and a remainder tile are covered, against the same references.
#[test]
fn interleaved_matrices_match_the_reference() {
    let xs: Vec<f32> = (0..512 * 7)
        .map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 6.0)
        .collect();
    for (ty, rows) in [
        (GgufType::Q4_0, 8),
        (GgufType::Q4_0, 32),
        (GgufType::Q4_1, 16),
        (GgufType::Q4K, 24),
        (GgufType::Q8_0, 8),
        (GgufType::Q8_0, 32),
        (GgufType::Q6K, 16),
        (GgufType::Q5_0, 8),
        (GgufType::Q5_1, 16),
    ] {
        let w = QMatrix::from_gguf(
            ty,
            rows,
            32 * 8,
            &vec![0u8; ty.bytes_for(rows * 256).unwrap()],
        )
        .unwrap();
        assert!(
            matches!(
                w.packed,
                kernels::Packed::U4x8 { .. }
                    | kernels::Packed::U4x8Half { .. }
                    | kernels::Packed::U5x8 { .. }
                    | kernels::Packed::I8x8 { .. }
                    | kernels::Packed::I8S16x8 { .. }
            ),
            "{ty:?} with {rows} rows should be interleaved"
        );
        // Half-float scales stay half floats, and 5-bit quants take 5 bits: the GGUF's bytes
        // (Q4_0's and Q5_0's offsets, -8 and -16 times their scales, are derived rather than
        // stored) or two more for Q5_1's own offsets, where a byte per quant took 40. Q4_K's
        // scales times its sub-scales are not half floats, and stay `f32`.
        // Blocks of 32 in `rows` rows of 256.
        let n = rows * 256 / 32;
        let random = || {
            let data = blocks(ty, rows * 256 / ty.block_elems(), 5);
            QMatrix::from_gguf(ty, rows, 256, &data).unwrap()
        };
        match ty {
            GgufType::Q8_0 => assert_eq!(random().bytes(), n * 34),
            GgufType::Q5_0 => assert_eq!(random().bytes(), n * 22),
            GgufType::Q5_1 => assert_eq!(random().bytes(), n * 24),
            GgufType::Q4_0 => assert_eq!(random().bytes(), n * 18),
            GgufType::Q4_1 => assert_eq!(random().bytes(), n * 20),
            GgufType::Q4K => assert!(matches!(random().packed, kernels::Packed::U4x8 { .. })),
            _ => {}
        }
        for t in [1, 2, 3, 4, 7] {
            check(ty, rows, 512, &xs[..t * 512], 17 + t as u64);
        }
    }
}

#[test]
fn activation_quantization_round_trips() {
    let x: Vec<f32> = (0..96)
        .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.3)
        .collect();
    let mut a = QAct::default();
    a.quantize(&x, 96);
    for (i, v) in x.iter().enumerate() {
        let back = a.q[i] as f32 * a.d[i / QK];
        assert!((back - v).abs() <= a.d[i / QK] * 0.5 + 1e-6);
    }
    for b in 0..3 {
        let s: i32 = a.q[b * QK..(b + 1) * QK].iter().map(|q| *q as i32).sum();
        assert!((a.s[b] - a.d[b] * s as f32).abs() < 1e-4);
    }
    // An all-zero block quantizes to zeros, not NaN.
    a.quantize(&[0.0; 32], 32);
    assert!(a.q.iter().all(|q| *q == 0) && a.d[0] == 0.0);
}

#[test]
fn parallel_quantization_matches_the_serial_one() {
    let pool = Pool::new(3);
    // Small inputs (a decode step's rows) stay on the calling thread; from 16,384 elements
    // (four rows here) they are split over the pool.
    let cols = 4096;
    for rows in [1, 2, 3, 5, 8] {
        let x: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 53 % 41) as f32 - 20.0) * 0.17)
            .collect();
        let (mut serial, mut parallel) = (QAct::default(), QAct::default());
        serial.quantize(&x, cols);
        parallel.quantize_on(&pool, &x, cols);
        assert_eq!((parallel.rows, parallel.cols), (rows, cols));
        assert_eq!(serial.q, parallel.q, "{rows} rows");
        assert_eq!(serial.d, parallel.d, "{rows} rows");
        assert_eq!(serial.s, parallel.s, "{rows} rows");
    }
}

#[test]
fn prepared_quantization_on_the_pool_matches_preparing_then_quantizing() {
    // Each element becomes a function of its value and its offset in the whole buffer (a
    // wrong offset or a piece prepared twice changes the bits).
    let prepare = |at: usize, rows: &mut [f32]| {
        for (i, v) in rows.iter_mut().enumerate() {
            *v = *v * 1.5 + ((at + i) % 97) as f32 * 0.01;
        }
    };
    for threads in [1, 2, 3] {
        let pool = Pool::new(threads);
        for (rows, cols) in [(1, 64), (2, 1536), (4, 1536), (5, 576), (9, 32)] {
            let x: Vec<f32> = (0..rows * cols)
                .map(|i| ((i * 53 % 41) as f32 - 20.0) * 0.17)
                .collect();
            let mut want_x = x.clone();
            prepare(0, &mut want_x);
            let mut want = QAct::default();
            want.quantize(&want_x, cols);
            let (mut got_x, mut got) = (x.clone(), QAct::default());
            got.quantize_prepared_on(&pool, &mut got_x, cols, &prepare);
            let at = format!("{threads} threads, {rows} x {cols}");
            assert!(got_x == want_x, "{at}: prepared values");
            assert_eq!((got.rows, got.cols), (rows, cols), "{at}");
            assert_eq!(got.q, want.q, "{at}");
            assert_eq!(got.d, want.d, "{at}");
            assert_eq!(got.s, want.s, "{at}");
        }
    }
}

#[test]
fn pieces_cover_every_element_once_at_their_offsets() {
    for threads in [1, 2, 3] {
        let pool = Pool::new(threads);
        for (len, unit) in [(0, 4), (3, 4), (12, 4), (14, 4), (100, 7), (5, 1)] {
            let mut v = vec![0usize; len];
            pool.for_each_piece(&mut v, unit, &|at, piece| {
                assert!(at % unit == 0 || piece.is_empty());
                for (i, x) in piece.iter_mut().enumerate() {
                    *x += at + i + 1;
                }
            });
            let want: Vec<usize> = (1..=len).collect();
            assert_eq!(v, want, "{threads} threads, {len} by {unit}");
        }
    }
}

#[test]
fn malformed_tensors_are_errors() {
    assert!(QMatrix::from_gguf(GgufType::Q4_0, 2, 32, &[0u8; 35]).is_err());
    assert!(QMatrix::from_gguf(GgufType::Q4K, 1, 32, &[0u8; 144]).is_err());
    assert!(QMatrix::from_gguf(GgufType::Q8_0, 0, 32, &[]).is_err());
    assert!(QMatrix::from_gguf(GgufType::F32, 1, 32, &[0u8; 128]).is_err());
}

#[test]
fn pool_runs_every_index_and_nests_safely() {
    let pool = Pool::new(3);
    for _ in 0..200 {
        let hits: Vec<std::sync::atomic::AtomicUsize> = (0..3)
            .map(|_| std::sync::atomic::AtomicUsize::new(0))
            .collect();
        pool.run(&|i| {
            hits[i].fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        assert!(hits
            .iter()
            .all(|h| h.load(std::sync::atomic::Ordering::SeqCst) == 1));
    }
    // A job that dispatches on the same pool runs its inner job inline instead of deadlocking.
    let inner = std::sync::atomic::AtomicUsize::new(0);
    pool.run(&|_| {
        pool.run(&|_| {
            inner.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        })
    });
    assert_eq!(inner.load(std::sync::atomic::Ordering::SeqCst), 9);
}

/// A product of several jobs (interleaved and row-by-row matrices of different types, row
/// counts that are and are not multiples of 8) is cut into pieces that the pool's threads take
/// as they come free: every output element is written once, and the bits do not depend on how
/// many threads there are or which took which piece.
#[test]
fn products_of_several_jobs_are_the_same_bits_on_any_number_of_threads() {
    let cols = 256;
    let mats: Vec<QMatrix> = [
        (GgufType::Q5_0, 24),
        (GgufType::Q8_0, 8),
        (GgufType::Q4K, 13),
        (GgufType::Q6K, 1000),
        (GgufType::Q4_1, 5),
    ]
    .iter()
    .enumerate()
    .map(|(i, &(ty, rows))| {
        let data = blocks(ty, rows * cols / ty.block_elems(), 40 + i as u64);
        QMatrix::from_gguf(ty, rows, cols, &data).unwrap()
    })
    .collect();
    for t in [1, 3, 6] {
        let x: Vec<f32> = (0..t * cols)
            .map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 6.0)
            .collect();
        let mut act = QAct::default();
        act.quantize(&x, cols);
        let run = |threads: usize| {
            let pool = Pool::new(threads);
            // Filled with NaN, so an element left unwritten shows.
            let mut outs: Vec<Vec<f32>> = mats.iter().map(|m| vec![f32::NAN; t * m.rows]).collect();
            let mut jobs: Vec<(&QMatrix, &mut [f32])> = mats
                .iter()
                .zip(outs.iter_mut())
                .map(|(m, o)| (m, &mut o[..]))
                .collect();
            kernels::matmul_with(kernels::detected_isa(), &pool, &mut jobs, &act);
            outs
        };
        let alone = run(1);
        assert!(alone.iter().flatten().all(|v| v.is_finite()), "{t} tokens");
        for threads in [2, 3, 5] {
            let got = run(threads);
            for (a, b) in alone.iter().zip(&got) {
                let (a, b): (Vec<u32>, Vec<u32>) = (
                    a.iter().map(|v| v.to_bits()).collect(),
                    b.iter().map(|v| v.to_bits()).collect(),
                );
                assert_eq!(a, b, "{t} tokens, {threads} threads");
            }
        }
    }
}

/// The 16-row kernels (two groups of eight rows per 512-bit register, AVX-512 VNNI; 4-bit
/// and 8-bit weights) give the bits of the 8-row kernels of the other instruction sets, whatever the token count
/// (tiles of 1 to 4 and remainders) and with an unpaired last group (5 groups).
#[test]
fn sixteen_row_kernels_give_the_eight_row_bits() {
    if !kernels::isa_available(Isa::Avx512Vnni) {
        eprintln!("skipped: this CPU has no AVX-512 VNNI");
        return;
    }
    let (rows, cols) = (40, 512);
    let xs: Vec<f32> = (0..cols * 9)
        .map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 6.0)
        .collect();
    let pool = Pool::new(2);
    for ty in [
        GgufType::Q4_0,
        GgufType::Q4_1,
        GgufType::Q4K,
        GgufType::Q8_0,
    ] {
        let w = QMatrix::from_gguf(
            ty,
            rows,
            cols,
            &blocks(ty, rows * cols / ty.block_elems(), 9),
        )
        .unwrap();
        for t in 1..=9 {
            let mut act = QAct::default();
            act.quantize(&xs[..t * cols], cols);
            let mut wide = vec![0f32; t * rows];
            kernels::matmul_with(Isa::Avx512Vnni, &pool, &mut [(&w, &mut wide[..])], &act);
            for isa in [Isa::Avx2, Isa::AvxVnni] {
                if !kernels::isa_available(isa) {
                    continue;
                }
                let mut narrow = vec![0f32; t * rows];
                kernels::matmul_with(isa, &pool, &mut [(&w, &mut narrow[..])], &act);
                for (i, (a, b)) in wide.iter().zip(&narrow).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{ty:?}, {t} tokens, element {i}: {a} against {isa:?}'s {b}"
                    );
                }
            }
        }
    }
}
