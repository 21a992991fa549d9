"""How a contract failure reads where people see it: in the notebook (IPython shows a ContractError
through its ``_render_traceback_`` hook), in nbgrader's feedback (the error output, redacted for a
hidden check) and in the grader's record (``str(err)``, which the judge redacts)."""
import json
import os
import pickle
import re
import subprocess
import sys

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_output

from course_grader import judge, preprocessors
from course_lib.grading import ContractError, check_bytes, contracts, named_faults

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

# Learner code, as cells of a notebook. The byte count forgets the factor 2 for K and V; the cached
# attention step masks with PyTorch's is_causal, whose mask is aligned to the top-left corner.
IMPORTS = "from course_lib.grading import lab01, lab02\nimport math, torch"
KV_BYTES = ("def kv_bytes_per_token(config, bytes_per_value):\n"
            "    return config.n_layers * config.n_kv_heads * config.head_dim * bytes_per_value")
KV_BYTES_RIGHT = ("def kv_bytes_right(config, bytes_per_value):\n"
                  "    return 2 * config.n_layers * config.n_kv_heads * config.head_dim * bytes_per_value")
ATTEND = ("def attend_with_cache(q, k_new, v_new, k_cache, v_cache, start):\n"
          "    T = q.shape[-2]\n"
          "    k_cache[:, :, start:start + T] = k_new\n"
          "    v_cache[:, :, start:start + T] = v_new\n"
          "    group = q.shape[1] // k_cache.shape[1]\n"
          "    k = k_cache[:, :, :start + T].repeat_interleave(group, dim=1)\n"
          "    v = v_cache[:, :, :start + T].repeat_interleave(group, dim=1)\n"
          "    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)")
VISIBLE_BYTES = "lab01.check_kv_bytes_per_token(kv_bytes_per_token, seed=0)\nprint('visible check passed')"
VISIBLE_ATTEND = "lab02.check_attention_step(attend_with_cache, seed=0)\nprint('visible check passed')"
HIDDEN_BYTES = ("lab01.check_kv_bytes_per_token(kv_bytes_right, seed=0)\nprint('visible check passed')\n"
                "### BEGIN HIDDEN TESTS\nlab01.check_kv_bytes_per_token(kv_bytes_per_token, seed=3, cases=12)\n"
                "### END HIDDEN TESTS")
SESSIONS = {
    "bytes": [IMPORTS, KV_BYTES, VISIBLE_BYTES],
    "attention": [IMPORTS, ATTEND, VISIBLE_ATTEND],
    "hidden": [IMPORTS, KV_BYTES, KV_BYTES_RIGHT, HIDDEN_BYTES],
}

