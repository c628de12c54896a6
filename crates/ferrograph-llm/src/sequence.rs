//! One generation in progress ([`Sequence`]): its KV cache, sampler, output grammar, stop
//! rule and text, advanced one forward pass at a time. [`Engine::generate`] runs one
//! sequence to its end; the model actor ([`crate::actor`]) keeps several in flight and runs
//! their forward passes together ([`Engine::forward_many`]): continuous batching.
//!
//! A step of a sequence is: [`Sequence::next_feed`] says which tokens it needs run (a chunk
//! of its prompt, or the tokens it just chose) or that it has ended; the engine runs them;
//! [`Engine::fed`] hands it the logits. Nothing in a step depends on the other sequences of
//! the batch, so a sequence gives the same tokens batched as alone.

use crate::constrain::Constraint;
use crate::engine::{Engine, FinishReason, Generation, Shared, Weights};
use crate::error::LlmError;
use crate::options::GenerateOptions;
use crate::sampling::Sampler;
use crate::text::{Detokenizer, StopFilter};
use ferrograph_kernels::decoder::{forward_batch, BatchItem};
use std::time::{Duration, Instant};

/// Where a sequence is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Computing its prompt.
    Prefill,
    /// Choosing tokens.
    Decode,
    /// Ended ([`Sequence::finish`] says why).
    Done,
}

/// A generation in progress (see the module documentation).
pub(crate) struct Sequence {
    /// The model with this sequence's KV cache.
    pub(crate) w: Weights,
    /// Whether `w` is the engine's base model, lent out (models that cannot be cloned).
    lent: bool,
    /// Prompt tokens: the start of `history`.
    prompt_len: usize,
    /// Where a cacheable prefix (the system prompt) of the prompt ends.
    hint: Option<usize>,
    /// Prompt lengths after which a snapshot is remembered for requests waiting to share them
    /// ([`Sequence::share_prefix`]).
    share_at: Vec<usize>,
    /// Prompt tokens served from the prefix cache.
    cached: usize,
    /// Tokens in the KV cache.
    pub(crate) pos: usize,
    /// The tokens of the forward pass this sequence waits for (at positions `pos..`).
    pub(crate) feed: Vec<u32>,
    options: GenerateOptions,
    max_ctx: usize,
    started: Instant,
    prefill_time: Duration,
    decode_start: Instant,
    sampler: Sampler,
    /// The prompt, then every generated token (the repetition penalty reads it).
    history: Vec<u32>,
    detok: Detokenizer,
    stops: StopFilter,
    generated: Vec<u32>,
    ttft: Option<Duration>,
    finish: FinishReason,
    constraint: Option<Constraint>,
    /// Tokens chosen (or forced by the grammar) but not yet output nor fed to the model.
    pending: Vec<u32>,
    logits: Vec<f32>,
    phase: Phase,
}

impl Sequence {
    /// Decides the next forward pass: `Ok(true)` with [`Sequence::feed`] set, or `Ok(false)`
    /// when the sequence has ended. While prefilling, at most `chunk` prompt tokens go in one
    /// pass (all of them with `None`); a chunk never crosses the end of the cacheable
    /// prefix, which is remembered on the way. While decoding, this samples the next token,
    /// outputs text through `on_piece` and applies the stop rules. `cancelled` is polled
    /// between passes.
    pub(crate) fn next_feed(
        &mut self,
        shared: &Shared,
        chunk: Option<usize>,
        on_piece: &mut dyn FnMut(&str),
        cancelled: &dyn Fn() -> bool,
    ) -> Result<bool, LlmError> {
        match self.phase {
            Phase::Done => Ok(false),
            Phase::Prefill => {
                if cancelled() {
                    return Ok(self.end(FinishReason::Cancelled));
                }
                let mut end = self.prompt_len;
                if let Some(c) = chunk {
                    end = end.min(self.pos + c.max(1));
                }
                for cut in self.hint.iter().chain(&self.share_at) {
                    if *cut > self.pos && *cut < end {
                        end = *cut;
                    }
                }
                self.feed.clear();
                self.feed.extend_from_slice(&self.history[self.pos..end]);
                Ok(true)
            }
            Phase::Decode => self.decode_step(shared, on_piece, cancelled),
        }
    }

