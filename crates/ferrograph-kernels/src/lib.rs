//! ferrograph's CPU inference kernels: quantized matrix products with SIMD chosen at run
//! time, the thread pool that runs them, and the forward passes built on them: llama-style
//! decoder models ([`decoder`]) and BERT sentence encoders ([`encoder`]). This crate holds
//! all of the workspace's SIMD and `unsafe` code; the inference engine (`ferrograph-llm`)
//! uses it through [`decoder::DecoderModel`], retrieval (`ferrograph-index`) through
//! [`encoder::EncoderModel`].
//!
//!
//! Weights are repacked at load time from their GGUF block types into a few internal layouts
//! ([`Packed`]), each made of blocks of 32 elements with `f32` scales (half floats in the
//! interleaved layouts whose GGUF scales are half floats, which keeps them exact):
//!
//! | layout | value of element `i` of a block | from GGUF |
//! |---|---|---|
//! | `U4` | `d * q[i] + m`, `q` 4-bit | Q4_0, Q4_1, Q4_K |
//! | `U8` | `d * q[i] + m`, `q` 0..=31 | Q5_0, Q5_1 |
//! | `I8` | `d * q[i]`, `q` signed 8-bit | Q8_0 |
//! | `I8S16` | `d * s[i / 16] * q[i]`, `q` -32..=31 | Q6_K |
//!
//! Activations are quantized per row into blocks of 32 signed bytes with an `f32` scale and
//! the scaled block sum ([`QAct`]); a dot product is then integer multiply-adds per block
//! plus one float multiply-add per block. The SIMD versions (AVX2 + FMA on x86-64) are
//! chosen at run time; a scalar version is the fallback and the reference the property tests
//! compare against. Matrix products split the output rows over the [`pool`] and process up to
//! four activation rows per weight row, so a weight block is unpacked once for four tokens
//! during prefill.
//!
//! Matrices whose row count is a multiple of 8 are stored interleaved instead
//! ([`Packed::U4x8`] and its siblings): the blocks of eight consecutive rows side by side, so
//! that one 32-bit lane of a SIMD register holds four weights of one row. 5-bit weights are
//! kept as 5 bits there ([`Packed::U5x8`]: the nibbles of `U4x8` and a plane of high bits),
//! not a byte each: 22 bytes per block of 32 for Q5_0, as in the GGUF (its offsets, -16 times
//! its scales, are derived), and 24 for Q5_1, where bytes took 40. A kernel then
//! multiplies eight rows by four broadcast activation bytes per instruction, sums in 16-bit
//! lanes where the bounds allow, and applies the block scales to eight rows with one
//! multiply-add: about a third of the instructions of the row-by-row kernel, for decode and
//! prefill alike. With AVX-512 VNNI, 4-bit and 8-bit layouts take two groups at once, sixteen
//! rows per 512-bit register, and write their outputs in place (`x86::x16_avx512`), with the
//! same bits. On such CPUs the 4-bit layouts store each pair of groups with their 32-byte
//! chunks side by side (`pairs` of [`Packed::U4x8`]), so that those kernels load a pair's
//! chunk in one 64-byte read, and where the CPU has GFNI they take the high nibbles with one
//! affine transform instead of a shift and a mask (`x86::x16_avx512_gfni`).
//! `FERROGRAPH_PAIRS=0` and `FERROGRAPH_GFNI=0` turn either off (for comparisons).
//! Q4_0's and Q4_1's half-float scales and offsets stay half floats there too
//! ([`Packed::U4x8Half`]): 20 bytes per block, as in the GGUF, where `f32` took 24.
//! `FERROGRAPH_INTERLEAVE=0` keeps the row-by-row layout (for comparisons).
//!
//! A model's matrices are moved, as they are loaded, into one [`WeightArena`]: their buffers
//! one after another on 2 MiB pages, in the order a forward pass reads them, where a small
//! model's many small buffers each took 4 KiB pages of their own (a TLB miss per 4 KiB that
//! decode streams).
//!
//! The `unsafe` code lives here and in [`pool`]: SIMD intrinsics, the pool's lifetime
//! erasure, and disjoint parallel writes of matrix product outputs; every block carries a
//! `SAFETY` comment (`clippy::undocumented_unsafe_blocks` is denied). [`decoder`] has none.
#![allow(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod attention;
pub mod decoder;
pub mod encoder;
pub mod gguf_meta;
mod hugepages;
mod ops;
pub mod pool;
mod scalar;
pub mod vector;
mod weights;
pub mod wide;

pub use decoder::Kernels;
pub use weights::{WeightArena, WeightBuf, WeightElem};
#[cfg(target_arch = "x86_64")]
mod x86;

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Q5_0's offset over its scale: its quants are 0..=31 around 16.
const Q5_0_OFFSET_PER_SCALE: f32 = -16.0;

/// Q4_0's offset over its scale: its quants are `q - 8`.
const Q4_0_OFFSET_PER_SCALE: f32 = -8.0;

/// Elements per block of every internal layout and of quantized activations.
pub const QK: usize = 32;

/// Why a tensor cannot be repacked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// The GGUF block type has no kernel here.
    #[error("unsupported tensor type {0}")]
    Unsupported(String),
    /// The byte length or shape does not match the block type.
    #[error("malformed tensor: {0}")]
    Malformed(String),
    /// The tensor's bytes could not be read.
    #[error("cannot read the tensor: {0}")]
    Read(#[source] std::io::Error),
    /// An input the model cannot take (a token outside its vocabulary, a sequence longer
    /// than its positions).
    #[error("invalid input: {0}")]
    Input(String),
}

/// GGUF block types that can be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgufType {
    /// 32-bit floats.
    F32,
    /// 16-bit floats.
    F16,
    /// 4-bit, scale, 32 per block.
    Q4_0,
    /// 4-bit, scale and minimum, 32 per block.
    Q4_1,
    /// 5-bit, scale, 32 per block.
    Q5_0,
    /// 5-bit, scale and minimum, 32 per block.
    Q5_1,
    /// 8-bit, scale, 32 per block.
    Q8_0,
    /// 4-bit k-quant, 256 per super-block.
    Q4K,
    /// 6-bit k-quant, 256 per super-block.
    Q6K,
}

impl GgufType {
    /// Elements per block.
    pub fn block_elems(self) -> usize {
        match self {
            GgufType::F32 | GgufType::F16 => 1,
            GgufType::Q4K | GgufType::Q6K => 256,
            _ => 32,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgufType::F32 => 4,
            GgufType::F16 => 2,
            GgufType::Q4_0 => 18,
            GgufType::Q4_1 => 20,
            GgufType::Q5_0 => 22,
            GgufType::Q5_1 => 24,
            GgufType::Q8_0 => 34,
            GgufType::Q4K => 144,
            GgufType::Q6K => 210,
        }
    }

    /// Bytes of a tensor of `elems` elements (`None` when not a whole number of blocks).
    pub fn bytes_for(self, elems: usize) -> Option<usize> {
        if !elems.is_multiple_of(self.block_elems()) {
            return None;
        }
        (elems / self.block_elems()).checked_mul(self.block_bytes())
    }
}

/// IEEE half to single precision.
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = if exp == 0 {
        if man == 0 {
            sign
        } else {
            // Subnormal: renormalize.
            let mut e = 127 - 15 + 1;
            let mut m = man;
            while m & 0x400 == 0 {
                m <<= 1;
                e -= 1;
            }
            sign | ((e as u32) << 23) | ((m & 0x3ff) << 13)
        }
    } else if exp == 0x1f {
        sign | 0x7f80_0000 | (man << 13)
    } else {
        sign | ((exp + 127 - 15) << 23) | (man << 13)
    };
    f32::from_bits(bits)
}

