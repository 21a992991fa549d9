"""Custom nbgrader preprocessors for the course's autograde pipeline.

``course_grader.config`` (which ``autograder/nbgrader_config.py`` calls) puts them into
nbgrader's sanitize, autograde and feedback preprocessor lists. They defend the grading against
what stock nbgrader 0.9 lets a submission do: zero itself with text UTF-8 cannot encode, with a
warning on stderr, or with a deleted or duplicated cell; score a wrong answer by displaying a
number; read hidden tests and their drawn inputs in the feedback's tracebacks or the judge's
messages (``redact``, which the judge also applies to its verdicts). They do not judge answers
(``course_grader.judge`` does) or run learner code (``course_grader.sandbox`` does).
"""

import ast
import re
from pathlib import Path

from nbformat import from_dict
from nbgrader import utils
from nbgrader.preprocessors import DeduplicateIds, NbGraderPreprocessor, OverwriteCells
from traitlets import Unicode

from .text import ANSI, encodable_tree, parse_python

STDERR_PREFIX = "[stderr]"


class EncodableText(NbGraderPreprocessor):
    """Make every string of the notebook encodable as UTF-8 (``course_grader.text.encodable``).

    A lone surrogate (``'\\ud800'``), legal in a Python string and in the notebook's JSON, makes
    nbconvert's UTF-8 writer raise, which nbgrader reports as a failed autograde (the whole
    submission scores 0). Learner code puts such text in outputs, an editor in a source. Runs last
    among the sanitize steps and right after ``Execute`` (the judge's outputs included); each lone
    surrogate becomes its six-character escape, so the text stays visible.
    """

    def preprocess(self, nb, resources):
        encodable_tree(nb)
        return nb, resources


class StderrToStdout(NbGraderPreprocessor):
    """Keep stderr text of graded code cells visible, but as stdout.

    Stock nbgrader 0.9.x (``nbgrader.utils.determine_grade``) gives 0 points to a graded code cell
    with any ``stderr`` stream, so a warning printed by torch or the learner's code would zero a
    correct answer; the course rule is that only an ``error`` output fails a test cell. Runs after
    ``Execute`` and ``IgnorePattern``, before ``SaveAutoGrades``: each ``stderr`` stream of a graded
    code cell becomes a ``stdout`` stream whose text starts with a line ``[stderr]``.
    """

    prefix = Unicode(
        STDERR_PREFIX,
        help="Line put before stderr text that is moved to stdout in graded cells.",
    ).tag(config=True)

    def preprocess_cell(self, cell, resources, cell_index):
        if cell.cell_type != "code" or not utils.is_grade(cell):
            return cell, resources
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream" and output.get("name") == "stderr":
                output["name"] = "stdout"
                output["text"] = self.prefix + "\n" + output.get("text", "")
        return cell, resources


class DisplayedValuesAreNotScores(NbGraderPreprocessor):
    """A graded test cell's score comes from its errors (and the judge's verdict) only.

    Stock nbgrader (``nbgrader.utils.determine_grade``) scores a graded code cell by the number its
    first ``execute_result`` shows and looks no further (an error after it is never seen), and
    learner code decides what a cell displays (``ast_node_interactivity = 'all'``). Runs after
    ``Execute``, before ``SaveAutoGrades``: every ``execute_result`` of a graded test cell (not a
    solution cell) becomes a ``display_data`` output with the same data, never read as a score.
    """

    def preprocess_cell(self, cell, resources, cell_index):
        if cell.cell_type != "code" or not utils.is_grade(cell) or utils.is_solution(cell):
            return cell, resources
        for i, output in enumerate(cell.get("outputs", [])):
            if output.get("output_type") == "execute_result":
                cell.outputs[i] = from_dict({"output_type": "display_data", "data": output.get("data", {}),
                                             "metadata": output.get("metadata", {})})
        return cell, resources


HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
REDACTED = "      ... (hidden test lines not shown)"


