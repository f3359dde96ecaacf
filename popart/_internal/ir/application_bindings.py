"""Binding modules of the C++ custom ops that Graphcore's applications (the model zoo,
graphcore/examples) ship in their own folders, as popxl-cpu provides them.

cppimport would compile such a module (``modelling.rotary_pos_embed.rotary_pos_embed_binding`` of
the Llama and Dolly applications, say) from the C++ files beside it. The import finder
(``popxl.custom_op_modules``) recognises the op by a fingerprint of those files (``fingerprint``)
and makes the module from the classes listed here under it: the same createOpInGraph surface,
creating popxl ops. A copy of an application that kept only its Python files (nothing for cppimport
to build) is recognised by the fingerprint of the Python files of the op's folder instead. A folder
whose files differ in anything but whitespace is not recognised (its numerics could differ), and its
import fails naming the module.
"""
from __future__ import annotations

import hashlib
import os
from typing import Any, Dict, Tuple, Type

from popart._internal.ir.addons_bindings import RotaryPosEmbedOp

__all__ = ["MODULES", "fingerprint", "CPP_SOURCES", "PYTHON_SOURCES"]

CPP_SOURCES = (".cpp", ".hpp", ".h", ".cc")
PYTHON_SOURCES = (".py",)


def fingerprint(folder: str, suffixes: Tuple[str, ...] = CPP_SOURCES) -> str:
    """SHA-256 of the files of ``folder`` ending in ``suffixes`` (names and contents, whitespace
    removed, in name order): what a custom op is, whatever its package is called or how its files
    are indented."""
    digest = hashlib.sha256()
    for name in sorted(os.listdir(folder)):
        if name.endswith(suffixes):
            with open(os.path.join(folder, name), "rb") as f:
                digest.update(name.encode() + b"\0" + b"".join(f.read().split()) + b"\0")
    return digest.hexdigest()


class RotaryPosEmbedHalvesOp(RotaryPosEmbedOp):
    """The rotary embedding of the Llama and Dolly applications: popxl-addons' op, except that it
    rotates the pairs (x[i], x[i + rotary_dim / 2]) (GPT-NeoX's form). Its gradient here is the
    rotation back of the same pairs; the applications' C++ gradient op rotates interleaved pairs
    back instead, which is not the gradient of their forward op (they only run inference with it)."""

    @classmethod
    def attributes(cls, graph: Any, rotaryDim: int) -> Dict[str, Any]:
        return {"rotary_dim": rotaryDim, "pairing": "halves"}


# (fingerprint of the folder's C++ or, with none, Python files; binding module name) -> its contents
MODULES: Dict[Tuple[str, str], Dict[str, Type[Any]]] = {
    # nlp/llama/popxl and nlp/dolly/popxl: modelling/rotary_pos_embed (C++; Python files only)
    ("03846d20d2373e507909fcc94722b3cc09e48b46491e90a3dc4f7f5822bb3f67", "rotary_pos_embed_binding"):
        {"RotaryPosEmbedOp": RotaryPosEmbedHalvesOp},
    ("600da2e897de1f91c83008d069dc788cea7937d0f4a1105a79304ee2cddfab55", "rotary_pos_embed_binding"):
        {"RotaryPosEmbedOp": RotaryPosEmbedHalvesOp},
    # popxl-addons' own rotary op (C++ sources), copied into an application's folder
    ("3a1aa8ba879328827561320bc10d6b21ac40b1ece01e3e181d601982c7b240c0", "rotary_pos_embed_binding"):
        {"RotaryPosEmbedOp": RotaryPosEmbedOp},
}
