"""The worker process of test_extreme_values.py: runs extreme-value cases on both engines.

Reads case keys (see extreme_cases.py), one per line, on stdin; for each, runs the case on the
reference and the native engine and writes a length-prefixed pickle of the two outcomes to the
stdout it was started with. Each outcome is ("ok", outputs, fallback ops) or ("raised", exception
type name, message). A crash (a signal, a sanitizer report) ends the process: the test sees it die
during that case and reports the case.
"""
import os
import pickle
import struct
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]


def run_case(case):
    import numpy as np
    from engine_harness import run_program

    outcomes = {}
    for engine in ("reference", "native"):
        try:
            with np.errstate(all="ignore"):
                outs, eng = run_program(case.build, case.inputs, engine, case.replication)
            outcomes[engine] = ("ok", [np.asarray(o) for o in outs], sorted(getattr(eng, "fallback_ops", ())))
        except Exception as e:  # noqa: BLE001 -- every Python exception is an outcome to compare
            outcomes[engine] = ("raised", type(e).__name__, str(e))
    return outcomes


def main() -> None:
    results = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # print_tensor and anything else printing goes to stderr, not into the results
    warnings.simplefilter("ignore")  # NumPy's overflow / invalid-value warnings are expected here
    from extreme_cases import CASES

    for line in sys.stdin:
        key = line.strip()
        if not key:
            continue
        data = pickle.dumps(run_case(CASES[key]))
        results.write(struct.pack("<Q", len(data)) + data)
        results.flush()


if __name__ == "__main__":
    main()
