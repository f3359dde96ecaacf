"""The import layers of .importlinter (docs/architecture.md) hold for the package, and the check can
fail: the same contracts over the package's import graph with one import added against a layer
report that contract broken, naming the import."""
from __future__ import annotations

import configparser
from pathlib import Path
from typing import List, Optional, Tuple

import pytest
from importlinter import configuration
from importlinter.application import use_cases
from importlinter.application.app_config import settings

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / ".importlinter"


class _AddingImports:
    """The graph builder import-linter uses, then the given (importer, imported) imports added."""

    def __init__(self, builder, extra: List[Tuple[str, str]]) -> None:
        self._builder, self._extra = builder, extra

    def build(self, **kwargs):
        graph = self._builder.build(**kwargs)
        for importer, imported in self._extra:
            graph.add_import(importer=importer, imported=imported, line_number=1, line_contents="(added by the test)")
        return graph


def _report(extra: Optional[List[Tuple[str, str]]] = None):
    configuration.configure()
    use_cases._register_built_in_contract_types()  # (what lint-imports does first)
    real = settings.GRAPH_BUILDER
    settings.configure(GRAPH_BUILDER=_AddingImports(real, extra or []))
    try:
        options = use_cases.read_user_options(config_filename=str(CONFIG))
        return use_cases.create_report(options, cache_dir=None)
    finally:
        settings.configure(GRAPH_BUILDER=real)


def _broken(report) -> List[str]:
    return [contract.name for contract, check in report.get_contracts_and_checks() if not check.kept]


def test_every_contract_is_kept():
    report = _report()
    assert not report.contains_failures, _broken(report)
    names = configparser.ConfigParser()
    names.read(CONFIG)
    assert len(list(report.get_contracts_and_checks())) == sum(s.startswith("importlinter:contract:")
                                                                for s in names.sections()) == 8


@pytest.mark.parametrize("importer,imported,contract", [
    # the core importing the session, the ops or popart
    ("popxl.tensor", "popxl.session", "popxl: core at the bottom"),
    ("popxl.graph", "popxl.ops.shape", "popxl: core at the bottom"),
    ("popxl.ir", "popart._internal.ir", "popart (ONNX import, PopART's session and IR) over popxl"),
    # an engine reaching past the executable
    ("popxl.engines.arena", "popxl.transforms.autodiff", "engines run an Executable"),
    # popdist reached other than through popxl.distributed, and its launcher importing popxl
    ("popxl.session", "popdist.backend", "popxl reaches popdist only through popxl.distributed"),
    ("popdist.supervisor", "popxl.errors", "popdist's launcher and backend import neither popxl nor popart"),
    # an ONNX family importing the importer or the registry; two families importing each other
    ("popart.onnx.nn", "popart.onnx.importer", "popart.onnx: the importer over the op table's families"),
    ("popart.onnx.elementwise", "popart.onnx.nn", "popart.onnx's family modules form no cycles"),
])
def test_an_import_against_the_layers_is_found(importer, imported, contract):
    report = _report([(importer, imported)])
    assert report.contains_failures
    broken = _broken(report)
    assert any(name.startswith(contract) for name in broken), broken
