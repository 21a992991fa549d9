"""Text that comes from learner code, made safe to store and to show.

Learner code decides the text of its exceptions, prints, displayed values, names and the bytes of
its notebook's JSON. This module defends against two kinds of such text: a lone surrogate
(``'\\ud800'``, legal in a Python ``str`` and in JSON escapes, with no UTF-8 encoding), which makes
every UTF-8 writer raise (the autograded notebook, the judge's verdicts, the export, the CSVs:
one used to fail a whole submission), fixed by ``encodable`` where learner text enters; and control
characters (terminal escapes, newlines) that move the cursor or forge rows in a table, fixed by
``printable`` where the driver prints or writes a one-line cell. Both keep the code point visible
as an escape (``\\ud800``, ``\\x1b``). It does not sanitise HTML (the feedback's exporter does).
"""
from __future__ import annotations

import re
from typing import Any

# Code points that UTF-8 cannot encode: the surrogate range U+D800..U+DFFF (Python strings may
# hold them alone; os.fsdecode also makes U+DC80..U+DCFF from undecodable file-name bytes).
_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
#: A terminal colour or cursor escape, as IPython puts in tracebacks.
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def encodable(text: str) -> str:
    """TEXT with every lone surrogate replaced by its escape (``'\\ud800'`` becomes the six
    characters ``\\ud800``), so that ``text.encode("utf-8")`` cannot fail. Other text is returned
    unchanged (the same object when there is nothing to replace).

    Raises:
        TypeError: TEXT is not a str.
    """
    if not isinstance(text, str):
        raise TypeError(f"encodable() takes a str, got {type(text).__name__}")
    if not _SURROGATE.search(text):
        return text
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def encodable_tree(obj: Any) -> Any:
    """OBJ (nested dicts, lists and tuples of str, numbers, bools and None, as JSON and nbformat
    hold them) with ``encodable`` applied to every string, keys included. Dicts and lists are
    changed in place, so a notebook node keeps its class; the object is also returned."""
    if isinstance(obj, str):
        return encodable(obj)
    if isinstance(obj, dict):
        for key in list(obj):       # each key taken out and put back, so their order stays
            value = encodable_tree(obj.pop(key))
            obj[encodable(key) if isinstance(key, str) else key] = value
        return obj
    if isinstance(obj, list):
        obj[:] = [encodable_tree(item) for item in obj]
        return obj
    if isinstance(obj, tuple):
        return tuple(encodable_tree(item) for item in obj)
    return obj


def printable(text: Any) -> str:
    """TEXT (made a str) on one safe line: control characters (terminal escapes, newlines,
    bells) shown as ``\\xNN`` and lone surrogates as ``\\uXXXX``. For names and notes taken from a
    submission, which must not move the cursor, forge rows in a table or CSV, or fail a UTF-8
    write."""
    return encodable(_CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text)))


def parse_python(source: str, filename: str = "<unknown>"):
    """``course_lib.exercises.parse_python``: ``ast.parse`` that survives CPython 3.11.7's spurious
    ``SystemError`` in threaded programs such as the grader (python/cpython#106905).

    Imported when called, so that a driver whose Python cannot import course_lib still reaches
    the grader's own check and its clear error.
    """
    from course_lib.exercises import parse_python as parse

    return parse(source, filename)
