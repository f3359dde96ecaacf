"""The op registry covers every public op: a shape/dtype rule, a kernel (or lowering) and an
explicit gradient decision for each."""
import pytest

import popxl.ops as ops
from popxl.op import REGISTRY, Grad
from popxl.ops import collectives, var_updates

# public functions that trace an op registered under another name (or are not ops)
ALIASES = {
    "clamp": "clip", "rename": "identity", "flatten": "reshape", "flatten_": "reshape_", "squeeze": "reshape",
    "call_with_info": "call", "repeat_with_info": "repeat", "conditional": "if", "conditional_with_info": "if",
    "all_reduce_identical_inputs": "all_reduce", "all_reduce_identical_grad_inputs": "all_reduce",
}
NOT_OPS = {"CollectiveOps", "to_collective_op", "CommGroupType", "CommGroup"}
PUBLIC = sorted({n for mod in (ops, collectives, var_updates) for n in mod.__all__} - NOT_OPS)
EXTRA_PUBLIC = ["floor", "log2", "remote_code_load"]  # on popxl.ops but not in its __all__, as in PopXL


@pytest.mark.parametrize("name", PUBLIC + EXTRA_PUBLIC)
def test_every_public_op_is_registered_completely(name):
    opname = ALIASES.get(name, name)
    assert opname in REGISTRY, f"public op {name} has no registry entry"
    d = REGISTRY[opname]
    assert callable(d.infer), name
    assert d.control or d.reference is not None or d.view is not None or d.expand is not None, f"{name} has no kernel"
    assert d.grad is not None, f"{name} has no gradient decision"
    assert d.grad in (Grad.STOP, Grad.ZERO, Grad.RAISE) or callable(d.grad)


def test_every_registered_op_is_complete():
    for name, d in REGISTRY.items():
        assert callable(d.infer) and d.grad is not None, name
        assert d.control or d.reference is not None or d.view is not None or d.expand is not None, name


def test_public_functions_exist():
    for name in PUBLIC + EXTRA_PUBLIC:
        mod = collectives if name in collectives.__all__ else var_updates if name in var_updates.__all__ else ops
        assert callable(getattr(mod, name)), name


def test_every_kernel_op_has_a_native_kernel():
    """Every op the engines run as a kernel has a native one: only program structure (control ops),
    views (which lower to copies or aliases) and ops a Session expands into other ops have none, so
    no program falls back to Python for want of a kernel."""
    from popxl.engines.native import _import_native

    native = set(_import_native().kernel_names())
    missing = sorted(name for name, d in REGISTRY.items()
                     if not d.control and d.view is None and d.expand is None and name not in native)
    assert not missing, f"registered ops without a native kernel: {missing}"