    /// Whether its prompt is still being computed.
    pub(crate) fn prefilling(&self) -> bool {
        self.phase == Phase::Prefill
    }

    /// Its prompt.
    pub(crate) fn prompt(&self) -> &[u32] {
        &self.history[..self.prompt_len]
    }

    /// Asks for its KV cache after the first `n` prompt tokens to be remembered in the
    /// prefix cache, for a request that waits to share them: the prefill stops there once.
    /// Nothing happens when those tokens are already computed.
    pub(crate) fn share_prefix(&mut self, n: usize) {
        if self.phase == Phase::Prefill
            && n > self.pos
            && n < self.prompt_len
            && !self.share_at.contains(&n)
        {
            self.share_at.push(n);
        }
    }

    fn end(&mut self, why: FinishReason) -> bool {
        self.finish = why;
        self.phase = Phase::Done;
        false
    }

    /// Outputs what is pending and feeds it, or samples the next token: the generation loop,
    /// stopped where it needs the model.
    fn decode_step(
        &mut self,
        shared: &Shared,
        on_piece: &mut dyn FnMut(&str),
        cancelled: &dyn Fn() -> bool,
    ) -> Result<bool, LlmError> {
        let max_tokens = self.options.max_tokens;
        loop {
            if !self.pending.is_empty() {
                for &tok in &self.pending {
                    self.generated.push(tok);
                    self.history.push(tok);
                    if let Some(piece) = self.detok.push(shared, tok)? {
                        if self.stops.push(&piece, on_piece) {
                            return Ok(self.end(FinishReason::Stop));
                        }
                    }
                }
                if self.constraint.as_ref().is_some_and(|c| c.is_finished()) {
                    return Ok(self.end(FinishReason::Stop));
                }
                if self.generated.len() >= max_tokens
                    || self.pos + self.pending.len() >= self.max_ctx
                {
                    return Ok(self.end(FinishReason::Length));
                }
                self.feed = std::mem::take(&mut self.pending);
                return Ok(true);
            }
            if self.generated.len() >= max_tokens {
                return Ok(self.end(FinishReason::Length));
            }
            if cancelled() {
                return Ok(self.end(FinishReason::Cancelled));
            }
            if let Some(c) = self.constraint.as_mut() {
                c.apply(&mut self.logits)?;
                // The last quarter of the budget (at least 24 tokens): wind the output down
                // so that it ends as valid JSON rather than being cut off.
                let left = max_tokens.saturating_sub(self.generated.len());
                if left <= (max_tokens / 4).max(24) {
                    c.wrap_up(&mut self.logits, &shared.specials.stop_ids);
                }
            }
            if let Some(n) = self.options.no_repeat_ngram {
                crate::sampling::block_repeated_ngrams(&mut self.logits, &self.generated, n);
            }
            let tok = self.sampler.sample(&mut self.logits, &self.history);
            if self.ttft.is_none() {
                self.ttft = Some(self.started.elapsed());
            }
            if shared.specials.stop_ids.contains(&tok) {
                return Ok(self.end(FinishReason::Stop));
            }
            self.pending.push(tok);
            if let Some(c) = self.constraint.as_mut() {
                c.commit(tok)?;
                let room = max_tokens
                    .saturating_sub(self.generated.len() + 1)
                    .min(self.max_ctx.saturating_sub(self.pos + 2));
                self.pending.extend(c.forced(room)?);
            }
        }
    }
}