def hidden_regions(text: str):
    """``(line, plain line, hidden, begins)`` for each line of TEXT: ``hidden`` from a BEGIN HIDDEN
    TESTS marker line to the next line with an END marker and no BEGIN marker, both included, or to
    the end; ``begins`` on the first BEGIN line. ANSI colour codes are ignored in the markers."""
    hidden = False
    for line in text.split("\n"):
        plain = ANSI.sub("", line)
        begins = not hidden and HIDDEN_BEGIN in plain
        hidden = hidden or begins
        yield line, plain, hidden, begins
        hidden = hidden and (HIDDEN_BEGIN in plain or HIDDEN_END not in plain)


def redact_hidden_lines(text: str) -> str:
    """TEXT with every hidden-test region (``hidden_regions``) replaced by one placeholder line."""
    return "\n".join(REDACTED if begins else line for line, _, hidden, begins in hidden_regions(text)
                     if begins or not hidden)


ARROW = re.compile(r"^\s*-+>\s*\d+")  # IPython's "----> 7 line" marker of the line that raised


def raised_in_hidden_lines(frame: str) -> bool:
    """True when a traceback frame's arrow points at a line between the hidden-test markers."""
    return any(hidden and ARROW.match(plain) and HIDDEN_BEGIN not in plain and HIDDEN_END not in plain
               for _, plain, hidden, _ in hidden_regions(frame))


_NUMBER = re.compile(r"(?<![\w])(?<!\d\.)[-+]?(?:\d[\d_]*(?:,\d{3})*(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?(?![\w])")
#: Phrases of a failing message whose numbers say *how* it failed, not what the inputs or the
#: reference were: they survive redaction.
_KEEP = [re.compile(p) for p in (
    r"max \|diff\|(?: over the compared steps)? [-+0-9.eE]+(?:inf|nan)?", r"\|diff\| [-+0-9.eE]+",
    r"\d+ of \d+ values over", r"ratio got/expected = [-+0-9.eE]+(?:inf|nan)?",
    r"first over tolerance at (?:index \([\d, ]*\)|step \d+)", r"\bcase \d+", r"\d+ significant figures",
    r"relative error (?:must be )?<= [-+0-9.eE]+", r"\b[ar]tol [-+0-9.eE]+", r"top-2", r"torch\.\w+")]
_HINT = re.compile(r"; your number is what the formula gives with .*$")
_CONSTANTS: set[str] = set()