fn rd_f16(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// Repacked weights of a matrix: see the module documentation.
#[derive(Clone, Debug)]
pub enum Packed {
    /// `d * q + m`, 4-bit `q`, 16 bytes per block: element `i < 16` in the low nibble of byte
    /// `i`, element `i + 16` in its high nibble.
    U4 {
        /// Scale per block.
        d: WeightBuf<f32>,
        /// Offset per block.
        m: WeightBuf<f32>,
        /// Nibbles.
        q: WeightBuf<u8>,
    },
    /// `d * q + m`, `q` in 0..=31, 32 bytes per block.
    U8 {
        /// Scale per block.
        d: WeightBuf<f32>,
        /// Offset per block.
        m: WeightBuf<f32>,
        /// Quants.
        q: WeightBuf<u8>,
    },
    /// `d * q`, signed `q`, 32 bytes per block.
    I8 {
        /// Scale per block.
        d: WeightBuf<f32>,
        /// Quants.
        q: WeightBuf<i8>,
    },
    /// `U4` with the blocks of each group of eight rows interleaved (row count a multiple of
    /// 8). For group `g`, block `b` (`gb = g * blocks_per_row + b`): the scale and offset of
    /// lane (row `8g + lane`) are `d[8 * gb + lane]`, `m[8 * gb + lane]`; the 128 nibble bytes
    /// are four chunks of 32, chunk `c` holding bytes `4c..4c + 4` of the `U4` block of each
    /// lane in turn (`q[128 * gb + 32 * c + 4 * lane + j]` is byte `4c + j` of that block).
    ///
    /// With `pairs`, each pair of groups `2p`, `2p + 1` (but an odd last group) has its chunks
    /// side by side instead, so that the 16-row kernels read both groups' chunk in one 64-byte
    /// load: in the pair's 256 bytes per block, from `q[256 * (p * nb + b)]`, chunk `c` of
    /// group `2p + h` is at `64 * c + 32 * h`. Matrices are loaded this way where the
    /// instruction set in use has those kernels (AVX-512 VNNI), unless `FERROGRAPH_PAIRS=0`.
    U4x8 {
        /// Scale per row and block.
        d: WeightBuf<f32>,
        /// Offset per row and block.
        m: WeightBuf<f32>,
        /// Nibbles, interleaved.
        q: WeightBuf<u8>,
        /// Whether the pairs of groups have their chunks side by side (see above).
        pairs: bool,
    },
    /// [`Packed::U4x8`] with half-float scales and offsets, where those of the GGUF are half
    /// floats (Q4_0, Q4_1): exact, and the GGUF's bytes per block (20 where `f32` took 24),
    /// which decode streams once per token. `m` is empty where every offset is the scale
    /// times -8 (Q4_0), which the kernels then derive.
    U4x8Half {
        /// Scale per row and block, half-float bits.
        d: WeightBuf<u16>,
        /// Offset per row and block, half-float bits; empty for Q4_0 (see above).
        m: WeightBuf<u16>,
        /// Nibbles, interleaved as in [`Packed::U4x8`].
        q: WeightBuf<u8>,
        /// As in [`Packed::U4x8`].
        pairs: bool,
    },
    /// `U8` (5-bit quants, from Q5_0 and Q5_1) with eight rows interleaved as 5 bits: the low
    /// four bits of each quant laid out as the nibbles of [`Packed::U4x8`], and their fifth
    /// bits in eight 32-bit words per block, one per register that the nibbles unpack to:
    /// word `r` (`h[8 * gb + r]`) holds for chunk `c = r % 4` the fifth bits of the low
    /// nibbles (`r < 4`) or the high ones (`r >= 4`), bit `4 * lane + j` for byte `4 * lane +
    /// j` of the chunk. Scales and offsets are half floats (exact: Q5_0's offset is `-16 d`,
    /// Q5_1's its own half float), laid out as in [`Packed::U4x8`]; Q5_0's are not stored.
    U5x8 {
        /// Scale per row and block, half-float bits.
        d: WeightBuf<u16>,
        /// Offset per row and block, half-float bits; empty where every offset is the scale
        /// times -16 (Q5_0), which the kernels then derive.
        m: WeightBuf<u16>,
        /// Low four bits, interleaved as in [`Packed::U4x8`].
        q: WeightBuf<u8>,
        /// Fifth bits, eight words per block.
        h: WeightBuf<u32>,
    },
    /// `I8` with the blocks of each group of eight rows interleaved (row count a multiple of
    /// 8). For group `g`, block `b` (`gb = g * blocks_per_row + b`): the scale of lane (row
    /// `8g + lane`) is `d[8 * gb + lane]`; the 256 quant bytes are eight chunks of 32, chunk
    /// `c` holding elements `4c..4c + 4` of each lane in turn (`q[256 * gb + 32 * c + 4 * lane
    /// + j]` is element `4c + j`). The scales are half floats, as Q8_0 stores them.
    I8x8 {
        /// Scale per row and block, half-float bits.
        d: WeightBuf<u16>,
        /// Quants, interleaved.
        q: WeightBuf<i8>,
    },
    /// `I8S16` with eight rows interleaved as in [`Packed::I8x8`]. The sub-scales of lane
    /// `lane`, half `h` of block `gb` are `s[32 * gb + 16 * h + 2 * lane]` and the element
    /// after it (the same value twice, one 32-bit lane of 16-bit pairs).
    I8S16x8 {
        /// Scale per row and block.
        d: WeightBuf<f32>,
        /// Sub-scales, interleaved and doubled.
        s: WeightBuf<i16>,
        /// Quants, interleaved.
        q: WeightBuf<i8>,
    },
    /// `d * s * q`, `q` in -32..=31, one `s` per 16 elements.
    I8S16 {
        /// Scale per block.
        d: WeightBuf<f32>,
        /// Two sub-scales per block.
        s: WeightBuf<i16>,
        /// Quants.
        q: WeightBuf<i8>,
    },
}

impl Packed {
    /// Calls `v` on every buffer.
    fn visit_bufs(&mut self, v: &mut impl BufVisitor) {
        match self {
            Packed::U4 { d, m, q } | Packed::U8 { d, m, q } | Packed::U4x8 { d, m, q, .. } => {
                v.visit(d);
                v.visit(m);
                v.visit(q);
            }
            Packed::U4x8Half { d, m, q, .. } => {
                v.visit(d);
                v.visit(m);
                v.visit(q);
            }
            Packed::U5x8 { d, m, q, h } => {
                v.visit(d);
                v.visit(m);
                v.visit(q);
                v.visit(h);
            }
            Packed::I8 { d, q } => {
                v.visit(d);
                v.visit(q);
            }
            Packed::I8x8 { d, q } => {
                v.visit(d);
                v.visit(q);
            }
            Packed::I8S16 { d, s, q } | Packed::I8S16x8 { d, s, q } => {
                v.visit(d);
                v.visit(s);
                v.visit(q);
            }
        }
    }
}

/// Something done to each buffer of a [`Packed`] ([`Packed::visit_bufs`]).
trait BufVisitor {
    fn visit<T: WeightElem>(&mut self, buf: &mut WeightBuf<T>);
}

/// Asks for transparent huge pages under a freshly reserved buffer ([`hugepages::advise`]).
struct AdviseHugePages;

impl BufVisitor for AdviseHugePages {
    fn visit<T: WeightElem>(&mut self, buf: &mut WeightBuf<T>) {
        hugepages::advise(buf.vec_mut());
    }
}

impl BufVisitor for WeightArena {
    fn visit<T: WeightElem>(&mut self, buf: &mut WeightBuf<T>) {
        self.adopt(buf);
    }
}

/// A weight matrix of `rows` output features by `cols` input features, row-major, repacked.
#[derive(Clone, Debug)]
pub struct QMatrix {
    /// Output features.
    pub rows: usize,
    /// Input features (a multiple of [`QK`]).
    pub cols: usize,
    /// The GGUF type it came from.
    pub source: GgufType,
    /// The repacked data.
    pub packed: Packed,
}

impl QMatrix {
    /// Repacks a GGUF tensor of `rows` x `cols` (`cols` contiguous) from its raw bytes.
    pub fn from_gguf(
        ty: GgufType,
        rows: usize,
        cols: usize,
        data: &[u8],
    ) -> Result<QMatrix, KernelError> {
        let need = Self::gguf_bytes(ty, rows, cols)?;
        if data.len() != need {
            return Err(KernelError::Malformed(format!(
                "{ty:?} {rows}x{cols} needs {need} bytes, got {}",
                data.len()
            )));
        }
        Self::read_gguf(ty, rows, cols, &mut &data[..])
    }

    /// Bytes of a GGUF tensor of `rows` x `cols` of type `ty`, or why it cannot be repacked.
    pub fn gguf_bytes(ty: GgufType, rows: usize, cols: usize) -> Result<usize, KernelError> {
        if cols == 0
            || rows == 0
            || !cols.is_multiple_of(QK)
            || !cols.is_multiple_of(ty.block_elems())
        {
            return Err(KernelError::Malformed(format!(
                "{rows}x{cols} does not fit {ty:?} blocks"
            )));
        }
        let elems = rows
            .checked_mul(cols)
            .ok_or_else(|| KernelError::Malformed("size overflows".into()))?;
        ty.bytes_for(elems)
            .ok_or_else(|| KernelError::Malformed("size overflows".into()))
    }

    /// Repacks a GGUF tensor of `rows` x `cols` read from `src` (exactly its bytes, see
    /// [`QMatrix::gguf_bytes`]) a slice at a time, so that loading holds the repacked matrix
    /// and a small buffer rather than a second copy of the tensor.
    pub fn read_gguf<R: std::io::Read>(
        ty: GgufType,
        rows: usize,
        cols: usize,
        src: &mut R,
    ) -> Result<QMatrix, KernelError> {
        /// Bytes read per slice (rounded down to whole blocks).
        const SLICE: usize = 256 * 1024;
        let need = Self::gguf_bytes(ty, rows, cols)?;
        let nb = rows * cols / QK;
        let mut packed = match ty {
            GgufType::Q4_0 | GgufType::Q4_1 | GgufType::Q4K => Packed::U4 {
                d: Vec::with_capacity(nb).into(),
                m: Vec::with_capacity(nb).into(),
                q: Vec::with_capacity(nb * 16).into(),
            },
            GgufType::Q5_0 | GgufType::Q5_1 => Packed::U8 {
                d: Vec::with_capacity(nb).into(),
                m: Vec::with_capacity(nb).into(),
                q: Vec::with_capacity(nb * QK).into(),
            },
            GgufType::Q8_0 => Packed::I8 {
                d: Vec::with_capacity(nb).into(),
                q: Vec::with_capacity(nb * QK).into(),
            },
            GgufType::Q6K => Packed::I8S16 {
                d: Vec::with_capacity(nb).into(),
                s: Vec::with_capacity(nb * 2).into(),
                q: Vec::with_capacity(nb * QK).into(),
            },
            GgufType::F32 | GgufType::F16 => {
                return Err(KernelError::Unsupported(format!("{ty:?} matrices")))
            }
        };
        packed.visit_bufs(&mut AdviseHugePages);
        let bb = ty.block_bytes();
        let mut buf = vec![0u8; need.min((SLICE / bb).max(1) * bb)];
        let mut left = need;
        while left > 0 {
            let n = left.min(buf.len());
            let slice = &mut buf[..n];
            src.read_exact(slice).map_err(KernelError::Read)?;
            append_blocks(ty, slice, &mut packed);
            left -= slice.len();
        }
        let packed = if rows.is_multiple_of(8) && interleave_enabled() {
            interleave(packed, rows, cols)
        } else {
            packed
        };
        Ok(QMatrix {
            rows,
            cols,
            source: ty,
            packed,
        })
    }

    /// Moves the matrix's buffers into `arena` (see [`WeightArena`]): the same values, on
    /// huge pages shared with the model's other matrices, in the order they are moved.
    pub fn move_into(&mut self, arena: &mut WeightArena) {
        self.packed.visit_bufs(arena);
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        match &self.packed {
            Packed::U4 { d, m, q } | Packed::U4x8 { d, m, q, .. } | Packed::U8 { d, m, q } => {
                (d.len() + m.len()) * 4 + q.len()
            }
            Packed::U4x8Half { d, m, q, .. } => (d.len() + m.len()) * 2 + q.len(),
            Packed::U5x8 { d, m, q, h } => (d.len() + m.len()) * 2 + q.len() + h.len() * 4,
            Packed::I8 { d, q } => d.len() * 4 + q.len(),
            Packed::I8x8 { d, q } => d.len() * 2 + q.len(),
            Packed::I8S16 { d, s, q } | Packed::I8S16x8 { d, s, q } => {
                d.len() * 4 + s.len() * 2 + q.len()
            }
        }
    }

    /// Writes row `row` as floats into `out` (`cols` long). `false` when out of range.
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) -> bool {
        if row >= self.rows || out.len() != self.cols {
            return false;
        }
        let nb = self.cols / QK;
        if let Some(all) = self.interleaved() {
            let g = all.group(row / 8, nb);
            let lane = row % 8;
            for (b, o) in out.chunks_exact_mut(QK).enumerate() {
                let db = g.d.get(8 * b + lane);
                let mb = g.m.map_or(0.0, |m| m.get(8 * b + lane));
                for (k, o) in o.iter_mut().enumerate() {
                    let sub =
                        g.s.map_or(1.0, |s| s[32 * b + 16 * (k / 16) + 2 * lane] as f32);
                    *o = db * sub * g.q.value(b, lane, k) as f32 + mb;
                }
            }
            return true;
        }
        let b0 = row * nb;
        for (b, o) in out.chunks_exact_mut(QK).enumerate() {
            let blk = b0 + b;
            match &self.packed {
                Packed::U4 { d, m, q } => {
                    let qs = &q[blk * 16..blk * 16 + 16];
                    for i in 0..16 {
                        o[i] = d[blk] * (qs[i] & 0x0f) as f32 + m[blk];
                        o[i + 16] = d[blk] * (qs[i] >> 4) as f32 + m[blk];
                    }
                }
                Packed::U8 { d, m, q } => {
                    for (i, v) in q[blk * QK..blk * QK + QK].iter().enumerate() {
                        o[i] = d[blk] * *v as f32 + m[blk];
                    }
                }
                Packed::I8 { d, q } => {
                    for (i, v) in q[blk * QK..blk * QK + QK].iter().enumerate() {
                        o[i] = d[blk] * *v as f32;
                    }
                }
                Packed::I8S16 { d, s, q } => {
                    for (i, v) in q[blk * QK..blk * QK + QK].iter().enumerate() {
                        o[i] = d[blk] * s[blk * 2 + i / 16] as f32 * *v as f32;
                    }
                }
                // Read through `interleaved` above.
                Packed::U4x8 { .. }
                | Packed::U4x8Half { .. }
                | Packed::U5x8 { .. }
                | Packed::I8x8 { .. }
                | Packed::I8S16x8 { .. } => {}
            }
        }
        true
    }

    /// The arrays of an interleaved matrix; `None` for the row-by-row layouts.
    pub(crate) fn interleaved(&self) -> Option<Interleaved<'_>> {
        let (d, m, s, q) = match &self.packed {
            Packed::U4x8 { d, m, q, pairs } => (
                Scales::F32(d),
                Some(Scales::F32(m)),
                None,
                GroupQuants::Nibbles(q, *pairs),
            ),
            Packed::U4x8Half { d, m, q, pairs } => (
                Scales::F16(d),
                Some(half_offsets(d, m, Q4_0_OFFSET_PER_SCALE)),
                None,
                GroupQuants::Nibbles(q, *pairs),
            ),
            Packed::U5x8 { d, m, q, h } => (
                Scales::F16(d),
                Some(half_offsets(d, m, Q5_0_OFFSET_PER_SCALE)),
                None,
                GroupQuants::Nibbles5(q, h),
            ),
            Packed::I8x8 { d, q } => (Scales::F16(d), None, None, GroupQuants::Signed(q)),
            Packed::I8S16x8 { d, s, q } => (Scales::F32(d), None, Some(s), GroupQuants::Signed(q)),
            _ => return None,
        };
        Some(Interleaved {
            d,
            m,
            s: s.map(|s| &s[..]),
            q,
        })
    }
}

