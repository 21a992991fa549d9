#!/usr/bin/env python
"""Similarity flags: which learners' exercise cells of a lab are near copies of each other.

    python -m course_grader.similarity SUBMISSIONS [--labs L] [--threshold T] [--out CSV] [--root DIR]
                                       [--release DIR] [--course FILE]

For every lab, every pair of learners' *exercise cells* (the code cells nbgrader marks as solution
cells, or tagged ``exercise``) is compared with copydetect's fingerprints (``copydetect.CodeFingerprint``
and ``compare_files``): the code is tokenised with Pygments, names become ``V``/``F``/``O``, strings
``S``, whitespace and comments are dropped, and the winnowed hashes of every NOISE-character k-gram
of what is left are compared (winnowing: Schleimer, Wilkerson and Aiken, "Winnowing: local algorithms
for document fingerprinting", SIGMOD 2003; copydetect's documentation:
https://copydetect.readthedocs.io). A renamed, re-spaced or re-commented copy keeps its fingerprints.

Every code cell of a learner's notebook is read, not only those marked as exercises (the metadata is
the learner's to edit: a copy moved into an unmarked cell still runs and is compared), except the
cells nbgrader overwrites with the course's source when it grades (the release's test and locked
cells, by grade_id) and the release's cells left unchanged. What every learner shares is boilerplate
and never counts: the release notebook's other code cells (the starter code: signatures, docstrings,
``raise NotImplementedError()``, set-up cells) and the source of the course_lib references the lab's
contracts name (``course_lib.grading.labNN.CONTRACTS``, ``Contract.references``).

A pair's ``similarity`` is the larger of copydetect's two fractions (the share of learner A's
fingerprinted code found in B's, and of B's in A's), so a short submission copied whole from a longer
one is flagged too; it is ``flagged`` at or above the threshold (``[similarity] threshold`` of the
course file, default 0.8; ``--threshold``). A flag is for a person to read the two notebooks; it never
changes a score, and a pair below the threshold is no proof of independent work.

Output: a CSV (default SUBMISSIONS/../similarity.csv; the grading driver writes WORK/similarity.csv)
with one row per compared pair, the flagged ones first (``COLUMNS``): every pair, not only the flagged
ones, so the file also shows that a lab was compared and how close the nearest unflagged pairs came.
Exit status: 0 done (flags or not); 2 refused (bad option, course file or folder: nothing written).
"""
from __future__ import annotations

import argparse
import csv
import importlib
import inspect
import io
import itertools
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import term as term_mod
from .paths import REPO_ROOT
from .term import TermError
from .text import printable

#: copydetect's defaults (``copydetect.defaults``): k-grams of this many characters of filtered code...
NOISE = 25
#: ...and every common run at least this long is guaranteed a shared fingerprint (window = GUARANTEE - NOISE + 1).
GUARANTEE = 25
MAX_CHARS = 200_000   # exercise code of one notebook beyond this is not compared (listed as skipped)
PRINTED_PAIRS = 20    # flagged pairs printed by the driver's summary; the rest are in the CSV
COLUMNS = ["lab", "learner_a", "learner_b", "similarity", "similarity_a", "similarity_b", "overlap", "flagged"]


@dataclass(frozen=True)
class Pair:
    """Two learners' exercise code of one lab: ``similarity_a`` is the fraction of A's fingerprinted
    code (after boilerplate) found in B's, ``similarity_b`` the reverse, ``similarity`` the larger,
    ``overlap`` the shared characters of filtered code in A's, ``flagged`` whether it reached the threshold."""
    lab: str
    learner_a: str
    learner_b: str
    similarity: float
    similarity_a: float
    similarity_b: float
    overlap: int
    flagged: bool


@dataclass
class Result:
    """The pairs of a comparison (flagged first, then by similarity) and the notebooks left out
    (``skipped``: ``(lab, learner, why)``)."""
    pairs: list[Pair]
    skipped: list[tuple[str, str, str]]
    threshold: float

    @property
    def flagged(self) -> list[Pair]:
        return [p for p in self.pairs if p.flagged]

    def flags_of(self, learner: str, lab: str) -> list[dict]:
        """The flagged pairs of LEARNER in LAB, as ``{"with": other learner, "similarity": x}``."""
        return [{"with": p.learner_b if p.learner_a == learner else p.learner_a, "similarity": p.similarity}
                for p in self.flagged if p.lab == lab and learner in (p.learner_a, p.learner_b)]


