//! Constrained decoding with llguidance: the model's output is held to a grammar token by
//! token, so structured answers are valid by construction rather than by luck.
//!
//! - [`token_bytes`] turns the model's vocabulary (byte-level BPE `gpt2` or SentencePiece
//!   `llama` with byte fallback, added and special tokens included) into the bytes each token
//!   stands for; [`Constraints`] builds a toktrie token trie and an llguidance parser factory
//!   from it, once per model and only when a constrained request first needs it.
//! - [`GrammarSpec::for_options`] picks the grammar a request asks for: a JSON Schema
//!   (`response_format`) or the tool-call grammar of [`crate::tool_calls`] (`tools` with a
//!   `tool_choice` other than `None`).
//! - [`Constraint`] drives one generation: before each sampling step the allowed-token mask is
//!   computed and every other logit set to −∞ (greedy and sampled decoding alike), tokens the
//!   grammar forces are fed without sampling, and the generation stops when the grammar is
//!   complete.
//!
//! JSON is generated compactly (`", "` and `": "` separators, no free whitespace), which keeps
//! small models from wandering into whitespace. Schema keywords llguidance does not implement
//! are ignored with a warning (`lenient`), and callers parse the result into their type, so a
//! schema the grammar cannot fully express still ends in a typed check.

use crate::error::LlmError;
use crate::options::GenerateOptions;
use crate::tokenizer::SpecialTokens;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokenizers::decoders::DecoderWrapper;
use tokenizers::Tokenizer;

/// Options of the JSON grammar compiler, embedded as `x-guidance` in every schema.
fn json_options() -> serde_json::Value {
    serde_json::json!({
        "whitespace_flexible": false,
        "item_separator": ", ",
        "key_separator": ": ",
        "lenient": true,
    })
}

/// `schema` with the compiler options of this module (an existing `x-guidance` is kept).
pub fn with_json_options(schema: &serde_json::Value) -> serde_json::Value {
    let mut s = match schema {
        serde_json::Value::Object(_) => schema.clone(),
        // `true` (anything) or a malformed schema: any JSON value.
        _ => serde_json::json!({}),
    };
    close_objects(&mut s);
    if let Some(map) = s.as_object_mut() {
        map.entry("x-guidance").or_insert_with(json_options);
    }
    s
}

