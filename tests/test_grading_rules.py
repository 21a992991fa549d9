"""The course's scoring rule on nbgrader's own grade function: a graded test cell scores from its
errors only (the judge adds one when it disagrees), whatever the learner's code displays."""
import pytest
from nbformat.v4 import new_code_cell, new_output
from nbgrader.utils import determine_grade
from nbgrader.preprocessors import Execute
from traitlets.config import Config

from course_grader import preprocessors
from course_grader.config import configure


def _test_cell(*outputs, points=2):
    cell = new_code_cell("lab02.check_kv_cache_bytes(kv_cache_bytes, measured_kv_bytes, seed=0)", metadata={
        "nbgrader": {"grade": True, "solution": False, "locked": True, "grade_id": "test_x", "points": points,
                     "schema_version": 3}})
    cell.outputs = list(outputs)
    return cell


def test_a_displayed_number_is_not_a_score():
    shown = new_output("execute_result", data={"text/plain": "2"}, execution_count=1)
    failed = new_output("error", ename="ContractError", evalue="kv_cache_bytes: factor 2 missing", traceback=[])
    cell = _test_cell(shown, failed)
    assert determine_grade(cell)[0] == 2                     # stock nbgrader: the shown number wins
    cell, _ = preprocessors.DisplayedValuesAreNotScores().preprocess_cell(cell, {}, 0)
    assert determine_grade(cell)[0] == 0                     # the error decides
    assert cell.outputs[0]["output_type"] == "display_data" and cell.outputs[0]["data"]["text/plain"] == "2"
    small = _test_cell(new_output("execute_result", data={"text/plain": "0.5"}, execution_count=1))
    assert determine_grade(small)[0] == 0.5                  # stock: partial credit from a display
    small, _ = preprocessors.DisplayedValuesAreNotScores().preprocess_cell(small, {}, 0)
    assert determine_grade(small)[0] == 2                    # no error: full points


def test_solution_and_ungraded_cells_keep_their_results():
    result = new_output("execute_result", data={"text/plain": "3"}, execution_count=1)
    plain = new_code_cell("1 + 2")
    plain.outputs = [result]
    plain, _ = preprocessors.DisplayedValuesAreNotScores().preprocess_cell(plain, {}, 0)
    assert plain.outputs[0]["output_type"] == "execute_result"


def test_the_course_config_applies_the_rule_between_execute_and_saving(tmp_path):
    c = Config()
    configure(c, root=str(tmp_path))
    names = [getattr(step, "__name__", str(step)) for step in c.Autograde.autograde_preprocessors]
    rule, save = names.index("DisplayedValuesAreNotScores"), names.index("SaveAutoGrades")
    execute = next(i for i, step in enumerate(c.Autograde.autograde_preprocessors)
                   if isinstance(step, type) and issubclass(step, Execute))
    assert execute < rule < save


# -- demonstrations: left unrun by the grader, and named when learner code needs one -------------
def _course_with_source(tmp_path, cells) -> Config:
    """A course root whose source notebook of lab 01_demo holds CELLS; the config nbgrader's
    preprocessors read it through (CourseDirectory)."""
    import nbformat

    path = tmp_path / "source" / "01_demo" / "01_demo.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    c = Config()
    c.CourseDirectory.root = str(tmp_path)
    c.CourseDirectory.source_directory = "source"
    return c


def _tagged(source, role, **nbgrader):
    return new_code_cell(source, metadata={"tags": [role], **({"nbgrader": nbgrader} if nbgrader else {})})


RESOURCES = {"nbgrader": {"assignment": "01_demo", "notebook": "01_demo"}}
SOURCE_CELLS = [_tagged("import math", "setup"),
                _tagged("def f():\n    return TABLE", "exercise", solution=True, grade=False, grade_id="f"),
                _tagged("TABLE = [1, 2]  \nprint(TABLE)\n", "demonstration"),
                _tagged("assert f() == 2", "check", grade=True, solution=False, grade_id="test_f", points=1)]


def _submission(*changes):
    from nbformat.v4 import new_notebook

    nb = new_notebook(cells=[new_code_cell(c.source, metadata=dict(c.metadata)) for c in SOURCE_CELLS])
    for change in changes:
        change(nb)
    return nb