def _code_cells(notebook: dict):
    """(cell, its nbgrader metadata, its tags) of each code cell of NOTEBOOK that is a dict."""
    for cell in notebook.get("cells", []) if isinstance(notebook, dict) else []:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        meta = cell.get("metadata") if isinstance(cell.get("metadata"), dict) else {}
        nbgrader = meta.get("nbgrader") if isinstance(meta.get("nbgrader"), dict) else {}
        yield cell, nbgrader, meta.get("tags") if isinstance(meta.get("tags"), list) else []


def overwritten_ids(release: dict) -> set[str]:
    """The grade_ids of RELEASE's test and locked code cells: nbgrader autograde puts the course's source
    back into a submitted cell with one of these ids, so what a learner wrote there never runs."""
    return {str(nbgrader.get("grade_id")) for _, nbgrader, _ in _code_cells(release)
            if (nbgrader.get("grade") is True or nbgrader.get("locked") is True)
            and nbgrader.get("solution") is not True}


def _source(cell: dict):
    source = cell.get("source", "")
    return "".join(s for s in source if isinstance(s, str)) if isinstance(source, list) else source


def exercise_code(notebook: dict, every_cell: bool = False, skip_ids: set[str] = frozenset(),
                  skip_sources: set[str] = frozenset()) -> str:
    """The source of NOTEBOOK's exercise cells (code cells with nbgrader ``solution: true`` or the
    ``exercise`` tag), in order, one after the other; with EVERY_CELL, of all its code cells but those
    whose grade_id is one of SKIP_IDS (what ``compare_submissions`` reads: a learner's metadata is theirs
    to edit, so code moved into a cell not marked as an exercise is compared too; the cells nbgrader
    overwrites, ``overwritten_ids``, are not, nor those whose stripped source is one of SKIP_SOURCES, the
    release's cells left as they were). NOTEBOOK is a parsed nbformat 4 notebook; cells that are not
    dicts, and sources that are not text, are left out."""
    out = []
    for cell, nbgrader, tags in _code_cells(notebook):
        source = _source(cell)
        if not isinstance(source, str):
            continue
        if every_cell and (str(nbgrader.get("grade_id")) in skip_ids or source.strip() in skip_sources):
            continue
        if every_cell or nbgrader.get("solution") is True or "exercise" in tags:
            out.append(source)
    return "\n\n".join(out)


def reference_code(lab: str) -> list[str]:
    """The source of every course_lib reference that LAB's contracts name
    (``course_lib.grading.labNN.CONTRACTS``; [] for a lab without such a module, e.g. a test course).
    A name that does not resolve, or whose source is not available, is left out."""
    try:
        module = importlib.import_module(f"course_lib.grading.lab{lab[:2]}")
    except ImportError:
        return []
    sources = []
    for name in sorted({r for contract in getattr(module, "CONTRACTS", ()) for r in contract.references}):
        parts = name.split(".")
        for split in range(len(parts) - 1, 0, -1):    # the longest importable module prefix, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:split]))
            except ImportError:
                continue
            try:
                for attr in parts[split:]:
                    obj = getattr(obj, attr)
                sources.append(inspect.getsource(obj))
            except (AttributeError, OSError, TypeError):
                pass
            break
    return sources


def _fingerprint(code: str, boilerplate=None):
    from copydetect import CodeFingerprint

    return CodeFingerprint("exercise.py", NOISE, GUARANTEE - NOISE + 1, boilerplate=boilerplate,
                           language="python", fp=io.StringIO(code))


def boilerplate_hashes(texts: list[str]):
    """The fingerprints of TEXTS (every k-gram, no winnowing: what copydetect does with its
    boilerplate files), as the array ``CodeFingerprint`` takes."""
    import numpy as np

    hashes = set()
    for text in texts:
        hashes |= set(_fingerprint(text).hashes) if len(text) >= NOISE else set()
    return np.array(sorted(hashes))


