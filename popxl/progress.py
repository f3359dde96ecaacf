"""Progress bars, drawn by tqdm: compiling a Session, and runs that take long.

Quick work stays silent: a bar appears only once the work has taken ``DELAY_SECONDS``. tqdm
throttles redraws (``MIN_INTERVAL_SECONDS``), so a compile of thousands of graphs draws a few
dozen times, not once per graph. In a notebook with ipywidgets the bar is a widget
(``tqdm.auto``); elsewhere it is text on stderr.

``POPXL_PROGRESS`` (read each time a bar starts) turns bars off (``0``), or on even when stderr
is not a terminal (``1``); unset, tqdm shows them on terminals and in notebooks only. In code,
``popxl.progress.set_enabled(False)`` (or ``True``, or ``None`` to follow the environment again).
"""
from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from typing import Any, Callable, Optional, TextIO

__all__ = ["Progress", "RunProgress", "set_enabled", "enabled", "PROGRESS_ENV", "DELAY_SECONDS",
           "MIN_INTERVAL_SECONDS", "LONG_RUN_SECONDS"]

PROGRESS_ENV = "POPXL_PROGRESS"
DELAY_SECONDS = 1.0  # silent until the work has taken this long
MIN_INTERVAL_SECONDS = 0.5  # at most two redraws a second
LONG_RUN_SECONDS = 2.0  # a run at least this long shows a bar on the next runs of its session

_forced: Optional[bool] = None


def set_enabled(value: Optional[bool]) -> None:
    """Turn progress bars on or off for this process (None: follow ``POPXL_PROGRESS`` again)."""
    global _forced
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"popxl.progress.set_enabled takes True, False or None, not {value!r}.")
    _forced = value


def enabled() -> Optional[bool]:
    """True: always draw; False: never; None: let tqdm decide (terminals and notebooks)."""
    if _forced is not None:
        return _forced
    value = os.environ.get(PROGRESS_ENV, "").strip().lower()
    if value in ("0", "false", "off", "no"):
        return False
    if value in ("1", "true", "on", "yes"):
        return True
    return None


def _tqdm_class(stream: Optional[TextIO]) -> Any:
    if stream is not None:  # an explicit stream is text, never a widget
        from tqdm.std import tqdm  # noqa: PLC0415  (optional: only progress bars need it)
        return tqdm
    with warnings.catch_warnings():  # tqdm.auto warns when a notebook lacks ipywidgets, then uses text
        warnings.simplefilter("ignore")
        from tqdm.auto import tqdm  # noqa: PLC0415  (optional, as above; its warning silenced)
    return tqdm


def _in_notebook() -> bool:
    shell = sys.modules.get("IPython")
    try:
        return shell is not None and "IPKernelApp" in shell.get_ipython().config
    except Exception:  # no running IPython
        return False


def _show(stream: Optional[TextIO]) -> bool:
    state = enabled()
    if state is not None:
        return state
    out = stream or sys.stderr
    return _in_notebook() or bool(getattr(out, "isatty", lambda: False)())


def _bar(title: str, total: Optional[float], stream: Optional[TextIO], unit: str, **kw: Any) -> Any:
    cls = _tqdm_class(stream)
    return cls(total=total, desc=title, file=stream, unit=unit, delay=DELAY_SECONDS,
               mininterval=MIN_INTERVAL_SECONDS, leave=True, dynamic_ncols=True, disable=not _show(stream),
               **kw)


class Progress:
    """``total`` steps of named work; ``step(label)`` after each, ``close()`` at the end."""

    def __init__(self, title: str, total: int, stream: Optional[TextIO] = None) -> None:
        self._bar = _bar(title, max(int(total), 1), stream, unit="step")

    def step(self, label: str) -> None:
        bar = self._bar
        if not bar.disable:
            bar.set_postfix_str(label[:40], refresh=False)  # shown at tqdm's next (throttled) redraw
        bar.update(1)

    def close(self) -> None:
        if self._bar.n < (self._bar.total or 0):
            self._bar.update(self._bar.total - self._bar.n)
        self._bar.close()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class RunProgress:
    """Progress for a session's long runs, at no cost to its short ones.

    A run is one call into the engine (the device loop runs there, with the GIL released), so
    progress comes from the clock: the first run is timed; if it took at least
    ``LONG_RUN_SECONDS``, later runs show a bar whose total is the last run's duration, advanced by
    a background thread while the engine works. A session whose first run was short is ``fast``:
    its runs are called directly, never timed again.

        if progress.fast:
            engine.run(...)
        else:
            progress.run(engine.run, ...)
    """

    __slots__ = ("fast", "expected", "title", "stream")

    def __init__(self, title: str = "popxl: run", stream: Optional[TextIO] = None) -> None:
        self.fast = False
        self.expected: Optional[float] = None  # seconds the last run took, once runs are long
        self.title, self.stream = title, stream

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        start = time.perf_counter()
        if self.expected is None or enabled() is False:
            result = fn(*args)
        else:
            result = self._run_with_bar(fn, args)
        took = time.perf_counter() - start
        if took >= LONG_RUN_SECONDS:
            self.expected = took
        elif self.expected is None:
            self.fast = True
        return result

    def _run_with_bar(self, fn: Callable[..., Any], args: tuple) -> Any:
        expected = self.expected or LONG_RUN_SECONDS
        bar = _bar(self.title, round(expected, 1), self.stream, unit="s",
                   bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed} of ~{total}s")
        done = threading.Event()

        def tick() -> None:
            start = time.perf_counter()
            while not done.wait(MIN_INTERVAL_SECONDS):
                elapsed = min(time.perf_counter() - start, expected * 0.99)  # never claims done early
                bar.update(round(elapsed, 1) - bar.n)

        ticker = threading.Thread(target=tick, name="popxl-run-progress", daemon=True)
        ticker.start()
        try:
            return fn(*args)
        finally:
            done.set()
            ticker.join()
            bar.update(bar.total - bar.n)
            bar.close()
