#!/usr/bin/env python3
"""Plots of `ferrograph bench llm --peer llama-cpp --json` output: tok/s against prompt length
(prefill), against context depth (decode) and against concurrent sequences (aggregate decode),
ours and llama.cpp's, medians over the rounds with the per-round range as error bars. Writes
llm-vs-llama-cpp.png and .svg into the output folder.

Usage: scripts/plot-llm-bench.py COMPARISON.json [MORE.json ...] OUT_DIR
(each JSON file one model/thread count; they share the figure, one row of panels each).
Needs matplotlib (scripts/bench-llm-peers.sh installs it into .peers/plot-venv).
"""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PANELS = [
    ("prefill", "prompt tokens", "prefill tok/s"),
    ("decode", "context depth (tokens)", "decode tok/s"),
    ("concurrent", "concurrent sequences", "aggregate decode tok/s"),
]


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def series(runs, shape):
    """(x, median, low, high) over the rounds of one engine."""
    by_at = {}
    for fig in runs:
        for p in fig[shape]:
            by_at.setdefault(p["at"], []).append(p["tok_s"])
    xs = sorted(by_at)
    med = [median(by_at[x]) for x in xs]
    lo = [m - min(by_at[x]) for x, m in zip(xs, med)]
    hi = [max(by_at[x]) - m for x, m in zip(xs, med)]
    return xs, med, lo, hi


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    files, out = sys.argv[1:-1], Path(sys.argv[-1])
    out.mkdir(parents=True, exist_ok=True)
    reports = [json.loads(Path(f).read_text()) for f in files]
    fig, axes = plt.subplots(len(reports), 3, figsize=(15, 4.2 * len(reports)), squeeze=False)
    for row, rep in zip(axes, reports):
        for ax, (shape, xlabel, ylabel) in zip(row, PANELS):
            for runs, label, style in [
                (rep["ours"], "ferrograph", "o-"),
                (rep["llama_cpp"], "llama.cpp", "s--"),
            ]:
                xs, med, lo, hi = series(runs, shape)
                ax.errorbar(xs, med, yerr=[lo, hi], fmt=style, capsize=3, label=label)
            if shape != "decode":
                ax.set_xscale("log", base=2)
            ax.set_xticks(xs)
            ax.set_xticklabels([str(x) for x in xs])
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            ax.set_title(f"{rep['model']}, {rep['threads']} thread(s)")
            ax.legend()
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(out / f"llm-vs-llama-cpp.{ext}", dpi=110)
    print(f"wrote {out / 'llm-vs-llama-cpp.png'} and .svg")


if __name__ == "__main__":
    main()