def compare_lab(lab: str, codes: dict[str, str], boilerplate: list[str], threshold: float) -> list[Pair]:
    """Every pair of CODES (learner -> exercise code of LAB), with the fingerprints of BOILERPLATE
    (starter code, references) removed first; learners in sorted order within a pair. A learner whose
    code has no fingerprint left (starter code only, or less than ``NOISE`` characters of filtered
    code of their own) scores 0 with everyone.

    Raises:
        TermError: a threshold that is not above 0 and at most 1."""
    from copydetect import compare_files

    threshold = term_mod.check_threshold(threshold, "threshold")
    common = boilerplate_hashes(boilerplate)
    prints = {learner: _fingerprint(code, common) for learner, code in sorted(codes.items())}
    pairs = []
    for a, b in itertools.combinations(prints, 2):
        if not prints[a].hashes or not prints[b].hashes:
            overlap, (sim_a, sim_b) = 0, (0.0, 0.0)
        else:
            overlap, (sim_a, sim_b), _ = compare_files(prints[a], prints[b])
        sim_a, sim_b = round(float(sim_a), 4), round(float(sim_b), 4)
        best = max(sim_a, sim_b)
        pairs.append(Pair(lab, a, b, best, sim_a, sim_b, int(overlap), best >= threshold))
    return pairs


def find_notebooks(submissions: Path, lab: str) -> dict[str, Path]:
    """{learner: notebook} of LAB under SUBMISSIONS/{learner}/{lab}/: ``{lab}.ipynb``, else the one
    and only ``*.ipynb`` there (the grading driver's rule); symbolic links are never followed."""
    found = {}
    for folder in sorted(p for p in submissions.glob(f"*/{lab}") if p.is_dir() and not p.is_symlink()
                         and not p.parent.is_symlink() and not p.parent.name.startswith(".")):
        path = folder / f"{lab}.ipynb"
        candidates = [path] if path.is_file() else sorted(folder.glob("*.ipynb"))
        if len(candidates) == 1 and candidates[0].is_file() and not candidates[0].is_symlink():
            found[folder.parent.name] = candidates[0]
    return found


def compare_submissions(submissions: Path, labs: list[str], release: Path, threshold: float,
                        learners: dict[str, set[str]] | None = None) -> Result:
    """Compare every pair of learners' code cells (only LEARNERS[lab], when given) of each of LABS under
    SUBMISSIONS (``{learner}/{lab}/{lab}.ipynb``; ``exercise_code`` with every cell, less the cells
    nbgrader overwrites and the release's unchanged ones); the starter code is RELEASE/{lab}/{lab}.ipynb's
    code cells (a missing release: no starter code removed, said in ``skipped`` as learner "*"). A
    notebook that is not readable JSON (or is nested too deep to parse), or whose code is longer than
    ``MAX_CHARS``, is skipped (listed)."""
    pairs, skipped = [], []
    for lab in labs:
        starter = release / lab / f"{lab}.ipynb"
        boilerplate = reference_code(lab)
        skip_ids, unchanged = set(), set()
        try:
            released = json.loads(starter.read_text(encoding="utf-8"))
            skip_ids = overwritten_ids(released)
            boilerplate.append(exercise_code(released, every_cell=True, skip_ids=skip_ids))
            unchanged = {s.strip() for cell, _, _ in _code_cells(released) if isinstance(s := _source(cell), str)}
        except (OSError, ValueError, RecursionError) as exc:
            skipped.append((lab, "*", f"starter code not removed: cannot read {starter}: {exc}"))
        codes = {}
        for learner, path in find_notebooks(submissions, lab).items():
            if learners is not None and learner not in learners.get(lab, ()):
                continue
            try:
                code = exercise_code(json.loads(path.read_bytes().decode("utf-8")), every_cell=True,
                                     skip_ids=skip_ids, skip_sources=unchanged)
            except (OSError, ValueError, RecursionError) as exc:   # RecursionError: JSON nested too deep
                skipped.append((lab, learner, f"not compared: {type(exc).__name__}"))
                continue
            if len(code) > MAX_CHARS:
                skipped.append((lab, learner, f"not compared: {len(code):,} characters of exercise code"))
                continue
            codes[learner] = code
        pairs += compare_lab(lab, codes, boilerplate, threshold)
    pairs.sort(key=lambda p: (not p.flagged, -p.similarity, p.lab, p.learner_a, p.learner_b))
    return Result(pairs, skipped, threshold)