impl Engine {
    /// Starts a generation of `prompt` (checked against the options and the model) from the
    /// longest cached prefix of it.
    pub(crate) fn start(
        &mut self,
        prompt: &[u32],
        prefix_hint: Option<usize>,
        options: &GenerateOptions,
    ) -> Result<Sequence, LlmError> {
        options.validate()?;
        let started = Instant::now();
        let max_ctx = options.max_context.min(self.shared.info.context_length);
        if prompt.is_empty() {
            return Err(LlmError::Validation("empty prompt".into()));
        }
        if prompt.len() >= max_ctx {
            return Err(LlmError::Validation(format!(
                "prompt of {} tokens does not fit max_context {max_ctx}",
                prompt.len()
            )));
        }
        self.check_vocabulary(prompt)?;
        let constraint = crate::constrain::for_request(&self.shared, options)?;
        let (w, cached, lent) = self.start_state(prompt)?;
        Ok(Sequence {
            w,
            lent,
            prompt_len: prompt.len(),
            hint: prefix_hint,
            share_at: Vec::new(),
            cached,
            pos: cached,
            feed: Vec::new(),
            options: options.clone(),
            max_ctx,
            started,
            prefill_time: Duration::ZERO,
            decode_start: started,
            sampler: Sampler::new(options),
            history: prompt.to_vec(),
            detok: Detokenizer::default(),
            stops: StopFilter::new(&options.stop),
            generated: Vec::new(),
            ttft: None,
            finish: FinishReason::Length,
            constraint,
            pending: Vec::new(),
            logits: Vec::new(),
            phase: Phase::Prefill,
        })
    }

    /// Hands `seq` the logits of the pass over its [`Sequence::feed`].
    pub(crate) fn fed(&mut self, seq: &mut Sequence, logits: Vec<f32>) -> Result<(), LlmError> {
        seq.pos += seq.feed.len();
        seq.logits = logits;
        match seq.phase {
            Phase::Prefill if seq.pos < seq.prompt_len => {
                if seq.hint == Some(seq.pos) || seq.share_at.contains(&seq.pos) {
                    self.remember(seq.history[..seq.pos].to_vec(), &seq.w);
                }
                let pos = seq.pos;
                seq.share_at.retain(|n| *n > pos);
            }
            Phase::Prefill => {
                seq.prefill_time = seq.started.elapsed();
                self.remember(seq.history.clone(), &seq.w);
                seq.decode_start = Instant::now();
                seq.phase = Phase::Decode;
                // Tokens the output grammar forces before anything is sampled.
                if let Some(c) = seq.constraint.as_mut() {
                    let room = seq
                        .options
                        .max_tokens
                        .min(seq.max_ctx.saturating_sub(seq.pos + 1));
                    seq.pending = c.forced(room)?;
                }
            }
            Phase::Decode => {}
            Phase::Done => {
                return Err(LlmError::Backend(
                    "a finished sequence was given logits".into(),
                ))
            }
        }
        seq.feed.clear();
        Ok(())
    }

    /// Ends `seq`: the text held back for stop strings is released through `on_piece`, the
    /// conversation so far is remembered for a follow-up turn, and the model goes back.
    pub(crate) fn finish(
        &mut self,
        mut seq: Sequence,
        on_piece: &mut dyn FnMut(&str),
    ) -> Result<Generation, LlmError> {
        let tail = (|| {
            if seq.finish != FinishReason::Stop {
                if let Some(rest) = seq.detok.flush(&self.shared)? {
                    if seq.stops.push(&rest, on_piece) {
                        seq.finish = FinishReason::Stop;
                    }
                }
            }
            Ok::<(), LlmError>(())
        })();
        if let Err(e) = tail {
            self.release(seq);
            return Err(e);
        }
        if seq.finish != FinishReason::Stop {
            seq.stops.flush(on_piece);
        }
        // The cache now holds the prompt and every generated token but the last: a follow-up
        // turn that repeats this exchange starts from here.
        // (`history` is the prompt followed by the generated tokens.)
        if seq.generated.len() > 1 && seq.finish != FinishReason::Cancelled {
            let all = &seq.history[..seq.history.len() - 1];
            if all.len() == seq.pos {
                self.remember(all.to_vec(), &seq.w);
            }
        }
        let Sequence {
            w,
            lent,
            prompt_len,
            cached,
            started,
            prefill_time,
            decode_start,
            stops,
            generated,
            ttft,
            finish,
            constraint,
            ..
        } = seq;
        self.give_back(w, lent);
        Ok(Generation {
            text: stops.into_text(),
            tokens: generated,
            prompt_tokens: prompt_len,
            cached_prompt_tokens: cached,
            finish_reason: finish,
            prefill_time,
            time_to_first_token: ttft.unwrap_or_else(|| started.elapsed()),
            decode_time: decode_start.elapsed(),
            constraint: constraint.map(|c| c.stats()),
        })
    }

