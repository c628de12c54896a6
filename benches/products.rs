//! Criterion benches of the quantized products that decode spends most of its time in, at one
//! token and at four (a four-sequence batch): SmolLM2's feed-forward shape in Q4_1 (1536 × 576)
//! and its Q8_0 output head (49152 × 576), with the weights in cache (one matrix, read again
//! and again) and streamed (enough matrices that each pass reads them from the last-level
//! cache or memory, as decode does). Like the model loader, the bench moves its matrices into
//! one [`WeightArena`], so they sit on 2 MiB pages as a model's do. Throughput is the weight bytes read per second; the ratio
//! of the four-token time to the one-token time is what bounds the four-sequence decode (see
//! the README's targets section).
//!
//! `cargo bench -p ferrograph-benches --bench products` (add `RUSTFLAGS="-C target-cpu=native"`
//! as the CLI's benchmarks do). `FERROGRAPH_THREADS` sets the pool's threads (default 1).

#![allow(clippy::expect_used, missing_docs)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferrograph_kernels::{
    detected_isa, matmul_with, pool::Pool, GgufType, QAct, QMatrix, WeightArena,
};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

/// SmolLM2-135M's hidden size, the products' input features.
const COLS: usize = 576;
/// Matrices in a streamed set: 60 feed-forward matrices are about 33 MB of weights.
const STREAMED_FFN: usize = 60;

/// A GGUF tensor of `ty` with deterministic pseudo-random quants and small, valid half-float
/// scales (and minimums for Q4_1), repacked as the model loader repacks it.
fn matrix(ty: GgufType, rows: usize, rng: &mut StdRng) -> QMatrix {
    let bytes = QMatrix::gguf_bytes(ty, rows, COLS).expect("shape");
    let block = ty.block_bytes();
    let mut data = vec![0u8; bytes];
    for b in data.chunks_exact_mut(block) {
        // Scale 2^-7 (half float 0x2000).
        b[0..2].copy_from_slice(&0x2000u16.to_le_bytes());
        let quants = if ty == GgufType::Q4_1 {
            // Minimum -2^-7 (0xa000).
            b[2..4].copy_from_slice(&0xa000u16.to_le_bytes());
            &mut b[4..]
        } else {
            &mut b[2..]
        };
        rng.fill_bytes(quants);
    }
    QMatrix::from_gguf(ty, rows, COLS, &data).expect("repack")
}

/// `tokens` rows of activations, quantized as the decoder quantizes them.
fn activations(tokens: usize) -> QAct {
    let x: Vec<f32> = (0..tokens * COLS)
        .map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0)
        .collect();
    let mut act = QAct::default();
    act.quantize(&x, COLS);
    act
}

fn products(c: &mut Criterion) {
    let threads = std::env::var("FERROGRAPH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let pool = Pool::new(threads);
    let isa = detected_isa();
    let mut rng = StdRng::seed_from_u64(0x9e37_79b9_7f4a_7c15);
    let mut sets: [(&str, Vec<QMatrix>); 3] = [
        (
            "q4_1-1536x576-cached",
            vec![matrix(GgufType::Q4_1, 1536, &mut rng)],
        ),
        (
            "q4_1-1536x576-streamed",
            (0..STREAMED_FFN)
                .map(|_| matrix(GgufType::Q4_1, 1536, &mut rng))
                .collect(),
        ),
        (
            "q8_0-49152x576-streamed",
            vec![matrix(GgufType::Q8_0, 49152, &mut rng)],
        ),
    ];
    // Into one arena, as the model loader moves a model's matrices: on 2 MiB pages, one after
    // another. Allocated one by one, matrices this size sit on 4 KiB pages, and the streamed
    // sets then measure TLB misses that decode does not have.
    let mut arena = WeightArena::new();
    for (_, mats) in sets.iter_mut() {
        for m in mats.iter_mut() {
            m.move_into(&mut arena);
        }
    }
    let mut group = c.benchmark_group(format!("products/{threads}-thread"));
    for (name, mats) in &sets {
        let bytes: usize = mats
            .iter()
            .map(|m| QMatrix::gguf_bytes(m.source, m.rows, m.cols).unwrap_or(0))
            .sum();
        group.throughput(Throughput::Bytes(bytes as u64));
        for tokens in [1usize, 4] {
            let act = activations(tokens);
            let mut outs: Vec<Vec<f32>> =
                mats.iter().map(|m| vec![0f32; tokens * m.rows]).collect();
            group.bench_with_input(BenchmarkId::new(*name, tokens), &tokens, |b, _| {
                b.iter(|| {
                    for (m, out) in mats.iter().zip(outs.iter_mut()) {
                        matmul_with(isa, &pool, &mut [(m, out.as_mut_slice())], &act);
                    }
                });
            });
        }
    }
    group.finish();
}

criterion_group!(benches, products);
criterion_main!(benches);