def test_demonstrations_are_skipped_by_the_source_roles_not_the_submissions_tags(tmp_path):
    config = _course_with_source(tmp_path, SOURCE_CELLS)

    def retag(nb):          # the learner tags the set-up and the check "demonstration", the check and
        for cell in (nb.cells[0], nb.cells[3]):                      # the exercise nbclient's skip tag
            cell.metadata["tags"] = ["demonstration"]
        nb.cells[1].metadata["tags"] = [preprocessors.SKIP_TAG]
        nb.cells[3].metadata["tags"].append(preprocessors.SKIP_TAG)
        nb.cells[2].metadata["tags"] = ["setup"]
        nb.cells[2].source = "TABLE = [1, 2]\nprint(TABLE)"   # trailing spaces aside, the same source
    nb, resources = preprocessors.SkipDemonstrations(config=config).preprocess(_submission(retag), dict(RESOURCES))
    skipped = [i for i, c in enumerate(nb.cells) if preprocessors.SKIP_TAG in c.metadata.get("tags", [])]
    assert skipped == [2] and nb.cells[2].outputs[0]["text"] == preprocessors.SKIPPED_NOTE
    assert resources["skipped_demonstrations"] == {"TABLE": "TABLE = [1, 2]"}
    assert preprocessors.SKIP_TAG not in nb.cells[1].metadata["tags"] + nb.cells[3].metadata["tags"]

    def edit(nb):           # an edited demonstration, and one moved into a solution cell, both run
        nb.cells[2].source = "TABLE = [1, 2, 3]\nprint(TABLE)"
        nb.cells.insert(1, new_code_cell(SOURCE_CELLS[2].source, metadata={"nbgrader": {"solution": True}}))
    nb, resources = preprocessors.SkipDemonstrations(config=config).preprocess(_submission(edit), dict(RESOURCES))
    assert not any(preprocessors.SKIP_TAG in c.metadata.get("tags", []) for c in nb.cells)
    assert resources["skipped_demonstrations"] == {}


def test_a_source_without_roles_skips_nothing_and_one_with_bad_roles_is_refused(tmp_path):
    untagged = [new_code_cell(c.source, metadata={k: v for k, v in c.metadata.items() if k != "tags"})
                for c in SOURCE_CELLS]
    config = _course_with_source(tmp_path / "a", untagged)
    nb, resources = preprocessors.SkipDemonstrations(config=config).preprocess(_submission(), dict(RESOURCES))
    assert resources["skipped_demonstrations"] == {} and all(not c.outputs for c in nb.cells)
    config = _course_with_source(tmp_path / "b", [*SOURCE_CELLS, new_code_cell("x = 1")])
    with pytest.raises(ValueError, match="cell roles of the source notebook.*code cell 4 has role tags"):
        preprocessors.SkipDemonstrations(config=config).preprocess(_submission(), dict(RESOURCES))
    with pytest.raises(ValueError, match="cell roles of the source notebook"):
        preprocessors.SkipDemonstrations(config=config).preprocess(_submission(), {"nbgrader": {
            "assignment": "02_missing", "notebook": "02_missing"}})


def test_a_name_error_on_a_skipped_demonstrations_name_says_so():
    error = new_output("error", ename="NameError", evalue="name 'TABLE' is not defined",
                       traceback=["\x1b[0;31mNameError\x1b[0m: name 'TABLE' is not defined"])
    other = new_output("error", ename="NameError", evalue="name 'tabel' is not defined", traceback=[])
    nb = _submission()
    nb.cells[3].outputs = [error, other]
    resources = {"skipped_demonstrations": {"TABLE": "TABLE = [1, 2]"}}
    nb, _ = preprocessors.NameSkippedDemonstrations().preprocess(nb, resources)
    named = "`TABLE` is defined by a demonstration cell, at its line `TABLE = [1, 2]`, which grading does not run."
    assert named in nb.cells[3].outputs[0]["evalue"] and named in nb.cells[3].outputs[0]["traceback"][-1]
    assert nb.cells[3].outputs[1]["evalue"] == "name 'tabel' is not defined"      # not a demonstration's name
    assert determine_grade(nb.cells[3])[0] == 0


def test_the_course_config_skips_demonstrations_before_execute_and_names_them_after():
    c = Config()
    configure(c, "/nonexistent")
    steps = list(c.Autograde.autograde_preprocessors)
    execute = next(i for i, s in enumerate(steps) if isinstance(s, type) and issubclass(s, Execute))
    assert steps.index(preprocessors.SkipDemonstrations) < execute < steps.index(
        preprocessors.NameSkippedDemonstrations) < steps.index(next(s for s in steps if s.__name__ == "SaveAutoGrades"))