/// Repacks the whole GGUF blocks of type `ty` in `data` onto the end of `packed` (a row-by-row
/// layout made for `ty` by [`QMatrix::read_gguf`]).
fn append_blocks(ty: GgufType, data: &[u8], packed: &mut Packed) {
    let bb = ty.block_bytes();
    match (ty, packed) {
        (GgufType::Q4_0 | GgufType::Q4_1, Packed::U4 { d, m, q }) => {
            let (d, m, q) = (d.vec_mut(), m.vec_mut(), q.vec_mut());
            for blk in data.chunks_exact(bb) {
                let scale = rd_f16(blk, 0);
                if ty == GgufType::Q4_0 {
                    d.push(scale);
                    m.push(Q4_0_OFFSET_PER_SCALE * scale);
                    q.extend_from_slice(&blk[2..18]);
                } else {
                    d.push(scale);
                    m.push(rd_f16(blk, 2));
                    q.extend_from_slice(&blk[4..20]);
                }
            }
        }
        (GgufType::Q5_0 | GgufType::Q5_1, Packed::U8 { d, m, q }) => {
            let (d, m, q) = (d.vec_mut(), m.vec_mut(), q.vec_mut());
            for blk in data.chunks_exact(bb) {
                let scale = rd_f16(blk, 0);
                let (min, hbase) = if ty == GgufType::Q5_0 {
                    (Q5_0_OFFSET_PER_SCALE * scale, 2)
                } else {
                    (rd_f16(blk, 2), 4)
                };
                let qh = u32::from_le_bytes([
                    blk[hbase],
                    blk[hbase + 1],
                    blk[hbase + 2],
                    blk[hbase + 3],
                ]);
                let qs = &blk[hbase + 4..hbase + 20];
                let mut vals = [0u8; 32];
                for i in 0..16 {
                    vals[i] = (qs[i] & 0x0f) | ((((qh >> i) & 1) as u8) << 4);
                    vals[i + 16] = (qs[i] >> 4) | ((((qh >> (i + 16)) & 1) as u8) << 4);
                }
                d.push(scale);
                m.push(min);
                q.extend_from_slice(&vals);
            }
        }
        (GgufType::Q8_0, Packed::I8 { d, q }) => {
            let (d, q) = (d.vec_mut(), q.vec_mut());
            for blk in data.chunks_exact(bb) {
                d.push(rd_f16(blk, 0));
                q.extend(blk[2..34].iter().map(|&b| b as i8));
            }
        }
        (GgufType::Q4K, Packed::U4 { d, m, q }) => {
            let (d, m, q) = (d.vec_mut(), m.vec_mut(), q.vec_mut());
            for blk in data.chunks_exact(bb) {
                let sd = rd_f16(blk, 0);
                let smin = rd_f16(blk, 2);
                let sc = &blk[4..16];
                let qs = &blk[16..144];
                for j in 0..8 {
                    let (s, mn) = if j < 4 {
                        (sc[j] & 63, sc[j + 4] & 63)
                    } else {
                        (
                            (sc[j + 4] & 0x0f) | ((sc[j - 4] >> 6) << 4),
                            (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4),
                        )
                    };
                    d.push(sd * s as f32);
                    m.push(-smin * mn as f32);
                    let chunk = &qs[32 * (j / 2)..32 * (j / 2) + 32];
                    let shift = if j % 2 == 0 { 0 } else { 4 };
                    for i in 0..16 {
                        let lo = (chunk[i] >> shift) & 0x0f;
                        let hi = (chunk[i + 16] >> shift) & 0x0f;
                        q.push(lo | (hi << 4));
                    }
                }
            }
        }
        (GgufType::Q6K, Packed::I8S16 { d, s, q }) => {
            let (d, s, q) = (d.vec_mut(), s.vec_mut(), q.vec_mut());
            for blk in data.chunks_exact(bb) {
                let ql = &blk[0..128];
                let qh = &blk[128..192];
                let sc = &blk[192..208];
                let sd = rd_f16(blk, 208);
                let mut vals = [0i8; 256];
                for half in 0..2 {
                    let (ql, qh) = (&ql[64 * half..], &qh[32 * half..]);
                    let base = 128 * half;
                    for l in 0..32 {
                        let h = qh[l];
                        vals[base + l] = ((ql[l] & 0x0f) | ((h & 3) << 4)) as i8 - 32;
                        vals[base + l + 32] =
                            ((ql[l + 32] & 0x0f) | (((h >> 2) & 3) << 4)) as i8 - 32;
                        vals[base + l + 64] = ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i8 - 32;
                        vals[base + l + 96] =
                            ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i8 - 32;
                    }
                }
                for b in 0..8 {
                    d.push(sd);
                    s.push(sc[2 * b] as i8 as i16);
                    s.push(sc[2 * b + 1] as i8 as i16);
                }
                q.extend_from_slice(&vals);
            }
        }
        // `read_gguf` makes the layout that matches the type.
        _ => {}
    }
}

/// The arrays of interleaved rows (see [`Packed::U4x8`] and its siblings): of a whole matrix,
/// or of one group of eight rows ([`Interleaved::group`]), which is what the `*_x8` kernels
/// read.
#[derive(Clone, Copy)]
pub(crate) struct Interleaved<'a> {
    /// Scales, 8 per block (one per row).
    pub d: Scales<'a>,
    /// Offsets, 8 per block (`U4x8`, `U5x8`).
    pub m: Option<Scales<'a>>,
    /// Doubled sub-scales, 32 per block (`I8S16x8`).
    pub s: Option<&'a [i16]>,
    /// The quants.
    pub q: GroupQuants<'a>,
}