/// Marks every object schema that says nothing about extra keys as closed
/// (`"additionalProperties": false`). JSON Schema leaves such objects open, and a small model
/// decoding under an open object keeps inventing keys until it runs out of tokens; the
/// answers stay valid for the schema (a closed object is a subset of the open one) and the
/// types generated from it (serde ignores nothing it needs). An explicit
/// `additionalProperties` is kept.
fn close_objects(schema: &mut serde_json::Value) {
    use serde_json::Value;
    match schema {
        Value::Object(map) => {
            let is_object = map.contains_key("properties")
                || map.get("type").and_then(Value::as_str) == Some("object");
            if is_object && !map.contains_key("additionalProperties") {
                map.insert("additionalProperties".into(), Value::Bool(false));
            }
            bound_integer_format(map);
            for (key, v) in map.iter_mut() {
                // Keys whose values are data, not schemas.
                if matches!(
                    key.as_str(),
                    "enum" | "const" | "default" | "examples" | "x-guidance"
                ) {
                    continue;
                }
                close_objects(v);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(close_objects),
        _ => {}
    }
}

/// Gives an integer schema with a sized `format` (`uint8` … `int64`, as schemars writes for
/// Rust integers) the range of that type when it states none: without it the grammar allows
/// any number of digits, and a small model can write a number the type cannot hold.
fn bound_integer_format(map: &mut serde_json::Map<String, serde_json::Value>) {
    use serde_json::Value;
    let Some(format) = map.get("format").and_then(Value::as_str) else {
        return;
    };
    let (min, max): (i128, i128) = match format {
        "uint8" => (0, u8::MAX.into()),
        "uint16" => (0, u16::MAX.into()),
        "uint32" => (0, u32::MAX.into()),
        "uint64" | "uint" => (0, u64::MAX.into()),
        "int8" => (i8::MIN.into(), i8::MAX.into()),
        "int16" => (i16::MIN.into(), i16::MAX.into()),
        "int32" => (i32::MIN.into(), i32::MAX.into()),
        "int64" | "int" => (i64::MIN.into(), i64::MAX.into()),
        _ => return,
    };
    let to_json = |v: i128| {
        u64::try_from(v)
            .map(Value::from)
            .or_else(|_| i64::try_from(v).map(Value::from))
            .unwrap_or(Value::Null)
    };
    if !map.contains_key("minimum") && !map.contains_key("exclusiveMinimum") {
        map.insert("minimum".into(), to_json(min));
    }
    if !map.contains_key("maximum") && !map.contains_key("exclusiveMaximum") {
        map.insert("maximum".into(), to_json(max));
    }
}

/// How a vocabulary's token strings map to bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum VocabKind {
    /// GPT-2 style byte-level BPE: each byte is one printable character.
    ByteLevel,
    /// SentencePiece: `▁` is a space and `<0xNN>` tokens are single bytes.
    SentencePiece,
}

fn vocab_kind(tokenizer: &Tokenizer) -> Option<VocabKind> {
    if matches!(tokenizer.get_decoder(), Some(DecoderWrapper::ByteLevel(_))) {
        return Some(VocabKind::ByteLevel);
    }
    if tokenizer.token_to_id("<0x0A>").is_some() || tokenizer.token_to_id("▁").is_some() {
        return Some(VocabKind::SentencePiece);
    }
    None
}

/// GPT-2's byte-to-character table, inverted: printable bytes stand for themselves, the others
/// are shifted past U+0100 in order.
fn byte_level_chars() -> HashMap<char, u8> {
    let mut map = HashMap::with_capacity(256);
    let mut shifted = 0x100u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let c = if printable {
            char::from(b)
        } else {
            let c = char::from_u32(shifted).unwrap_or(char::REPLACEMENT_CHARACTER);
            shifted += 1;
            c
        };
        map.insert(c, b);
    }
    map
}

fn sentencepiece_byte(tok: &str) -> Option<u8> {
    let hex = tok.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// The bytes each token id of `tokenizer` stands for. Special (control) tokens are prefixed
/// with toktrie's `0xFF` marker so that no grammar text can produce them; ids without a token
/// are empty (never allowed).
pub fn token_bytes(tokenizer: &Tokenizer) -> Result<Vec<Vec<u8>>, LlmError> {
    let kind = vocab_kind(tokenizer).ok_or_else(|| {
        LlmError::Validation(
            "constrained decoding needs a byte-level BPE or SentencePiece vocabulary".into(),
        )
    })?;
    let n = tokenizer.get_vocab_size(true);
    let added = tokenizer.get_added_tokens_decoder();
    let chars = byte_level_chars();
    let mut out = Vec::with_capacity(n);
    for id in 0..n {
        let id32 = u32::try_from(id).unwrap_or(u32::MAX);
        if let Some(t) = added.get(&id32) {
            let mut b = Vec::with_capacity(t.content.len() + 1);
            if t.special {
                b.push(TokTrie::SPECIAL_TOKEN_MARKER);
            }
            b.extend_from_slice(t.content.as_bytes());
            out.push(b);
            continue;
        }
        let Some(tok) = tokenizer.id_to_token(id32) else {
            out.push(Vec::new());
            continue;
        };
        let bytes = match kind {
            VocabKind::ByteLevel => {
                let mapped: Option<Vec<u8>> = tok.chars().map(|c| chars.get(&c).copied()).collect();
                // A token outside the byte alphabet is taken literally.
                mapped.unwrap_or_else(|| tok.as_bytes().to_vec())
            }
            VocabKind::SentencePiece => match sentencepiece_byte(&tok) {
                Some(b) => vec![b],
                None => tok.replace('▁', " ").into_bytes(),
            },
        };
        out.push(bytes);
    }
    Ok(out)
}

/// The tokenizer as llguidance sees it: the token trie plus our tokenizer for forced text.
struct Env {
    trie: TokTrie,
    tokenizer: Tokenizer,
    canonical: bool,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        if self.canonical {
            if let Ok(text) = std::str::from_utf8(s) {
                if let Ok(enc) = self.tokenizer.encode(text, false) {
                    return enc.get_ids().to_vec();
                }
            }
        }
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        self.canonical
    }
}