def _checker_constants() -> set[str]:
    """Numbers written literally in the checkers' message strings (fault names such as
    "k(k+1)/2" or "binary GiB (2^30 bytes)"): constants, not drawn inputs."""
    if not _CONSTANTS:
        import course_lib.grading as grading

        folder = Path(grading.__file__).parent
        for path in sorted(folder.glob("*.py")):
            for node in ast.walk(parse_python(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    _CONSTANTS.update(m.group(0) for m in _NUMBER.finditer(node.value))
        _CONSTANTS.add("")
    return _CONSTANTS


def _collapse_case(head: str) -> str:
    """Every "(case N: <drawn inputs>)" becomes "(case N)"; a call label "name(<args>) (case N)"
    becomes "name (case N)"; "case N: <inputs>: ..." (check_paged) becomes "case N: ..."."""
    out, i = [], 0
    while True:
        j = head.find("(case ", i)
        if j < 0:
            out.append(head[i:])
            break
        depth, k = 0, j
        while k < len(head):
            depth += head[k] == "("
            depth -= head[k] == ")"
            if depth == 0:
                break
            k += 1
        m = re.match(r"\(case \d+", head[j:])
        out.append(head[i:j] + m.group(0) + ")")
        i = k + 1
    head = "".join(out)
    head = re.sub(r"^(\w+)\([^()]*(?:\([^()]*\)[^()]*)*\) \((case \d+)\)", r"\1 (\2)", head)
    head = re.sub(r"^(\w+)\((?!case)[^:]*?\)(?=: )", r"\1 (a hidden case)", head)
    head = re.sub(r"^(case \d+): [^:]*?(?=: )", r"\1", head)
    return re.sub(r"^(\w+)\((case \d+)\)", r"\1 (\2)", head)


def redact(message: str) -> str:
    """A hidden check's message without its drawn inputs or reference values.

    Kept: the function and case number, the kind of failure (type, dtype, contract), error
    magnitudes (max |diff|, how many values over, the got/expected ratio), the first failing
    index or step, tolerances, and the Diagnosis naming the fault (numbers in it only where the
    checker's own text has them, never a bare "(N)"). Dropped: the case's drawn inputs, expected
    and got values, shapes, formula terms, and the lines that print reference values ("(reference:",
    "expected ...", "got ..."); other numbers become '#'."""
    lines = str(message).splitlines() or [""]
    head = _collapse_case(_HINT.sub("", lines[0]))
    if head.rstrip().endswith(":"):
        head = head.rstrip() + " the result differs from the reference"
    # the lines after the first print reference values, expected/got plans and the like, up to the Diagnosis
    diagnosis = next((i for i, line in enumerate(lines) if line.strip().startswith("Diagnosis:")), len(lines))
    return "\n".join([_mask_numbers(head, constants=False)]
                     + [_mask_numbers(line, constants=True) for line in lines[max(1, diagnosis):]])


def _mask_numbers(line: str, constants: bool) -> str:
    spans: list[tuple[int, int]] = []
    for pattern in _KEEP:
        spans.extend(m.span() for m in pattern.finditer(line))
    bare = [m.span(1) for m in re.finditer(r"\((\s*[-+]?[\d.,]+\s*)\)", line)]   # "(24)": an input
    allowed = _checker_constants() if constants else set()
    out, last = [], 0
    for m in _NUMBER.finditer(line):
        if any(a <= m.start() and m.end() <= b for a, b in spans):
            continue
        if m.group(0) in allowed and not any(a <= m.start() and m.end() <= b for a, b in bare):
            continue
        out.append(line[last:m.start()])
        out.append("#")
        last = m.end()
    out.append(line[last:])
    text = "".join(out)
    text = re.sub(r"\(#(?:, #)+\)", "(…)", text)
    return re.sub(r"\[#?(?:, #)*\]", "[…]", text)


class RedactHiddenTracebacks(NbGraderPreprocessor):
    """Remove hidden tests and what they drew from the errors of graded cells (for feedback).

    ``ClearHiddenTests`` removes the hidden region from a test cell's *source*, but an error
    raised while the cell ran carries a traceback that quotes the cell's lines, hidden ones
    included, and a hidden check's message names the case it drew and the reference value.
    This preprocessor rewrites each traceback frame of a graded code cell's error outputs with
    ``redact_hidden_lines``; when the error was raised by a hidden line, the message is cut down
    by ``redact`` (the contract, the error's size and the named fault stay; drawn
    inputs and expected values go). The exception's type stays. Printed text of graded cells gets
    ``redact_hidden_lines`` too (learner code can print the source of the cell running it).
    """

    def preprocess_cell(self, cell, resources, cell_index):
        if cell.cell_type != "code" or not utils.is_grade(cell):
            return cell, resources
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":     # a learner printing the running cell's source
                output["text"] = redact_hidden_lines(output.get("text", ""))
            if output.get("output_type") != "error":
                continue
            frames = output.get("traceback", [])
            hidden = any(raised_in_hidden_lines(frame) for frame in frames)
            frames = [redact_hidden_lines(frame) for frame in frames]
            if hidden:
                ename, message = output.get("ename", "Error"), redact(output.get("evalue", ""))
                output["evalue"] = message
                frames = [frame for frame in frames if not ANSI.sub("", frame).startswith(f"{ename}:")]
                frames.append(f"{ename}: {message} (a hidden test; its inputs are not shown)")
            output["traceback"] = frames
        return cell, resources


class RestoreMissingTests(OverwriteCells):
    """nbgrader's OverwriteCells, with a sturdier way to put back deleted test cells.

    Stock ``OverwriteCells.add_missing_cells`` (nbgrader 0.9.5) inserts a missing grade cell
    right after the source cell that precedes it, and raises KeyError when that cell is gone
    too (a learner who deleted an exercise's solution cell and its test), which fails the
    whole notebook. Here a missing grade cell goes after the nearest earlier graded or
    solution cell still in the notebook, or first when there is none. Source cells are
    taken in the gradebook's order, which is the source notebook's (as stock nbgrader assumes).
    Enabled by ``c.OverwriteCells.add_missing_cells = True``.
    """

    def add_missing_grade_cells(self, nb, resources):
        source_nb = self.gradebook.find_notebook(self.notebook_id, self.assignment_id)
        order = [cell.name for cell in source_nb.source_cells]
        source = {cell.name: cell for cell in source_nb.source_cells}
        graded = {cell.name: cell for cell in source_nb.grade_cells}
        solutions = {cell.name for cell in source_nb.solution_cells}
        for position, name in enumerate(order):
            if name not in graded:
                continue
            present = {cell.metadata.nbgrader.get("grade_id"): i for i, cell in enumerate(nb.cells)
                       if utils.is_grade(cell) or utils.is_solution(cell)}
            if name in present:
                continue
            self.log.warning("Missing grade cell %s encountered, adding to notebook", name)
            earlier = [present[p] for p in reversed(order[:position]) if p in present]
            cell = from_dict(self.missing_cell_transform(source[name], graded[name].max_score,
                                                         is_solution=name in solutions))  # nested nodes too
            nb.cells.insert(earlier[0] + 1 if earlier else 0, cell)
        return nb, resources

    def add_missing_task_cells(self, nb, resources):
        """Stock behaviour (missing task cells go at the end, in source order), without the stock
        KeyError on a cell whose nbgrader metadata has no grade_id (DeduplicateIds empties the
        metadata of a repeated cell)."""
        source_nb = self.gradebook.find_notebook(self.notebook_id, self.assignment_id)
        source = {cell.name: cell for cell in source_nb.source_cells}
        present = {cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") for cell in nb.cells}
        for task in source_nb.task_cells:
            if task.name not in present:
                nb.cells.append(from_dict(self.missing_cell_transform(source[task.name], task.max_score, is_task=True)))
        return nb, resources


class DropRepeatedIds(DeduplicateIds):
    """nbgrader's DeduplicateIds (the last cell with a repeated grade_id keeps it), but the
    earlier copies lose their ``nbgrader`` metadata entirely. Stock DeduplicateIds leaves an
    empty ``nbgrader: {}``, which CheckCellMetadata then rejects as "an old version" of the
    metadata, failing the whole notebook of a learner who merely duplicated a cell."""

    def preprocess_cell(self, cell, resources, cell_index):
        cell, resources = super().preprocess_cell(cell, resources, cell_index)
        if cell.get("metadata", {}).get("nbgrader", None) == {}:
            del cell.metadata["nbgrader"]
        return cell, resources


#: nbclient's tag for a cell it leaves unrun (``NotebookClient.skip_cells_with_tag``'s default).
SKIP_TAG = "skip-execution"
SKIPPED_NOTE = ("[grading] not run: a demonstration cell. Grading runs the set-up, exercise and check cells and "
                "any cell you added or edited; a demonstration's results are never graded.\n")
_NAME_ERROR = re.compile(r"name '([A-Za-z_][A-Za-z0-9_]*)' is not defined")


def _plain_source(source: str) -> str:
    """A cell's source (nbformat holds it as one str) with trailing spaces and leading or trailing
    blank lines removed."""
    return "\n".join(line.rstrip() for line in source.strip("\n").split("\n")).strip("\n")


class SkipDemonstrations(NbGraderPreprocessor):
    """Leave a lab's demonstration cells unrun while autograding (before ``Execute``).

    The roles come from the lab's source notebook (``CourseDirectory.source_directory``, the
    instructor's; ``course_lib.exercises.cell_roles``), never from the submission's tags: a code
    cell of the submission is skipped when it is neither a solution nor a graded cell and its
    source equals a source cell tagged ``demonstration`` (spaces at line ends aside). A cell the
    learner edited or added runs, in its place. A skipped cell gets nbclient's ``skip-execution``
    tag in memory and one output line saying why; the submitted file is not changed. That tag is
    the grader's alone: one the submission put on any cell is removed first, so every cell that is
    not a skipped demonstration runs (a check the kernel skipped would be scored on the judge's
    verdict alone, and the kernel's run of a check can only take points away).
    ``resources["skipped_demonstrations"]`` maps each name a skipped cell binds to the source line
    that binds it, for ``NameSkippedDemonstrations``. Learner cells are compared, never parsed.

    A source notebook without any role tag declares no demonstration: every cell runs.

    Raises (failing that submission's autograde, as nbgrader does for a preprocessor error):
        ValueError: the source notebook is missing, or some of its cells carry role tags and they
            are not valid (``cell_roles``).
    """

    def preprocess(self, nb, resources):
        demonstrations = self._demonstrations(resources)
        skipped: dict[str, str] = {}
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            tags = cell.metadata.get("tags")
            if isinstance(tags, list) and SKIP_TAG in tags:
                cell.metadata["tags"] = [t for t in tags if t != SKIP_TAG]
            binds = demonstrations.get(_plain_source(cell.source))
            if binds is None or utils.is_grade(cell) or utils.is_solution(cell):
                continue
            cell.metadata.setdefault("tags", []).append(SKIP_TAG)
            cell.outputs = [from_dict({"output_type": "stream", "name": "stdout", "text": SKIPPED_NOTE})]
            for name, line in binds.items():
                skipped.setdefault(name, line)
        resources["skipped_demonstrations"] = skipped
        return nb, resources

    def _demonstrations(self, resources) -> dict[str, dict[str, str]]:
        """The plain source of each of the source notebook's demonstration cells, with the names it
        binds and the line that binds each."""
        import nbformat
        from nbgrader.coursedir import CourseDirectory

        from course_lib.exercises import ROLES, binding_lines, cell_roles

        info = (resources or {}).get("nbgrader") or {}
        coursedir = CourseDirectory(config=self.config)
        path = Path(coursedir.format_path(coursedir.source_directory, ".", info.get("assignment", ""))) \
            / f"{info.get('notebook', '')}.ipynb"
        try:
            source = nbformat.read(path, as_version=4)
            if not any(set(ROLES) & set(cell.metadata.get("tags", [])) for cell in source.cells):
                return {}                         # a notebook that declares no roles: every cell runs
            found = {}
            for cell, role in zip(source.cells, cell_roles(source)):
                if role == "demonstration":
                    plain = _plain_source(cell.source)
                    lines = plain.split("\n")
                    found[plain] = {name: lines[n - 1].strip() for name, n in binding_lines(plain).items()}
        except (OSError, ValueError, TypeError, SyntaxError) as exc:
            raise ValueError(f"SkipDemonstrations: cannot read the cell roles of the source notebook {path}: {exc}") \
                from None
        return found


class NameSkippedDemonstrations(NbGraderPreprocessor):
    """After ``Execute``: an error that says ``name 'X' is not defined``, where X is bound by a
    demonstration cell ``SkipDemonstrations`` left unrun, says so and quotes the line that binds it
    (in its value and as the last line of its traceback), so the feedback names the cause: the
    learner's code depends on a demonstration."""

    def preprocess(self, nb, resources):
        skipped = (resources or {}).get("skipped_demonstrations") or {}
        for cell in nb.cells if skipped else ():
            for output in cell.get("outputs", []):
                if output.get("output_type") != "error":
                    continue
                text = ANSI.sub("", "\n".join([str(output.get("evalue", "")), *map(str, output.get("traceback", []))]))
                names = [n for n in dict.fromkeys(_NAME_ERROR.findall(text)) if n in skipped]
                if not names:
                    continue
                note = " ".join(f"`{n}` is defined by a demonstration cell, at its line `{skipped[n]}`, which "
                                "grading does not run." for n in names) + \
                    " Code that grading runs must not depend on demonstration cells: define what it needs in " \
                    "its own cell (an error outside a check cell costs no points by itself)."
                output["evalue"] = f"{output.get('evalue', '')} ({note})"
                output["traceback"] = [*output.get("traceback", []), note]
        return nb, resources
