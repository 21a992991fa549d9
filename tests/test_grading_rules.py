"""The course's scoring rule on nbgrader's own grade function: a graded test cell scores from its
errors only (the judge adds one when it disagrees), whatever the learner's code displays."""
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