/// The token environment of a model: its trie (with every stop token as end-of-sequence).
pub fn tok_env(tokenizer: &Tokenizer, specials: &SpecialTokens) -> Result<TokEnv, LlmError> {
    let words = token_bytes(tokenizer)?;
    let vocab = u32::try_from(words.len())
        .map_err(|_| LlmError::Validation("vocabulary too large".into()))?;
    let mut eos: Vec<u32> = specials
        .stop_ids
        .iter()
        .copied()
        .chain(specials.eos)
        .filter(|t| *t < vocab)
        .collect();
    eos.sort_unstable();
    eos.dedup();
    let first = *eos.first().ok_or_else(|| {
        LlmError::Validation("constrained decoding needs an end-of-sequence token".into())
    })?;
    // Byte-level BPE from the tokenizer library is canonical; SentencePiece normalizers may
    // prepend a space, so forced text is tokenized greedily from the trie instead.
    let canonical = vocab_kind(tokenizer) == Some(VocabKind::ByteLevel);
    let trie = std::panic::catch_unwind(|| {
        TokTrie::from(&TokRxInfo::new(vocab, first), &words).with_eos_tokens(&eos)
    })
    .map_err(|_| LlmError::Validation("cannot build a token trie for this vocabulary".into()))?;
    Ok(Arc::new(Env {
        trie,
        tokenizer: tokenizer.clone(),
        canonical,
    }))
}

/// A model's constrained-decoding machinery, built on first use (building the trie and the
/// parser factory's token slices takes a moment) and shared by all its requests.
#[derive(Default)]
pub struct Constraints {
    factory: OnceLock<Result<Arc<ParserFactory>, String>>,
    closers: OnceLock<Arc<Closers>>,
}

impl std::fmt::Debug for Constraints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraints")
            .field("built", &self.factory.get().is_some())
            .finish()
    }
}

impl Constraints {
    /// The parser factory for this tokenizer, built once.
    pub fn factory(
        &self,
        tokenizer: &Tokenizer,
        specials: &SpecialTokens,
    ) -> Result<Arc<ParserFactory>, LlmError> {
        self.factory
            .get_or_init(|| {
                let env = tok_env(tokenizer, specials).map_err(|e| e.to_string())?;
                let mut f = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
                f.quiet();
                Ok(Arc::new(f))
            })
            .clone()
            .map_err(LlmError::Validation)
    }

    /// The vocabulary's closing tokens, found once.
    pub fn closers(&self, factory: &ParserFactory) -> Arc<Closers> {
        self.closers
            .get_or_init(|| Arc::new(Closers::of(factory.tok_env().tok_trie())))
            .clone()
    }
}

/// The grammar a request's output must follow.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum GrammarSpec {
    /// A JSON value matching the schema.
    JsonSchema(serde_json::Value),
    /// A Lark grammar (llguidance's dialect; `%json {...}` embeds a schema).
    Lark(String),
}

impl GrammarSpec {
    /// The grammar `options` ask for: tool calls when tools are bound (and `tool_choice` is
    /// not `None`), else the `response_format`'s JSON, else none (free text).
    pub fn for_options(options: &GenerateOptions) -> Result<Option<GrammarSpec>, LlmError> {
        if let Some(g) = crate::tool_calls::tool_grammar(options)? {
            return Ok(Some(GrammarSpec::Lark(g)));
        }
        Ok(crate::tool_calls::response_schema(options).map(GrammarSpec::JsonSchema))
    }

    fn to_llguidance(&self) -> TopLevelGrammar {
        match self {
            GrammarSpec::JsonSchema(s) => TopLevelGrammar::from_json_schema(with_json_options(s)),
            GrammarSpec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        }
    }
}

