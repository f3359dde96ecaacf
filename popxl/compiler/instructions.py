"""The executable's instructions, declared once: their kinds and fields (``FIELDS``), typed
constructors that lowering uses, and ``check_program`` for anything that reads them. The engines
read these plain dicts (they round-trip through JSON); the native loader declares the fields it
reads in a table of its own (``popxl._native.instruction_fields()``), and a test holds the two
equal, so an instruction kind or field cannot be added on one side only. See executable.py for
what each instruction does.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence, Tuple, TypedDict

from popxl.op import REGISTRY, check_attributes

__all__ = ["FIELDS", "OPTIONAL_FIELDS", "BRANCH_FIELDS", "op", "copy", "call", "repeat", "if_", "host_load",
           "host_store", "branch", "check_program", "op_attributes", "check_op_attrs"]

Pairs = List[List[int]]  # [source buffer, destination buffer] pairs


class Branch(TypedDict):
    graph: int
    copy_in: Pairs
    copy_out: Pairs


# kind -> the fields an instruction of that kind has (besides "kind")
FIELDS: Dict[str, Tuple[str, ...]] = {
    "op": ("type", "name", "inputs", "outputs", "attrs"),
    "copy": ("src", "dst"),
    "call": ("graph", "copy_in", "copy_out"),
    "repeat": ("graph", "count", "copy_in", "carry", "copy_out"),
    "if": ("cond", "then", "else"),
    "host_load": ("stream", "output"),
    "host_store": ("stream", "input"),
}
# fields that may be absent (kind -> fields)
OPTIONAL_FIELDS: Dict[str, Tuple[str, ...]] = {"op": ("static_inputs",)}
BRANCH_FIELDS: Tuple[str, ...] = tuple(Branch.__annotations__)


def op(type: str, name: str, inputs: Sequence[int], outputs: Sequence[int], attrs: Mapping[str, Any],
       static_inputs: Sequence[int] = ()) -> Dict[str, Any]:
    """Run the kernel of op ``type`` on the input buffers into the output buffers; ``static_inputs``
    lists input positions lying in static storage (omitted when empty)."""
    instr = {"kind": "op", "type": type, "name": name, "inputs": list(inputs), "outputs": list(outputs),
             "attrs": dict(attrs)}
    if static_inputs:
        instr["static_inputs"] = list(static_inputs)
    return instr


def copy(src: int, dst: int) -> Dict[str, Any]:
    return {"kind": "copy", "src": src, "dst": dst}


def call(graph: int, copy_in: Pairs, copy_out: Pairs) -> Dict[str, Any]:
    return {"kind": "call", "graph": graph, "copy_in": copy_in, "copy_out": copy_out}


def repeat(graph: int, count: int, copy_in: Pairs, carry: Pairs, copy_out: Pairs) -> Dict[str, Any]:
    return {"kind": "repeat", "graph": graph, "count": count, "copy_in": copy_in, "carry": carry,
            "copy_out": copy_out}


def branch(graph: int, copy_in: Pairs, copy_out: Pairs) -> Branch:
    return {"graph": graph, "copy_in": copy_in, "copy_out": copy_out}


def if_(cond: int, then: Branch, else_: Branch) -> Dict[str, Any]:
    return {"kind": "if", "cond": cond, "then": then, "else": else_}


def host_load(stream: int, output: int) -> Dict[str, Any]:
    return {"kind": "host_load", "stream": stream, "output": output}


def host_store(stream: int, input: int) -> Dict[str, Any]:
    return {"kind": "host_store", "stream": stream, "input": input}


def check_program(program: Sequence[Mapping[str, Any]], where: str = "program") -> None:
    """Raise ValueError naming the first instruction that is not of a declared kind or does not
    have exactly that kind's fields."""
    for k, instr in enumerate(program):
        kind = instr.get("kind")
        if kind not in FIELDS:
            raise ValueError(f"{where}[{k}]: unknown instruction kind {kind!r}; known: {sorted(FIELDS)}.")
        have = set(instr) - {"kind"}
        need, may = set(FIELDS[kind]), set(OPTIONAL_FIELDS.get(kind, ()))
        if not need <= have <= need | may:
            raise ValueError(f"{where}[{k}]: a {kind!r} instruction has fields {sorted(have)}; expected "
                             f"{sorted(need)}" + (f" and optionally {sorted(may)}" if may else "") + ".")
        if kind == "if":
            for key in ("then", "else"):
                if set(instr[key]) != set(BRANCH_FIELDS):
                    raise ValueError(f"{where}[{k}]: the {key!r} branch has fields {sorted(instr[key])}; expected "
                                     f"{sorted(BRANCH_FIELDS)}.")


def op_attributes(graphs: Sequence[Mapping[str, Any]]) -> Dict[str, Dict[str, str]]:
    """The attribute declarations (popxl.op.OpDef.attributes) of the op types run by ``graphs``'
    op instructions, for the executable: op type -> {name: type}; ops that declare none are left out."""
    table: Dict[str, Dict[str, str]] = {}
    for g in graphs:
        for instr in g["program"]:
            if instr["kind"] == "op" and instr["type"] not in table:
                opdef = REGISTRY.get(instr["type"])
                if opdef is not None and opdef.attributes is not None:
                    table[instr["type"]] = dict(opdef.attributes)
    return table


def check_op_attrs(graphs: Sequence[Mapping[str, Any]], op_attrs: Mapping[str, Mapping[str, str]]) -> None:
    """Raise ValueError naming the op and the attribute if an op instruction's attributes differ
    from its type's declaration in ``op_attrs`` (an executable's): an attribute it does not declare,
    one it declares missing, or a value not of the declared type. The native loader checks the same."""
    for g in graphs:
        for instr in g["program"]:
            if instr["kind"] == "op":
                declared = op_attrs.get(instr["type"])
                check_attributes(instr["type"], None if declared is None else dict(declared), instr["attrs"],
                                 f"executable: op {instr['name']!r} ({instr['type']})")