impl<'a> Interleaved<'a> {
    /// Group `g` (rows `8g..8g + 8`) of a whole matrix with `nb` blocks per row.
    ///
    /// # Panics
    /// When the matrix has no group `g` (callers pass groups of its rows).
    pub(crate) fn group(&self, g: usize, nb: usize) -> Interleaved<'a> {
        let r = |n: usize| n * g * nb..n * (g + 1) * nb;
        Interleaved {
            d: self.d.range(r(8)),
            m: self.m.map(|m| m.range(r(8))),
            s: self.s.map(|s| &s[r(32)]),
            q: match self.q {
                GroupQuants::Nibbles(q, true) if g < q.len() / (256 * nb) * 2 => {
                    // From the group's first chunk to its last: the pair's bytes but the
                    // partner's first chunk (group `2p + 1`) or last (group `2p`).
                    let at = 128 * nb * (g - g % 2) + 32 * (g % 2);
                    GroupQuants::Nibbles(&q[at..at + 256 * nb - 32], true)
                }
                GroupQuants::Nibbles(q, _) => GroupQuants::Nibbles(&q[r(128)], false),
                GroupQuants::Nibbles5(q, h) => GroupQuants::Nibbles5(&q[r(128)], &h[r(8)]),
                GroupQuants::Signed(q) => GroupQuants::Signed(&q[r(256)]),
            },
        }
    }
}

/// The scales (or offsets) of [`Interleaved`] rows: `f32`, or half-float bits where the GGUF's
/// own are half floats (exact, and half the bytes to read).
#[derive(Clone, Copy)]
pub(crate) enum Scales<'a> {
    /// Single precision.
    F32(&'a [f32]),
    /// Half-float bits.
    F16(&'a [u16]),
    /// Half-float bits times a power of two (exact): Q5_0's offsets are its scales times -16,
    /// so they are derived from the scales rather than stored.
    F16Times(&'a [u16], f32),
}

impl<'a> Scales<'a> {
    /// Values held.
    pub(crate) fn len(self) -> usize {
        match self {
            Scales::F32(v) => v.len(),
            Scales::F16(v) | Scales::F16Times(v, _) => v.len(),
        }
    }

    /// Value `i` as `f32`.
    pub(crate) fn get(self, i: usize) -> f32 {
        match self {
            Scales::F32(v) => v[i],
            Scales::F16(v) => f16_to_f32(v[i]),
            Scales::F16Times(v, by) => by * f16_to_f32(v[i]),
        }
    }

    /// The values of `r`.
    fn range(self, r: std::ops::Range<usize>) -> Scales<'a> {
        match self {
            Scales::F32(v) => Scales::F32(&v[r]),
            Scales::F16(v) => Scales::F16(&v[r]),
            Scales::F16Times(v, by) => Scales::F16Times(&v[r], by),
        }
    }
}

/// Where the fifth bit of quant `k` (0..32) of lane `lane` lies in a [`Packed::U5x8`] block:
/// its word (the register its nibble unpacks to) and its bit.
fn fifth_bit(lane: usize, k: usize) -> (usize, usize) {
    let (c, j) = ((k % 16) / 4, k % 4);
    (c + 4 * (k / 16), 4 * lane + j)
}

/// `v`, which came from a half float, as half-float bits; `None` if it does not fit one
/// exactly (a Q5_0 offset, `-16 d`, past the half-float range).
fn exact_f16(v: f32) -> Option<u16> {
    let h = half::f16::from_f32(v);
    (h.to_f32() == v || (v.is_nan() && h.is_nan())).then(|| h.to_bits())
}

/// Per-block values of a row-by-row matrix (`rows`, a multiple of 8, by `nb` blocks) as
/// half-float bits in the interleaved order; `None` when one is not exactly a half float.
fn half_per_block(v: &[f32], rows: usize, nb: usize) -> Option<Vec<u16>> {
    let mut half: Vec<u16> = v.iter().map(|&x| exact_f16(x)).collect::<Option<_>>()?;
    interleave_in_place(&mut half, rows, nb, 1, 1);
    Some(half)
}

/// The per-block scales and offsets of a row-by-row matrix (`rows`, a multiple of 8, by `nb`
/// blocks) as half-float bits in the interleaved order, the offsets empty where each is the
/// scale times `derived` (so not stored); `None` when a value is not exactly a half float.
fn half_scales(
    d: &[f32],
    m: &[f32],
    derived: f32,
    rows: usize,
    nb: usize,
) -> Option<(Vec<u16>, Vec<u16>)> {
    let dh = half_per_block(d, rows, nb)?;
    let mh = if d.iter().zip(m).all(|(d, m)| *m == derived * d) {
        Vec::new()
    } else {
        half_per_block(m, rows, nb)?
    };
    Some((dh, mh))
}

/// The offsets [`half_scales`] kept: stored, or each the scale times `derived` where none
/// were stored.
fn half_offsets<'a>(d: &'a [u16], m: &'a [u16], derived: f32) -> Scales<'a> {
    if m.is_empty() {
        Scales::F16Times(d, derived)
    } else {
        Scales::F16(m)
    }
}

/// The quants of [`Interleaved`] rows.
#[derive(Clone, Copy)]
pub(crate) enum GroupQuants<'a> {
    /// 4-bit, 128 bytes per block (`U4x8`), and whether the chunks of pairs of groups lie side
    /// by side (`pairs` of [`Packed::U4x8`]). Of one group ([`Interleaved::group`]), `true`
    /// says that this group's are: its blocks 256 bytes apart, its chunks 64, and its slice
    /// running from its first chunk to its last.
    Nibbles(&'a [u8], bool),
    /// 5-bit: the nibbles of `Nibbles` and eight words of fifth bits per block (`U5x8`).
    Nibbles5(&'a [u8], &'a [u32]),
    /// Signed bytes, 256 per block (`I8x8`, `I8S16x8`).
    Signed(&'a [i8]),
}

/// Where byte `k` of lane `lane`'s row-block lies within interleaved block `b` of a group
/// whose blocks are `block` bytes apart and whose chunks (four bytes per lane in turn) are
/// `chunk` bytes apart.
fn lane_index(block: usize, chunk: usize, b: usize, lane: usize, k: usize) -> usize {
    block * b + chunk * (k / 4) + 4 * lane + k % 4
}

/// Bytes between a group's blocks of nibbles, and between its chunks: 128 and 32 alone, 256
/// and 64 in a pair whose chunks lie side by side.
pub(crate) fn nibble_steps(paired: bool) -> (usize, usize) {
    if paired {
        (256, 64)
    } else {
        (128, 32)
    }
}

impl GroupQuants<'_> {
    /// Quant `k` (0..32) of lane `lane` in block `b`.
    pub(crate) fn value(self, b: usize, lane: usize, k: usize) -> i32 {
        match self {
            GroupQuants::Nibbles(q, paired) => {
                let (block, chunk) = nibble_steps(paired);
                let byte = q[lane_index(block, chunk, b, lane, k % 16)];
                i32::from(if k < 16 { byte & 0x0f } else { byte >> 4 })
            }
            GroupQuants::Nibbles5(q, h) => {
                let low = GroupQuants::Nibbles(q, false).value(b, lane, k);
                let (word, bit) = fifth_bit(lane, k);
                low | (((h[8 * b + word] >> bit) & 1) as i32) << 4
            }
            GroupQuants::Signed(q) => i32::from(q[lane_index(8 * QK, 32, b, lane, k)]),
        }
    }
}

/// Asks the CPU to bring `lines` cache lines, from `ahead` bytes past `at`, into its caches:
/// where a kernel that streams its weights reads next (see [`prefetch_distance`]). A hint
/// only: a prefetch never faults, so the addresses may lie past the buffer.
#[inline]
pub(crate) fn prefetch_lines(at: *const u8, ahead: usize, lines: usize) {
    for l in 0..lines {
        let line = at.wrapping_add(ahead + 64 * l);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: SSE is part of every x86-64 CPU, and a prefetch reads nothing the program
        // sees (an address that is not mapped is ignored).
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(line as *const i8)
        };
        #[cfg(not(target_arch = "x86_64"))]
        let _ = line;
    }
}

/// The most activation rows (tokens) one kernel call takes.
const MAX_TILE: usize = 4;

/// How far ahead, in bytes of quants, the kernels of interleaved matrices ask for the cache
/// lines they will read in the first tile of tokens of each group of rows, which streams the
/// group's weights from memory (later tiles find them in cache): 8 KiB, or
/// `FERROGRAPH_PREFETCH` (0 turns it off).
///
/// Decode reads every weight once per token, and the CPU's own prefetchers did not keep up:
/// on the 2-core Xeon VM of the README, Gemma 3 270M decoded 76 tokens/s on 2 threads without
/// and 94-100 with (2, 4, 8 and 16 KiB ahead measured; 8 KiB best on both models), SmolLM2
/// 240 and 320.
pub(crate) fn prefetch_distance() -> usize {
    static D: OnceLock<usize> = OnceLock::new();
    *D.get_or_init(|| {
        std::env::var("FERROGRAPH_PREFETCH")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(8 << 10)
    })
}

/// Whether the comparison switch `var` leaves its feature on: unset, or anything but `0`.
fn switched_on(var: &str) -> bool {
    std::env::var(var).map_or(true, |v| v != "0")
}

/// Whether matrices are interleaved at load (`FERROGRAPH_INTERLEAVE=0` turns it off).
fn interleave_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| switched_on("FERROGRAPH_INTERLEAVE"))
}

