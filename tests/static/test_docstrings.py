"""Every public name of popxl is documented in its docstring, Google style (what the API reference in
docs/api/ is built from): functions list each parameter under ``Args:``, say what they give under
``Returns:``, and ops (everything in popxl.ops and its subpackages) say what they raise under
``Raises:``; classes document their constructor's parameters, and their public methods and
properties have docstrings too (methods with an ``Args:`` entry per parameter).

The public surface is found by walking, not listed by hand, so a new op or module is checked as
soon as it exists: the ``__all__`` of popxl's public modules, every function bound on
``popxl.ops``, and the ``__all__`` of every module under popxl/ops (new op families and
subpackages included)."""
from __future__ import annotations

import enum
import importlib
import inspect
import pkgutil
import re
from typing import Any, Callable, Dict, Iterator, List, Set, Tuple


import popxl
import popxl.ops

# Modules whose ``__all__`` is public API (API.md section 1), besides everything under popxl.ops.
PUBLIC_MODULES = ["popxl", "popxl.context", "popxl.dtypes", "popxl.tensor", "popxl.streams", "popxl.remote_buffer",
                  "popxl.replica_grouping", "popxl.tensorlocation", "popxl.errors", "popxl.utils", "popxl.fp8_utils",
                  "popxl.random_seed", "popxl.testing", "popxl.transforms", "popxl.transforms.autodiff", "popxl.transforms.pipeline",
                  "popxl.session",
                  "popxl.onnx_export"]
# Public names missing from their module's ``__all__`` (as in PopXL).
EXTRA_NAMES = [("popxl", "replica_sharded_buffer"), ("popxl", "export_onnx"), ("popxl.ops", "floor"),
               ("popxl.ops", "log2"), ("popxl.ops", "remote_code_load")]

SECTION = re.compile(r"^(\s*)(Args|Arguments|Returns|Yields|Raises|Example|Examples|Note|Notes|Attributes):\s*$")


def _ops_modules() -> List[Any]:
    """popxl.ops and every module below it (new op families and subpackages included)."""
    found = [popxl.ops]
    for info in pkgutil.walk_packages(popxl.ops.__path__, "popxl.ops."):
        found.append(importlib.import_module(info.name))
    return found


def _is_popxl(obj: Any) -> bool:
    return (getattr(obj, "__module__", None) or "").startswith("popxl")


def public_objects() -> Dict[str, Tuple[Any, bool]]:
    """Qualified name -> (object, is an op) for every public function and class of popxl."""
    found: Dict[str, Tuple[Any, bool]] = {}

    def add(qualname: str, obj: Any, is_op: bool) -> None:
        if (inspect.isfunction(obj) or inspect.isclass(obj)) and _is_popxl(obj):
            key = f"{obj.__module__}.{obj.__qualname__}"
            found.setdefault(key, (obj, is_op))
            found[key] = (obj, found[key][1] or is_op)

    for name in PUBLIC_MODULES:
        module = importlib.import_module(name)
        for attr in getattr(module, "__all__", ()):
            add(f"{name}.{attr}", getattr(module, attr), False)
    for module in _ops_modules():
        for attr in getattr(module, "__all__", ()):
            obj = getattr(module, attr)  # popxl.ops.utils holds helpers for writing ops, not ops
            add(f"{module.__name__}.{attr}", obj, inspect.isfunction(obj) and module.__name__ != "popxl.ops.utils")
    for attr, obj in vars(popxl.ops).items():
        if not attr.startswith("_"):
            add(f"popxl.ops.{attr}", obj, inspect.isfunction(obj))
    for module_name, attr in EXTRA_NAMES:
        obj = getattr(importlib.import_module(module_name), attr)
        add(f"{module_name}.{attr}", obj, module_name == "popxl.ops")
    return found


def sections(doc: str) -> Dict[str, List[str]]:
    """The docstring's Google-style sections: name -> the lines under it (dedented once)."""
    out: Dict[str, List[str]] = {}
    current, indent = None, ""
    for line in inspect.cleandoc(doc).splitlines():
        m = SECTION.match(line)
        if m:
            current, indent = m.group(2), m.group(1)
            out[current] = []
        elif current is not None:
            if line.strip() and not line.startswith(indent + " "):
                current = None  # text at the section's own indentation ends it
            else:
                out[current].append(line[len(indent) + 4:] if line.strip() else "")
    return out


def documented_args(doc: str) -> List[str]:
    """The parameter names the ``Args:`` section describes (``*args`` / ``**kwargs`` without stars)."""
    return [m.group(1) for line in sections(doc).get("Args", [])
            if (m := re.match(r"^\*{0,2}(\w+)(?: \([^)]*\))?:", line))]


def parameters(fn: Callable, skip_first: bool) -> List[str]:
    params = list(inspect.signature(fn).parameters.values())
    return [p.name for p in params[1 if skip_first else 0:]]


def returns_none(fn: Callable) -> bool:
    ann = inspect.signature(fn).return_annotation
    return ann is None or ann is type(None) or ann == "None"


