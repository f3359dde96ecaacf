"""popart reaches popxl's Session through its public API only."""
from __future__ import annotations

import re
from pathlib import Path

import popart


def test_popart_uses_only_popxls_public_api():
    """No private member of popxl.Session (or of its compiled program or engine) is reached from popart's
    session modules."""
    root = Path(popart.__file__).parent
    for name in ("session.py", "training.py", "program.py", "stepio.py", "weights.py", "report.py"):
        text = (root / name).read_text()
        found = re.findall(r"\b(?:_px|px|session)\._[a-z]\w*|\._(?:exe|engine)\b|_host_data_value|_all_graphs", text)
        assert not found, (name, found)