/// Reorders `v`, a `rows` (a multiple of 8) by `nb` blocks matrix with `per` values per
/// block, from row order to the interleaved order of [`Packed::U4x8`] and its siblings: per
/// group of eight rows and block, `chunk` values of each row in turn. Each group occupies the
/// same range in both orders, so this works in place with one group of scratch.
fn interleave_in_place<T: Copy>(v: &mut [T], rows: usize, nb: usize, per: usize, chunk: usize) {
    let group_len = 8 * nb * per;
    let mut scratch: Vec<T> = Vec::with_capacity(group_len);
    for g in 0..rows / 8 {
        let region = &mut v[g * group_len..(g + 1) * group_len];
        scratch.clear();
        scratch.extend_from_slice(region);
        for lane in 0..8 {
            for b in 0..nb {
                let src = (lane * nb + b) * per;
                let dst = b * 8 * per + lane * chunk;
                for k in 0..per {
                    region[dst + (k / chunk) * 8 * chunk + k % chunk] = scratch[src + k];
                }
            }
        }
    }
}

/// Whether the nibbles of interleaved matrices are stored with the chunks of each pair of
/// groups side by side (`pairs` of [`Packed::U4x8`]): where this CPU runs the 16-row kernels,
/// which then load a pair's chunk in one 64-byte read instead of two 32-byte reads and an
/// insert (an instruction of the ones that bound those kernels at four tokens), unless
/// `FERROGRAPH_PAIRS=0`. The 8-row kernels read either layout; a CPU (or `FERROGRAPH_ISA`)
/// without the 16-row kernels keeps the group-by-group one, which they read whole lines of.
fn pairs_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| switched_on("FERROGRAPH_PAIRS") && detected_isa() == Isa::Avx512Vnni)
}

/// Moves the nibbles of an interleaved matrix of `groups` groups of `nb` blocks between the
/// group-by-group layout and the paired one of [`Packed::U4x8`] (`to_pairs`), in place with
/// one pair of scratch; an odd last group stays as it is.
fn pair_chunks(q: &mut [u8], groups: usize, nb: usize, to_pairs: bool) {
    let pair_len = 256 * nb;
    let mut scratch = vec![0u8; pair_len];
    for region in q.chunks_exact_mut(pair_len).take(groups / 2) {
        scratch.copy_from_slice(region);
        for b in 0..nb {
            for c in 0..4 {
                for h in 0..2 {
                    let apart = 128 * nb * h + 128 * b + 32 * c;
                    let together = 256 * b + 64 * c + 32 * h;
                    let (from, to) = if to_pairs {
                        (apart, together)
                    } else {
                        (together, apart)
                    };
                    region[to..to + 32].copy_from_slice(&scratch[from..from + 32]);
                }
            }
        }
    }
}

/// The interleaved form of a row-by-row matrix of `rows` (a multiple of 8) by `cols`.
fn interleave(packed: Packed, rows: usize, cols: usize) -> Packed {
    let nb = cols / QK;
    let per_block = |mut v: WeightBuf<f32>| {
        interleave_in_place(v.vec_mut(), rows, nb, 1, 1);
        v
    };
    match packed {
        Packed::U4 { d, m, mut q } => {
            interleave_in_place(q.vec_mut(), rows, nb, 16, 4);
            let pairs = pairs_enabled();
            if pairs {
                pair_chunks(q.vec_mut(), rows / 8, nb, true);
            }
            // Half floats where every scale and offset is one exactly (Q4_0 and Q4_1 always;
            // Q4_K's scales times its 6-bit sub-scales are not).
            match half_scales(&d, &m, Q4_0_OFFSET_PER_SCALE, rows, nb) {
                Some((d, m)) => Packed::U4x8Half {
                    d: d.into(),
                    m: m.into(),
                    q,
                    pairs,
                },
                None => Packed::U4x8 {
                    d: per_block(d),
                    m: per_block(m),
                    q,
                    pairs,
                },
            }
        }
        Packed::U8 { d, m, q } => match five_bits(&d, &m, &q, rows, nb) {
            Some(packed) => packed,
            // Offsets past the half-float range: kept row by row, in `f32`.
            None => Packed::U8 { d, m, q },
        },
        Packed::I8 { d, mut q } => match half_per_block(&d, rows, nb) {
            Some(d) => {
                interleave_in_place(q.vec_mut(), rows, nb, QK, 4);
                Packed::I8x8 { d: d.into(), q }
            }
            None => Packed::I8 { d, q },
        },
        Packed::I8S16 { d, mut s, mut q } => {
            interleave_in_place(q.vec_mut(), rows, nb, QK, 4);
            // Each lane's two sub-scales per block, then each written twice: one 32-bit lane
            // of 16-bit pairs for `madd`.
            interleave_in_place(s.vec_mut(), rows, nb, 2, 1);
            let s = s.iter().flat_map(|&v| [v, v]).collect::<Vec<_>>().into();
            Packed::I8S16x8 {
                d: per_block(d),
                s,
                q,
            }
        }
        interleaved => interleaved,
    }
}

/// The [`Packed::U5x8`] form of a row-by-row `U8` matrix of 5-bit quants (`rows` a multiple
/// of 8, `nb` blocks per row); `None` when a scale or offset is not exactly a half float.
fn five_bits(d: &[f32], m: &[f32], q: &[u8], rows: usize, nb: usize) -> Option<Packed> {
    // Q5_0's offsets are its scales times -16: derived, not stored (22 bytes per block, as
    // in the GGUF). Q5_1's are its own.
    let (dh, mh) = half_scales(d, m, Q5_0_OFFSET_PER_SCALE, rows, nb)?;
    let blocks = rows * nb;
    let mut nibbles = Vec::with_capacity(blocks * 16);
    // Eight words of 32 fifth bits per group of eight rows and block: one word per block.
    let mut h = vec![0u32; blocks];
    // Row by row, as `U4` packs nibbles: element `i < 16` low, `i + 16` high, of byte `i`.
    for qs in q.chunks_exact(QK) {
        for i in 0..16 {
            nibbles.push((qs[i] & 0x0f) | ((qs[i + 16] & 0x0f) << 4));
        }
    }
    interleave_in_place(&mut nibbles, rows, nb, 16, 4);
    for g in 0..rows / 8 {
        for b in 0..nb {
            let gb = g * nb + b;
            for lane in 0..8 {
                let qs = &q[((8 * g + lane) * nb + b) * QK..][..QK];
                for (k, &v) in qs.iter().enumerate() {
                    let (word, bit) = fifth_bit(lane, k);
                    h[8 * gb + word] |= u32::from((v >> 4) & 1) << bit;
                }
            }
        }
    }
    Some(Packed::U5x8 {
        d: dh.into(),
        m: mh.into(),
        q: nibbles.into(),
        h: h.into(),
    })
}

/// Rows of activations quantized to 8-bit blocks of [`QK`].
#[derive(Clone, Debug, Default)]
pub struct QAct {
    /// Elements per row.
    pub cols: usize,
    /// Rows.
    pub rows: usize,
    /// Quants, `rows * cols`.
    pub q: Vec<i8>,
    /// Scale per block.
    pub d: Vec<f32>,
    /// Scale times the sum of the block's quants.
    pub s: Vec<f32>,
    /// The sum of the block's quants.
    pub sums: Vec<i32>,
}

impl QAct {
    /// Quantizes `x` (`rows` rows of `cols`, `cols` a multiple of [`QK`]) into `self`.
    pub fn quantize(&mut self, x: &[f32], cols: usize) {
        self.resize(x.len(), cols);
        quantize_blocks(x, self.blocks_mut());
    }

    fn resize(&mut self, len: usize, cols: usize) {
        debug_assert!(cols.is_multiple_of(QK) && len.is_multiple_of(cols.max(1)));
        self.cols = cols;
        self.rows = len.checked_div(cols).unwrap_or(0);
        self.q.resize(len, 0);
        self.d.resize(len / QK, 0.0);
        self.s.resize(len / QK, 0.0);
        self.sums.resize(len / QK, 0);
    }

    /// [`QAct::quantize`] with the rows split over `pool`'s threads (the same result).
    pub fn quantize_on(&mut self, pool: &pool::Pool, x: &[f32], cols: usize) {
        let rows = x.len().checked_div(cols).unwrap_or(0);
        if pool.threads().min(rows) <= 1 || x.len() < QUANTIZE_PARALLEL_MIN {
            return self.quantize(x, cols);
        }
        self.resize(x.len(), cols);
        let pieces: Vec<_> = self
            .row_pieces(pool, rows, cols)
            .map(|(r, blocks)| parking_lot::Mutex::new((r.start * cols..r.end * cols, blocks)))
            .collect();
        pool.run(&|tid| {
            if let Some(piece) = pieces.get(tid) {
                let mut piece = piece.lock();
                let (range, blocks) = &mut *piece;
                quantize_blocks(&x[range.clone()], blocks.reborrow());
            }
        });
    }

    /// Applies `prepare` to each piece of rows of `x` (its offset in `x`, the rows) and
    /// quantizes the piece, both on the thread of `pool` that holds it: [`QAct::quantize`] of
    /// the prepared `x`, the same bits. An element-wise step (the feed-forward's gate) and
    /// the quantization of its result then make one dispatch, and no thread reads rows
    /// another just wrote. One row runs on the calling thread.
    pub fn quantize_prepared_on(
        &mut self,
        pool: &pool::Pool,
        x: &mut [f32],
        cols: usize,
        prepare: &(dyn Fn(usize, &mut [f32]) + Sync),
    ) {
        let rows = x.len().checked_div(cols).unwrap_or(0);
        self.resize(x.len(), cols);
        if pool.threads().min(rows) <= 1 {
            prepare(0, x);
            quantize_blocks(x, self.blocks_mut());
            return;
        }
        let mut rest_x = x;
        let pieces: Vec<_> = self
            .row_pieces(pool, rows, cols)
            .map(|(r, blocks)| {
                let (head, tail) = std::mem::take(&mut rest_x).split_at_mut(r.len() * cols);
                rest_x = tail;
                parking_lot::Mutex::new((r.start * cols, head, blocks))
            })
            .collect();
        pool.run(&|tid| {
            if let Some(piece) = pieces.get(tid) {
                let mut piece = piece.lock();
                let (offset, rows, blocks) = &mut *piece;
                prepare(*offset, rows);
                quantize_blocks(rows, blocks.reborrow());
            }
        });
    }

