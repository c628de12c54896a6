#!/usr/bin/env python3
"""llama.cpp side of `ferrograph bench llm`: the same measurements as ferrograph-llm's
`bench_llm` (load time, time to first token, prefill and decode tok/s, peak RSS) on the same
GGUF and thread count, through llama-cpp-python (built from its sdist for this CPU).

Setup (compiles llama.cpp; about 10 minutes on 2 cores):
    python3 -m venv benches/peers/.venv
    CMAKE_ARGS="-DGGML_NATIVE=ON" benches/peers/.venv/bin/pip install --no-binary llama-cpp-python llama-cpp-python==0.3.36

Usage:
    benches/peers/.venv/bin/python benches/peers/llama_cpp_bench.py MODEL.gguf \
        [--threads N] [--prompt-tokens 128] [--gen-tokens 64] [--runs 3] [--json]

Method (mirrors bench_llm): one warm-up, then `runs` repetitions of: reset the context,
evaluate a prompt of exactly `prompt-tokens` tokens in one batch (prefill), take the greedy
token (time to first token), then decode `gen-tokens` tokens one by one greedily, ignoring
end-of-sequence (`decode_after_prompt_tok_s`); and decode `gen-tokens` tokens from a one-token
context (`decode_tok_s`, what llama-bench's tg measures). Medians are reported. Peak RSS is the process's VmHWM.
"""

import argparse
import json
import statistics
import sys
import time


def peak_rss_mib() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    try:
        import llama_cpp
        from llama_cpp import Llama
    except ImportError:
        sys.exit("llama-cpp-python is not installed in this interpreter; see the setup in --help")

    n_ctx = a.prompt_tokens + a.gen_tokens + 16
    t0 = time.perf_counter()
    llm = Llama(model_path=a.model, n_ctx=n_ctx, n_batch=max(a.prompt_tokens, 8),
                n_threads=a.threads, n_threads_batch=a.threads, logits_all=False, verbose=False)
    load_s = time.perf_counter() - t0

    text = ("The quick brown fox jumps over the lazy dog while the orchestra tunes its "
            "instruments and the city wakes up to another ordinary, remarkable day. ")
    unit = llm.tokenize(text.encode(), add_bos=False, special=False)
    prompt = (unit * (a.prompt_tokens // len(unit) + 1))[: a.prompt_tokens]

    def once(prompt_ids, n):
        llm.reset()
        start = time.perf_counter()
        llm.eval(prompt_ids)
        prefill = time.perf_counter() - start
        tok = int(llm._scores[-1].argmax())
        ttft = time.perf_counter() - start
        t = time.perf_counter()
        for _ in range(n):
            llm.eval([tok])
            tok = int(llm._scores[-1].argmax())
        return prefill, ttft, time.perf_counter() - t

    once(prompt[:8], 4)
    pre, ttft, dec, tg = [], [], [], []
    for _ in range(a.runs):
        p, t, d = once(prompt, a.gen_tokens)
        pre.append(len(prompt) / p)
        ttft.append(t * 1e3)
        dec.append(a.gen_tokens / d)
        # Decode from a one-token context (llama-bench's tg), as bench_llm's decode_tok_s.
        _, _, d = once(prompt[:1], a.gen_tokens)
        tg.append(a.gen_tokens / d)

    report = {
        "engine": "llama.cpp",
        "llama_cpp_python": getattr(llama_cpp, "__version__", "?"),
        "model": a.model,
        "threads": a.threads,
        "prompt_tokens": len(prompt),
        "gen_tokens": a.gen_tokens,
        "load_ms": load_s * 1e3,
        "ttft_ms": statistics.median(ttft),
        "prefill_tok_s": statistics.median(pre),
        "decode_tok_s": statistics.median(tg),
        "decode_after_prompt_tok_s": statistics.median(dec),
        "peak_rss_mib": peak_rss_mib(),
        "runs": a.runs,
    }
    if a.json:
        print(json.dumps(report))
    else:
        print(f"llama.cpp {report['llama_cpp_python']}, {a.threads} thread(s): load {report['load_ms']:.0f} ms, "
              f"ttft {report['ttft_ms']:.1f} ms, prefill {report['prefill_tok_s']:.1f} tok/s "
              f"({len(prompt)} tokens), decode {report['decode_tok_s']:.1f} tok/s ({a.gen_tokens} tokens; "
              f"{report['decode_after_prompt_tok_s']:.1f} after the prompt), "
              f"peak RSS {report['peak_rss_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
