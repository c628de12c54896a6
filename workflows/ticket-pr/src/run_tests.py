# The ticket-to-PR test runner, run inside the sandbox by `python3 -I -B`:
#   _ferrograph_tests.py [--block-network] TEST_FILE...
# It imports each test file by path (the tree's root and `src/` on sys.path), runs its
# unittest cases and its plain `test_*` functions (pytest style: bare asserts, no fixtures),
# and prints one JSON result line after a marker. No pytest is needed.
import importlib.util
import inspect
import json
import os
import socket
import sys
import time
import traceback
import unittest

MARK = "@@FERROGRAPH_TESTS@@"
HERE = os.path.abspath(".")


def block_network():
    def refuse(*_args, **_kwargs):
        raise OSError("network access is disabled in the ferrograph sandbox")

    socket.socket = refuse
    socket.create_connection = refuse
    socket.getaddrinfo = refuse


def short(tb, limit=2500):
    tb = tb.replace(HERE + os.sep, "")
    return tb if len(tb) <= limit else "…" + tb[-limit:]


class Collect(unittest.TestResult):
    def __init__(self, out):
        super().__init__()
        self.out = out

    def addSuccess(self, test):
        self.out.append({"id": test.id(), "outcome": "passed", "detail": ""})

    def addFailure(self, test, err):
        self.out.append({"id": test.id(), "outcome": "failed",
                         "detail": short("".join(traceback.format_exception(*err)))})

    def addError(self, test, err):
        self.out.append({"id": test.id(), "outcome": "error",
                         "detail": short("".join(traceback.format_exception(*err)))})

    def addSkip(self, test, reason):
        self.out.append({"id": test.id(), "outcome": "skipped", "detail": str(reason)})


def run_file(path, results):
    name = "ferrograph_test_" + "".join(c if c.isalnum() else "_" for c in path)
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, path))
    if spec is None or spec.loader is None:
        results.append({"id": path, "outcome": "error", "detail": "not a Python file"})
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    folder = os.path.dirname(os.path.join(HERE, path))
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except BaseException:  # an import error is the test file's failure, reported as such
        results.append({"id": path, "outcome": "error",
                        "detail": short(traceback.format_exc())})
        return
    suite = unittest.defaultTestLoader.loadTestsFromModule(module)
    suite.run(Collect(results))
    for attr, fn in sorted(vars(module).items()):
        if not attr.startswith("test") or not inspect.isfunction(fn):
            continue
        if fn.__module__ != name:
            continue
        test_id = f"{path}::{attr}"
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.default is inspect.Parameter.empty]
        args = ()
        if [p.name for p in params] == ["self"]:
            # A method's signature written at module level: it gets no instance.
            params, args = [], (None,)
        if params:
            results.append({"id": test_id, "outcome": "error",
                            "detail": f"{attr} takes {', '.join(p.name for p in params)}: "
                                      "pytest fixtures are not available; write a test without arguments"})
            continue
        try:
            fn(*args)
            results.append({"id": test_id, "outcome": "passed", "detail": ""})
        except AssertionError:
            results.append({"id": test_id, "outcome": "failed",
                            "detail": short(traceback.format_exc())})
        except BaseException:
            results.append({"id": test_id, "outcome": "error",
                            "detail": short(traceback.format_exc())})


def main():
    args = sys.argv[1:]
    if args and args[0] == "--block-network":
        block_network()
        args = args[1:]
    for root in (os.path.join(HERE, "src"), HERE):
        if os.path.isdir(root) and root not in sys.path:
            sys.path.insert(0, root)
    started = time.time()
    results = []
    for path in args:
        run_file(path, results)
    print(MARK + json.dumps({"tests": results, "duration": time.time() - started}), flush=True)


main()
