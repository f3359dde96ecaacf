"""ONNX's own backend node tests, run through the popart backend adapter (popart.onnx.backend).

The node tests ship with the ``onnx`` package (generated from ``onnx.backend.test.case.node``). The
selection is derived from the importer's op table: a node test is in scope when every node of its
model is an op type in ``popart.onnx.OPS``. Of those, the cases below that need a feature popart
does not have are excluded, each group with its reason; everything else must pass.
"""
from __future__ import annotations

import re
import warnings
from typing import Dict, Iterable, List

import onnx
import onnx.backend.test
from onnx.backend.test.loader import load_node_model_tests

from popart.onnx import OPS
from popart.onnx.backend import PopartBackend
from popart.onnx.functions import expand_functions
from popart.onnx.importer import MIN_OPSET, op_key


def _op_types(graph: onnx.GraphProto) -> set:
    """Every op key in ``graph``, including those of subgraphs held in attributes."""
    found = set()
    for node in graph.node:
        found.add(op_key(node))
        for a in node.attribute:
            for g in list(a.graphs) + ([a.g] if a.HasField("g") else []):
                found |= _op_types(g)
    return found


with warnings.catch_warnings():  # some generators divide by zero on purpose
    warnings.simplefilter("ignore")
    NODE_TESTS = load_node_model_tests()


