"""hnswlib on the vectors written by `ferrograph index bench-ann --out DIR`.

Same vectors, queries, exact answers, M and ef_construction as the ferrograph run
(DIR/params.json); inner-product space on unit vectors (= cosine). Prints one JSON object:
build time (all cores), and per ef one-thread QPS and recall@k, measured two ways: one
knn_query call per query (as an application calls it) and one batched call with
num_threads=1 (the engine alone, no Python per-query overhead).
"""
import json
import sys
import time
from pathlib import Path

import hnswlib
import numpy as np


def main() -> None:
    out = Path(sys.argv[1])
    p = json.loads((out / "params.json").read_text())
    n, dim, nq, k = p["n"], p["dim"], p["queries"], p["k"]
    base = np.fromfile(out / "base.f32", dtype="<f4").reshape(n, dim)
    queries = np.fromfile(out / "queries.f32", dtype="<f4").reshape(nq, dim)
    truth = np.fromfile(out / "truth.u64", dtype="<u8").reshape(nq, k)

    index = hnswlib.Index(space="ip", dim=dim)
    index.init_index(max_elements=n, M=p["m"], ef_construction=p["ef_construction"], random_seed=p["seed"])
    t = time.perf_counter()
    index.add_items(base, np.arange(n))
    build = time.perf_counter() - t

    def recall(labels: np.ndarray) -> float:
        return float(np.mean([len(set(labels[i]) & set(truth[i])) / k for i in range(nq)]))

    results = []
    for ef in p["efs"]:
        index.set_ef(max(ef, k))
        index.knn_query(queries[:20], k=k, num_threads=1)
        t = time.perf_counter()
        labels = np.empty((nq, k), dtype=np.uint64)
        for i in range(nq):
            labels[i] = index.knn_query(queries[i : i + 1], k=k, num_threads=1)[0][0]
        loop_s = time.perf_counter() - t
        t = time.perf_counter()
        batch_labels, _ = index.knn_query(queries, k=k, num_threads=1)
        batch_s = time.perf_counter() - t
        results.append(
            {
                "ef": ef,
                "qps": nq / loop_s,
                "qps_batched": nq / batch_s,
                "recall": recall(labels),
                "recall_batched": recall(batch_labels),
            }
        )
    print(
        json.dumps(
            {
                "engine": f"hnswlib {getattr(hnswlib, '__version__', '')}".strip(),
                "build_s": build,
                "results": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