    /// The blocks of `rows` rows of `cols` columns cut at the pool's row ranges
    /// (`Pool::split`): each range with its blocks, for one thread to write.
    fn row_pieces<'s>(
        &'s mut self,
        pool: &pool::Pool,
        rows: usize,
        cols: usize,
    ) -> impl Iterator<Item = (std::ops::Range<usize>, QBlocksMut<'s>)> {
        let per_row = cols / QK;
        let mut rest = self.blocks_mut();
        pool.split(rows).map(move |r| {
            let (head, tail) = std::mem::take(&mut rest).split_at(r.len() * per_row);
            rest = tail;
            (r, head)
        })
    }

    /// The quantized blocks, to write.
    fn blocks_mut(&mut self) -> QBlocksMut<'_> {
        QBlocksMut {
            q: &mut self.q,
            d: &mut self.d,
            s: &mut self.s,
            sums: &mut self.sums,
        }
    }
}

/// Quantized activation blocks being written: the arrays of [`QAct`], or a run of their
/// blocks.
#[derive(Default)]
pub(crate) struct QBlocksMut<'a> {
    /// Quants, [`QK`] per block.
    pub q: &'a mut [i8],
    /// Scales.
    pub d: &'a mut [f32],
    /// Scales times the quants' sums.
    pub s: &'a mut [f32],
    /// The quants' sums.
    pub sums: &'a mut [i32],
}

impl<'a> QBlocksMut<'a> {
    /// Whether every array has room for `blocks` blocks (what the SIMD quantizers check
    /// before writing through pointers).
    pub(crate) fn holds(&self, blocks: usize) -> bool {
        self.q.len() >= blocks * QK
            && self.d.len() >= blocks
            && self.s.len() >= blocks
            && self.sums.len() >= blocks
    }

    /// The first `n` blocks and the rest.
    fn split_at(self, n: usize) -> (QBlocksMut<'a>, QBlocksMut<'a>) {
        let (q, qt) = self.q.split_at_mut(n * QK);
        let (d, dt) = self.d.split_at_mut(n);
        let (s, st) = self.s.split_at_mut(n);
        let (sums, sumst) = self.sums.split_at_mut(n);
        (
            QBlocksMut { q, d, s, sums },
            QBlocksMut {
                q: qt,
                d: dt,
                s: st,
                sums: sumst,
            },
        )
    }

    /// The same blocks, borrowed again.
    fn reborrow(&mut self) -> QBlocksMut<'_> {
        QBlocksMut {
            q: self.q,
            d: self.d,
            s: self.s,
            sums: self.sums,
        }
    }
}

/// Below this many elements, [`QAct::quantize_on`] quantizes on the calling thread: a
/// dispatch costs about what one thread spends on them (a decode step's few rows).
const QUANTIZE_PARALLEL_MIN: usize = 1 << 14;

/// Quantizes the blocks of `x` into `q`, their scales `d` and scaled sums `s`: with AVX2
/// where the CPU has it ([`x86::quant`], the same bits), else [`quantize_blocks_scalar`].
fn quantize_blocks(x: &[f32], out: QBlocksMut<'_>) {
    quantize_blocks_with(detected_isa(), x, out)
}

/// [`quantize_blocks`] with `isa`'s code (AVX-512 for [`Isa::Avx512Vnni`]); any gives the same
/// bits.
fn quantize_blocks_with(isa: Isa, x: &[f32], out: QBlocksMut<'_>) {
    #[cfg(target_arch = "x86_64")]
    match isa {
        _ if !isa_available(isa) => {}
        Isa::Scalar => {}
        // SAFETY: `Avx512Vnni` is available (checked): it includes AVX-512 F, VL and BW,
        // AVX2 and FMA.
        Isa::Avx512Vnni => return unsafe { x86::quant512::quantize_blocks(x, out) },
        // SAFETY: every other SIMD `Isa` includes AVX2 and FMA, and this one is available.
        _ => return unsafe { x86::quant::quantize_blocks(x, out) },
    }
    let _ = isa;
    quantize_blocks_scalar(x, out)
}

/// [`quantize_blocks`] without SIMD: the reference.
fn quantize_blocks_scalar(x: &[f32], out: QBlocksMut<'_>) {
    for ((((xb, qb), db), sb), nb) in x
        .chunks_exact(QK)
        .zip(out.q.chunks_exact_mut(QK))
        .zip(out.d.iter_mut())
        .zip(out.s.iter_mut())
        .zip(out.sums.iter_mut())
    {
        let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let scale = amax / 127.0;
        let id = quant_inverse(scale);
        // Round to nearest even without a libm call or a float-to-int conversion (which
        // does not vectorize): adding 1.5 * 2^23 leaves the integer in the low mantissa bits
        // (|v * id| <= 127). A NaN product (a NaN or infinite input) quantizes to 0.
        const SHIFT: f32 = 12_582_912.0;
        let mut sum = 0i32;
        for (o, v) in qb.iter_mut().zip(xb) {
            let p = v * id;
            let p = if p.is_nan() { 0.0 } else { p };
            let qi = (p + SHIFT).to_bits().wrapping_sub(SHIFT.to_bits()) as i32;
            *o = qi as i8;
            sum = sum.wrapping_add(qi);
        }
        *db = scale;
        *sb = scale * sum as f32;
        *nb = sum;
    }
}

/// What activation quants multiply a block by: the inverse of its scale, or 0 for a block
/// of zeros or one whose scale has no finite inverse (a largest magnitude below about 1e-36),
/// which then quantizes to zeros.
#[inline]
fn quant_inverse(scale: f32) -> f32 {
    let id = 1.0 / scale;
    if scale > 0.0 && id.is_finite() {
        id
    } else {
        0.0
    }
}

/// Instruction sets with kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Isa {
    /// Portable scalar code (the reference).
    Scalar,
    /// x86-64 AVX2 + FMA.
    Avx2,
    /// AVX2 + FMA with AVX-VNNI's `vpdpbusd` for the interleaved kernels' integer sums.
    AvxVnni,
    /// AVX2 + FMA with AVX-512 VNNI's `vpdpbusd` (256-bit, AVX-512VL) for the interleaved
    /// kernels' integer sums, and AVX-512BW's byte masks to complete 5-bit quants.
    Avx512Vnni,
}

impl Isa {
    /// Every instruction set, the preferred last.
    pub const ALL: [Isa; 4] = [Isa::Scalar, Isa::Avx2, Isa::AvxVnni, Isa::Avx512Vnni];

    /// The name `FERROGRAPH_ISA` accepts.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::AvxVnni => "avxvnni",
            Isa::Avx512Vnni => "avx512vnni",
        }
    }
}

/// The best instruction set of this CPU. `FERROGRAPH_ISA` (`scalar`, `avx2`, `avxvnni`,
/// `avx512vnni`) asks for another one; one this CPU lacks is ignored with a warning.
pub fn detected_isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        if let Ok(want) = std::env::var("FERROGRAPH_ISA") {
            match Isa::ALL.into_iter().find(|i| i.name() == want) {
                Some(isa) if isa_available(isa) => return isa,
                _ => tracing::warn!(isa = %want, "FERROGRAPH_ISA names no instruction set this CPU has; using the best one"),
            }
        }
        Isa::ALL
            .into_iter()
            .rev()
            .find(|&isa| isa_available(isa))
            .unwrap_or(Isa::Scalar)
    })
}

/// Whether `isa` can run on this CPU.
pub fn isa_available(isa: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // F16C converts the interleaved layouts' half-float scales.
        let avx2 = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        match isa {
            Isa::Scalar => true,
            Isa::Avx2 => avx2,
            Isa::AvxVnni => avx2 && is_x86_feature_detected!("avxvnni"),
            Isa::Avx512Vnni => {
                avx2 && is_x86_feature_detected!("avx512vnni")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512bw")
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        isa == Isa::Scalar
    }
}

impl QAct {
    /// Activation rows `t0..t0 + nt`, sliced for kernels.
    fn tile(&self, t0: usize, nt: usize) -> Acts<'_> {
        let nb = self.cols / QK;
        Acts {
            q: &self.q[t0 * self.cols..(t0 + nt) * self.cols],
            d: &self.d[t0 * nb..(t0 + nt) * nb],
            s: &self.s[t0 * nb..(t0 + nt) * nb],
            sums: &self.sums[t0 * nb..(t0 + nt) * nb],
            nb,
            // The first tile of a group streams its weights from memory; the next tiles find
            // them in cache.
            ahead: if t0 == 0 { prefetch_distance() } else { 0 },
        }
    }
}

/// Dot products of weight row `row` with activation rows `t0..t0 + out.len()` (at most 4),
/// into `out`.
fn dot_tile(isa: Isa, w: &QMatrix, row: usize, x: &QAct, t0: usize, out: &mut [f32]) {
    let xs = x.tile(t0, out.len());
    let r = row * xs.nb..(row + 1) * xs.nb;
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar {
        // SAFETY: every SIMD `Isa` includes AVX2 and FMA, and `matmul_with` runs only ones
        // `isa_available` finds on this CPU.
        unsafe { x86::dot_tile(&w.packed, r, &xs, out) };
        return;
    }
    let _ = isa;
    scalar::dot_tile(&w.packed, r, &xs, out);
}

