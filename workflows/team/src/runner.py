# The ferrograph team's test runner, run inside the sandbox by `python3 -I -B`.
# It compiles every Python file (lint), measures each function's cyclomatic complexity,
# discovers and runs the unittest suite under the standard library's line tracer (coverage
# of the program's own modules), and prints one result line after a marker.
import ast
import json
import os
import socket
import sys
import time
import trace
import unittest

MARK = "@@FERROGRAPH_RESULT@@"
HERE = os.path.abspath(".")
SELF = os.path.basename(__file__)


def block_network():
    def refuse(*_args, **_kwargs):
        raise OSError("network access is disabled in the ferrograph sandbox")

    socket.socket = refuse
    socket.create_connection = refuse
    socket.getaddrinfo = refuse


def python_files():
    out = []
    for root, dirs, files in os.walk(HERE):
        dirs[:] = [d for d in dirs if not d.startswith((".", "__"))]
        for f in sorted(files):
            if f.endswith(".py") and f != SELF:
                out.append(os.path.relpath(os.path.join(root, f), HERE))
    return sorted(out)


def is_test(path):
    return os.path.basename(path).startswith("test")


def complexity(tree):
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = 1
            for sub in ast.walk(node):
                if isinstance(sub, (ast.If, ast.For, ast.AsyncFor, ast.While, ast.IfExp, ast.ExceptHandler, ast.Assert)):
                    n += 1
                elif isinstance(sub, ast.BoolOp):
                    n += len(sub.values) - 1
                elif isinstance(sub, ast.comprehension):
                    n += 1 + len(sub.ifs)
                elif hasattr(ast, "match_case") and isinstance(sub, ast.match_case):
                    n += 1
            found.append((node.name, n))
    return found


def executable_lines(code):
    lines = set()
    stack = [code]
    while stack:
        c = stack.pop()
        for _start, _end, line in c.co_lines():
            if line is not None:
                lines.add(line)
        stack.extend(k for k in c.co_consts if hasattr(k, "co_lines"))
    return lines


def main():
    if "--block-network" in sys.argv:
        block_network()
    started = time.time()
    files = python_files()
    lint_errors, functions, executable = [], [], {}
    for path in files:
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
            code = compile(text, path, "exec")
            functions += [(f"{path}:{name}", n) for name, n in complexity(ast.parse(text))]
            if not is_test(path):
                executable[os.path.abspath(path)] = executable_lines(code)
        except (SyntaxError, ValueError, UnicodeDecodeError) as e:
            lint_errors.append(f"{path}: {e}")

    sys.path.insert(0, HERE)
    outcome = {}

    def run_suite():
        suite = unittest.TestLoader().discover(HERE, pattern="test*.py", top_level_dir=HERE)
        ids = []

        def walk(s):
            for t in s:
                if isinstance(t, unittest.TestSuite):
                    walk(t)
                else:
                    ids.append(t.id())

        walk(suite)
        result = unittest.TextTestRunner(stream=sys.stderr, verbosity=2).run(suite)
        outcome["ids"] = ids
        outcome["failed"] = [t.id() for t, _ in result.failures + result.errors]
        outcome["skipped"] = len(result.skipped)
        outcome["run"] = result.testsRun

    tracer = trace.Trace(count=1, trace=0, ignoredirs=[sys.prefix, sys.exec_prefix])
    tracer.runfunc(run_suite)
    counts = tracer.results().counts
    hit = {}
    for (filename, line), _n in counts.items():
        hit.setdefault(os.path.abspath(filename), set()).add(line)
    coverage, total_exec, total_hit = {}, 0, 0
    for path, lines in executable.items():
        if not lines:
            continue
        covered = len(lines & hit.get(path, set()))
        coverage[os.path.relpath(path, HERE)] = round(100.0 * covered / len(lines), 1)
        total_exec += len(lines)
        total_hit += covered
    worst = max(functions, key=lambda f: f[1]) if functions else ("", 0)
    print(MARK + json.dumps({
        "total": outcome.get("run", 0),
        "failed": outcome.get("failed", []),
        "skipped": outcome.get("skipped", 0),
        "test_ids": outcome.get("ids", []),
        "coverage": coverage,
        "coverage_percent": round(100.0 * total_hit / total_exec, 1) if total_exec else 0.0,
        "lint_errors": lint_errors,
        "max_complexity": worst[1],
        "most_complex": worst[0],
        "duration": round(time.time() - started, 3),
    }))


main()