def function_problems(fn: Callable, is_op: bool, is_method: bool = False) -> List[str]:
    doc = fn.__doc__
    if not doc or not doc.strip():
        return ["no docstring"]
    problems = []
    found = sections(doc)
    params = parameters(fn, skip_first=is_method)
    args = documented_args(doc)
    missing = [p for p in params if p not in args]
    if missing:
        problems.append(f"Args does not describe {missing}")
    extra = [a for a in args if a not in params]
    if extra:
        problems.append(f"Args describes {extra}, which are not parameters")
    if not is_method and not returns_none(fn) and "Returns" not in found and "Yields" not in found:
        problems.append("no Returns section")
    if is_op and "Raises" not in found:
        problems.append("no Raises section")
    if re.search(r"^\s*(Parameters|Returns)\n\s*-{3,}", doc, re.M) or ":param " in doc:
        problems.append("NumPy or reST field style (popxl's docstrings use the Google style)")
    return problems


def own_members(cls: type) -> Iterator[Tuple[str, Any]]:
    """Public methods and properties of ``cls`` and of its popxl base classes."""
    seen: Set[str] = set()
    for klass in cls.__mro__:
        if not _is_popxl(klass):
            continue
        for name, member in vars(klass).items():
            if name.startswith("_") or name in seen:
                continue
            seen.add(name)
            yield name, member


def class_problems(cls: type) -> Dict[str, List[str]]:
    out: Dict[str, List[str]] = {}
    doc = cls.__dict__.get("__doc__")
    if not doc or not doc.strip():
        out[""] = ["no class docstring"]
    elif "__init__" in cls.__dict__ and not issubclass(cls, enum.Enum):
        params = parameters(cls.__dict__["__init__"], skip_first=True)
        missing = [p for p in params if p not in documented_args(doc)]
        if missing:
            out[""] = [f"the class docstring's Args does not describe the constructor's {missing}"]
    if issubclass(cls, enum.Enum):
        return out
    for name, member in own_members(cls):
        if isinstance(member, property):
            if not (member.fget.__doc__ or "").strip():
                out[name] = ["no docstring"]
        elif isinstance(member, (staticmethod, classmethod)) or inspect.isfunction(member):
            fn = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
            problems = function_problems(fn, is_op=False, is_method=not isinstance(member, staticmethod))
            if problems:
                out[name] = problems
    return out


def surface_problems(objects: Dict[str, Tuple[Any, bool]]) -> Dict[str, List[str]]:
    problems: Dict[str, List[str]] = {}
    for qualname, (obj, is_op) in sorted(objects.items()):
        if inspect.isclass(obj):
            for member, found in class_problems(obj).items():
                problems[f"{qualname}.{member}" if member else qualname] = found
        else:
            found = function_problems(obj, is_op)
            if found:
                problems[qualname] = found
    return problems


def test_public_surface_is_found():
    objects = public_objects()
    # the walk reaches ops of every family, the op subpackages, the classes, and the names
    # PopXL leaves out of __all__
    for name in ["popxl.ops.elementwise.activations.gelu", "popxl.ops.reduce.sum", "popxl.ops.shape.reshape",
                 "popxl.ops.collectives.collectives.replicated_all_reduce", "popxl.ops.var_updates.adam_updater",
                 "popxl.ops.call.CallSiteInfo", "popxl.ops.elementwise.unary.floor",
                 "popxl.ops.remote.remote_code_load",
                 "popxl.tensor.Tensor", "popxl.session.Session", "popxl.transforms.autodiff.autodiff",
                 "popxl.grad_graph_info.GradGraphInfo", "popxl.remote_buffer.replica_sharded_buffer",
                 "popxl.utils.to_numpy", "popxl.context.op_debug_context"]:
        assert name in objects, name
    assert objects["popxl.ops.elementwise.activations.gelu"][1] and not objects["popxl.tensor.Tensor"][1]
    assert sum(is_op for _, is_op in objects.values()) > 140


def test_every_public_name_is_documented():
    problems = surface_problems(public_objects())
    assert not problems, "undocumented public API:\n" + "\n".join(
        f"  {name}: {'; '.join(found)}" for name, found in problems.items())


def test_the_check_finds_what_is_missing():
    """The rules fail on each kind of gap (so the test above can fail)."""
    def op(t, axis=0):
        """Something.

        Args:
            t: A tensor.
            bogus: Not a parameter.

        Returns:
            A tensor.
        """

    def no_doc(t):
        pass

    def good(t, *ts, axis=0, **kw) -> None:
        """Something.

        Args:
            t: A tensor.
            *ts: More.
            axis (int): An axis.
            **kw: Options.

        Raises:
            ValueError: Never.
        """

    class Thing:
        """A thing."""

        def __init__(self, size: int) -> None:
            pass

        @property
        def size(self) -> int:
            return 1

    assert function_problems(no_doc, is_op=False) == ["no docstring"]
    assert function_problems(op, is_op=True) == ["Args does not describe ['axis']",
                                                 "Args describes ['bogus'], which are not parameters",
                                                 "no Raises section"]
    assert function_problems(good, is_op=True) == []
    Thing.__module__ = "popxl.fake"
    assert class_problems(Thing) == {"": ["the class docstring's Args does not describe the constructor's ['size']"],
                                     "size": ["no docstring"]}
    assert "popxl.fake.Thing" in surface_problems({"popxl.fake.Thing": (Thing, False)})
