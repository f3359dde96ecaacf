"""ONNX Div and Mod on integers, imported through popart and run on both engines, against
Python's integer arithmetic: Div truncates toward zero (ONNX's rule), Mod with fmod=0 takes the
divisor's sign and with fmod=1 the dividend's. A divisor of 0 gives 0, and the most negative value
divided by -1 wraps to itself (two's complement), remainder 0: an untrusted model fed INT_MIN and -1
must not kill the process (it did, with SIGFPE).
"""
import numpy as np
import pytest
from onnx import helper

from engine_harness import engine
from popart_helpers import make_model, run_session
from extreme_values import SIGNED, UNSIGNED, all_pairs, c_remainder, oracle, python_remainder, trunc_quotient


# The importer holds 64-bit integers in their 32-bit counterparts (the device has no 64-bit types,
# as an IPU): their extremes are the 32-bit ones.
DEVICE = {np.int64: np.int32, np.uint64: np.uint32}


@pytest.mark.parametrize("engine_name", ["native", "reference"])
@pytest.mark.parametrize("dtype", SIGNED + UNSIGNED, ids=lambda d: np.dtype(d).name)
def test_div_and_mod_of_every_extreme_pair(dtype, engine_name):
    device = DEVICE.get(dtype, dtype)
    a, b = all_pairs(device)
    nodes = [helper.make_node("Div", ["a", "b"], ["q"]),
             helper.make_node("Mod", ["a", "b"], ["m"], fmod=0),
             helper.make_node("Mod", ["a", "b"], ["f"], fmod=1)]
    feeds = {"a": a.astype(dtype), "b": b.astype(dtype)}
    model = make_model(nodes, feeds, ["q", "m", "f"], opset=13)
    with engine(engine_name):
        q, m, f = run_session(model, feeds, ["q", "m", "f"])
    for got, fn in ((q, trunc_quotient), (m, python_remainder), (f, c_remainder)):
        np.testing.assert_array_equal(got, oracle(fn, a, b).astype(dtype))