def csv_text(result: Result) -> str:
    """RESULT's pairs as CSV text (``COLUMNS``; learner names through ``printable``; ``flagged`` is
    "yes" or empty)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for p in result.pairs:
        writer.writerow([p.lab, printable(p.learner_a), printable(p.learner_b), f"{p.similarity:.4f}",
                         f"{p.similarity_a:.4f}", f"{p.similarity_b:.4f}", p.overlap, "yes" if p.flagged else ""])
    return out.getvalue()


def write_csv(result: Result, path: Path) -> None:
    """Write RESULT's pairs to PATH (``csv_text``), whole or not at all (a temporary file renamed over it)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".similarity-", suffix=".csv")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(csv_text(result))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def summary_lines(result: Result, csv_path: Path, cap: int = PRINTED_PAIRS) -> list[str]:
    """What a person reads at the end of a run: the flagged pairs (at most CAP, then how many more are in
    CSV_PATH) and the skipped notebooks."""
    flagged = result.flagged
    lines = [f"{len(flagged)} similar pair(s) of learners (exercise cells, similarity >= {result.threshold:g}; "
             "a flag for a person to read, never a score change)" + (":" if flagged else ".")]
    lines += [f"  {p.lab}: {printable(p.learner_a)} ~ {printable(p.learner_b)} {p.similarity:.2f}"
              for p in flagged[:cap]]
    if len(flagged) > cap:
        lines.append(f"  ... and {len(flagged) - cap} more in {csv_path}")
    lines += [f"  {lab} / {printable(learner)}: {why}" for lab, learner, why in result.skipped]
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m course_grader.similarity",
        description="Flag pairs of learners whose exercise cells of a lab are near copies (copydetect "
                    "fingerprints; starter code and references excluded). Never changes a score.")
    parser.add_argument("submissions", type=Path, help="folder laid out as {learner}/{lab}/{lab}.ipynb")
    parser.add_argument("--labs", metavar="LAB[,LAB...]", help="compare only these labs (default: every lab "
                                                               "of the course found in SUBMISSIONS)")
    parser.add_argument("--threshold", type=float, default=None,
                        help="flag a pair at or above this similarity, 0 < T <= 1 (default: the course file's "
                             f"[similarity] threshold, else {term_mod.SIMILARITY_THRESHOLD:g})")
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help="course root (default: this repository)")
    parser.add_argument("--release", type=Path, default=None,
                        help="folder of the release notebooks, the starter code (default: ROOT/labs)")
    parser.add_argument("--course", type=Path, default=None,
                        help="the course file (default: ROOT/autograder/course.toml)")
    parser.add_argument("--out", type=Path, default=None,
                        help="the CSV to write (default: similarity.csv beside SUBMISSIONS)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    prog = "python -m course_grader.similarity"
    try:
        labs = term_mod.course_labs(args.root)
        course = term_mod.load(args.course or args.root / "autograder" / "course.toml", labs=labs or None)
        threshold = (course.similarity_threshold if args.threshold is None
                     else term_mod.check_threshold(args.threshold, "--threshold"))
        if not args.submissions.is_dir():
            raise ValueError(f"SUBMISSIONS: {args.submissions} is not a folder")
        present = sorted({p.name for p in args.submissions.glob("*/*") if p.is_dir() and p.name in labs})
        wanted = [s.strip() for s in args.labs.split(",") if s.strip()] if args.labs else present
        unknown = sorted(set(wanted) - set(labs))
        if unknown:
            raise ValueError(f"--labs: {', '.join(unknown)} is not a lab of the course at {args.root}")
        if not wanted:
            raise ValueError(f"SUBMISSIONS: no lab folder of the course in {args.submissions}")
        out = (args.out or args.submissions.resolve().parent / "similarity.csv")
        if not out.parent.is_dir():
            raise ValueError(f"--out: no folder {out.parent}")
    except (TermError, ValueError) as exc:
        print(f"{prog}: refused: {exc}", file=sys.stderr)
        return 2
    result = compare_submissions(args.submissions, wanted, args.release or args.root / "labs", threshold)
    write_csv(result, out)
    print("\n".join(summary_lines(result, out)))
    print(f"Similarity CSV: {out} ({len(result.pairs)} pair(s) compared)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