/// The constraint for one request of a loaded model: `None` when `options` ask for free text.
/// A `response_prefix` (already part of the prompt) is consumed by the grammar first; a
/// prefix the grammar rejects is a validation error.
pub fn for_request(
    shared: &crate::engine::Shared,
    options: &GenerateOptions,
) -> Result<Option<Constraint>, LlmError> {
    let Some(grammar) = GrammarSpec::for_options(options)? else {
        return Ok(None);
    };
    let factory = shared
        .constraints
        .factory(&shared.tokenizer, &shared.specials)?;
    let mut c =
        Constraint::new(&factory, &grammar)?.with_closers(shared.constraints.closers(&factory));
    if let Some(prefix) = options.response_prefix.as_deref().filter(|p| !p.is_empty()) {
        let toks = shared.encode(prefix)?;
        let taken = c.matcher.try_consume_tokens(&toks).unwrap_or(0);
        c.feed(&toks[..taken.min(toks.len())]);
        if taken != toks.len() {
            return Err(LlmError::Validation(format!(
                "response_prefix {prefix:?} does not fit the output grammar"
            )));
        }
    }
    Ok(Some(c))
}

/// Time and work spent on the constraint during one generation.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ConstraintStats {
    /// Time to compile the grammar into a parser.
    pub compile_time: Duration,
    /// Time spent computing masks, applying them and advancing the parser.
    pub time: Duration,
    /// Masks computed (sampled tokens).
    pub masks: usize,
    /// Tokens the grammar forced (fed without sampling).
    pub forced_tokens: usize,
}

impl ConstraintStats {
    /// Milliseconds of constraint work per generated token.
    pub fn ms_per_token(&self) -> f64 {
        let n = self.masks + self.forced_tokens;
        if n == 0 {
            0.0
        } else {
            self.time.as_secs_f64() * 1e3 / n as f64
        }
    }
}

/// The grammar state of one generation.
pub struct Constraint {
    matcher: Matcher,
    mask: Option<SimpleVob>,
    stats: ConstraintStats,
    /// Tokens that only close open strings, arrays and objects (quotes, brackets, braces,
    /// whitespace), and those that may also start the next member (with commas).
    closers: Arc<Closers>,
    string: StringState,
}

/// What [`Constraint::wrap_up`] needs of a vocabulary: which tokens close a JSON string,
/// which close arrays and objects, and each token's bytes (to follow whether the output is
/// inside a string).
#[derive(Debug, Default)]
pub struct Closers {
    /// `"` then only `]`, `}`, `,` or whitespace: ends the current string.
    quote: Vec<u32>,
    /// Only `]`, `}` and whitespace, at least one bracket or brace.
    closing: Vec<u32>,
    /// Only `,`, `]`, `}` and whitespace, at least one comma.
    with_commas: Vec<u32>,
    /// Every token's bytes.
    bytes: Vec<Vec<u8>>,
}

impl Closers {
    /// The closers of a vocabulary.
    pub fn of(trie: &TokTrie) -> Self {
        let mut c = Closers::default();
        let tail = |b: &[u8]| {
            b.iter()
                .all(|x| matches!(x, b']' | b'}' | b',' | b' ' | b'\n'))
        };
        for id in 0..trie.vocab_size() as u32 {
            let bytes = trie.token(id);
            c.bytes.push(bytes.to_vec());
            match bytes.split_first() {
                Some((b'"', rest)) if tail(rest) => c.quote.push(id),
                Some(_)
                    if bytes
                        .iter()
                        .all(|x| matches!(x, b']' | b'}' | b' ' | b'\n'))
                        && bytes.iter().any(|x| matches!(x, b']' | b'}')) =>
                {
                    c.closing.push(id)
                }
                Some(_) if tail(bytes) && bytes.contains(&b',') => c.with_commas.push(id),
                _ => {}
            }
        }
        c
    }
}

fn grammar_error(e: impl std::fmt::Display) -> LlmError {
    LlmError::Validation(format!("cannot compile the output grammar: {e}"))
}

/// Whether the output so far ends inside a JSON string (a tiny lexer over its bytes).
#[derive(Clone, Copy, Debug, Default)]
struct StringState {
    inside: bool,
    escaped: bool,
}

