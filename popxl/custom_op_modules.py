"""Where PopXL code finds the binding modules of C++ custom ops.

PopXL custom ops are C++ (PopART ops and Poplar code) with a pybind11 binding module that
``cppimport`` compiles on import (``import cppimport.import_hook``, then ``import <module>``).
popxl-cpu has no PopART or Poplar headers to compile them against, so an import finder, put ahead
of cppimport's when popxl is imported (and again whenever ``cppimport.import_hook`` is imported
later), decides those imports first:

- popxl-addons' thirteen binding modules (``popxl_addons.ops.<dir>.<name>_binding`` or
  ``..._impl``) resolve to popxl-cpu's own (``popart._internal.ir.addons_bindings``), whose ops
  are the popxl ops of ``popxl.ops.addons``;
- another module whose source is a PopART C++ custom op (a ``<name>.cpp`` that opts in to
  cppimport and includes PopART headers) resolves to a Python module of that name beside it if
  there is one (a CPU port of the op: the user guide's docs/guide/custom_ops.md); else, if its folder's
  C++ sources are those of an op that one of Graphcore's applications ships (recognised by their
  fingerprint), to popxl-cpu's module for it (``popart._internal.ir.application_bindings``); and
  otherwise fails with an ``ImportError`` naming the module and its source;
- a binding module (``..._binding`` / ``..._impl``) that has no source at all beside it, in a
  folder whose Python files are those of such an application's op (a copy of the application that
  kept only its Python files), resolves to popxl-cpu's module for that op too;
- every other import, C++ modules that are not PopART ops included, is left to the finders after
  it (cppimport's among them).
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from typing import Any, Dict, Optional, Sequence, Tuple

from popxl import _pb

__all__ = ["CustomOpModuleFinder", "install", "register", "ADDONS_PACKAGE"]

ADDONS_PACKAGE = "popxl_addons.ops."
_CPP_EXTENSIONS = (".cpp", ".c")  # what cppimport looks for
_BINDING_SUFFIXES = ("_binding", "_impl")  # how Graphcore's code names its cppimport modules


class CustomOpModuleFinder(importlib.abc.MetaPathFinder):
    """The finder described in this module's docstring (one per process, see ``install``)."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]], target: Any = None) -> Any:
        if fullname == "cppimport.import_hook":
            return _keeping_first(self, fullname, path)
        if fullname.startswith(ADDONS_PACKAGE) and fullname.count(".") == 3:
            key = fullname[len(ADDONS_PACKAGE):]
            modules = _tables()[0]
            if key in modules:
                return importlib.machinery.ModuleSpec(fullname, _BindingLoader(modules[key]),
                                                      origin="popart._internal.ir.addons_bindings")
        source = _popart_cpp_source(fullname, path)
        if source is None:
            return _sourceless_application_op(fullname, path)
        port = importlib.machinery.PathFinder.find_spec(fullname, path)
        if port is not None:
            return port
        spec = _application_op(fullname, os.path.dirname(source), cpp=True)
        if spec is not None:
            return spec
        raise ImportError(
            f"{fullname}: {source} is a PopART C++ custom op, and PopART C++ custom ops cannot be built "
            f"here (popxl-cpu has no PopART or Poplar to compile them against). Give the op a CPU "
            f"implementation instead: a popxl op and a Python module {fullname.rpartition('.')[2]}.py beside "
            f"the C++ file (see popxl-cpu's user guide, docs/guide/custom_ops.md).", name=fullname, path=source)


class _BindingLoader(importlib.abc.Loader):
    """Makes one of popxl-addons' binding modules from popxl-cpu's classes."""

    def __init__(self, contents: dict) -> None:
        self.contents = contents

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        module.__dict__.update(self.contents)
        module.__doc__ = f"The C++ binding module {module.__name__}, as popxl-cpu provides it."


class _KeepFirst(importlib.abc.Loader):
    """Loads ``cppimport.import_hook`` with its own loader, then puts the finder back in front of
    the hook that module has just inserted at the head of ``sys.meta_path``."""

    def __init__(self, loader: Any, finder: CustomOpModuleFinder) -> None:
        self.loader, self.finder = loader, finder

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        _put_first(self.finder)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


