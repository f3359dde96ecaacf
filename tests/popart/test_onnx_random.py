"""ONNX's random ops through an InferenceSession: distributions, seeds and per-step freshness."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import popart
from popart_helpers import make_model, make_session

N = helper.make_node


def _run(model, feeds=None, steps: int = 1, seed=None):
    s, anchors = make_session(model, steps=steps)
    if seed is not None:
        s.setRandomSeed(seed)
    s.run(popart.PyStepIO(dict(feeds or {}), anchors))
    first = {k: v.copy() for k, v in anchors.items()}
    s.run(popart.PyStepIO(dict(feeds or {}), anchors))
    return first, anchors


def test_normal_and_uniform_have_their_distributions_and_dtypes():
    nodes = [N("RandomNormal", [], ["n"], shape=[200, 500], mean=2.0, scale=0.5),
             N("RandomUniform", [], ["u"], shape=[200, 500], low=-1.0, high=3.0, dtype=TensorProto.FLOAT16)]
    first, _ = _run(make_model(nodes, {}, ["n", "u"]))
    n, u = first["n"], first["u"]
    assert n.shape == (200, 500) and n.dtype == np.float32 and u.dtype == np.float16
    assert abs(n.mean() - 2.0) < 0.01 and abs(n.std() - 0.5) < 0.01  # 1e5 samples: 5+ sigma margins
    assert u.min() >= -1.0 and u.max() <= 3.0 and abs(u.astype(np.float64).mean() - 1.0) < 0.02


def test_like_ops_take_shape_and_dtype_from_their_input_and_bernoulli_follows_p():
    p = np.tile(np.array([0.0, 0.25, 0.9, 1.0], np.float32), (20000, 1))
    nodes = [N("RandomUniformLike", ["p"], ["u"]), N("RandomNormalLike", ["p"], ["n"], dtype=TensorProto.FLOAT16),
             N("Bernoulli", ["p"], ["b"], dtype=TensorProto.INT32)]
    first, _ = _run(make_model(nodes, {"p": p}, ["u", "n", "b"]), {"p": p})
    u, n = first["u"], first["n"]
    assert u.shape == p.shape and u.dtype == np.float32 and n.dtype == np.float16
    assert u.min() >= 0.0 and u.max() < 1.0 and abs(u.mean() - 0.5) < 0.005  # 8e4 samples
    n64 = n.astype(np.float64)
    assert abs(n64.mean()) < 0.02 and abs(n64.std() - 1.0) < 0.02
    b = first["b"]
    assert b.dtype == np.int32 and set(np.unique(b)) <= {0, 1}
    assert (b[:, 0] == 0).all() and (b[:, 3] == 1).all()  # p = 0 and p = 1 are exact
    np.testing.assert_allclose(b.mean(0)[1:3], [0.25, 0.9], atol=0.015)  # 5+ sigma for 2e4 draws


def test_a_seed_attribute_repeats_values_and_no_seed_draws_fresh_ones_each_run():
    model = make_model([N("RandomNormal", [], ["a"], shape=[64], seed=3.0), N("RandomNormal", [], ["b"], shape=[64]),
                        N("RandomNormal", [], ["c"], shape=[64], seed=4.0)], {}, ["a", "b", "c"])
    first, second = _run(model)
    np.testing.assert_array_equal(first["a"], second["a"])
    assert not np.array_equal(first["b"], second["b"])
    assert not np.array_equal(first["a"], first["c"])
    # another session: the seeded op gives the same values again
    again, _ = _run(model)
    np.testing.assert_array_equal(again["a"], first["a"])


def test_set_random_seed_makes_unseeded_ops_reproducible_and_steps_differ():
    model = make_model([N("RandomUniform", [], ["u"], shape=[32])], {}, ["u"])
    a, _ = _run(model, steps=2, seed=11)
    b, _ = _run(model, steps=2, seed=11)
    np.testing.assert_array_equal(a["u"], b["u"])
    assert not np.array_equal(a["u"][0], a["u"][1])  # each step of a run draws anew


def test_random_ops_need_a_shape():
    with pytest.raises(popart.OnnxImportError, match="RandomNormal\\): required attribute\\(s\\) 'shape'"):
        _run(make_model([N("RandomNormal", [], ["y"])], {}, ["y"]))


def test_an_unseeded_random_op_in_a_subgraph_is_refused_by_name():
    body = helper.make_graph([N("RandomNormal", [], ["r"], shape=[2])], "body", [],
                             [helper.make_tensor_value_info("r", TensorProto.FLOAT, [2])])
    c = np.array(True)
    model = make_model([N("If", ["c"], ["y"], then_branch=body, else_branch=body)], {"c": c}, ["y"])
    with pytest.raises(popart.OnnxImportError, match="RandomNormal.*inside an If/Loop/Scan body.*seed attribute"):
        _run(model, {"c": c})
