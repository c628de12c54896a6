//! The decoder's causal attention over its KV cache, flash-style.
//!
//! **The cache** ([`KvCache`], one per layer) holds keys and values as IEEE half floats, as
//! llama.cpp does by default: half the memory of `f32` and half the bytes to read per decoded
//! token, which is what decode at depth is bound by. Keys are stored transposed by blocks of
//! [`KEY_BLOCK`] positions, so that one vector load gives one dimension of sixteen keys;
//! values one row per position.
//!
//! **The computation** never builds a score matrix. Query rows (a token and one of the query
//! heads sharing a key/value head) go in tiles of four; for each block of sixteen keys the
//! tile's scores are accumulated in registers along the head's dimensions, each row's running
//! maximum and normalizer are updated (online softmax), and the weighted values are added to
//! its output in registers. Keys are grouped in chunks of [`KEY_CHUNK`]: each chunk is
//! computed from scratch and the chunks are merged in order, so that decoding one token deep
//! in the cache can be split over threads by chunks.
//!
//! **The order is fixed.** Block and chunk boundaries are at fixed positions, each row's keys
//! are summed in position order, and a row's arithmetic never depends on the other rows of its
//! tile, its batch, the split over threads, or whether its token came in a prefill or a
//! decode step. So a sequence's output is bit for bit the same alone or batched, and a prompt
//! gives the same cache whether it was prefilled in one pass or several. The AVX-512 blocks,
//! the AVX2 ones and the scalar ones perform the same operations in the same order on every
//! score and output (tested bit for bit); the AVX-512 ones only hold more of them per
//! register (two key blocks' scores at once, a tile's softmax steps side by side).
//!
//! **Decode** (one row per sequence, a few hundred keys) is mostly fixed costs, so whole
//! units (every key of their rows) write their normalized rows straight to the output, and
//! each thread keeps its buffers from one pass to the next.

// Index loops address the tile's rows, lanes and dimensions in several arrays at once.
#![allow(clippy::needless_range_loop)]

use crate::ops::exp_approx;
use half::f16;
use parking_lot::Mutex;
use std::ops::Range;

/// Key positions per block of the transposed key cache (and per block of scores).
pub(crate) const KEY_BLOCK: usize = 16;
/// Key positions per chunk: the unit of the online softmax's merges, and of the split of one
/// row's keys over threads.
pub(crate) const KEY_CHUNK: usize = 256;
/// Query rows computed together.
const TILE: usize = 4;
/// How many key blocks ahead a unit of one tile (a decode step's rows) asks for the blocks it
/// will read. One key/value head's blocks are 4 KiB each at 64 dimensions (16 positions, keys
/// then values, half floats) and lie `kv_heads` blocks apart, a stream the CPU's own
/// prefetchers did not keep ahead of. Measured on SmolLM2 after a 2,000-token prompt, 1
/// thread, alternated in one process: four sequences (46 MiB of cache each) decode 129-135
/// tok/s with it against 123-126 without; one sequence, and short prompts, the same.
const PREFETCH_BLOCKS: usize = 4;
/// The most positions whose lines [`KvCache::prefetch_append`] asks for (a decode step's).
const APPEND_PREFETCH_MAX: usize = 4;
/// Tokens per unit of attention work during prefill.
const ATTN_ROWS: usize = 32;
/// Below this many multiply-adds in a pass (query head and key pairs times the head
/// dimension, for the scores), attention runs on the calling thread: a parallel dispatch
/// costs a few microseconds, about what one thread spends on this many.
const ATTN_PARALLEL_MIN: usize = 1 << 16;
/// The largest finite half float: larger keys and values are stored as it (not as infinity,
/// which would turn a zero probability times the value into NaN).
pub(crate) const F16_MAX: f32 = 65_504.0;

/// `x` as the bits of the nearest half float, saturated to the finite range.
fn to_f16(x: f32) -> u16 {
    f16::from_f32(x.clamp(-F16_MAX, F16_MAX)).to_bits()
}

/// [`to_f16`] of every element of `src` into `dst` (the same bits): eight at a time with F16C
/// where the CPU has it.
fn to_f16_slice(src: &[f32], dst: &mut [u16]) {
    let n = src.len().min(dst.len());
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if crate::detected_isa() != crate::Isa::Scalar {
        // SAFETY: every SIMD `Isa` has AVX2 and F16C.
        done = unsafe { crate::x86::attn_f16::to_f16(&src[..n], &mut dst[..n]) };
    }
    for (o, &x) in dst[done..n].iter_mut().zip(&src[done..n]) {
        *o = to_f16(x);
    }
}

/// Keys converted per [`to_f16_slice`] call when appending (a head of up to 256 dimensions
/// in one).
const F16_CHUNK: usize = 256;

/// The `f32` value of half-float bits (exact).
fn from_f16(b: u16) -> f32 {
    f16::from_bits(b).to_f32()
}

/// The key positions a row at position `pos` attends to: every one up to its own, or the
/// last `window` of them.
pub(crate) fn keys_seen(pos: usize, window: Option<usize>) -> Range<usize> {
    let end = pos + 1;
    window.map_or(0, |w| end.saturating_sub(w))..end
}

/// Positions a sliding-window cache keeps beyond what its next row can see, so that a
/// snapshot of it can still be rewound by this many tokens (the end of a chat turn rendered
/// again differently, say). Four blocks.
pub(crate) const SLIDING_SLACK: usize = 4 * KEY_BLOCK;

/// One layer's cached keys and values, as half floats.
///
/// Stored by blocks of [`KEY_BLOCK`] positions and key/value heads: block `b` of head `g`
/// starts at `((b - first) * kv_heads + g) * 2 * hd * KEY_BLOCK` and holds the keys transposed
/// (`hd` rows of [`KEY_BLOCK`] lanes, lane `i` being position `b * KEY_BLOCK + i`), then the
/// values ([`KEY_BLOCK`] rows of `hd`). What one head's attention reads for sixteen positions
/// is one contiguous 4 KiB (at 64 dimensions), read in order. The last block's lanes past
/// `len` hold zeros or stale entries and are never used.
///
/// A sliding-window layer's cache ([`KvCache::sliding`]) drops its oldest blocks once no
/// later row can see them (with [`SLIDING_SLACK`] positions to spare): `first` blocks are
/// gone from the front. Its memory then stays near the window, however long the sequence,
/// as llama.cpp's sliding-window cache does; what attention reads is unchanged, so the
/// output is bit for bit the same.
#[derive(Clone, Debug, Default)]
pub(crate) struct KvCache {
    data: Vec<u16>,
    /// Cached positions.
    len: usize,
    /// Blocks dropped from the front.
    first: usize,
    /// The layer's attention window, for a sliding-window layer.
    window: Option<usize>,
}

/// Most bytes of spare KV-cache memory one model keeps ([`SpareCaches`]): four sequences
/// of SmolLM2 at the 288 positions a short request reserves take about 25 MiB.
const SPARE_BYTES: usize = 64 << 20;

/// Positions a cache reserves beyond what it needs when it grows.
const HEADROOM: usize = 256;