def _keeping_first(finder: CustomOpModuleFinder, fullname: str, path: Optional[Sequence[str]]) -> Any:
    spec = importlib.machinery.PathFinder.find_spec(fullname, path)
    if spec is not None and spec.loader is not None:
        spec.loader = _KeepFirst(spec.loader, finder)
    return spec


def _application_op(fullname: str, folder: str, cpp: bool) -> Any:
    """The spec of popxl-cpu's module for one of Graphcore's applications' C++ custom ops, if the
    C++ (or with ``cpp`` False, the Python) files of ``folder`` are that op's, else None."""
    apps = _tables()[1]
    key = (apps.fingerprint(folder, apps.CPP_SOURCES if cpp else apps.PYTHON_SOURCES), fullname.rpartition(".")[2])
    if key not in apps.MODULES:
        return None
    return importlib.machinery.ModuleSpec(fullname, _BindingLoader(apps.MODULES[key]),
                                          origin="popart._internal.ir.application_bindings")


def _sourceless_application_op(fullname: str, path: Optional[Sequence[str]]) -> Any:
    """For a binding module of a package that nothing else provides (no C++ source, no module):
    popxl-cpu's module for the application's op whose Python files its folder holds, if any."""
    if path is None or not fullname.endswith(_BINDING_SUFFIXES):
        return None
    if importlib.machinery.PathFinder.find_spec(fullname, path) is not None:
        return None
    for folder in path:
        if os.path.isdir(folder):
            spec = _application_op(fullname, folder, cpp=False)
            if spec is not None:
                return spec
    return None


def _popart_cpp_source(fullname: str, path: Optional[Sequence[str]]) -> Optional[str]:
    """The C++ source cppimport would build for ``fullname`` if it is a PopART custom op: a file
    ``<name>.cpp`` (or ``.c``) in the package's folders (``sys.path`` for a top-level module) whose
    first line names cppimport and which includes PopART headers."""
    name = fullname.rpartition(".")[2]
    for folder in (path if path is not None else sys.path):
        folder = folder or os.getcwd()
        for ext in _CPP_EXTENSIONS:
            candidate = os.path.join(folder, name + ext)
            if os.path.isfile(candidate) and _is_popart_custom_op(candidate):
                return candidate
    return None


def _is_popart_custom_op(filename: str) -> bool:
    try:
        with open(filename, "rb") as f:
            first = f.readline()
            rest = f.read(1 << 20)
    except OSError:
        return False
    return b"cppimport" in first and (b"<popart/" in rest or b'"popart/' in rest)


def _put_first(finder: CustomOpModuleFinder) -> None:
    while finder in sys.meta_path:
        sys.meta_path.remove(finder)
    sys.meta_path.insert(0, finder)


# (popxl-addons' binding modules by name, the module of Graphcore's applications' ops): popxl-cpu's
# binding modules live in popart._internal.ir (the top layer), which registers them here when it is
# imported (``register``); ``_tables`` has it imported (popxl._pb's loader) the first time they are needed.
_TABLES: Optional[Tuple[Dict[str, Dict[str, Any]], Any]] = None


def register(addons_modules: Dict[str, Dict[str, Any]], application_bindings: Any) -> None:
    """Called by ``popart._internal.ir`` when it is imported: the contents of popxl-addons' binding
    modules by name (``<dir>.<module>``), and its module of Graphcore's applications' ops
    (``fingerprint``, ``CPP_SOURCES``, ``PYTHON_SOURCES``, ``MODULES``)."""
    global _TABLES
    _TABLES = (addons_modules, application_bindings)


def _tables() -> Tuple[Dict[str, Dict[str, Any]], Any]:
    if _TABLES is None:
        _pb.load()
    if _TABLES is None:
        raise ImportError("popxl-cpu's binding modules of C++ custom ops come from popart._internal.ir, which has not "
                          "registered them: import it (import popxl loads it when a binding module is imported).")
    return _TABLES


_FINDER: Optional[CustomOpModuleFinder] = None


def install() -> CustomOpModuleFinder:
    """Put the finder at the head of ``sys.meta_path`` (once per process; again if it moved)."""
    global _FINDER
    if _FINDER is None:
        _FINDER = CustomOpModuleFinder()
    _put_first(_FINDER)
    return _FINDER
