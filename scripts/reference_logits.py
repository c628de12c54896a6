#!/usr/bin/env python3
"""Greedy reference logits from llama.cpp (llama-cpp-python) for a GGUF model.

Feeds the prompt token ids in one batch, then decodes greedily for N steps, one token at a
time, and writes every step's logits. `crates/ferrograph-llm/tests/architectures.rs` compares
ferrograph's logits with these on the same file, position by position.

Usage: reference_logits.py MODEL.gguf IDS N OUT
  IDS  comma-separated prompt token ids (no BOS is added)
  N    greedy steps
  OUT  prefix: OUT.json gets {"tokens": [...], "rows": R, "vocab": V}; OUT.f32 gets R x V
       little-endian float32 logits (row 0 follows the prompt, row i follows token i-1)

KV cache and weights stay in float32 (type_k/type_v = 0) so that the comparison measures the
forward pass, not llama.cpp's default half-precision cache.
"""

import json
import sys

import numpy as np
from llama_cpp import Llama


def main() -> None:
    model, ids, steps, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    prompt = [int(x) for x in ids.split(",") if x]
    kwargs = dict(
        model_path=model,
        n_ctx=len(prompt) + steps + 16,
        n_batch=len(prompt),
        n_threads=2,
        logits_all=True,
        verbose=False,
        type_k=0,
        type_v=0,
    )
    try:
        llm = Llama(**kwargs)
    except ValueError:
        # Load again with llama.cpp's log on stderr, which says why.
        kwargs["verbose"] = True
        llm = Llama(**kwargs)
    llm.eval(prompt)
    rows = [np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)]
    tokens = []
    for _ in range(steps):
        tok = int(np.argmax(rows[-1]))
        tokens.append(tok)
        llm.eval([tok])
        rows.append(np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32))
    logits = np.stack(rows).astype("<f4")
    logits.tofile(out + ".f32")
    with open(out + ".json", "w") as f:
        json.dump({"tokens": tokens, "rows": logits.shape[0], "vocab": logits.shape[1]}, f)


if __name__ == "__main__":
    main()