/// The KV-cache memory of a model's finished sequences, handed to the next ones: memory the
/// system has already mapped, so a new sequence's steps do not fault on fresh pages where
/// its predecessor wrote. On a VM a fault cost about 12 µs: four new sequences of SmolLM2
/// took 10.7 a decode step, about 130 µs of a 4.5 ms step on 2 threads, and none with this
/// (a lone sequence took none either way: the allocator kept its memory). At most
/// [`SPARE_BYTES`] are kept, the oldest dropped first, and none once a cache needs what no
/// spare buffer fits (see [`SpareCaches::take`]), so that the process's peak memory stays
/// what it was without them.
#[derive(Debug, Default)]
pub(crate) struct SpareCaches {
    bufs: parking_lot::Mutex<std::collections::VecDeque<Vec<u16>>>,
}

impl SpareCaches {
    /// The smallest spare buffer holding `capacity` half floats, at most twice that, emptied.
    /// When none does, all are freed: the caller is about to allocate, and memory kept aside
    /// must not raise the process's peak.
    pub(crate) fn take(&self, capacity: usize) -> Option<Vec<u16>> {
        let mut bufs = self.bufs.lock();
        let at = bufs
            .iter()
            .enumerate()
            .filter(|(_, b)| (capacity..=2 * capacity.max(1)).contains(&b.capacity()))
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        let Some(at) = at else {
            let freed = std::mem::take(&mut *bufs);
            drop(bufs);
            drop(freed);
            return None;
        };
        let mut buf = bufs.remove(at)?;
        buf.clear();
        Some(buf)
    }

    /// Keeps `buf` for a later [`SpareCaches::take`], within [`SPARE_BYTES`].
    pub(crate) fn put(&self, buf: Vec<u16>) {
        if buf.capacity() == 0 || bytes(&buf) > SPARE_BYTES {
            return;
        }
        let mut bufs = self.bufs.lock();
        bufs.push_back(buf);
        let mut total: usize = bufs.iter().map(bytes).sum();
        while total > SPARE_BYTES {
            match bufs.pop_front() {
                Some(old) => total -= bytes(&old),
                None => break,
            }
        }
    }

    /// Bytes kept.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.bufs.lock().iter().map(bytes).sum()
    }
}

/// Bytes a buffer holds, capacity included.
fn bytes(buf: &Vec<u16>) -> usize {
    buf.capacity() * std::mem::size_of::<u16>()
}

impl KvCache {
    /// An empty cache for a layer that attends through a window of `window` positions.
    pub(crate) fn sliding(window: usize) -> KvCache {
        KvCache {
            window: Some(window.max(1)),
            ..KvCache::default()
        }
    }

    /// Cached positions.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.len
    }

    /// Bytes held (capacity included).
    pub(crate) fn bytes(&self) -> usize {
        self.data.capacity() * std::mem::size_of::<u16>()
    }

    /// Half floats held by the kept blocks of the first `len` positions.
    fn span(&self, len: usize, kv_dim: usize) -> usize {
        len.div_ceil(KEY_BLOCK).saturating_sub(self.first) * KEY_BLOCK * 2 * kv_dim
    }

    /// The first block that a row at position `pos` or later can see.
    fn first_seen(&self, pos: usize) -> usize {
        keys_seen(pos, self.window).start / KEY_BLOCK
    }

    /// Whether the sequence can go on from `len` cached positions: every key the rows from
    /// there on see is still held (always, but for a sliding-window cache that dropped blocks
    /// from the front more than [`SLIDING_SLACK`] positions ago).
    pub(crate) fn rewinds_to(&self, len: usize) -> bool {
        len == 0 || len >= self.len || self.first_seen(len) >= self.first
    }

    /// Keeps the first `len` positions (keeping the memory). The caller checks
    /// [`KvCache::rewinds_to`] first; `len` 0 always empties it.
    pub(crate) fn truncate(&mut self, len: usize, kv_dim: usize) {
        if len == 0 {
            self.data.clear();
            self.first = 0;
            self.len = 0;
            return;
        }
        let len = len.min(self.len);
        self.data.truncate(self.span(len, kv_dim));
        self.len = len;
    }

    /// A copy of the first `len` positions, in memory from `spare` (else new) with room for
    /// [`HEADROOM`] more. The caller checks [`KvCache::rewinds_to`] first.
    pub(crate) fn prefix(&self, len: usize, kv_dim: usize, spare: &SpareCaches) -> KvCache {
        let len = len.min(self.len);
        if len == 0 {
            return KvCache {
                window: self.window,
                ..KvCache::default()
            };
        }
        let capacity = self.span(len + HEADROOM, kv_dim);
        let mut data = spare
            .take(capacity)
            .unwrap_or_else(|| Vec::with_capacity(capacity));
        data.extend_from_slice(&self.data[..self.span(len, kv_dim)]);
        KvCache {
            data,
            len,
            first: self.first,
            window: self.window,
        }
    }

    /// Gives the cache's memory to `spare`, leaving it empty.
    pub(crate) fn recycle(&mut self, spare: &SpareCaches) {
        self.first = 0;
        self.len = 0;
        spare.put(std::mem::take(&mut self.data));
    }

    /// Appends the keys and values of new positions (`kv_heads * hd` each, row by row). A
    /// sliding-window cache first drops the blocks that no row from here on can see.
    ///
    /// A cache that outgrows its memory reserves [`HEADROOM`] positions more: it moves to a
    /// buffer from `spare` that holds them (giving its old one back), else grows in place.
    pub(crate) fn append(
        &mut self,
        keys: &[f32],
        values: &[f32],
        kv_heads: usize,
        hd: usize,
        spare: &SpareCaches,
    ) {
        let kv = kv_heads * hd;
        let block = 2 * hd * KEY_BLOCK;
        if self.window.is_some() {
            let keep = self.first_seen(self.len.saturating_sub(SLIDING_SLACK));
            if keep > self.first {
                let drop = ((keep - self.first) * kv_heads * block).min(self.data.len());
                self.data.drain(..drop);
                self.first = keep;
            }
        }
        let total = self.len + keys.len() / kv;
        let want = self.span(total, kv);
        if self.data.capacity() < want {
            // Exact growth with headroom: doubling would keep up to half the cache unused at
            // long contexts. Into a spare buffer that fits, else in place (the allocator
            // moves a large buffer's pages without copying them).
            let capacity = self.span(total + HEADROOM, kv);
            if let Some(mut data) = spare.take(capacity) {
                data.extend_from_slice(&self.data);
                spare.put(std::mem::replace(&mut self.data, data));
            } else {
                self.data.reserve_exact(capacity - self.data.len());
            }
        }
        if self.data.len() < want {
            self.data.resize(want, 0);
        }
        for (i, (kr, vr)) in keys
            .chunks_exact(kv)
            .zip(values.chunks_exact(kv))
            .enumerate()
        {
            let j = self.len + i;
            let (b, lane) = (j / KEY_BLOCK - self.first, j % KEY_BLOCK);
            for (g, (kh, vh)) in kr.chunks_exact(hd).zip(vr.chunks_exact(hd)).enumerate() {
                let base = (b * kv_heads + g) * block;
                let (kt, vb) = self.data[base..base + block].split_at_mut(hd * KEY_BLOCK);
                // Keys: dimension `d` of this position is lane `lane` of row `d`.
                let mut converted = [0u16; F16_CHUNK];
                for (k0, kc) in kh.chunks(F16_CHUNK).enumerate() {
                    to_f16_slice(kc, &mut converted);
                    for (o, &h) in kt[(k0 * F16_CHUNK) * KEY_BLOCK + lane..]
                        .iter_mut()
                        .step_by(KEY_BLOCK)
                        .zip(&converted[..kc.len()])
                    {
                        *o = h;
                    }
                }
                let vrow = &mut vb[lane * hd..(lane + 1) * hd];
                for (vc, oc) in vh.chunks(F16_CHUNK).zip(vrow.chunks_mut(F16_CHUNK)) {
                    to_f16_slice(vc, oc);
                }
            }
        }
        self.len = total;
    }

    /// Asks for the cache lines that appending positions `pos..pos + n` will write, where
    /// they are already held (a decode step's few positions only; a hint, nothing else). An
    /// appended key goes one half float into every row of its block's transposed keys, so a
    /// position touches a line per two dimensions of each head, and those strided stores were
    /// most of the append's time. The decoder asks for the next layer's lines while it
    /// appends to this one's: SmolLM2, four sequences on 2 threads, the rotations and appends
    /// took 332-351 µs a step with it against 385-424 without (one sequence: within noise).
    pub(crate) fn prefetch_append(&self, pos: usize, n: usize, kv_heads: usize, hd: usize) {
        if n == 0 || n > APPEND_PREFETCH_MAX {
            return;
        }
        for j in pos..pos + n {
            let (b, lane) = (j / KEY_BLOCK, j % KEY_BLOCK);
            for g in 0..kv_heads {
                let Some(block) = self.held_block(b, g, kv_heads, hd) else {
                    continue;
                };
                let (keys, values) = block.split_at(hd * KEY_BLOCK);
                // Two rows of sixteen lanes per 64-byte line.
                crate::prefetch_lines(keys.as_ptr().cast(), 0, keys.len() / 32);
                let row = &values[lane * hd..(lane + 1) * hd];
                crate::prefetch_lines(row.as_ptr().cast(), 0, (2 * hd).div_ceil(64));
            }
        }
    }

    /// Asks for the cache lines of block `b` of key/value head `g` (a hint: nothing when the
    /// block is not held).
    fn prefetch_block(&self, b: usize, g: usize, kv_heads: usize, hd: usize) {
        if let Some(block) = self.held_block(b, g, kv_heads, hd) {
            crate::prefetch_lines(block.as_ptr().cast(), 0, std::mem::size_of_val(block) / 64);
        }
    }

    /// Block `b` of key/value head `g` (keys then values) if it is held: not dropped from
    /// the front, not past the end.
    fn held_block(&self, b: usize, g: usize, kv_heads: usize, hd: usize) -> Option<&[u16]> {
        if b < self.first {
            return None;
        }
        self.data.get(self.block_span(b, g, kv_heads, hd))
    }

    /// Block `b` of key/value head `g`: its transposed keys and its values.
    /// Block `b` must still be held (`b >= first`): attention reads only blocks its rows see.
    fn block(&self, b: usize, g: usize, kv_heads: usize, hd: usize) -> (&[u16], &[u16]) {
        self.data[self.block_span(b, g, kv_heads, hd)].split_at(hd * KEY_BLOCK)
    }

    /// Where block `b` (`b >= first`) of key/value head `g` lies in `data`.
    fn block_span(&self, b: usize, g: usize, kv_heads: usize, hd: usize) -> Range<usize> {
        let len = 2 * hd * KEY_BLOCK;
        let at = ((b - self.first) * kv_heads + g) * len;
        at..at + len
    }
}

