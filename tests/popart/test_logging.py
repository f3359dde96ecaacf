"""Logging: the environment variables, PopART's line format, module levels, and popxl logging
through the same loggers. Each case runs in a fresh interpreter: the environment is read at import."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z popart:(\w+) (\d+)\.(\d+) ([TDIWEC]): (.*)$")

PROGRAM = textwrap.dedent("""
    import numpy as np, onnx, popart, popxl
    from onnx import helper, TensorProto
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    s = popart.InferenceSession(model.SerializeToString(), popart.DataFlow(1, ["y"]),
                                popart.DeviceManager().createCpuDevice())
    s.prepareDevice()
    out = s.initAnchorArrays()
    s.run(popart.PyStepIO({"x": np.array([-1.0, 2.0], np.float32)}, out))
    ir = popxl.Ir()
    with ir.main_graph:
        popxl.ops.add(popxl.constant(1.0), popxl.constant(2.0))
    popxl.Session(ir, "ipu_hw")  # warns through popart.popxl (POPXL_IPU_HW=cpu)
""")


def run(tmp_path, **env) -> subprocess.CompletedProcess:
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    full = {k: v for k, v in os.environ.items() if not k.startswith("POPART_LOG")}
    full.update(env, POPXL_IPU_HW="cpu")
    return subprocess.run([sys.executable, str(script)], env=full, capture_output=True, text=True, timeout=120)


def parsed(text: str):
    lines = [line for line in text.splitlines() if line.strip()]
    matches = [LINE.match(line) for line in lines]
    assert all(matches), [line for line, m in zip(lines, matches) if not m]
    return [m.groups() for m in matches]


def test_log_level_and_destination_file(tmp_path):
    dest = tmp_path / "popart.log"
    r = run(tmp_path, POPART_LOG_LEVEL="TRACE", POPART_LOG_DEST=str(dest))
    assert r.returncode == 0, r.stderr
    assert r.stderr == "" and r.stdout == ""  # everything went to the file
    records = parsed(dest.read_text())
    assert ("session", "T", "Session::prepareDevice") in {(m, lvl, msg) for m, _, _, lvl, msg in records}
    assert any(m == "popxl" and lvl == "W" and "ipu_hw" in msg for m, _, _, lvl, msg in records)
    assert len({pid for _, pid, _, _, _ in records}) == 1  # one process: <pid>.<tid> from the same pid


def test_a_log_file_that_cannot_be_opened_falls_back_to_stderr(tmp_path):
    r = run(tmp_path, POPART_LOG_DEST=str(tmp_path / "no" / "such" / "dir" / "log.txt"))
    assert r.returncode == 0, r.stderr  # the program still runs
    records = parsed(r.stderr)
    first = records[0]
    assert first[0] == "popxl" and first[3] == "W"
    assert "POPART_LOG_DEST=" in first[4] and "cannot be opened for writing" in first[4] and "stderr" in first[4]
    assert any(m == "popxl" and "ipu_hw" in msg for m, _, _, _, msg in records)  # later lines go there too


def test_level_filters_and_stdout(tmp_path):
    r = run(tmp_path, POPART_LOG_LEVEL="WARN", POPART_LOG_DEST="stdout")
    assert r.returncode == 0, r.stderr
    records = parsed(r.stdout)
    assert records and all(lvl in "WEC" for _, _, _, lvl, _ in records)  # no TRACE/DEBUG/INFO lines
    assert any(m == "popxl" for m, *_ in records)


def test_default_is_warn_on_stderr(tmp_path):
    """As PopART: unset, POPART_LOG_LEVEL is WARN and the lines go to stderr."""
    r = run(tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    records = parsed(r.stderr)
    assert records and all(lvl in "WEC" for _, _, _, lvl, _ in records)
    assert any(m == "popxl" and lvl == "W" and "ipu_hw" in msg for m, _, _, lvl, msg in records)


def test_off_is_silent(tmp_path):
    r = run(tmp_path, POPART_LOG_LEVEL="OFF")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and r.stderr == ""


def test_lines_go_to_the_stream_current_when_written():
    """A redirection made after import (contextlib.redirect_stderr / redirect_stdout) receives the
    lines, as PopART's C++ logger's go to the process's streams whatever Python did at import."""
    program = textwrap.dedent("""
        import contextlib, io, sys
        import popxl
        from popxl.logs import get_logger
        for dest in ("stderr", "stdout"):
            buf = io.StringIO()
            with getattr(contextlib, f"redirect_{dest}")(buf):
                get_logger("popxl").warning("caught %s", dest)
            print(dest, repr(buf.getvalue()), file=sys.__stdout__)
    """)
    for dest in ("stderr", "stdout"):
        env = {k: v for k, v in os.environ.items() if not k.startswith("POPART_LOG")}
        env["POPART_LOG_DEST"] = dest
        r = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        seen = dict(line.split(" ", 1) for line in r.stdout.splitlines() if line.startswith(("stderr ", "stdout ")))
        assert f"W: caught {dest}" in seen[dest], r.stdout
        other = "stdout" if dest == "stderr" else "stderr"
        assert seen[other] == "''", r.stdout  # nothing in the stream not chosen
