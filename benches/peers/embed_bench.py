"""sentence-transformers (torch, CPU) on the same model folder and sentences as
`ferrograph index bench-embed`.

Usage: embed_bench.py MODEL_DIR SENTENCES_FILE BATCH RUNS [FERROGRAPH_VECTORS]
Prints one JSON object: sentences/s (best of RUNS, after a warm-up) and, when the
ferrograph vectors are given, the cosine similarity between the two engines' vectors
(mean and minimum over the sentences) as a correctness check.
"""
import json
import sys
import time

import numpy as np
import torch
from sentence_transformers import SentenceTransformer, models


def main() -> None:
    model_dir, sentences_file, batch, runs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    ours = sys.argv[5] if len(sys.argv) > 5 else None
    sentences = [l for l in open(sentences_file, encoding="utf-8").read().splitlines() if l.strip()]
    word = models.Transformer(model_dir, max_seq_length=256)
    pool = models.Pooling(word.get_word_embedding_dimension(), pooling_mode="mean")
    model = SentenceTransformer(modules=[word, pool, models.Normalize()], device="cpu")
    model.encode(sentences[:8], batch_size=batch)
    best = float("inf")
    vecs = None
    for _ in range(max(runs, 1)):
        t = time.perf_counter()
        vecs = model.encode(sentences, batch_size=batch, convert_to_numpy=True)
        best = min(best, time.perf_counter() - t)
    report = {
        "engine": "sentence-transformers",
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "sentences": len(sentences),
        "batch_size": batch,
        "seconds": best,
        "sentences_per_s": len(sentences) / best,
    }
    if ours:
        o = np.fromfile(ours, dtype="<f4").reshape(len(sentences), -1)
        cos = np.sum(o * vecs, axis=1)
        report["cosine_vs_ferrograph_mean"] = float(cos.mean())
        report["cosine_vs_ferrograph_min"] = float(cos.min())
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