impl StringState {
    fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.inside {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.inside = false;
                }
            } else if b == b'"' {
                self.inside = true;
            }
        }
    }
}

impl Constraint {
    /// A constraint for `grammar` over the factory's vocabulary.
    pub fn new(factory: &ParserFactory, grammar: &GrammarSpec) -> Result<Self, LlmError> {
        let start = Instant::now();
        let parser = factory
            .create_parser(grammar.to_llguidance())
            .map_err(grammar_error)?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(grammar_error(e));
        }
        Ok(Constraint {
            matcher,
            mask: None,
            stats: ConstraintStats {
                compile_time: start.elapsed(),
                ..ConstraintStats::default()
            },
            closers: Arc::new(Closers::default()),
            string: StringState::default(),
        })
    }

    /// The closing tokens [`Constraint::wrap_up`] steers towards (none by default).
    #[must_use]
    pub fn with_closers(mut self, closers: Arc<Closers>) -> Self {
        self.closers = closers;
        self
    }

    fn failed(&self) -> LlmError {
        LlmError::Backend(format!(
            "constraint failed: {}",
            self.matcher
                .get_error()
                .unwrap_or_else(|| "unknown error".into())
        ))
    }

    /// Sets every logit the grammar does not allow to −∞ (ids past the vocabulary too).
    pub fn apply(&mut self, logits: &mut [f32]) -> Result<(), LlmError> {
        let start = Instant::now();
        let mask = match self.matcher.compute_mask() {
            Ok(m) => m,
            Err(_) => return Err(self.failed()),
        };
        if mask.is_zero() {
            return Err(LlmError::Backend(
                "constraint allows no token (the grammar is unsatisfiable here)".into(),
            ));
        }
        let words = mask.as_slice();
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            let bits = words.get(w).copied().unwrap_or(0);
            if bits == u32::MAX {
                continue;
            }
            for (i, l) in chunk.iter_mut().enumerate() {
                if bits & (1 << i) == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        self.mask = Some(mask);
        self.stats.masks += 1;
        self.stats.time += start.elapsed();
        Ok(())
    }

    /// Steers the next token towards finishing the output: among the tokens the last mask
    /// allows, only end-of-sequence and tokens that close strings, arrays and objects keep
    /// their logits (or, when none of those is allowed, tokens that also hold commas, to get
    /// past a member the grammar still requires). Used in the last part of the token budget,
    /// so a long answer ends as valid, shorter JSON instead of being cut off at `max_tokens`.
    /// Does nothing when no such token is allowed (a number still needs its first digit).
    pub fn wrap_up(&self, logits: &mut [f32], end_tokens: &[u32]) {
        let Some(mask) = self.mask.as_ref() else {
            return;
        };
        let allowed = |t: &u32| (*t as usize) < logits.len() && mask.is_allowed(*t);
        let mut keep: Vec<u32> = end_tokens.iter().copied().filter(allowed).collect();
        if self.string.inside {
            // Inside a string, brackets are text: only a quote ends it.
            keep.extend(self.closers.quote.iter().copied().filter(allowed));
        } else {
            keep.extend(self.closers.closing.iter().copied().filter(allowed));
            if keep.is_empty() {
                keep.extend(self.closers.with_commas.iter().copied().filter(allowed));
            }
        }
        if keep.is_empty() {
            return;
        }
        let kept: Vec<(u32, f32)> = keep.iter().map(|&t| (t, logits[t as usize])).collect();
        logits.fill(f32::NEG_INFINITY);
        for (t, l) in kept {
            logits[t as usize] = if l.is_finite() { l } else { 0.0 };
        }
    }

    fn feed(&mut self, toks: &[u32]) {
        for t in toks {
            if let Some(b) = self.closers.bytes.get(*t as usize) {
                self.string.feed(b);
            }
        }
    }

    /// Whether `tok` was allowed by the last mask.
    pub fn allowed(&self, tok: u32) -> bool {
        self.mask.as_ref().is_none_or(|m| m.is_allowed(tok))
    }

    /// Advances the grammar by a sampled token.
    pub fn commit(&mut self, tok: u32) -> Result<(), LlmError> {
        let start = Instant::now();
        if self.matcher.consume_token(tok).is_err() {
            return Err(self.failed());
        }
        self.feed(&[tok]);
        self.mask = None;
        self.stats.time += start.elapsed();
        Ok(())
    }

    /// Tokens the grammar forces next (consumed by the grammar already; feed them to the
    /// model and output them without sampling). At most `limit` are taken.
    pub fn forced(&mut self, limit: usize) -> Result<Vec<u32>, LlmError> {
        if limit == 0 || self.matcher.is_stopped() {
            return Ok(Vec::new());
        }
        let start = Instant::now();
        let mut toks = self.matcher.compute_ff_tokens();
        toks.truncate(limit);
        if !toks.is_empty() && self.matcher.consume_tokens(&toks).is_err() {
            return Err(self.failed());
        }
        self.feed(&toks);
        if self.matcher.is_error() {
            return Err(self.failed());
        }
        self.stats.forced_tokens += toks.len();
        self.stats.time += start.elapsed();
        Ok(toks)
    }

    /// Whether the grammar is complete and allows nothing more (the output is finished).
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped() && !self.matcher.is_error()
    }

    /// Whether the output so far is a complete sentence of the grammar.
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }

    /// Time and work spent so far.
    pub fn stats(&self) -> ConstraintStats {
        self.stats
    }
}

