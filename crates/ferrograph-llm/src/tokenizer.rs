//! Tokenizers built from GGUF metadata (or loaded from a `tokenizer.json` beside the model).
//!
//! Two GGUF vocabulary types are covered: `gpt2` (byte-level BPE with merges; the
//! pre-tokenizer regex is chosen by `tokenizer.ggml.pre`) and `llama` (SentencePiece with
//! scores and byte fallback; merges are derived from the scores the way Hugging Face's
//! converter does). Control tokens (type 3) become special added tokens, user-defined tokens
//! (type 4) plain added tokens.

use crate::error::LlmError;
use candle_core::quantized::gguf_file::Content;
use ferrograph_kernels::gguf_meta;
use std::collections::HashSet;
use std::path::Path;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{NormalizerWrapper, Sequence as NormalizerSequence};
use tokenizers::normalizers::{Prepend, Replace};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

/// GPT-2's pre-tokenizer regex (what `ByteLevel` with `use_regex` applies).
const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama 3's pre-tokenizer regex (`llama-bpe`, also used by several families).
const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen 2's pre-tokenizer regex.
const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Token ids and flags the generator needs besides the tokenizer itself.
#[derive(Clone, Debug, Default)]
pub struct SpecialTokens {
    /// Beginning-of-sequence token.
    pub bos: Option<u32>,
    /// End-of-sequence token.
    pub eos: Option<u32>,
    /// Every token that ends a generation (eos, end-of-turn, ...).
    pub stop_ids: Vec<u32>,
    /// Whether prompts start with `bos`.
    pub add_bos: bool,
    /// Text of `bos` (for chat templates).
    pub bos_text: String,
    /// Text of `eos` (for chat templates).
    pub eos_text: String,
}

fn md_strings(ct: &Content, key: &str, path: &Path) -> Result<Vec<String>, LlmError> {
    gguf_meta::strings(ct, key).map_err(|e| LlmError::invalid(path, e.to_string()))
}

/// Builds the tokenizer described by a GGUF's `tokenizer.ggml.*` metadata.
pub fn tokenizer_from_gguf(
    ct: &Content,
    path: &Path,
) -> Result<(Tokenizer, SpecialTokens), LlmError> {
    let kind = gguf_meta::string(ct, "tokenizer.ggml.model")
        .unwrap_or_default()
        .to_string();
    let tokens = md_strings(ct, "tokenizer.ggml.tokens", path)?;
    if tokens.is_empty() {
        return Err(LlmError::invalid(path, "empty tokenizer vocabulary"));
    }
    let types: Vec<i64> = gguf_meta::numbers(ct, "tokenizer.ggml.token_type")
        .map(|v| v.into_iter().map(|x| x as i64).collect())
        .unwrap_or_default();
    let n =
        u32::try_from(tokens.len()).map_err(|_| LlmError::invalid(path, "vocabulary too large"))?;
    let vocab: Vocab = tokens.iter().cloned().zip(0..n).collect();

    let mut tokenizer = match kind.as_str() {
        "gpt2" => {
            let merges_raw = md_strings(ct, "tokenizer.ggml.merges", path)?;
            let mut merges = Vec::with_capacity(merges_raw.len());
            for m in &merges_raw {
                let (a, b) = m
                    .split_once(' ')
                    .ok_or_else(|| LlmError::invalid(path, format!("bad merge `{m}`")))?;
                merges.push((a.to_string(), b.to_string()));
            }
            let bpe = BPE::builder()
                .vocab_and_merges(vocab, merges)
                .build()
                .map_err(|e| LlmError::invalid(path, format!("BPE: {e}")))?;
            let pre = gguf_meta::string(ct, "tokenizer.ggml.pre")
                .unwrap_or_default()
                .to_string();
            let mut t = Tokenizer::new(bpe);
            t.with_pre_tokenizer(Some(byte_level_pre_tokenizer(&pre, path)?));
            t.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::default())));
            t
        }
        "llama" => {
            let scores = gguf_meta::numbers(ct, "tokenizer.ggml.scores")
                .map_err(|e| LlmError::invalid(path, e.to_string()))?;
            let merges = spm_merges(&tokens, &scores);
            let bpe = BPE::builder()
                .vocab_and_merges(vocab, merges)
                .byte_fallback(true)
                .unk_token("<unk>".to_string())
                .build()
                .map_err(|e| LlmError::invalid(path, format!("BPE: {e}")))?;
            let add_space_prefix =
                gguf_meta::boolean(ct, "tokenizer.ggml.add_space_prefix").unwrap_or(false);
            let mut t = Tokenizer::new(bpe);
            let mut norms: Vec<NormalizerWrapper> = Vec::new();
            if add_space_prefix {
                norms.push(Prepend::new("▁".to_string()).into());
            }
            norms.push(
                Replace::new(" ", "▁")
                    .map_err(|e| LlmError::invalid(path, e))?
                    .into(),
            );
            t.with_normalizer(Some(NormalizerSequence::new(norms)));
            let mut decs: Vec<DecoderWrapper> = vec![
                tokenizers::decoders::DecoderWrapper::Replace(
                    tokenizers::normalizers::Replace::new("▁", " ")
                        .map_err(|e| LlmError::invalid(path, e))?,
                ),
                ByteFallback::default().into(),
                Fuse::default().into(),
            ];
            if add_space_prefix {
                decs.push(Strip::new(' ', 1, 0).into());
            }
            t.with_decoder(Some(DecoderSequence::new(decs)));
            t
        }
        other => {
            return Err(LlmError::invalid(
                path,
                format!("unsupported tokenizer model `{other}` (supported: gpt2, llama)"),
            ))
        }
    };

    let mut special = Vec::new();
    let mut user = Vec::new();
    for (i, tok) in tokens.iter().enumerate() {
        match types.get(i).copied().unwrap_or(1) {
            3 => special.push(AddedToken::from(tok.clone(), true)),
            4 => user.push(AddedToken::from(tok.clone(), false)),
            _ => {}
        }
    }
    tokenizer.add_special_tokens(&special);
    tokenizer.add_tokens(&user);

    let bos = gguf_meta::u32(ct, "tokenizer.ggml.bos_token_id");
    let eos = gguf_meta::u32(ct, "tokenizer.ggml.eos_token_id");
    let add_bos = gguf_meta::boolean(ct, "tokenizer.ggml.add_bos_token").unwrap_or(kind == "llama");
    let text_of = |id: Option<u32>| {
        id.and_then(|i| tokens.get(i as usize).cloned())
            .unwrap_or_default()
    };
    let mut stop_ids: Vec<u32> = [
        eos,
        gguf_meta::u32(ct, "tokenizer.ggml.eot_token_id"),
        gguf_meta::u32(ct, "tokenizer.ggml.eom_token_id"),
    ]
    .into_iter()
    .flatten()
    .collect();
    // End-of-turn markers of common templates also end a generation.
    for marker in ["<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>"] {
        if let Some(id) = tokenizer.token_to_id(marker) {
            stop_ids.push(id);
        }
    }
    stop_ids.sort_unstable();
    stop_ids.dedup();
    let specials = SpecialTokens {
        bos,
        eos,
        stop_ids,
        add_bos,
        bos_text: text_of(bos),
        eos_text: text_of(eos),
    };
    Ok((tokenizer, specials))
}