/// Dot products of the eight rows of `group` with activation rows `t0..t0 + out.len() / 8`
/// (at most 4), into `out` (`out[8 * t + lane]`).
fn dot_tile_x8(isa: Isa, group: &Interleaved<'_>, x: &QAct, t0: usize, out: &mut [f32]) {
    let xs = x.tile(t0, out.len() / 8);
    #[cfg(target_arch = "x86_64")]
    {
        // `matmul_with` runs only instruction sets `isa_available` finds on this CPU, which
        // is what each module's entry point requires.
        match isa {
            // SAFETY: AVX2 and FMA are present (see above).
            Isa::Avx2 => return unsafe { x86::x8_avx2::dot_x8(group, &xs, out) },
            // SAFETY: AVX-VNNI is present (see above).
            Isa::AvxVnni => return unsafe { x86::x8_avx_vnni::dot_x8(group, &xs, out) },
            // SAFETY: AVX512-VNNI is present (see above).
            Isa::Avx512Vnni => return unsafe { x86::x8_avx512_vnni::dot_x8(group, &xs, out) },
            Isa::Scalar => {}
        }
    }
    let _ = isa;
    scalar::dot_x8(group, &xs, out);
}

/// Whether `isa` has a 16-row kernel (two groups at once) for the layout of `all`.
fn has_x16(isa: Isa, all: &Interleaved<'_>) -> bool {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512Vnni {
        return x86::x16_avx512::has_x16(all);
    }
    let _ = (isa, all);
    false
}

/// Whether this CPU has GFNI.
fn cpu_has_gfni() -> bool {
    #[cfg(target_arch = "x86_64")]
    return is_x86_feature_detected!("gfni");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether the 16-row kernels take the high nibbles with GFNI (where this CPU has it, unless
/// `FERROGRAPH_GFNI=0`): one instruction where a shift and a mask took two, the same bytes.
fn gfni_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| cpu_has_gfni() && switched_on("FERROGRAPH_GFNI"))
}

/// Products of groups `groups` (an even count, from an even group) of `all` (a whole matrix
/// of `w_rows` rows and `nb` blocks per row) with every token of `x`, written in place to
/// `out`, by the 16-row kernels that [`has_x16`] says `isa` has (with GFNI where `gfni`):
/// what the 8-row kernels give, bit for bit.
///
/// # Safety
/// `out` must be the product's output, its elements of these groups written by no other
/// thread meanwhile; `gfni` only where the CPU has GFNI.
#[allow(clippy::too_many_arguments)]
unsafe fn groups_x16(
    isa: Isa,
    gfni: bool,
    all: &Interleaved<'_>,
    nb: usize,
    groups: Range<usize>,
    x: &QAct,
    out: OutPtr,
    w_rows: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512Vnni {
        let rows = x86::OutRows {
            ptr: out.0,
            len: out.1,
            rows: w_rows,
        };
        let mut t0 = 0;
        while t0 < x.rows {
            let nt = (x.rows - t0).min(MAX_TILE);
            // SAFETY: `matmul_with` runs only instruction sets `isa_available` finds on this
            // CPU, and AVX-512 VNNI's check includes what the 16-row kernels need; the output
            // is the caller's contract.
            unsafe {
                if gfni {
                    x86::x16_avx512_gfni::run_x16(
                        all,
                        nb,
                        groups.clone(),
                        &x.tile(t0, nt),
                        t0,
                        &rows,
                    )
                } else {
                    x86::x16_avx512::run_x16(all, nb, groups.clone(), &x.tile(t0, nt), t0, &rows)
                }
            };
            t0 += nt;
        }
    }
    let _ = (isa, gfni, all, nb, groups, x, out, w_rows);
}

/// A tile of activation rows, sliced for one weight row's blocks.
pub(crate) struct Acts<'a> {
    pub q: &'a [i8],
    pub d: &'a [f32],
    pub s: &'a [f32],
    /// The quants' sums per block.
    pub sums: &'a [i32],
    pub nb: usize,
    /// How far ahead (bytes of quants) the kernels prefetch, 0 for not at all (see
    /// [`prefetch_distance`]).
    pub ahead: usize,
}

/// A matrix product's output (pointer, length), written by the pool's threads at disjoint
/// elements.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(*mut f32, usize);
// SAFETY: used only to write disjoint elements from the pool's threads (see `matmul_with`
// and `wide::matmul_wide_with`).
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// Writes a tile of eight rows (group `g` of a matrix of `rows` rows) for tokens `t0..`:
    /// `tile[8 * i + lane]` goes to `out[(t0 + i) * rows + 8 * g + lane]`.
    ///
    /// # Panics
    /// When an element is out of bounds.
    ///
    /// # Safety
    /// No other thread may access those elements meanwhile.
    pub(crate) unsafe fn write_group_tile(self, rows: usize, g: usize, t0: usize, tile: &[f32]) {
        for (i, vals) in tile.chunks_exact(8).enumerate() {
            let idx = (t0 + i) * rows + 8 * g;
            assert!(idx + 8 <= self.1);
            for (lane, v) in vals.iter().enumerate() {
                // SAFETY: in bounds (checked); exclusive access is the caller's contract.
                unsafe { *self.0.add(idx + lane) = *v };
            }
        }
    }
}

/// `out_j[t * rows_j + r] = dot(w_j row r, x row t)` for every job `(w_j, out_j)`, all jobs
/// sharing one activation and one parallel dispatch over the pool.
///
/// # Panics
/// When an output's length is not `x.rows * w.rows` or `x.cols != w.cols` (programming
/// errors; shapes are checked at load).
pub fn matmul(jobs: &mut [(&QMatrix, &mut [f32])], x: &QAct) {
    matmul_with(detected_isa(), pool::global(), jobs, x)
}

/// [`matmul`] with an explicit instruction set and pool.
pub fn matmul_with(isa: Isa, pool: &pool::Pool, jobs: &mut [(&QMatrix, &mut [f32])], x: &QAct) {
    matmul_on(isa, gfni_enabled(), pool, jobs, x)
}

/// [`matmul_with`], the 16-row kernels with GFNI where `gfni` (and the CPU has it).
fn matmul_on(
    isa: Isa,
    gfni: bool,
    pool: &pool::Pool,
    jobs: &mut [(&QMatrix, &mut [f32])],
    x: &QAct,
) {
    let isa = if isa_available(isa) { isa } else { Isa::Scalar };
    let gfni = gfni && cpu_has_gfni();
    let t = x.rows;
    let mut outs = Vec::with_capacity(jobs.len());
    for (w, out) in jobs.iter_mut() {
        assert_eq!(w.cols, x.cols, "matmul: inner dimensions differ");
        assert_eq!(out.len(), t * w.rows, "matmul: output size");
        outs.push((*w, w.interleaved(), OutPtr(out.as_mut_ptr(), out.len())));
    }
    let rows: Vec<usize> = outs.iter().map(|(w, ..)| w.rows).collect();
    let pieces = matmul_pieces(&rows, pool.threads());
    let claims = PieceClaims::new(pieces.len(), pool.threads());
    // Each thread takes the pieces of its own share, then helps with the others' (a thread
    // that starts late or runs slower ends with fewer). Each output element is computed by
    // one tile call whichever thread runs it, so the result does not depend on the split.
    let work = |tid: usize| {
        let mut tile = [0f32; 8 * MAX_TILE];
        let mut claim = claims.claimer(tid);
        loop {
            let Some(i) = claim.next() else {
                return;
            };
            let Some(&(job, ref rows)) = pieces.get(i) else {
                return;
            };
            let (w, interleaved, out) = outs[job];
            if let Some(all) = interleaved {
                let nb = w.cols / QK;
                let mut groups = rows.start / 8..rows.end.div_ceil(8);
                if has_x16(isa, &all) {
                    // Pairs of groups by the 16-row kernels; an odd last group below.
                    let paired = groups.start..groups.start + groups.len() / 2 * 2;
                    // SAFETY: each (token, group) is written by exactly one thread: the
                    // pieces are disjoint and each is taken once.
                    unsafe { groups_x16(isa, gfni, &all, nb, paired.clone(), x, out, w.rows) };
                    groups.start = paired.end;
                }
                for g in groups {
                    let group = all.group(g, nb);
                    let mut t0 = 0;
                    while t0 < t {
                        let nt = (t - t0).min(MAX_TILE);
                        dot_tile_x8(isa, &group, x, t0, &mut tile[..8 * nt]);
                        // SAFETY: as above.
                        unsafe { out.write_group_tile(w.rows, g, t0, &tile[..8 * nt]) };
                        t0 += nt;
                    }
                }
                continue;
            }
            for r in rows.clone() {
                let mut t0 = 0;
                while t0 < t {
                    let nt = (t - t0).min(MAX_TILE);
                    dot_tile(isa, w, r, x, t0, &mut tile[..nt]);
                    for (i, v) in tile[..nt].iter().enumerate() {
                        let idx = (t0 + i) * w.rows + r;
                        assert!(idx < out.1);
                        // SAFETY: `idx` is in bounds (checked) of the output, which outlives
                        // the dispatch; each (token, row) pair is written by exactly one
                        // thread, since the pieces are disjoint and each is taken once.
                        unsafe { *out.0.add(idx) = *v };
                    }
                    t0 += nt;
                }
            }
        }
    };
    if pieces.len() <= 1 {
        work(0);
    } else {
        pool.run(&work);
    }
}