/// Cost of constrained decoding on one model (see [`bench_constraint`]).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ConstraintBench {
    /// Time to build the token trie and parser factory (once per model, on first use).
    pub setup_ms: f64,
    /// Time to compile the benchmark's JSON schema into a parser (per request).
    pub compile_ms: f64,
    /// Tokens generated under the constraint (median run).
    pub tokens: usize,
    /// Of which forced by the grammar (fed without sampling).
    pub forced_tokens: usize,
    /// Mask computation, masking and parser updates per generated token.
    pub constraint_ms_per_token: f64,
    /// Decode time per token with the constraint (everything after the first token).
    pub decode_ms_per_token_constrained: f64,
    /// Decode time per token of the same prompt without a constraint.
    pub decode_ms_per_token_free: f64,
}

/// Measures the constraint's overhead on `engine`: greedy generation of a JSON object for a
/// fixed prompt, with the schema as `response_format` and without it, `runs` times each (after
/// one warm-up), reporting medians.
pub fn bench_constraint(
    engine: &mut crate::engine::Engine,
    runs: usize,
) -> Result<ConstraintBench, LlmError> {
    let shared = engine.shared();
    let t = Instant::now();
    let factory = shared
        .constraints
        .factory(&shared.tokenizer, &shared.specials)?;
    let setup_ms = t.elapsed().as_secs_f64() * 1e3;
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "country": {"type": "string"},
            "population": {"type": "integer", "minimum": 0},
            "landmarks": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        },
        "required": ["name", "country", "population", "landmarks"],
    });
    let t = Instant::now();
    Constraint::new(&factory, &GrammarSpec::JsonSchema(schema.clone()))?;
    let compile_ms = t.elapsed().as_secs_f64() * 1e3;
    let messages = [
        ferrograph_core::message::Message::system("Answer in JSON."),
        ferrograph_core::message::Message::human("Describe the city of Paris in detail."),
    ];
    let (prompt, _) = shared.chat_prompt(&messages, None, "")?;
    let constrained = GenerateOptions::greedy()
        .max_tokens(96)
        .json_schema("city", schema);
    let free = GenerateOptions::greedy().max_tokens(96);
    let per_token = |g: &crate::engine::Generation| {
        g.decode_time.as_secs_f64() * 1e3 / (g.tokens.len().max(2) - 1) as f64
    };
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let mut c_runs = Vec::new();
    let mut f_runs = Vec::new();
    for i in 0..=runs.max(1) {
        let c = engine.generate(&prompt, None, &constrained, &mut |_| {}, &|| false)?;
        let f = engine.generate(&prompt, None, &free, &mut |_| {}, &|| false)?;
        if i > 0 {
            c_runs.push(c);
            f_runs.push(f);
        }
    }
    c_runs.sort_by(|a, b| per_token(a).total_cmp(&per_token(b)));
    let mid = c_runs.get(c_runs.len() / 2);
    let stats = mid.and_then(|g| g.constraint).unwrap_or_default();
    Ok(ConstraintBench {
        setup_ms,
        compile_ms,
        tokens: mid.map(|g| g.tokens.len()).unwrap_or(0),
        forced_tokens: stats.forced_tokens,
        constraint_ms_per_token: median(
            c_runs
                .iter()
                .filter_map(|g| g.constraint.map(|s| s.ms_per_token()))
                .collect(),
        ),
        decode_ms_per_token_constrained: median(c_runs.iter().map(per_token).collect()),
        decode_ms_per_token_free: median(f_runs.iter().map(per_token).collect()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_table_covers_all_bytes() {
        let t = byte_level_chars();
        assert_eq!(t.len(), 256);
        assert_eq!(t.get(&'Ġ'), Some(&b' '));
        assert_eq!(t.get(&'Ċ'), Some(&b'\n'));
        assert_eq!(t.get(&'a'), Some(&b'a'));
    }

    #[test]
    fn sentencepiece_bytes() {
        assert_eq!(sentencepiece_byte("<0x0A>"), Some(b'\n'));
        assert_eq!(sentencepiece_byte("<0xFF>"), Some(0xFF));
        assert_eq!(sentencepiece_byte("<0x0>"), None);
        assert_eq!(sentencepiece_byte("hello"), None);
    }

    #[test]
    fn string_state_follows_quotes_and_escapes() {
        let mut st = StringState::default();
        st.feed(br#"{"a": "x}]"#);
        assert!(st.inside, "brackets inside a string are text");
        st.feed(br#"\"#);
        assert!(st.inside && st.escaped);
        st.feed(br#"""#);
        assert!(st.inside, "an escaped quote does not end the string");
        st.feed(br#"", "b": 1"#);
        assert!(!st.inside);
    }

    #[test]
    fn sized_integer_formats_get_their_range() {
        let s = with_json_options(&serde_json::json!({
            "type": "object",
            "properties": {
                "n": {"type": "integer", "format": "uint64", "minimum": 0},
                "m": {"type": "integer", "format": "int8", "maximum": 9},
                "f": {"type": "number", "format": "double"}
            }
        }));
        let p = &s["properties"];
        assert_eq!(p["n"]["maximum"], serde_json::json!(u64::MAX));
        assert_eq!(p["n"]["minimum"], 0);
        assert_eq!(
            (p["m"]["minimum"].clone(), p["m"]["maximum"].clone()),
            (serde_json::json!(-128), serde_json::json!(9))
        );
        assert!(p["f"].get("maximum").is_none());
    }

    #[test]
    fn objects_without_a_stance_on_extra_keys_are_closed() {
        let s = with_json_options(&serde_json::json!({
            "type": "object",
            "properties": {"a": {"type": "object", "properties": {}}, "b": {"type": "string"}},
            "$defs": {"Open": {"type": "object", "additionalProperties": true}},
            "enum": [{"type": "object"}]
        }));
        assert_eq!(s["additionalProperties"], false);
        assert_eq!(s["properties"]["a"]["additionalProperties"], false);
        assert!(s["properties"]["b"].get("additionalProperties").is_none());
        assert_eq!(s["$defs"]["Open"]["additionalProperties"], true);
        assert!(s["enum"][0].get("additionalProperties").is_none());
    }

    #[test]
    fn json_options_are_added() {
        let s = with_json_options(&serde_json::json!({"type": "object"}));
        assert_eq!(s["x-guidance"]["whitespace_flexible"], false);
        let keep = with_json_options(&serde_json::json!({"x-guidance": {"lenient": false}}));
        assert_eq!(keep["x-guidance"]["lenient"], false);
        assert!(with_json_options(&serde_json::json!(true)).is_object());
    }
}
