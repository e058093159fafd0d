"""Where in the model's own code a traced call was made or a trace stopped, for messages.

Two sources say it: a call of a ``torch.export`` program keeps the stack trace of the Python
that made it (:func:`call_site`, :func:`call_place`), and a trace that fails raises from inside
the model's Python, since a non-strict trace runs it (:func:`failure_place`: torch.export's own
guard error names torch's frame where it finds no user code, so the traceback is read instead).
"""

from __future__ import annotations

import linecache
import os
import sys
import sysconfig
import traceback
from pathlib import Path

import torch
import torch.fx

__all__ = ["call_place", "call_site", "failure_place"]


def call_site(n: torch.fx.Node) -> str:
    """Where the model's source made call ``n``: its file's name and line, and the code there
    (``n``'s name where its stack trace is not kept)."""
    found = _call_source(n)
    return f"{found[0]}: {found[1]}".rstrip(": ") if found else n.name


def call_place(n: torch.fx.Node) -> str:
    """`` at file:line (`code`)`` where the model's source made call ``n``, where that is known."""
    found = _call_source(n)
    return "" if found is None else f" at {found[0]}" + (f" (`{found[1]}`)" if found[1] else "")


def _call_source(n: torch.fx.Node) -> tuple[str, str] | None:
    """(file's name:line, the code there) of the innermost frame of call ``n``'s stack trace."""
    frames = [line.strip() for line in (n.meta.get("stack_trace") or "").splitlines() if line.strip()]
    for i in range(len(frames) - 1, -1, -1):
        if frames[i].startswith("File "):
            where = frames[i].split('"')
            line = frames[i].rsplit("line ", 1)[-1].split(",")[0]
            code = frames[i + 1] if i + 1 < len(frames) and not frames[i + 1].startswith("File ") else ""
            return f"{Path(where[1]).name if len(where) > 1 else '?'}:{line}", code
    return None


def failure_place(error: BaseException) -> str:
    """Where in the model's code a trace met what it could not trace: the innermost frame of
    ``error``'s traceback outside torch, opsched and Python's own library, as `` at file:line in
    function (`code`)``, the file named from the path entry it is under (a library's from its
    package); nothing where there is none."""
    place = None
    for frame, line in traceback.walk_tb(error.__traceback__):
        file = os.path.abspath(frame.f_code.co_filename)
        if not frame.f_code.co_filename.startswith("<") and not file.startswith(_NOT_THE_MODELS) and \
                (file.startswith(_INSTALLED) or not file.startswith(_PYTHONS)):
            place = (file, line, frame.f_code.co_name)
    if place is None:
        return ""
    file, line, function = place
    roots = [os.path.abspath(r) + os.sep for r in sys.path if r and file.startswith(os.path.abspath(r) + os.sep)]
    shown = file[len(max(roots, key=len)):] if roots else file
    code = linecache.getline(file, line).strip()
    return f" at {shown}:{line} in {function}" + (f" (`{code[:120]}`)" if code else "")


#: Code whose frames are not the model's: torch's, opsched's, and Python's own library's but for
#: the packages installed within it (transformers').
_NOT_THE_MODELS = tuple(os.path.abspath(d) + os.sep for d in (os.path.dirname(torch.__file__),
                                                              os.path.dirname(os.path.dirname(__file__))))
_PYTHONS = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep
_INSTALLED = tuple(os.path.abspath(sysconfig.get_paths()[k]) + os.sep for k in ("purelib", "platlib"))