/// The attention heads' shape.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttnShape {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (each shared by `heads / kv_heads` query heads).
    pub kv_heads: usize,
    /// Dimensions per head.
    pub hd: usize,
    /// The scores' scale.
    pub scale: f32,
}

impl AttnShape {
    fn group(&self) -> usize {
        self.heads / self.kv_heads
    }
}

/// One sequence's view for [`attention`]: its cache (new positions already appended) and
/// where its new rows lie in the batch.
pub(crate) struct AttnSeq<'a> {
    /// The layer's cache.
    pub cache: &'a KvCache,
    /// Position of its first new row.
    pub pos: usize,
    /// Its rows in the stacked queries and outputs.
    pub rows: Range<usize>,
}

/// A unit of work: key/value head `g` of sequence `seq`, its tokens `r0..r0 + tokens`, over
/// the key chunks `chunks`. The first unit of a (sequence, head, tokens) triple folds its
/// chunks into one state per query row; later units (a row's keys split over threads) keep
/// one state per chunk, folded in order afterwards.
struct Unit {
    seq: usize,
    g: usize,
    r0: usize,
    tokens: usize,
    chunks: Range<usize>,
    first: bool,
}

impl Unit {
    /// Query row `fr` of this unit (token by token, the query heads of `g` within each): its
    /// token among the sequence's new rows, and where its head starts in the stacked queries
    /// and outputs.
    fn row_at(&self, fr: usize, s: &AttnSeq<'_>, shape: &AttnShape) -> (usize, usize) {
        let group = shape.group();
        let t = self.r0 + fr / group;
        let h = self.g * group + fr % group;
        (
            t,
            (s.rows.start + t) * shape.heads * shape.hd + h * shape.hd,
        )
    }

    /// States kept per query row.
    fn states(&self) -> usize {
        if self.first {
            1
        } else {
            self.chunks.len()
        }
    }
}

/// Floats per saved state: the maximum, the normalizer, the `hd` outputs.
fn state_len(hd: usize) -> usize {
    hd + 2
}

/// Causal attention of every sequence's new rows over its own cache; with a `window`, a row
/// at position `p` sees only positions `p - window + 1 ..= p`.
pub(crate) fn attention(
    shape: &AttnShape,
    q: &[f32],
    seqs: &[AttnSeq<'_>],
    window: Option<usize>,
    out: &mut [f32],
) {
    let pool = crate::pool::global();
    attention_with(Blocks::best(), pool.threads(), shape, q, seqs, window, out);
}

/// [`attention`] of one sequence on the calling thread alone: for a caller that has already
/// split the sequences over the pool's threads. The same bits as [`attention`] (the result
/// does not depend on how the work is split).
pub(crate) fn attention_here(
    shape: &AttnShape,
    q: &[f32],
    seq: &AttnSeq<'_>,
    window: Option<usize>,
    out: &mut [f32],
) {
    attention_with(
        Blocks::best(),
        1,
        shape,
        q,
        std::slice::from_ref(seq),
        window,
        out,
    );
}

/// Which code computes the blocks: each performs the same operations in the same order on
/// every score and output, so all give the same bits (tested).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Blocks {
    /// Portable code.
    Scalar,
    /// AVX2, FMA and F16C ([`crate::x86::attn_f16`]); every SIMD instruction set of
    /// [`crate::Isa`] has them.
    Avx2,
    /// AVX-512 where [`crate::Isa::Avx512Vnni`] runs ([`crate::x86::attn_f16_512`]): two key
    /// blocks' scores at once, a tile's softmax steps and value sums in registers.
    Avx512,
}

