"""Names PopXL client code (popxl-addons, the tutorials, PopXL's own tests) imports from PopXL's
module paths, and what they do here."""
import typing

import numpy as np
import pytest

import popxl
import popxl.ops as ops


def test_per_op_module_paths_keep_the_op_names_functions():
    from popxl.ops.conv import PadType, conv
    from popxl.ops.negative_log_likelihood import REDUCTION_TYPE, nll_loss
    assert typing.get_args(PadType) == ("not_set", "same_upper", "same_lower", "valid")
    assert typing.get_args(REDUCTION_TYPE) == ("mean", "sum", "none")
    # ``popxl.ops.conv`` is the op, not the module, even after the module was imported by its path
    import popxl.ops.conv  # noqa: F401
    assert ops.conv is conv and callable(ops.conv) and ops.nll_loss is nll_loss
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones((1, 2, 5, 5), np.float32))
        w = popxl.variable(np.ones((3, 2, 3, 3), np.float32))
        assert ops.conv(x, w, pad_type="same_upper").shape == (1, 3, 5, 5)


def test_host_tensor_types_cover_numpy_iterables_and_torch():
    from popxl.tensor import host_tensor_types
    assert isinstance(np.zeros(2), host_tensor_types) and isinstance([1, 2], host_tensor_types)
    assert not isinstance(3.0, host_tensor_types)
    torch = pytest.importorskip("torch")
    assert isinstance(torch.zeros(2), host_tensor_types)


def test_convert_optional_values():
    from popxl.ops.utils import convert_optional_dtype, convert_optional_float, convert_optional_int
    assert convert_optional_float(None) is None and convert_optional_float(np.float16(0.5)) == 0.5
    assert isinstance(convert_optional_float(1), float) and convert_optional_int(np.int64(3)) == 3
    assert convert_optional_dtype(popxl.int8) is popxl.int8 and convert_optional_dtype(None) is None
    for bad, fn in ((True, convert_optional_float), ("0.5", convert_optional_float), (2.5, convert_optional_int),
                    ("int8", convert_optional_dtype)):
        with pytest.raises(TypeError):
            fn(bad)


def test_stream_base_class():
    from popxl.streams import Stream
    ir = popxl.Ir()
    with ir.main_graph:
        h2d = popxl.h2d_stream((2,), popxl.float32)
        d2h = popxl.d2h_stream((2,), popxl.float32)
    assert isinstance(h2d, Stream) and isinstance(d2h, Stream)
    assert issubclass(popxl.HostToDeviceStream, Stream) and issubclass(popxl.DeviceToHostStream, Stream)
    with pytest.raises(NotImplementedError, match="h2d_stream"):
        Stream()


def test_execution_context_parts():
    from popxl.context import _execution_context, get_current_context
    ir = popxl.Ir()
    with ir.main_graph:
        with _execution_context(popxl.ExecutionContext.Normal) as ec:
            assert ec is popxl.ExecutionContext.Normal
            assert get_current_context().execution_context is popxl.ExecutionContext.Normal
            ops.add(popxl.constant(1.0), popxl.constant(2.0))
        assert get_current_context().execution_context is None
        for part in ("OptimizerFromHostFragment", "AccumulateOuterFragment"):  # the weight fragments: test_fragments
            with pytest.raises(NotImplementedError, match=part):
                with _execution_context(popxl.ExecutionContext[part]):
                    pass
        with pytest.raises(TypeError, match="ExecutionContext"):
            with _execution_context("Normal"):
                pass


def test_session_full_input_shape():
    session = _session_with_loop(8, 4)
    assert session._full_input_shape((3, 4)) == (8, 4, 3, 4)
    assert session._full_input_shape(()) == (8, 4)
    assert _session_with_loop(1, 1)._full_input_shape((3, 4)) == (3, 4)


def _session_with_loop(transfers, replicas):
    ir = popxl.Ir(replication=replicas)
    ir.num_host_transfers = transfers
    with ir.main_graph:
        x_s = popxl.h2d_stream((3, 4), popxl.float32)
        y_s = popxl.d2h_stream((3, 4), popxl.float32)
        step = ir.create_graph(lambda: ops.host_store(y_s, ops.host_load(x_s)))
        ops.repeat(step, transfers)
    return popxl.Session(ir, "ipu_model")


def test_utils_names():
    from popxl.fp8_utils import host_pow2scale_cast_to_fp8
    from popxl.utils import downcast_np_dtypes, to_numpy
    import popxl.utils
    assert popxl.utils.host_pow2scale_cast_to_fp8 is host_pow2scale_cast_to_fp8
    for wide, narrow in downcast_np_dtypes.items():
        assert wide.itemsize == 8 and narrow.itemsize == 4 and to_numpy(np.zeros(1, wide)).dtype == narrow