/// The pieces of a product (`0..n`) in one contiguous share per thread, each share with its
/// own counter on its own cache line: a thread claims its share's pieces without touching a
/// line the other threads write, then claims what is left of the others' shares. With one
/// shared counter, every claim moved that line between the cores: a few percent of a decode
/// step on two threads.
pub(crate) struct PieceClaims {
    /// Per share: its end, and the next unclaimed piece.
    shares: Vec<(usize, crossbeam_utils::CachePadded<AtomicUsize>)>,
}

impl PieceClaims {
    /// `0..n` in `threads` shares of (nearly) equal length.
    pub(crate) fn new(n: usize, threads: usize) -> PieceClaims {
        let threads = threads.max(1);
        PieceClaims::from_shares((0..threads).map(|i| n * i / threads..n * (i + 1) / threads))
    }

    /// The given shares, one per thread, in order (each starting where the last ended).
    pub(crate) fn from_shares(shares: impl Iterator<Item = std::ops::Range<usize>>) -> PieceClaims {
        PieceClaims {
            shares: shares
                .map(|r| {
                    (
                        r.end,
                        crossbeam_utils::CachePadded::new(AtomicUsize::new(r.start)),
                    )
                })
                .collect(),
        }
    }

    /// Thread `tid`'s claims: its own share first, then the next shares in turn.
    pub(crate) fn claimer(&self, tid: usize) -> impl Iterator<Item = usize> + '_ {
        let n = self.shares.len();
        (0..n).flat_map(move |k| {
            let (end, next) = &self.shares[(tid + k) % n];
            std::iter::from_fn(move || {
                let i = next.fetch_add(1, Ordering::Relaxed);
                (i < *end).then_some(i)
            })
        })
    }
}

/// Pieces per thread that [`matmul_with`] cuts a product into: enough that the last piece
/// is a small part of a thread's share, few enough that taking one costs nothing.
const PIECES_PER_THREAD: usize = 16;

/// The pieces of a product's jobs of `rows` rows each: `(job, rows)`, rows in whole groups
/// of eight (the last group of a job may be shorter), each piece within one job, together
/// every row once.
fn matmul_pieces(rows: &[usize], threads: usize) -> Vec<(usize, Range<usize>)> {
    let groups: usize = rows.iter().map(|r| r.div_ceil(8)).sum();
    // An even count, so that the 16-row kernels find their pairs of groups within a piece.
    let per = groups
        .div_ceil(threads.max(1) * PIECES_PER_THREAD)
        .max(1)
        .next_multiple_of(2);
    let mut pieces = Vec::new();
    for (job, &n) in rows.iter().enumerate() {
        for g in (0..n.div_ceil(8)).step_by(per) {
            pieces.push((job, 8 * g..(8 * (g + per)).min(n)));
        }
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every SIMD quantizer's bits against the scalar reference's.
    fn same_quantization(x: &[f32]) {
        for isa in Isa::ALL.into_iter().filter(|&i| isa_available(i)) {
            same_quantization_with(isa, x);
        }
    }

    /// `isa`'s quantizer's bits against the scalar reference's.
    fn same_quantization_with(isa: Isa, x: &[f32]) {
        let n = x.len() / QK;
        let (mut q1, mut d1, mut s1) = (vec![0i8; n * QK], vec![0f32; n], vec![0f32; n]);
        let (mut q2, mut d2, mut s2) = (q1.clone(), d1.clone(), s1.clone());
        let (mut n1, mut n2) = (vec![0i32; n], vec![0i32; n]);
        quantize_blocks_with(
            isa,
            x,
            QBlocksMut {
                q: &mut q1,
                d: &mut d1,
                s: &mut s1,
                sums: &mut n1,
            },
        );
        quantize_blocks_scalar(
            x,
            QBlocksMut {
                q: &mut q2,
                d: &mut d2,
                s: &mut s2,
                sums: &mut n2,
            },
        );
        assert_eq!(q1, q2);
        assert_eq!(n1, n2);
        for (b, sum) in n1.iter().enumerate() {
            assert_eq!(
                *sum,
                q1[b * QK..(b + 1) * QK]
                    .iter()
                    .map(|&v| i32::from(v))
                    .sum::<i32>()
            );
        }
        assert_eq!(
            d1.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            d2.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!(
            s1.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            s2.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn simd_quantization_gives_the_scalar_bits(
            x in proptest::collection::vec(-1e4f32..1e4, 32 * 9),
            more in 0usize..40,
            scale in prop_oneof![Just(1.0f32), Just(1e-30), Just(1e-3), Just(3e4)],
        ) {
            // 9 to 48 blocks: whole and partial passes of the 16-block AVX-512 quantizer.
            let x: Vec<f32> = x.iter().cycle().take(32 * (9 + more)).map(|v| v * scale).collect();
            same_quantization(&x);
        }
    }

    #[test]
    fn simd_quantization_handles_zero_ties_and_extremes() {
        let mut x = vec![0f32; 32];
        // Halves round to even: 127 * v / amax lands on .5 for these.
        x.extend((0..32).map(|i| if i == 0 { 127.0 } else { i as f32 + 0.5 }));
        x.extend((0..32).map(|i| {
            if i % 2 == 0 {
                -f32::MAX
            } else {
                f32::MAX / 3.0
            }
        }));
        x.extend((0..32).map(|i| f32::MIN_POSITIVE * i as f32));
        x.extend((0..32).map(|i| [f32::NAN, 1.0, f32::INFINITY, -2.0][i % 4]));
        x.extend((0..32).map(|i| [f32::NAN, 1.0, -3.0, 0.25][i % 4]));
        same_quantization(&x);
    }

    /// `w` with its nibbles' pairs of groups side by side or not (`on`).
    fn with_pairs(mut w: QMatrix, on: bool) -> QMatrix {
        let groups = w.rows / 8;
        let nb = w.cols / QK;
        match &mut w.packed {
            Packed::U4x8 { q, pairs, .. } | Packed::U4x8Half { q, pairs, .. } => {
                if *pairs != on {
                    pair_chunks(q.vec_mut(), groups, nb, on);
                    *pairs = on;
                }
            }
            _ => panic!("not a matrix of interleaved nibbles"),
        }
        w
    }

    /// GGUF bytes of `n` blocks of `ty` (Q4_0, Q4_1 or Q4_K): half-float scales of a few
    /// magnitudes and signs, every other byte from `seed`.
    fn nibble_blocks(ty: GgufType, n: usize, seed: u64) -> Vec<u8> {
        let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut byte = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        };
        let scales: [u16; 4] = [0x2e66, 0xa0f5, 0x3400, 0x1c00];
        let head = match ty {
            GgufType::Q4_0 => 1,
            GgufType::Q4_1 | GgufType::Q4K => 2,
            _ => panic!("not a type of nibbles"),
        };
        let mut out = Vec::with_capacity(n * ty.block_bytes());
        for _ in 0..n {
            for _ in 0..head {
                let h = scales[usize::from(byte()) % 4];
                out.extend_from_slice(&h.to_le_bytes());
            }
            out.extend((2 * head..ty.block_bytes()).map(|_| byte()));
        }
        out
    }

    /// Both layouts of nibbles (pairs of groups side by side or not) hold the same values and
    /// give the same bits through every instruction set, with and without GFNI, on one and
    /// two threads, for every tile of tokens: each instruction set's own on the group-by-group
    /// layout, which are those of AVX2 for all but the scalar kernel. Odd counts of groups
    /// keep their last group apart.
    #[test]
    fn paired_nibbles_give_the_same_bits_in_every_kernel() {
        for (ty, rows, cols) in [
            (GgufType::Q4_1, 8, 96),
            (GgufType::Q4_1, 16, 96),
            (GgufType::Q4_1, 40, 256),
            (GgufType::Q4_0, 24, 512),
            (GgufType::Q4K, 24, 256),
            (GgufType::Q4K, 32, 512),
        ] {
            let data = nibble_blocks(ty, rows * cols / ty.block_elems(), rows as u64 + 7);
            let loaded = QMatrix::from_gguf(ty, rows, cols, &data).unwrap();
            let apart = with_pairs(loaded.clone(), false);
            let together = with_pairs(loaded, true);
            assert_ne!(
                apart.interleaved().map(
                    |i| matches!(i.q, GroupQuants::Nibbles(q, _) if q.len() == rows * cols / 2)
                ),
                None
            );
            let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
            for r in 0..rows {
                assert!(apart.dequantize_row(r, &mut a) && together.dequantize_row(r, &mut b));
                assert_eq!(a, b, "{ty:?} row {r}");
                assert!(a.iter().all(|v| v.is_finite()));
            }
            let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            for t in [1, 2, 3, 4, 5, 8] {
                let x: Vec<f32> = (0..t * cols)
                    .map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 6.0)
                    .collect();
                let mut act = QAct::default();
                act.quantize(&x, cols);
                let product = |w: &QMatrix, isa: Isa, gfni: bool, threads: usize| {
                    let mut out = vec![f32::NAN; t * rows];
                    matmul_on(
                        isa,
                        gfni,
                        &pool::Pool::new(threads),
                        &mut [(w, &mut out[..])],
                        &act,
                    );
                    out
                };
                // The SIMD kernels give the same bits as each other (the scalar one sums in
                // its own order).
                let simd = bits(&product(&apart, Isa::Avx2, false, 1));
                for isa in Isa::ALL.into_iter().filter(|&i| isa_available(i)) {
                    let want = if isa == Isa::Scalar {
                        bits(&product(&apart, isa, false, 1))
                    } else {
                        simd.clone()
                    };
                    assert!(want.iter().all(|v| f32::from_bits(*v).is_finite()));
                    for gfni in [false, true] {
                        for threads in [1, 2] {
                            for w in [&apart, &together] {
                                assert_eq!(
                                    bits(&product(w, isa, gfni, threads)),
                                    want,
                                    "{ty:?} {rows}x{cols}, {t} tokens, {isa:?}, gfni {gfni}, {threads} threads"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