def _opset(model: onnx.ModelProto) -> int:
    """The model's ai.onnx opset (0 when it imports none: such models use other domains only)."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _importable(model: onnx.ModelProto) -> bool:
    """Every op of the model is in the importer's table, once ops defined as functions of other
    ops are expanded (as the importer does)."""
    if _op_types(model.graph) <= set(OPS):
        return True
    if not _opset(model):
        return False
    expanded, _ = expand_functions(model, OPS, _opset(model))
    return _op_types(expanded.graph) <= set(OPS)


# In scope: node tests whose every op the importer can lower.
IN_SCOPE = sorted(c.name for c in NODE_TESTS if _importable(c.model))
_BY_NAME = {c.name: c for c in NODE_TESTS}

# Element types popxl has no dtype for (the device has float32/float16, float8 143/152 (ONNX's
# FLOAT8E4M3FNUZ/FLOAT8E5M2FNUZ), 8/16/32-bit integers and bool; 64-bit types are held in their
# 32-bit counterparts).
_UNSUPPORTED_TYPES = {getattr(onnx.TensorProto, t) for t in (
    "STRING", "BFLOAT16", "FLOAT8E4M3FN", "FLOAT8E5M2", "FLOAT8E8M0", "FLOAT4E2M1", "INT4", "UINT4", "INT2",
    "UINT2", "COMPLEX64", "COMPLEX128") if hasattr(onnx.TensorProto, t)}


def _value_infos(model: onnx.ModelProto) -> Iterable[onnx.ValueInfoProto]:
    return list(model.graph.input) + list(model.graph.output)


def _needs_unsupported_type(model: onnx.ModelProto) -> bool:
    return any(vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type in _UNSUPPORTED_TYPES
               for vi in _value_infos(model))


def _needs_non_tensor_value(model: onnx.ModelProto) -> bool:
    return any(not vi.type.HasField("tensor_type") for vi in _value_infos(model))


# Excluded groups derived from the models themselves: reason -> test names.
DERIVED_EXCLUSIONS: Dict[str, List[str]] = {
    # The importer reads ai.onnx opsets 11 and later (older models: onnx.version_converter).
    f"ai.onnx opset below {MIN_OPSET}": [n for n in IN_SCOPE if _opset(_BY_NAME[n].model) < MIN_OPSET],
    # bfloat16, ONNX float8/float4, int4/int2 and string tensors: dtypes popxl does not have.
    "element type popxl lacks": [n for n in IN_SCOPE if _needs_unsupported_type(_BY_NAME[n].model)],
    # Optional and sequence values: popart moves tensors only.
    "optional/sequence values": [n for n in IN_SCOPE if _needs_non_tensor_value(_BY_NAME[n].model)],
}

# Excluded by name: regex -> reason.
NAMED_EXCLUSIONS: Dict[str, str] = {
    # Training-mode attributes/inputs: an InferenceSession neither updates BatchNormalization's running
    # statistics nor applies dropout (and ONNX's expected dropout masks come from NumPy's RNG).
    r"^test_batchnorm_.*_training_mode$": "training mode",
    r"^test_training_dropout": "training mode",
    # MaxPool's second output (Indices) and storage_order: popxl's max_pool has no indices output.
    r"^test_maxpool_with_argmax_": "MaxPool Indices output",
    # Resize features popxl's interpolate does not have.
    r"^test_resize_.*_antialias$": "Resize antialias",
    r"^test_resize_tf_crop_and_resize": "Resize tf_crop_and_resize",
    r"^test_resize_.*_not_(larger|smaller)$": "Resize keep_aspect_ratio_policy",
    r"^test_resize_.*_cubic_A_n0p5_exclude_outside$": "Resize cubic_coeff_a/exclude_outside",
    r"^test_resize_.*_half_pixel_symmetric$": "Resize half_pixel_symmetric (opset 19)",
    # float16 rounding: 2 of 192 outputs differ by one float16 ulp from the reference (different
    # rounding order in the composed attention), which exceeds the test's rtol of 1e-3.
    r"^test_attention_4d_causal_fp16(_expanded)?$": "float16 last-ulp differences",
    # Random draws: the expected values are NumPy's generator's; popart's come from its own
    # counter-based generator (tests/popart/test_onnx_random.py checks the distributions).
    r"^test_bernoulli": "random values of another generator",
    # The expected inverse DFT was computed with a float32 FFT: entries that are exactly 0 carry
    # ~1.9e-7 of its rounding noise, above the runner's atol of 1e-7; ours are exactly 0.
    r"^test_dft_inverse(_opset19)?$": "float32 FFT rounding noise in the expected output",
}


def excluded() -> Dict[str, str]:
    """In-scope test name -> the reason it is excluded."""
    out = {}
    for reason, names in DERIVED_EXCLUSIONS.items():
        out.update({n: reason for n in names})
    for pattern, reason in NAMED_EXCLUSIONS.items():
        rx = re.compile(pattern)
        out.update({n: reason for n in IN_SCOPE if rx.search(n) and n not in out})
    return out


EXCLUDED = excluded()
SELECTED = [n for n in IN_SCOPE if n not in EXCLUDED]

backend_test = onnx.backend.test.BackendTest(PopartBackend, __name__)
# One include pattern over the selected names (CPU only: the backend supports no other device).
backend_test.include("^(" + "|".join(re.escape(n) for n in SELECTED) + ")_cpu$")
for _pattern in NAMED_EXCLUSIONS:
    backend_test.exclude(_pattern)
for _reason, _names in DERIVED_EXCLUSIONS.items():
    if _names:
        backend_test.exclude("^(" + "|".join(re.escape(n) for n in _names) + ")_cpu$")

# Only the node tests are collected (the other categories hold models downloaded from the web or
# older converted models); of those, only the in-scope CPU cases, so the excluded ones show as
# skipped with their pattern and out-of-scope ones do not clutter the report.
OnnxBackendNodeModelTest = backend_test.test_cases["OnnxBackendNodeModelTest"]
_KEEP = {f"{n}_cpu" for n in IN_SCOPE}
for _name in [a for a in vars(OnnxBackendNodeModelTest) if a.startswith("test_") and a not in _KEEP]:
    delattr(OnnxBackendNodeModelTest, _name)


def test_selection_is_derived_from_the_op_table():
    # Nothing in scope is silently dropped; and ops the table does not list but ONNX defines as
    # functions of ops it does come in through their expansion (which the importer runs too).
    assert SELECTED and set(SELECTED) | set(EXCLUDED) == set(IN_SCOPE)
    by_expansion = [n for n in SELECTED if not _op_types(_BY_NAME[n].model.graph) <= set(OPS)]
    for prefix in ("test_rms_normalization", "test_swish", "test_attention_"):
        assert any(n.startswith(prefix) for n in by_expansion), prefix
    assert "RMSNormalization" not in OPS and "Swish" not in OPS and "Attention" not in OPS
