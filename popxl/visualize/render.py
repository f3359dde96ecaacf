"""DOT -> SVG, laid out by Graphviz's ``dot`` inside this process.

The layout engine is Graphviz through pygraphviz: since pygraphviz 2.0 its PyPI wheels bundle the
Graphviz libraries and layout plugins, so ``pip install`` alone brings a real ``dot`` layout, with
no system package. (The ``graphviz`` and ``pydot`` packages only write DOT and run a ``dot``
executable that the system must provide.)
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from typing import TYPE_CHECKING, Iterator, Optional, Union

from popxl.visualize.dot import DrawOptions, to_dot

if TYPE_CHECKING:  # pragma: no cover
    from popxl.graph import Graph
    from popxl.ir import Ir

__all__ = ["to_svg", "dot_to_svg", "GraphvizUnavailable"]


class GraphvizUnavailable(ImportError):
    """pygraphviz (which brings the Graphviz layout libraries) is not installed or does not load."""


def dot_to_svg(source: str) -> str:
    """Lay out DOT ``source`` with Graphviz's ``dot`` and return the SVG text."""
    try:
        import pygraphviz  # noqa: PLC0415  (optional: only pictures need it)
    except ImportError as e:
        raise GraphvizUnavailable(
            f"Drawing a graph needs pygraphviz (its wheels bundle Graphviz): pip install pygraphviz ({e})") from e
    agraph = pygraphviz.AGraph(string=source)
    global _first_layout
    if _first_layout:  # the bundled fontconfig may warn about the system's newer config files
        _first_layout = False
        with _quiet_native_stderr():
            agraph.layout(prog="dot")
    else:
        agraph.layout(prog="dot")
    svg = agraph.draw(format="svg")
    return svg.decode("utf-8") if isinstance(svg, bytes) else svg


_first_layout = True


@contextlib.contextmanager
def _quiet_native_stderr() -> Iterator[None]:
    """Send what C code writes to file descriptor 2 to a file for the duration (Python's own
    ``sys.stderr`` is untouched); Graphviz's errors still reach Python as exceptions."""
    try:
        saved = os.dup(2)
    except OSError:  # no descriptor 2 (a service): nothing to hide
        yield
        return
    try:
        with tempfile.TemporaryFile() as sink:
            os.dup2(sink.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)


def to_svg(subject: Union["Graph", "Ir"], options: Optional[DrawOptions] = None, **kw) -> str:
    """A picture of a graph (with the graphs it calls) or of a whole Ir, as SVG text.

    Keyword arguments are ``DrawOptions`` fields (``max_nodes``, ``depth``, ``page``, ``rankdir``).
    """
    if options is not None and kw:
        raise TypeError("to_svg: pass either options or DrawOptions fields as keywords, not both.")
    return dot_to_svg(to_dot(subject, options or DrawOptions(**kw)))


def repr_svg(subject: Union["Graph", "Ir"]) -> Optional[str]:
    """What Jupyter shows: the picture, or None (the text repr is shown) without Graphviz."""
    try:
        return to_svg(subject)
    except GraphvizUnavailable:
        return None
