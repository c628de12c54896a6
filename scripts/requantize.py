#!/usr/bin/env python3
"""Requantize a GGUF with llama.cpp's quantizer (through llama-cpp-python), for benchmarking
other block types of the same model: SmolLM2-135M ships as Q4_1 only in models/models.toml.

Requantizing an already-quantized file (allow_requantize) loses some quality; it is meant for
speed and kernel-correctness comparisons, not for serving.

Usage:
    benches/peers/.venv/bin/python scripts/requantize.py IN.gguf OUT.gguf TYPE
    TYPE: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K_M, Q4_K_S, Q6_K
Example (the three extra SmolLM2 files of the README's ratio table):
    for t in Q4_0 Q8_0 Q4_K_M; do
      benches/peers/.venv/bin/python scripts/requantize.py \\
        models/smollm2-135m-instruct-q4_1/SmolLM2-135M-Instruct.Q4_1.gguf \\
        models/smollm2-135m-requant/SmolLM2-135M-Instruct.$t.gguf $t
    done
"""

import ctypes
import os
import sys


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    src, dst, ty = sys.argv[1:]
    try:
        import llama_cpp
    except ImportError:
        sys.exit("llama-cpp-python is not installed in this interpreter (scripts/setup-peers.sh)")
    name = "LLAMA_FTYPE_MOSTLY_" + ty.upper()
    ftype = getattr(llama_cpp, name, None)
    if ftype is None:
        sys.exit(f"unknown type {ty}")
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 1
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    if rc != 0:
        sys.exit(f"quantization failed ({rc})")
    print(dst)


if __name__ == "__main__":
    main()