# Runs in a fresh interpreter: an InteractiveShell takes over sys.modules["__main__"] and more.
SHELL = """
import json, sys
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

shell = InteractiveShell.instance()
errors, show = [], shell._showtraceback


def record(etype, evalue, stb):   # the hook ipykernel overrides to send the error output
    errors.append({"ename": etype.__name__, "evalue": str(evalue), "traceback": list(stb)})
    show(etype, evalue, stb)


shell._showtraceback = record
out = {}
for name, cells in json.loads(sys.stdin.read()).items():
    errors.clear()
    with capture_output() as captured:
        for cell in cells:
            shell.run_cell(cell, store_history=True)
    out[name] = {"errors": list(errors), "shown": captured.stdout}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def shown(tmp_path_factory):
    """Each session's cells run through IPython: the error outputs and the text IPython printed."""
    env = dict(os.environ, IPYTHONDIR=str(tmp_path_factory.mktemp("ipython")))
    run = subprocess.run([sys.executable, "-c", SHELL], input=json.dumps(SESSIONS), capture_output=True,
                         text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def _lines(text: str) -> list[str]:
    return [line for line in ANSI.sub("", text).splitlines() if line.strip()]


def test_the_notebook_shows_the_diagnosis_first_and_no_checker_source(shown):
    session = shown["bytes"]
    assert [e["ename"] for e in session["errors"]] == ["ContractError"]
    lines = _lines(session["shown"])
    assert lines[0].startswith("ContractError: kv_bytes_per_token(case 0: ")
    diagnosis = next(i for i, line in enumerate(lines) if line.startswith("Diagnosis:"))
    assert diagnosis <= 2 and "factor 2 for K and V forgotten" in lines[diagnosis]
    # the alternatives come after the diagnosis
    alternatives = next(i for i, line in enumerate(lines) if "'K and V' = 1 instead of 2" in line)
    assert alternatives > diagnosis
    text = "\n".join(lines)
    # nothing of the checker: no source line, no file, no list of the faults it tries
    for checker_text in ("named_faults(", "diagnose(", "raise ", "lab01.py", "contracts.py", "Traceback",
                         "d_model used instead of n_kv * head_dim", "both: query heads and no factor 2"):
        assert checker_text not in text, checker_text
    # the learner's own call, marked
    assert any(line.startswith("---->") and "lab01.check_kv_bytes_per_token(kv_bytes_per_token, seed=0)" in line
               for line in lines)
    assert len(lines) <= 12


def test_the_top_left_causal_mask_is_named_in_the_notebook(shown):
    session = shown["attention"]
    assert [e["ename"] for e in session["errors"]] == ["ContractError"]
    lines = _lines(session["shown"])
    assert lines[0].startswith("ContractError: attention output (case ")
    assert lines[1].startswith("Diagnosis:") and "causal mask aligned top-left" in lines[1]
    assert "is_causal=True" in lines[1] and "attn_mask" in lines[1]      # the fix hint
    assert "causal_attention(" not in "\n".join(lines)                   # a line of the checker's variants


def test_a_hidden_failure_keeps_only_the_diagnosis_in_feedback(shown):
    """The error output of a failing hidden check, through nbgrader's feedback redaction: the drawn
    inputs, reference values and the hidden line are gone; the contract's name and the diagnosis stay."""
    (error,) = shown["hidden"]["errors"]
    drawn = re.search(r"\(case \d+: ([^)]*)\)", error["evalue"]).group(1)
    expected = re.search(r"expected ([\d,]+)", error["evalue"]).group(1)
    cell = new_code_cell(HIDDEN_BYTES, metadata={"nbgrader": {"grade": True, "solution": False, "locked": True,
                                                              "grade_id": "test_kv_bytes_per_token", "points": 2}})
    cell.outputs = [new_output("error", **error)]
    cell, _ = preprocessors.RedactHiddenTracebacks().preprocess_cell(cell, {}, 0)
    out = cell.outputs[0]
    text = ANSI.sub("", "\n".join(out["traceback"]))
    for secret in (drawn, expected, "seed=3, cases=12", "instead of 2 or"):
        assert secret not in text and secret not in out["evalue"], secret
    assert "kv_bytes_per_token (case" in text and "Diagnosis:" in text
    assert "factor 2 for K and V forgotten" in text
    nbformat.validate(nbformat.v4.new_notebook(cells=[cell]))


def _byte_error(diagnosed: bool) -> ContractError:
    try:
        check_bytes(67_584, {"K and V": 2, "layers": 66, "KV heads": 4, "head_dim": 128, "bytes per value": 2},
                    what="kv_bytes_per_token(case 0: L 66, 2 B/value)")
    except ContractError as err:
        return named_faults(err, ["the factor 2 for K and V forgotten"] if diagnosed else [])
    raise AssertionError("check_bytes accepted a wrong count")


def test_the_record_puts_the_diagnosis_after_the_first_line_and_redacts_cleanly():
    diagnosed = str(_byte_error(True)).splitlines()
    assert diagnosed[0] == ("kv_bytes_per_token(case 0: L 66, 2 B/value): expected 135,168 = K and V 2 * layers "
                            "66 * KV heads 4 * head_dim 128 * bytes per value 2, got 67,584")
    assert diagnosed[1] == ("Diagnosis: your result equals the reference with this fault: the factor 2 for K and V "
                            "forgotten")
    assert diagnosed[2] == contracts.LIKELY and len(diagnosed) == 3
    # without a diagnosis the alternatives are the explanation, on the first line (where redaction drops them)
    plain = str(_byte_error(False))
    assert plain.endswith("got 67,584; your number is what the formula gives with 'K and V' = 1 instead of 2 or "
                          "'layers' = 33 instead of 66 or 'KV heads' = 2 instead of 4 or 'head_dim' = 64 instead "
                          "of 128 or 'bytes per value' = 1 instead of 2")
    for err in (_byte_error(True), _byte_error(False)):
        redacted = preprocessors.redact(str(err))
        assert "66" not in redacted and "instead of" not in redacted and "135,168" not in redacted


def test_a_message_with_values_keeps_them_before_the_diagnosis():
    err = named_faults("schedule_step(case 0: running [(3, 4)]):\n  expected A\n  got      B", ["oldest evicted"])
    assert str(err).splitlines()[:4] == ["schedule_step(case 0: running [(3, 4)]):", "  expected A",
                                         "  got      B", "Diagnosis: your result equals the reference with this "
                                         "fault: oldest evicted"]
    assert "expected A" not in preprocessors.redact(str(err))


def test_the_parts_survive_pickling():
    err = _byte_error(True)
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is ContractError and str(copy) == str(err)
    assert (copy.what, copy.diagnosis, copy.caveat, copy.hint) == (err.what, err.diagnosis, err.caveat, err.hint)


def test_the_display_hook_never_fails(monkeypatch):
    """IPython shows no error at all when _render_traceback_ raises (a graded cell would then pass in
    the kernel), so a failure inside it falls back to the plain message."""
    err = _byte_error(True)
    try:
        raise err
    except ContractError:
        pass
    rendered = err._render_traceback_()
    assert len(rendered) == 2 and rendered[0].startswith("ContractError: kv_bytes_per_token(case 0")

    def broken(tb):
        raise RuntimeError("no frame")
    monkeypatch.setattr(contracts, "_learner_call", broken)
    assert err._render_traceback_() == [f"ContractError: {err}"]
    assert ContractError("x")._render_traceback_() == ["ContractError: x"]   # never raised: no call to show