    /// Drops `seq` after an error, giving the model back.
    pub(crate) fn release(&mut self, seq: Sequence) {
        self.give_back(seq.w, seq.lent);
    }

    /// Whether several sequences can share a forward pass (our kernels; candle's models
    /// run one sequence at a time).
    pub fn batches(&self) -> bool {
        matches!(self.base, Some(Weights::Fast(_)))
    }

    /// Runs the pending pass of every sequence in `seqs`: in one batched pass on our
    /// kernels, else one after the other. One result per sequence, in order.
    pub(crate) fn forward_many(
        &self,
        seqs: &mut [&mut Sequence],
    ) -> Vec<Result<Vec<f32>, LlmError>> {
        let all_fast = seqs.iter().all(|s| matches!(s.w, Weights::Fast(_)));
        if seqs.len() > 1 && all_fast {
            let mut items: Vec<BatchItem<'_>> = Vec::with_capacity(seqs.len());
            for s in seqs.iter_mut() {
                let s: &mut Sequence = s;
                if let Weights::Fast(m) = &mut s.w {
                    items.push(BatchItem {
                        model: m,
                        tokens: &s.feed,
                        pos: s.pos,
                        // Refilled in place: its previous logits, about to be replaced.
                        logits: std::mem::take(&mut s.logits),
                    });
                }
            }
            let n = items.len();
            return match forward_batch(&mut items) {
                Ok(rows) => rows.into_iter().map(Ok).collect(),
                Err(e) => (0..n).map(|_| Err(LlmError::Backend(e.clone()))).collect(),
            };
        }
        seqs.iter_mut()
            .map(|s| {
                let s: &mut Sequence = s;
                self.logits(&mut s.w, &s.feed, s.pos)
            })
            .collect()
    }
}

impl Engine {
    /// Runs `prompts` together for benchmarks: one batched prefill of all of them, then `n`
    /// greedy decode steps of all of them (end-of-sequence ignored), each step one pass over
    /// every sequence (one after the other on candle's models). Returns the prefill and the
    /// decode durations; aggregate decode speed is `prompts.len() * n` over the second.
    pub fn bench_batch(
        &mut self,
        prompts: &[Vec<u32>],
        n: usize,
    ) -> Result<(Duration, Duration), LlmError> {
        self.forget_prefixes();
        let options = GenerateOptions::greedy();
        let mut seqs = Vec::with_capacity(prompts.len());
        for p in prompts {
            seqs.push(self.start(p, None, &options)?);
        }
        let result = self.bench_batch_steps(&mut seqs, n);
        for s in seqs {
            self.release(s);
        }
        result
    }

    fn bench_batch_steps(
        &mut self,
        seqs: &mut [Sequence],
        n: usize,
    ) -> Result<(Duration, Duration), LlmError> {
        // Each pass's logits go into the sequences, whose buffers the next pass refills, as
        // the model actor's steps do.
        fn keep(
            refs: &mut [&mut Sequence],
            results: Vec<Result<Vec<f32>, LlmError>>,
        ) -> Result<(), LlmError> {
            for (s, l) in refs.iter_mut().zip(results) {
                s.logits = l?;
            }
            Ok(())
        }
        let start = Instant::now();
        for s in seqs.iter_mut() {
            s.feed = s.history.clone();
        }
        let mut refs: Vec<&mut Sequence> = seqs.iter_mut().collect();
        let results = self.forward_many(&mut refs);
        keep(&mut refs, results)?;
        let prefill = start.elapsed();
        let start = Instant::now();
        for step in 0..n {
            for s in refs.iter_mut() {
                if step == 0 {
                    s.pos = s.prompt_len;
                } else {
                    s.pos += 1;
                }
                s.feed = vec![crate::sampling::argmax(&s.logits)];
            }
            let results = self.forward_many(&mut refs);
            keep(&mut refs, results)?;
        }
        Ok((prefill, start.elapsed()))
    }
}