impl Blocks {
    /// The fastest this CPU (or `FERROGRAPH_ISA`) allows.
    fn best() -> Blocks {
        #[cfg(target_arch = "x86_64")]
        {
            match crate::detected_isa() {
                crate::Isa::Scalar => Blocks::Scalar,
                crate::Isa::Avx512Vnni => Blocks::Avx512,
                _ => Blocks::Avx2,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            Blocks::Scalar
        }
    }
}

/// [`attention`] with the SIMD blocks or the scalar ones, its work split as for `threads`
/// threads (the result does not depend on either); it runs on the pool's threads.
fn attention_with(
    isa: Blocks,
    threads: usize,
    shape: &AttnShape,
    q: &[f32],
    seqs: &[AttnSeq<'_>],
    window: Option<usize>,
    out: &mut [f32],
) {
    let (hd, group) = (shape.hd, shape.group());
    // Base units: (sequence, key/value head, block of tokens), with the chunks their rows see.
    let mut base: Vec<Unit> = Vec::new();
    let mut pairs = 0usize;
    for (si, s) in seqs.iter().enumerate() {
        let t_n = s.rows.len();
        pairs += shape.heads * t_n * (s.pos + t_n);
        for r0 in (0..t_n).step_by(ATTN_ROWS) {
            let tokens = ATTN_ROWS.min(t_n - r0);
            let lo = keys_seen(s.pos + r0, window).start;
            let hi = s.pos + r0 + tokens;
            for g in 0..shape.kv_heads {
                base.push(Unit {
                    seq: si,
                    g,
                    r0,
                    tokens,
                    chunks: lo / KEY_CHUNK..hi.div_ceil(KEY_CHUNK),
                    first: true,
                });
            }
        }
    }
    let parallel = pairs * hd >= ATTN_PARALLEL_MIN && threads > 1;
    // Too few units to keep every thread busy (decoding one or two sequences): split each
    // one's chunks into contiguous pieces, a few per thread.
    let pieces = if parallel && base.len() < 4 * threads {
        (4 * threads).div_ceil(base.len().max(1))
    } else {
        1
    };
    let mut units: Vec<Unit> = Vec::with_capacity(base.len() * pieces);
    for u in &base {
        let per = u.chunks.len().div_ceil(pieces).max(1);
        let mut c = u.chunks.start;
        loop {
            let end = (c + per).min(u.chunks.end);
            units.push(Unit {
                chunks: c..end,
                first: c == u.chunks.start,
                ..*u
            });
            c = end;
            if c >= u.chunks.end {
                break;
            }
        }
    }
    // Units that are whole (no row's keys split over units) write their rows' outputs
    // straight to `out`; split ones keep their states for the fold below.
    let whole = pieces == 1;
    let results: Vec<Mutex<Vec<f32>>> = if whole {
        Vec::new()
    } else {
        units
            .iter()
            .map(|u| Mutex::new(vec![0f32; u.tokens * group * u.states() * state_len(hd)]))
            .collect()
    };
    let out_rows = OutRows {
        ptr: out.as_mut_ptr(),
        len: out.len(),
    };
    let run_unit = |ui: usize, scratch: &mut Scratch| {
        let u = &units[ui];
        let to = if whole {
            Dest::Out(&out_rows)
        } else {
            Dest::States(&mut results[ui].lock())
        };
        unit_states(isa, shape, q, &seqs[u.seq], u, window, scratch, to);
    };
    let pool = crate::pool::global();
    if parallel && units.len() > 1 && pool.threads() > 1 {
        // Each thread first takes the units of the sequences the decoder gave it for their
        // rotations and cache appends (`Pool::split` over the sequences), whose rows and keys
        // are in its caches, then helps with the others' (units vary with their keys).
        let claims = crate::PieceClaims::from_shares(pool.split(seqs.len()).map(|r| {
            let at = |si: usize| units.partition_point(|u| u.seq < si);
            at(r.start)..at(r.end)
        }));
        pool.run(&|tid| {
            Scratch::with(hd, |scratch| {
                for ui in claims.claimer(tid) {
                    run_unit(ui, scratch);
                }
            });
        });
    } else {
        Scratch::with(hd, |scratch| {
            for ui in 0..units.len() {
                run_unit(ui, scratch);
            }
        });
    }
    if whole {
        return;
    }
    // Fold each row's states in chunk order and normalize. A base unit's pieces are
    // consecutive, its first piece first.
    let results: Vec<Vec<f32>> = results.into_iter().map(Mutex::into_inner).collect();
    let sl = state_len(hd);
    let mut acc = vec![0f32; hd];
    let mut ui = 0;
    while ui < units.len() {
        let end = units[ui + 1..]
            .iter()
            .position(|u| u.first)
            .map_or(units.len(), |p| ui + 1 + p);
        let u = &units[ui];
        let s = &seqs[u.seq];
        for fr in 0..u.tokens * group {
            let first = &results[ui][fr * sl..(fr + 1) * sl];
            let (mut m, mut l) = (first[0], first[1]);
            acc.copy_from_slice(&first[2..]);
            for later in ui + 1..end {
                let k = units[later].states();
                for saved in results[later][fr * k * sl..(fr + 1) * k * sl].chunks_exact(sl) {
                    merge_state(
                        (&mut m, &mut l, &mut acc),
                        (saved[0], saved[1], &saved[2..]),
                    );
                }
            }
            let (_, at) = u.row_at(fr, s, shape);
            normalize(&acc, l, &mut out[at..at + hd]);
        }
        ui = end;
    }
}

/// A row's output: its weighted values over its normalizer.
fn normalize(acc: &[f32], l: f32, out: &mut [f32]) {
    let inv = 1.0 / l;
    for (o, a) in out.iter_mut().zip(acc) {
        *o = a * inv;
    }
}

/// Merges one row's state `b` (largest score, normalizer, weighted outputs) into `a`: both
/// rescaled to the larger maximum. A state that has seen no keys changes nothing; merged
/// into one that has seen none, it is copied.
fn merge_state(a: (&mut f32, &mut f32, &mut [f32]), b: (f32, f32, &[f32])) {
    let ((ma, la, acc), (mb, lb, other)) = (a, b);
    if mb == f32::NEG_INFINITY {
        return;
    }
    if *ma == f32::NEG_INFINITY {
        (*ma, *la) = (mb, lb);
        acc.copy_from_slice(other);
        return;
    }
    let m = ma.max(mb);
    let (fa, fb) = (exp_approx(*ma - m), exp_approx(mb - m));
    *ma = m;
    *la = *la * fa + lb * fb;
    for (x, y) in acc.iter_mut().zip(other) {
        *x = *x * fa + *y * fb;
    }
}

/// Per-thread buffers: one tile's queries and two states.
struct Scratch {
    q: Vec<f32>,
    chunk: TileState,
    fold: TileState,
}

impl Scratch {
    fn new(hd: usize) -> Scratch {
        Scratch {
            q: vec![0f32; TILE * hd],
            chunk: TileState::new(hd),
            fold: TileState::new(hd),
        }
    }

    /// Runs `f` with this thread's buffers for heads of `hd` dimensions (kept from one
    /// attention pass to the next: a decode step runs one per layer).
    fn with<R>(hd: usize, f: impl FnOnce(&mut Scratch) -> R) -> R {
        thread_local! {
            static SCRATCH: std::cell::RefCell<Option<Scratch>> = const { std::cell::RefCell::new(None) };
        }
        SCRATCH.with_borrow_mut(|s| {
            let s = match s {
                Some(s) if s.q.len() == TILE * hd => s,
                _ => s.insert(Scratch::new(hd)),
            };
            f(s)
        })
    }
}

/// The whole output, written through a pointer by the threads of a pass: each unit writes
/// only its own rows' heads.
struct OutRows {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: the pointer is only written through at disjoint places (see `Dest::Out`), while the
// slice it comes from is borrowed by `attention_with` and not otherwise accessed.
unsafe impl Sync for OutRows {}

/// Where a unit's rows go.
enum Dest<'a> {
    /// Normalized, into the output (a whole unit: every key of its rows).
    Out(&'a OutRows),
    /// As saved states, row by row, to be folded with other units'.
    States(&'a mut [f32]),
}

/// The online softmax's state of a tile's rows: per row the largest score so far, the sum of
/// the exponentials relative to it, and the outputs weighted by them.
struct TileState {
    m: [f32; TILE],
    l: [f32; TILE],
    acc: Vec<f32>,
}

impl TileState {
    fn new(hd: usize) -> TileState {
        TileState {
            m: [f32::NEG_INFINITY; TILE],
            l: [0.0; TILE],
            acc: vec![0f32; TILE * hd],
        }
    }

    /// Back to no keys seen.
    fn clear(&mut self) {
        self.m = [f32::NEG_INFINITY; TILE];
        self.l = [0.0; TILE];
        self.acc.fill(0.0);
    }

    /// Row `r` as a saved state into `dst` (maximum, normalizer, outputs).
    fn save(&self, r: usize, hd: usize, dst: &mut [f32]) {
        dst[0] = self.m[r];
        dst[1] = self.l[r];
        dst[2..].copy_from_slice(&self.acc[r * hd..(r + 1) * hd]);
    }

    /// Merges row `r` of `other` into row `r` of this state ([`merge_state`]).
    fn merge(&mut self, other: &TileState, r: usize, hd: usize) {
        merge_state(
            (
                &mut self.m[r],
                &mut self.l[r],
                &mut self.acc[r * hd..(r + 1) * hd],
            ),
            (other.m[r], other.l[r], &other.acc[r * hd..(r + 1) * hd]),
        );
    }
}

/// Computes one unit: for each tile of its query rows, the states over its chunks (folded
/// into one for a first unit, one per chunk otherwise), into `dst` (row by row).
#[allow(clippy::too_many_arguments)]
fn unit_states(
    isa: Blocks,
    shape: &AttnShape,
    q: &[f32],
    s: &AttnSeq<'_>,
    u: &Unit,
    window: Option<usize>,
    scratch: &mut Scratch,
    mut to: Dest<'_>,
) {
    let (hd, group) = (shape.hd, shape.group());
    let sl = state_len(hd);
    let rows = u.tokens * group;
    let k = u.states();
    for f0 in (0..rows).step_by(TILE) {
        // The tile's rows: their queries, and the keys each sees (`first..n`).
        let mut span: [Range<usize>; TILE] = std::array::from_fn(|_| 0..0);
        scratch.q.fill(0.0);
        for r in 0..TILE.min(rows - f0) {
            let (t, at) = u.row_at(f0 + r, s, shape);
            // Scaled here rather than per score.
            for (a, b) in scratch.q[r * hd..(r + 1) * hd]
                .iter_mut()
                .zip(&q[at..at + hd])
            {
                *a = b * shape.scale;
            }
            span[r] = keys_seen(s.pos + t, window);
        }
        let live = TILE.min(rows - f0);
        let lo = span[..live].iter().map(|x| x.start).min().unwrap_or(0);
        let hi = span[..live].iter().map(|x| x.end).max().unwrap_or(0);
        scratch.fold.clear();
        // One tile (a decode step's rows) reads each block once: its first blocks are asked
        // for here, and `chunk_state` asks for each later one `PREFETCH_BLOCKS` early (past
        // its chunk's end, so into the next chunk's).
        let ahead = rows <= TILE;
        if ahead {
            let first = (u.chunks.start * KEY_CHUNK).max(lo) / KEY_BLOCK;
            for b in first..first + PREFETCH_BLOCKS {
                s.cache.prefetch_block(b, u.g, shape.kv_heads, hd);
            }
        }
        for (ci, c) in u.chunks.clone().enumerate() {
            let keys = (c * KEY_CHUNK).max(lo)..((c + 1) * KEY_CHUNK).min(hi);
            scratch.chunk.clear();
            if !keys.is_empty() {
                chunk_state(
                    isa,
                    shape,
                    s.cache,
                    u.g,
                    &scratch.q,
                    &span,
                    keys,
                    ahead,
                    &mut scratch.chunk,
                );
            }
            if u.first {
                for r in 0..live {
                    scratch.fold.merge(&scratch.chunk, r, hd);
                }
            } else if let Dest::States(dst) = &mut to {
                for r in 0..live {
                    let at = ((f0 + r) * k + ci) * sl;
                    scratch.chunk.save(r, hd, &mut dst[at..at + sl]);
                }
            }
        }
        if u.first {
            for r in 0..live {
                match &mut to {
                    Dest::States(dst) => {
                        let at = (f0 + r) * sl;
                        scratch.fold.save(r, hd, &mut dst[at..at + sl]);
                    }
                    Dest::Out(out) => {
                        let (_, at) = u.row_at(f0 + r, s, shape);
                        assert!(at + hd <= out.len);
                        // SAFETY: in bounds (asserted); this unit alone writes the heads of
                        // its key/value head `u.g` in its rows, and nothing else reads or
                        // writes the output during the pass.
                        let row = unsafe { std::slice::from_raw_parts_mut(out.ptr.add(at), hd) };
                        let acc = &scratch.fold.acc[r * hd..(r + 1) * hd];
                        normalize(acc, scratch.fold.l[r], row);
                    }
                }
            }
        }
    }
}

/// The state of a tile's rows over `keys` (within one chunk), from no keys seen: block by
/// block, the scores, each row's online-softmax update, the weighted values. Row `r` uses
/// only the keys of `span[r]`.
#[allow(clippy::too_many_arguments)]
fn chunk_state(
    isa: Blocks,
    shape: &AttnShape,
    cache: &KvCache,
    g: usize,
    qs: &[f32],
    span: &[Range<usize>; TILE],
    keys: Range<usize>,
    ahead: bool,
    st: &mut TileState,
) {
    let (hd, kv_heads) = (shape.hd, shape.kv_heads);
    let blocks = keys.start / KEY_BLOCK..keys.end.div_ceil(KEY_BLOCK);
    // Each block's softmax steps and values, in block order.
    let mut finish = |b: usize, mut p: [[f32; KEY_BLOCK]; TILE]| {
        let j0 = b * KEY_BLOCK;
        let valid: [Range<usize>; TILE] = std::array::from_fn(|r| {
            span[r].start.max(j0).saturating_sub(j0)
                ..span[r].end.min(j0 + KEY_BLOCK).saturating_sub(j0)
        });
        let lanes = keys.start.max(j0) - j0..keys.end.min(j0 + KEY_BLOCK) - j0;
        let (_, vb) = cache.block(b, g, kv_heads, hd);
        #[cfg(target_arch = "x86_64")]
        if isa == Blocks::Avx512 && hd.is_multiple_of(32) {
            use crate::x86::attn_f16_512::softmax_values;
            let (p, m, l, acc) = (&mut p, &mut st.m, &mut st.l, &mut st.acc[..]);
            // SAFETY: `Avx512` is chosen only where `Isa::Avx512Vnni` runs, which has
            // AVX-512 F, VL and BW, FMA and F16C.
            unsafe {
                if hd.is_multiple_of(64) {
                    softmax_values::<4>(p, &valid, m, l, lanes, vb, hd, hd, acc);
                } else {
                    softmax_values::<2>(p, &valid, m, l, lanes, vb, hd, hd, acc);
                }
            }
            return;
        }
        for (r, valid) in valid.into_iter().enumerate() {
            softmax_step(
                &mut p[r],
                valid,
                &mut st.m[r],
                &mut st.l[r],
                &mut st.acc[r * hd..(r + 1) * hd],
            );
        }
        add_values_block(isa, &p, lanes, vb, hd, hd, &mut st.acc);
    };
    let mut b = blocks.start;
    while b < blocks.end {
        // With `ahead`, the blocks `PREFETCH_BLOCKS` on from the ones read now.
        if ahead {
            for a in b + PREFETCH_BLOCKS..b + PREFETCH_BLOCKS + 2 {
                cache.prefetch_block(a, g, kv_heads, hd);
            }
        }
        // Scores do not depend on the softmax's state: two blocks' at once where the
        // registers allow.
        if let Some([pa, pb]) = (b + 1 < blocks.end)
            .then(|| {
                scores_pair(
                    isa,
                    qs,
                    cache.block(b, g, kv_heads, hd).0,
                    cache.block(b + 1, g, kv_heads, hd).0,
                    hd,
                )
            })
            .flatten()
        {
            finish(b, pa);
            finish(b + 1, pb);
            b += 2;
        } else {
            finish(
                b,
                scores_block(isa, qs, cache.block(b, g, kv_heads, hd).0, hd),
            );
            b += 1;
        }
    }
}

/// One row's online-softmax update over one block: `s` holds the block's scores and becomes
/// the probabilities to weight the values with (zero outside `valid`). The largest score, the
/// normalizer and the outputs are rescaled when the maximum grows; a block with no valid key
/// changes nothing. The block's maximum and sum are taken as a fixed tree over the sixteen
/// lanes (vectorizable, the same order on every CPU).
fn softmax_step(
    s: &mut [f32; KEY_BLOCK],
    valid: Range<usize>,
    m: &mut f32,
    l: &mut f32,
    acc: &mut [f32],
) {
    if valid.is_empty() {
        s.fill(0.0);
        return;
    }
    let mut x = [f32::NEG_INFINITY; KEY_BLOCK];
    x[valid.clone()].copy_from_slice(&s[valid.clone()]);
    let m_new = m.max(lane_tree(x, f32::max));
    let f = if *m == f32::NEG_INFINITY {
        0.0
    } else {
        exp_approx(*m - m_new)
    };
    for (i, (p, v)) in s.iter_mut().zip(x).enumerate() {
        let e = exp_approx(v - m_new);
        *p = if valid.contains(&i) { e } else { 0.0 };
    }
    *l = *l * f + lane_tree(*s, |a, b| a + b);
    if f != 1.0 {
        acc.iter_mut().for_each(|a| *a *= f);
    }
    *m = m_new;
}

/// `op` over sixteen lanes as a fixed tree: lane `i` with lane `i + 8`, then `i + 4`, `i + 2`,
/// `i + 1`.
#[inline(always)]
fn lane_tree(x: [f32; KEY_BLOCK], op: impl Fn(f32, f32) -> f32) -> f32 {
    let mut h = [0f32; 8];
    for i in 0..8 {
        h[i] = op(x[i], x[i + 8]);
    }
    let mut w = 4;
    while w > 0 {
        for i in 0..w {
            h[i] = op(h[i], h[i + w]);
        }
        w /= 2;
    }
    h[0]
}

/// Two blocks' [`scores_block`] at once, where the blocks have such code (else `None`).
fn scores_pair(
    isa: Blocks,
    qs: &[f32],
    kt_a: &[u16],
    kt_b: &[u16],
    hd: usize,
) -> Option<[[[f32; KEY_BLOCK]; TILE]; 2]> {
    #[cfg(target_arch = "x86_64")]
    if isa == Blocks::Avx512 {
        // SAFETY: `Avx512` is chosen only where `Isa::Avx512Vnni` runs, which has AVX-512 F,
        // VL and BW, FMA and F16C.
        return Some(unsafe { crate::x86::attn_f16_512::scores_pair(qs, kt_a, kt_b, hd) });
    }
    let _ = (isa, qs, kt_a, kt_b, hd);
    None
}

/// [`crate::x86::attn_f16::scores`] on any CPU: the same fused multiply-adds in the same
/// order.
fn scores_block(isa: Blocks, qs: &[f32], kt: &[u16], hd: usize) -> [[f32; KEY_BLOCK]; TILE] {
    #[cfg(target_arch = "x86_64")]
    if isa != Blocks::Scalar {
        // SAFETY: the SIMD blocks are chosen only where `Isa::Avx2` or better runs, which
        // has AVX2, FMA and F16C.
        return unsafe { crate::x86::attn_f16::scores(qs, kt, hd) };
    }
    let _ = isa;
    let mut acc = [[0f32; KEY_BLOCK]; TILE];
    for d in 0..hd {
        for l in 0..KEY_BLOCK {
            let k = from_f16(kt[d * KEY_BLOCK + l]);
            for r in 0..TILE {
                acc[r][l] = qs[r * hd + d].mul_add(k, acc[r][l]);
            }
        }
    }
    acc
}

/// [`crate::x86::attn_f16::add_weighted_values`] on any CPU: the same fused multiply-adds in
/// the same order.
fn add_values_block(
    isa: Blocks,
    probs: &[[f32; KEY_BLOCK]; TILE],
    lanes: Range<usize>,
    v: &[u16],
    stride: usize,
    hd: usize,
    acc: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::x86::attn_f16;
        // (`Avx512` adds the values of heads of 32 or more dimensions in `softmax_values`.)
        if isa != Blocks::Scalar && hd.is_multiple_of(16) {
            // SAFETY: the SIMD blocks are chosen only where `Isa::Avx2` or better runs,
            // which has AVX2, FMA and F16C.
            unsafe { attn_f16::add_weighted_values(probs, lanes, v, stride, hd, acc) };
            return;
        }
    }
    let _ = isa;
    for l in lanes {
        let vr = &v[l * stride..l * stride + hd];
        for r in 0..TILE {
            let p = probs[r][l];
            for (a, &x) in acc[r * hd..(r + 1) * hd].iter_mut().zip(vr) {
                *a = p.mul_add(from_f16(x), *a);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl KvCache {
        /// [`KvCache::append`] with no spare memory: the cache grows on its own.
        fn append_alone(&mut self, keys: &[f32], values: &[f32], kv_heads: usize, hd: usize) {
            self.append(keys, values, kv_heads, hd, &SpareCaches::default());
        }
    }

    /// Deterministic values in [-1, 1).
    fn noise(seed: u64, n: usize) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// Plain softmax attention in f64 over the cache's half floats: the exact result the
    /// blocks approximate.
    fn exact(
        shape: &AttnShape,
        q: &[f32],
        seqs: &[AttnSeq<'_>],
        keys: &[Vec<f32>],
        values: &[Vec<f32>],
        window: Option<usize>,
    ) -> Vec<f64> {
        let (hd, group) = (shape.hd, shape.group());
        let (qd, kv) = (shape.heads * hd, shape.kv_heads * hd);
        let rows: usize = seqs.iter().map(|s| s.rows.len()).sum();
        let mut out = vec![0f64; rows * qd];
        let r16 = |x: f32| from_f16(to_f16(x)) as f64;
        for (si, s) in seqs.iter().enumerate() {
            for t in 0..s.rows.len() {
                let n = s.pos + t + 1;
                let first = window.map_or(0, |w| n.saturating_sub(w));
                let row = s.rows.start + t;
                for h in 0..shape.heads {
                    let g = h / group;
                    let qv = &q[row * qd + h * hd..row * qd + (h + 1) * hd];
                    let sc: Vec<f64> = (first..n)
                        .map(|j| {
                            let kr = &keys[si][j * kv + g * hd..j * kv + (g + 1) * hd];
                            qv.iter()
                                .zip(kr)
                                .map(|(a, b)| *a as f64 * r16(*b))
                                .sum::<f64>()
                                * shape.scale as f64
                        })
                        .collect();
                    let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = sc.iter().map(|x| (x - mx).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for (i, j) in (first..n).enumerate() {
                        let vr = &values[si][j * kv + g * hd..j * kv + (g + 1) * hd];
                        for d in 0..hd {
                            out[row * qd + h * hd + d] += e[i] / z * r16(vr[d]);
                        }
                    }
                }
            }
        }
        out
    }

    #[test]
    fn slice_conversion_gives_the_bits_of_one_at_a_time() {
        let mut x: Vec<f32> = noise(5, 3000).iter().map(|v| v * 70_000.0).collect();
        x.extend(noise(6, 500).iter().map(|v| v * 1e-5));
        x.extend([
            0.0,
            -0.0,
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            F16_MAX,
            65_519.0,
            65_520.0,
            1.0 + 1.0 / 2048.0,
            1.0 + 3.0 / 2048.0,
            5.96e-8,
            2.98e-8,
            f32::MIN_POSITIVE,
        ]);
        for chunk in x.chunks(F16_CHUNK) {
            let mut got = vec![0u16; chunk.len()];
            to_f16_slice(chunk, &mut got);
            let want: Vec<u16> = chunk.iter().map(|&v| to_f16(v)).collect();
            assert_eq!(got, want);
        }
    }

    #[test]
    fn cache_stores_half_floats_transposed_and_truncates() {
        let (kv_heads, hd) = (2, 4);
        let kv = kv_heads * hd;
        let mut c = KvCache::default();
        let keys: Vec<f32> = (0..20 * kv).map(|i| i as f32).collect();
        let values: Vec<f32> = (0..20 * kv).map(|i| -(i as f32) * 0.5).collect();
        c.append_alone(&keys[..7 * kv], &values[..7 * kv], kv_heads, hd);
        c.append_alone(&keys[7 * kv..], &values[7 * kv..], kv_heads, hd);
        assert_eq!(c.len(), 20);
        for j in 0..20 {
            for g in 0..kv_heads {
                let (kt, vb) = c.block(j / KEY_BLOCK, g, kv_heads, hd);
                let lane = j % KEY_BLOCK;
                for d in 0..hd {
                    assert_eq!(
                        from_f16(kt[d * KEY_BLOCK + lane]),
                        keys[j * kv + g * hd + d]
                    );
                    assert_eq!(from_f16(vb[lane * hd + d]), values[j * kv + g * hd + d]);
                }
            }
        }
        let p = c.prefix(17, kv, &SpareCaches::default());
        assert_eq!(p.len(), 17);
        assert_eq!(p.data.len(), 2 * KEY_BLOCK * 2 * kv);
        assert!(p.data == c.data[..p.data.len()]);
        c.truncate(5, kv);
        assert_eq!((c.len(), c.data.len()), (5, KEY_BLOCK * 2 * kv));
        // Saturated, not infinite; NaN stays NaN.
        assert_eq!(from_f16(to_f16(1e9)), F16_MAX);
        assert_eq!(from_f16(to_f16(-1e9)), -F16_MAX);
        assert!(from_f16(to_f16(f32::NAN)).is_nan());
    }

    #[test]
    fn recycled_memory_gives_the_same_cache_and_spare_memory_is_bounded() {
        let (kv_heads, hd) = (2, 8);
        let kv = kv_heads * hd;
        let keys: Vec<f32> = (0..300 * kv).map(|i| (i % 97) as f32 * 0.25).collect();
        let values: Vec<f32> = (0..300 * kv).map(|i| -((i % 89) as f32)).collect();
        // Used buffers, every half float NaN: one as large as the first growth needs, one
        // large enough for 300 positions. Without spare memory, a cache grows in place.
        let dirty = SpareCaches::default();
        let span = |n: usize| KvCache::default().span(n, kv);
        let (junk, junk2) = (
            vec![0xFFFFu16; span(5 + HEADROOM) + 1],
            vec![0xFFFFu16; span(300 + HEADROOM) + 1],
        );
        let (junk_at, junk2_at) = (junk.as_ptr(), junk2.as_ptr());
        dirty.put(junk2);
        dirty.put(junk);
        let fresh = SpareCaches::default();
        let (mut a, mut b) = (KvCache::default(), KvCache::default());
        for r in [0..5, 5..6, 6..40, 40..41, 41..300] {
            let (k, v) = (
                &keys[r.start * kv..r.end * kv],
                &values[r.start * kv..r.end * kv],
            );
            a.append(k, v, kv_heads, hd, &dirty);
            b.append(k, v, kv_heads, hd, &fresh);
            assert!(a.data == b.data, "after {r:?}");
        }
        // The first growth took the smaller used buffer; the later one took the larger and
        // gave the smaller back.
        assert_eq!(a.data.as_ptr(), junk2_at);
        assert_eq!(dirty.bufs.lock().front().map(|b| b.as_ptr()), Some(junk_at));
        assert!(b.data.capacity() >= b.span(300 + HEADROOM, kv));
        // A prefix in recycled memory holds the same positions.
        let p = b.prefix(100, kv, &dirty);
        assert!(p.data == b.data[..b.span(100, kv)]);
        assert!(p.data.capacity() >= b.span(100 + HEADROOM, kv));
        // Dropped instances' memory is kept up to the bound, the oldest going first.
        let spare = SpareCaches::default();
        let big = SPARE_BYTES / 2 / 3;
        for _ in 0..4 {
            spare.put(Vec::with_capacity(big));
        }
        assert_eq!(spare.bytes(), 3 * 2 * big);
        spare.put(vec![0u16; SPARE_BYTES]);
        assert_eq!(
            spare.bytes(),
            3 * 2 * big,
            "a buffer over the bound is not kept"
        );
        a.recycle(&spare);
        assert_eq!((a.len, a.data.capacity()), (0, 0));
        assert!(spare.bytes() <= SPARE_BYTES);
        assert_eq!(
            spare.take(span(300 + HEADROOM)).map(|b| b.capacity()),
            Some(span(300 + HEADROOM) + 1)
        );
        // A buffer more than twice as large as asked for is not handed out, and a request
        // that nothing fits frees every spare buffer.
        assert!(spare.bytes() > 0);
        assert!(spare.take(1).is_none());
        assert_eq!(spare.bytes(), 0);
    }

    #[test]
    fn a_sliding_cache_drops_what_no_row_sees_and_refuses_to_rewind_past_it() {
        let (kv_heads, hd, window) = (2, 4, 20);
        let kv = kv_heads * hd;
        let keys: Vec<f32> = (0..1000 * kv).map(|i| i as f32).collect();
        let values: Vec<f32> = (0..1000 * kv).map(|i| -(i as f32)).collect();
        let mut full = KvCache::default();
        let mut c = KvCache::sliding(window);
        // A prompt of 50 in one pass, then decode steps up to 1,000 positions.
        full.append_alone(&keys[..50 * kv], &values[..50 * kv], kv_heads, hd);
        c.append_alone(&keys[..50 * kv], &values[..50 * kv], kv_heads, hd);
        for j in 50..1000 {
            let r = j * kv..(j + 1) * kv;
            full.append_alone(&keys[r.clone()], &values[r.clone()], kv_heads, hd);
            c.append_alone(&keys[r.clone()], &values[r], kv_heads, hd);
        }
        // The last append was at 999: blocks before (999 - 64 + 1 - 20) / 16 = 57 are gone.
        assert_eq!((c.len(), c.first), (1000, 57));
        // The append hint changes nothing wherever it points: dropped blocks, held ones, past
        // the end, more positions than a decode step's.
        let before = c.data.clone();
        for (pos, n) in [(0, 1), (999, 1), (1000, 4), (5000, 1), (990, 5), (990, 0)] {
            c.prefetch_append(pos, n, kv_heads, hd);
        }
        assert!(c.data == before);
        assert_eq!(c.data.len(), (63 - 57) * KEY_BLOCK * 2 * kv);
        assert!(
            c.bytes() * 2 < full.bytes(),
            "{} vs {}",
            c.bytes(),
            full.bytes()
        );
        for b in 57..63 {
            for g in 0..kv_heads {
                assert_eq!(
                    c.block(b, g, kv_heads, hd),
                    full.block(b, g, kv_heads, hd),
                    "block {b}"
                );
            }
        }
        // Rows from 931 on see only kept blocks; a row at 930 would need block 56.
        assert!(c.rewinds_to(1000) && c.rewinds_to(931) && c.rewinds_to(0));
        assert!(!c.rewinds_to(930) && !c.rewinds_to(100));
        assert!(full.rewinds_to(1));
        let p = c.prefix(950, kv, &SpareCaches::default());
        assert_eq!((p.len(), p.first, p.window), (950, 57, Some(window)));
        assert!(p.data == c.data[..(60 - 57) * KEY_BLOCK * 2 * kv]);
        // Going back to the start empties it, ready for a new sequence.
        c.truncate(0, kv);
        assert_eq!((c.len(), c.first, c.data.len()), (0, 0, 0));
        c.append_alone(&keys[..16 * kv], &values[..16 * kv], kv_heads, hd);
        assert_eq!(c.block(0, 1, kv_heads, hd), full.block(0, 1, kv_heads, hd));
    }

    #[test]
    fn blocks_match_exact_attention_and_are_the_same_bits_in_any_batch_split_or_isa() {
        // SmolLM2's heads (9 over 3, 64 wide), Gemma 3's (4 over 1, 256 wide) with a sliding
        // window, one query head per key/value head, 8-wide heads (scalar values path);
        // sequences from prefill (many rows, several row blocks and chunks) to decode (one
        // row deep in the cache), alone and batched.
        let cases: [(usize, usize, usize, Option<usize>); 4] = [
            (9, 3, 64, None),
            (4, 1, 256, Some(300)),
            (4, 4, 16, None),
            (6, 2, 8, Some(24)),
        ];
        let here = Blocks::best();
        let all: Vec<Blocks> = [Blocks::Scalar, Blocks::Avx2, Blocks::Avx512]
            .into_iter()
            .filter(|b| match b {
                Blocks::Scalar => true,
                Blocks::Avx2 => here != Blocks::Scalar,
                Blocks::Avx512 => here == Blocks::Avx512,
            })
            .collect();
        for (ci, &(heads, kv_heads, hd, window)) in cases.iter().enumerate() {
            let shape = AttnShape {
                heads,
                kv_heads,
                hd,
                scale: 1.0 / (hd as f32).sqrt(),
            };
            let (qd, kv) = (heads * hd, kv_heads * hd);
            let shapes: [(usize, usize); 4] = [(0, 70), (300, 1), (21, 7), (1100, 1)];
            let mut keys = Vec::new();
            let mut values = Vec::new();
            let mut caches = Vec::new();
            for (i, &(pos, t_n)) in shapes.iter().enumerate() {
                let n = (pos + t_n) * kv;
                // Keys scaled up so that the softmax is peaked and the maxima move.
                let k: Vec<f32> = noise(7 * i as u64 + 1, n).iter().map(|x| x * 4.0).collect();
                let v = noise(7 * i as u64 + 2, n);
                // A windowed layer's cache drops what its rows no longer see.
                let mut c = window.map_or_else(KvCache::default, KvCache::sliding);
                // Cached in passes of at most 100 positions, as a prompt in several passes,
                // then the new rows.
                for piece in k[..pos * kv]
                    .chunks(100 * kv)
                    .zip(v[..pos * kv].chunks(100 * kv))
                {
                    c.append_alone(piece.0, piece.1, kv_heads, hd);
                }
                c.append_alone(&k[pos * kv..], &v[pos * kv..], kv_heads, hd);
                if window.is_some() && pos >= 1000 {
                    assert!(c.first > 0, "case {ci}: nothing dropped at {pos}");
                }
                keys.push(k);
                values.push(v);
                caches.push(c);
            }
            let mut start = 0;
            let seqs: Vec<AttnSeq<'_>> = shapes
                .iter()
                .zip(&caches)
                .map(|(&(pos, t_n), c)| {
                    let s = AttnSeq {
                        cache: c,
                        pos,
                        rows: start..start + t_n,
                    };
                    start += t_n;
                    s
                })
                .collect();
            let q = noise(99 + ci as u64, start * qd);
            let want = exact(&shape, &q, &seqs, &keys, &values, window);
            let mut scalar = vec![0f32; start * qd];
            attention_with(Blocks::Scalar, 1, &shape, &q, &seqs, window, &mut scalar);
            let worst = scalar
                .iter()
                .zip(&want)
                .map(|(a, b)| (*a as f64 - b).abs())
                .fold(0.0, f64::max);
            assert!(worst < 2e-5, "case {ci}: {worst} from exact attention");
            for threads in [1, 2, 3, 16] {
                for &isa in &all {
                    let mut o = vec![1f32; start * qd];
                    attention_with(isa, threads, &shape, &q, &seqs, window, &mut o);
                    assert!(o == scalar, "case {ci}: {threads} threads, {isa:?}");
                }
            }
            // Each sequence alone gives its rows of the batch; so does each of its rows fed
            // one at a time (decode) over the same cache.
            for s in &seqs {
                let qs = &q[s.rows.start * qd..s.rows.end * qd];
                let alone = [AttnSeq {
                    cache: s.cache,
                    pos: s.pos,
                    rows: 0..s.rows.len(),
                }];
                let mut o = vec![0f32; qs.len()];
                attention_with(here, 2, &shape, qs, &alone, window, &mut o);
                assert!(
                    o == scalar[s.rows.start * qd..s.rows.end * qd],
                    "case {ci}: a sequence alone differs from its rows in the batch"
                );
                for t in 0..s.rows.len() {
                    let one = [AttnSeq {
                        cache: s.cache,
                        pos: s.pos + t,
                        rows: 0..1,
                    }];
                    let mut o = vec![0f32; qd];
                    attention_with(
                        here,
                        2,
                        &shape,
                        &qs[t * qd..(t + 1) * qd],
                        &one,
                        window,
                        &mut o,
                    );
                    assert!(
                        o == scalar[(s.rows.start + t) * qd..(s.rows.start + t + 1) * qd],
                        "case {ci}: row {t} alone differs"
                    );
                }
            }
        }
    }
}