fn byte_level_pre_tokenizer(pre: &str, path: &Path) -> Result<PreTokenizerWrapper, LlmError> {
    let split = |pattern: &str| -> Result<PreTokenizerWrapper, LlmError> {
        Split::new(
            SplitPattern::Regex(pattern.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map(PreTokenizerWrapper::Split)
        .map_err(|e| LlmError::invalid(path, format!("pre-tokenizer regex: {e}")))
    };
    let byte_level = PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, false));
    Ok(match pre {
        // SmolLM: single digits, then GPT-2's byte-level split.
        "smollm" => PreTokenizerWrapper::Sequence(PreSequence::new(vec![
            PreTokenizerWrapper::Digits(Digits::new(true)),
            PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true)),
        ])),
        "llama-bpe" | "llama3" | "dbrx" | "smaug-bpe" => {
            PreTokenizerWrapper::Sequence(PreSequence::new(vec![
                split(LLAMA3_PATTERN)?,
                byte_level,
            ]))
        }
        "qwen2" | "deepseek-r1-qwen" => {
            PreTokenizerWrapper::Sequence(PreSequence::new(vec![split(QWEN2_PATTERN)?, byte_level]))
        }
        _ => {
            PreTokenizerWrapper::Sequence(PreSequence::new(vec![split(GPT2_PATTERN)?, byte_level]))
        }
    })
}

/// Merges of a SentencePiece BPE vocabulary: every split of a token into two tokens of the
/// vocabulary is a merge, ranked by the merged token's score (then id).
///
/// A large vocabulary has millions of candidate merges (Gemma 3's 262,144 tokens), so they
/// are ranked as (score, token, split point) and turned into strings once, in order.
fn spm_merges(tokens: &[String], scores: &[f64]) -> Vec<(String, String)> {
    let index: HashSet<&str> = tokens.iter().map(String::as_str).collect();
    let mut ranked: Vec<(f64, u32, u32)> = Vec::new();
    for (id, tok) in tokens.iter().enumerate() {
        let Ok(id32) = u32::try_from(id) else {
            break;
        };
        let score = scores.get(id).copied().unwrap_or(0.0);
        for (split, _) in tok.char_indices().skip(1) {
            let (a, b) = tok.split_at(split);
            if index.contains(a) && index.contains(b) {
                ranked.push((score, id32, split as u32));
            }
        }
    }
    drop(index);
    ranked.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
    let mut merges = Vec::with_capacity(ranked.len());
    for (_, id, split) in ranked {
        let (a, b) = tokens[id as usize].split_at(split as usize);
        merges.push((a.to_string(), b.to_string()));
    }
    merges
}

/// Loads a `tokenizer.json` (Hugging Face format).
pub fn tokenizer_from_file(path: &Path) -> Result<Tokenizer, LlmError> {
    Tokenizer::from_file(path).map_err(|e| LlmError::invalid(path, format!("tokenizer.json: {e}")))
}
