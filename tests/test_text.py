"""Learner text made safe to store (course_grader.text) and the preprocessor that applies it."""
import json

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from course_grader import text
from course_grader.preprocessors import EncodableText

LONE = "not done yet \ud800"


def test_encodable_escapes_lone_surrogates_and_keeps_other_text():
    with pytest.raises(UnicodeEncodeError):
        LONE.encode("utf-8")
    fixed = text.encodable(LONE)
    assert fixed == "not done yet \\ud800"
    fixed.encode("utf-8")
    # a low surrogate from os.fsdecode of an undecodable byte, and a pair written as two halves
    assert text.encodable("name\udcff") == "name\\udcff"
    assert text.encodable("\ud83d\ude00") == "\\ud83d\\ude00"
    plain = "émoji 😀, tabs\tand newlines\n"
    assert text.encodable(plain) is plain
    with pytest.raises(TypeError):
        text.encodable(b"bytes")


def test_encodable_tree_reaches_keys_values_and_nested_lists():
    tree = {"a\udc80": [LONE, ("x\ud800", 1)], "n": None, "f": 1.5, "ok": {"deep": ["\udfff"]}}
    out = text.encodable_tree(tree)
    assert out is tree
    json.dumps(out, ensure_ascii=False).encode("utf-8")
    assert out == {"a\\udc80": ["not done yet \\ud800", ("x\\ud800", 1)], "n": None, "f": 1.5,
                   "ok": {"deep": ["\\udfff"]}}


def test_printable_shows_control_characters_and_surrogates():
    assert text.printable("a\x1b[2Kb\r\n\x07") == "a\\x1b[2Kb\\x0d\\x0a\\x07"
    assert text.printable(f"{LONE}\n") == "not done yet \\ud800\\x0a"
    assert text.printable(3) == "3"


def test_encodable_text_preprocessor_makes_the_notebook_writable(tmp_path):
    """A lone surrogate in an error message, a stream, display data, a source and metadata: the
    notebook cannot be written as UTF-8 before the preprocessor and can after it."""
    cell = new_code_cell(source="raise ValueError('\ud800')", outputs=[
        new_output("error", ename="ValueError", evalue=LONE, traceback=[f"ValueError: {LONE}"]),
        new_output("stream", name="stdout", text="printed \udc80\n"),
        new_output("display_data", data={"text/plain": "'\ud800'"}),
    ])
    cell.metadata["course_judge"] = {"message": LONE}
    nb = new_notebook(cells=[cell])
    with pytest.raises(UnicodeEncodeError):
        nbformat.write(nb, str(tmp_path / "before.ipynb"))
    nb, _ = EncodableText().preprocess(nb, {})
    path = tmp_path / "after.ipynb"
    nbformat.write(nb, str(path))
    back = nbformat.read(str(path), as_version=4).cells[0]
    assert back.outputs[0].evalue == "not done yet \\ud800"
    assert back.outputs[0].traceback == ["ValueError: not done yet \\ud800"]
    assert back.outputs[1].text == "printed \\udc80\n"
    assert back.source == "raise ValueError('\\ud800')"
    assert back.metadata.course_judge.message == "not done yet \\ud800"


def test_the_course_config_runs_it_in_both_autograde_passes():
    """Last among the sanitize steps (submitted sources) and right after the Execute step
    (outputs and the judge's verdicts), on the stock path as in the driver."""
    from traitlets.config import Config

    from course_grader import config, paths

    c = Config()
    config.configure(c, str(paths.REPO_ROOT))
    assert c.Autograde.sanitize_preprocessors[-1] is EncodableText
    steps = list(c.Autograde.autograde_preprocessors)
    from nbgrader.preprocessors import Execute

    execute = next(i for i, step in enumerate(steps) if isinstance(step, type) and issubclass(step, Execute))
    assert steps[execute + 1] is EncodableText
