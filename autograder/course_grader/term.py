"""The course file, ``autograder/course.toml``: what an instructor sets for a term.

Read once, validated where it enters: every refusal is a ``TermError`` whose message names the
file and the field (``[lms] course_id: ...``), and nothing is written by a command that refuses.

Sections (all optional; a command that needs a missing one says which):

``[lms]``
    ``url`` (the Canvas site, ``https://canvas.example.edu``), ``course_id`` (an integer),
    ``token_env`` (the environment variable holding an API token; default ``CANVAS_TOKEN``; the
    token itself never goes in the file), and ``[lms.assignments]``: one entry per lab,
    ``"01_roofline" = { id = 1234, name = "Lab 1: roofline" }``.
``roster``
    A path (relative to the course file) to the roster CSV (``course_grader.lms.read_roster``).

Format: TOML 1.0, read with the standard library's ``tomllib``.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .paths import REPO_ROOT

COURSE_FILE = REPO_ROOT / "autograder" / "course.toml"
LABS = ("01_roofline", "02_kv_cache", "03_scheduling", "04_quantization", "05_speculative_decoding",
        "06_batching_determinism")


class TermError(ValueError):
    """The course file (or a file it names) cannot be used; the message names the field."""


@dataclass(frozen=True)
class Assignment:
    lab: str
    id: int
    name: str


@dataclass(frozen=True)
class LMS:
    url: str
    course_id: int
    token_env: str = "CANVAS_TOKEN"
    assignments: dict[str, Assignment] = field(default_factory=dict)


@dataclass(frozen=True)
class Term:
    path: Path
    lms: LMS | None = None
    roster: Path | None = None


def _int(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise TermError(f"{where}: expected a positive integer, got {value!r}")
    return value


def _str(value, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise TermError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _lms(raw, path: Path) -> LMS:
    if not isinstance(raw, dict):
        raise TermError(f"{path}: [lms] must be a table")
    unknown = set(raw) - {"url", "course_id", "token_env", "assignments"}
    if unknown:
        raise TermError(f"{path}: [lms] has unknown field(s) {sorted(unknown)}")
    url = _str(raw.get("url"), f"{path}: [lms] url")
    if not url.startswith(("https://", "http://")):
        raise TermError(f"{path}: [lms] url: expected an http(s) address, got {url!r}")
    assignments = {}
    table = raw.get("assignments", {})
    if not isinstance(table, dict):
        raise TermError(f"{path}: [lms.assignments] must be a table of lab = {{ id = N, name = \"...\" }}")
    for lab, entry in table.items():
        where = f"{path}: [lms.assignments] {lab}"
        if lab not in LABS:
            raise TermError(f"{where}: unknown lab (the labs are {', '.join(LABS)})")
        if not isinstance(entry, dict) or set(entry) - {"id", "name"} or "id" not in entry:
            raise TermError(f"{where}: expected {{ id = N, name = \"...\" }}, got {entry!r}")
        assignments[lab] = Assignment(lab, _int(entry["id"], f"{where} id"),
                                      _str(entry.get("name", lab), f"{where} name"))
    return LMS(url=url.rstrip("/"), course_id=_int(raw.get("course_id"), f"{path}: [lms] course_id"),
               token_env=_str(raw.get("token_env", "CANVAS_TOKEN"), f"{path}: [lms] token_env"),
               assignments=assignments)


def load(path: Path | str = COURSE_FILE) -> Term:
    """Read and validate the course file at PATH. A missing file is an empty term (no LMS, no roster).

    Raises:
        TermError: the file does not parse as TOML, or a field is missing, of the wrong type or unknown.
    """
    path = Path(path)
    if not path.exists():
        return Term(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise TermError(f"{path}: not a valid TOML file: {exc}") from None
    unknown = set(raw) - {"lms", "roster"}
    if unknown:
        raise TermError(f"{path}: unknown section(s) or field(s) {sorted(unknown)}")
    roster = None
    if "roster" in raw:
        roster = (path.parent / _str(raw["roster"], f"{path}: roster")).resolve()
    return Term(path, lms=_lms(raw["lms"], path) if "lms" in raw else None, roster=roster)
