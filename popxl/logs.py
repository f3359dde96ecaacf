"""Logging for popxl and popart: PopART's loggers on Python's ``logging``.

PopXL is built on PopART and logs through the same loggers, so one configuration controls both:
every logger lives under ``popart`` (``popart.session``, ``popart.devicex``, ..., and
``popart.popxl`` for this package), lines have PopART's format, and ``POPART_LOG_LEVEL`` (default
WARN, as PopART's) / ``POPART_LOG_DEST`` (stdout, stderr (default) or a file path) set them up at
import.
Handlers added to these loggers work as usual; records do not propagate to the root logger.
"""
from __future__ import annotations

import datetime
import logging
import os
import sys

LEVELS = {"TRACE": 5, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING,
          "ERR": logging.ERROR, "CRITICAL": logging.CRITICAL, "OFF": logging.CRITICAL + 10}
TRACE = LEVELS["TRACE"]
logging.addLevelName(TRACE, "TRACE")
ROOT = logging.getLogger("popart")
ROOT.propagate = False  # PopART writes its own log lines, not through the application's handlers


def get_logger(module: str) -> logging.Logger:
    """The Python logger of one module (``popart`` itself, or a child such as ``session``)."""
    return ROOT if module == "popart" else ROOT.getChild(module)


class _Formatter(logging.Formatter):
    """PopART's line format: ``<timestamp> <namespace> <pid>.<tid> <level initial>: <message>``,
    e.g. ``2022-05-18T12:39:14.459868Z popart:session 90915.90915 T: Session::weightsToHost``."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
        namespace = record.name.replace(".", ":")
        return (f"{stamp.strftime('%Y-%m-%dT%H:%M:%S.%f')}Z {namespace} {record.process}.{record.thread} "
                f"{record.levelname[0]}: {record.getMessage()}")


class _StandardStream(logging.StreamHandler):
    """A handler writing to ``sys.stderr`` (or ``sys.stdout``) as it is when each line is written,
    not as it was at import: PopART's C++ logger writes to the process's streams, so redirections
    made later (``contextlib.redirect_stderr``, a test's output capture) receive the lines."""

    def __init__(self, name: str) -> None:
        logging.Handler.__init__(self)  # StreamHandler's would store a stream
        self._name = name

    @property
    def stream(self):
        return getattr(sys, self._name)


def _configure_from_environment() -> None:
    level = os.environ.get("POPART_LOG_LEVEL", "WARN").upper()  # PopART's default level
    ROOT.setLevel(LEVELS.get(level, LEVELS["WARN"]))
    dest = os.environ.get("POPART_LOG_DEST", "stderr")
    if dest.lower() in ("stdout", "stderr"):
        handler: logging.Handler = _StandardStream(dest.lower())
    else:
        try:
            handler = logging.FileHandler(dest)
        except OSError as e:  # a log file that cannot be opened must not make `import popxl` fail
            handler = _StandardStream("stderr")
            handler.setFormatter(_Formatter())
            ROOT.addHandler(handler)
            get_logger("popxl").warning("POPART_LOG_DEST=%r cannot be opened for writing (%s); logging to stderr instead.",
                         dest, e.strerror or e)
            return
    handler.setFormatter(_Formatter())
    ROOT.addHandler(handler)


_configure_from_environment()
