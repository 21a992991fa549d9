"""Similarity flags (course_grader.similarity): a renamed copy of a learner's exercise cells is
flagged, two independently written correct solutions and starter-code-only notebooks are not.

The learners' notebooks are Lab 1's release (labs/01_roofline) with some exercise cells filled in;
no grading runs here (the driver's use is checked in tests/test_grading_pipeline.py)."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from course_grader import similarity, term
from course_grader.term import TermError

REPO = Path(__file__).resolve().parents[1]
LAB = "01_roofline"
RELEASE = REPO / "labs"

# the release's signature and docstring (the starter code, boilerplate) of one exercise
REQUESTS_THAT_FIT = ("def requests_that_fit(config, device, *, weight_bytes, prompt_tokens, output_tokens, "
                     "overhead_gb=2.5,\n"
                     "                      kv_bytes_per_value=2):\n"
                     '    """Full-length requests whose KV cache fits beside the weights and the overhead '
                     '(int >= 0)."""\n')
# alice's own Lab 1 answers (written for this test, not taken from the solutions or course_lib)
ALICE = {
    "count_parameters": '''def count_parameters(config):
    """(N, N_matmul) of a Llama-style decoder config, as exact ints."""
    hidden = config.d_model
    heads_out = config.n_heads * config.head_dim
    kv_out = config.n_kv_heads * config.head_dim
    per_layer_attn = hidden * heads_out * 2 + hidden * kv_out * 2
    per_layer_mlp = hidden * config.d_ff * 3
    norms = hidden * (2 * config.n_layers + 1)
    matmul = config.n_layers * (per_layer_attn + per_layer_mlp)
    embed = config.vocab_size * hidden
    head = 0 if config.tie_embeddings else embed
    return int(matmul + embed + head + norms), int(matmul + (embed if config.tie_embeddings else head))
''',
    "requests_that_fit": REQUESTS_THAT_FIT + '''    spare = device.memory - weight_bytes - overhead_gb * 1e9
    if spare <= 0:
        return 0
    tokens_each = prompt_tokens + output_tokens
    cache_each = kv_bytes_per_token(config, kv_bytes_per_value) * tokens_each
    count = 0
    while (count + 1) * cache_each <= spare:
        count += 1
    return count
''',
}
# bob's: alice's cells with every name changed, other spacing, comments added
BOB = {
    "count_parameters": '''def count_parameters(config):
    """(N, N_matmul) of a Llama-style decoder config, as exact ints."""
    d = config.d_model   # model width
    q_cols  =  config.n_heads*config.head_dim
    kv_cols = config.n_kv_heads*config.head_dim
    # attention: q, o and k, v
    attention_params = d*q_cols*2 + d*kv_cols*2
    mlp_params = d*config.d_ff*3      # gate, up, down
    norm_params = d*(2*config.n_layers + 1)
    mm = config.n_layers*(attention_params + mlp_params)
    emb = config.vocab_size*d
    lm_head = 0 if config.tie_embeddings else emb
    return int(mm + emb + lm_head + norm_params), int(mm + (emb if config.tie_embeddings else lm_head))
''',
    "requests_that_fit": REQUESTS_THAT_FIT + '''    free_bytes = device.memory - weight_bytes - overhead_gb*1e9

    if free_bytes <= 0:
        return 0
    length = prompt_tokens + output_tokens
    per_req = kv_bytes_per_token(config, kv_bytes_per_value)*length
    n = 0
    while (n + 1)*per_req <= free_bytes:   # one more request?
        n += 1
    return n
''',
}
# carol's: the same two exercises, written independently
CAROL = {
    "count_parameters": '''def count_parameters(config):
    """(N, N_matmul) of a Llama-style decoder config, as exact ints."""
    shapes = []
    for _ in range(config.n_layers):
        shapes.append((config.d_model, config.n_heads * config.head_dim))        # W_q
        shapes.append((config.d_model, config.n_kv_heads * config.head_dim))     # W_k
        shapes.append((config.d_model, config.n_kv_heads * config.head_dim))     # W_v
        shapes.append((config.n_heads * config.head_dim, config.d_model))        # W_o
        shapes.extend([(config.d_model, config.d_ff)] * 3)                       # gate, up, down
    matmul_weights = sum(rows * cols for rows, cols in shapes)
    embedding = config.vocab_size * config.d_model
    if not config.tie_embeddings:
        matmul_weights += embedding
        embedding *= 2
    else:
        matmul_weights += config.vocab_size * config.d_model
    norm_weights = config.d_model * (1 + 2 * config.n_layers)
    total = sum(rows * cols for rows, cols in shapes) + embedding + norm_weights
    return int(total), int(matmul_weights)
''',
    "requests_that_fit": REQUESTS_THAT_FIT + '''    import math
    budget = max(0.0, float(device.memory) - float(weight_bytes) - 1e9 * overhead_gb)
    one_request = (prompt_tokens + output_tokens) * kv_bytes_per_token(config, kv_bytes_per_value)
    return int(math.floor(budget / one_request))
''',
}


def notebook(answers: dict[str, str]) -> dict:
    """Lab 1's release with the exercise cells named in ANSWERS (grade_id -> source) replaced."""
    nb = json.loads((RELEASE / LAB / f"{LAB}.ipynb").read_text())
    for cell in nb["cells"]:
        grade_id = cell["metadata"].get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell["source"] = answers[grade_id]
    return nb


@pytest.fixture(scope="module")
def submissions(tmp_path_factory):
    folder = tmp_path_factory.mktemp("similarity") / "submitted"
    for learner, answers in (("alice", ALICE), ("bob", BOB), ("carol", CAROL), ("dave", {}), ("erin", {})):
        path = folder / learner / LAB / f"{LAB}.ipynb"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(notebook(answers)))
    (folder / "frank" / LAB).mkdir(parents=True)
    (folder / "frank" / LAB / f"{LAB}.ipynb").write_text('{"cells": [')   # not JSON: skipped, said so
    return folder


def test_a_renamed_copy_is_flagged_independent_solutions_and_starter_code_are_not(submissions):
    result = similarity.compare_submissions(submissions, [LAB], RELEASE, 0.8)
    scores = {(p.learner_a, p.learner_b): p.similarity for p in result.pairs}
    assert [(p.learner_a, p.learner_b) for p in result.flagged] == [("alice", "bob")]
    assert scores[("alice", "bob")] > 0.9
    assert scores[("alice", "carol")] < 0.5 and scores[("bob", "carol")] < 0.5
    # the release's starter code (and the references) are boilerplate: two untouched notebooks share nothing
    assert scores[("dave", "erin")] == 0.0
    assert all(scores[(a, "dave")] == 0.0 for a in ("alice", "bob", "carol"))
    assert result.skipped == [(LAB, "frank", "not compared: JSONDecodeError")]
    assert result.flags_of("bob", LAB) == [{"with": "alice", "similarity": scores[("alice", "bob")]}]
    assert result.flags_of("carol", LAB) == []


def test_the_command_writes_every_pair_and_refuses_a_bad_threshold_by_name(submissions, tmp_path, capsys):
    out = tmp_path / "similarity.csv"
    assert similarity.main([str(submissions), "--labs", LAB, "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0]) == similarity.COLUMNS and len(rows) == 10      # 5 readable notebooks: 10 pairs
    assert [(r["learner_a"], r["learner_b"]) for r in rows if r["flagged"] == "yes"] == [("alice", "bob")]
    assert "1 similar pair(s)" in capsys.readouterr().out
    course = tmp_path / "course.toml"
    course.write_text("[similarity]\nthreshold = 1.5\n")
    for args, field in ((["--threshold", "0"], "--threshold: expected a number above 0"),
                        (["--course", str(course)], "[similarity] threshold: expected a number above 0"),
                        (["--labs", "09_none"], "--labs: 09_none is not a lab")):
        fresh = tmp_path / "refused.csv"
        assert similarity.main([str(submissions), "--out", str(fresh), *args]) == 2
        assert field in capsys.readouterr().err and not fresh.exists()
    course.write_text("[similarity]\nthreshold = 0.95\nthreshold_b = 1\n")
    with pytest.raises(TermError, match=r"\[similarity\] has unknown field\(s\) \['threshold_b'\]"):
        term.load(course)


def test_the_summary_caps_the_printed_pairs():
    pairs = [similarity.Pair(LAB, f"a{i:02d}", f"b{i:02d}", 0.9, 0.9, 0.9, 100, True) for i in range(25)]
    lines = similarity.summary_lines(similarity.Result(pairs, [], 0.8), Path("s.csv"), cap=20)
    assert lines[0].startswith("25 similar pair(s)") and len(lines) == 22
    assert lines[-1] == "  ... and 5 more in s.csv"


def test_a_notebook_nested_too_deep_to_parse_is_skipped_not_a_crash(tmp_path):
    """Hostile review: json.loads raises RecursionError (not a ValueError) on '[' * 100000, which
    stopped the whole comparison, every lab and learner."""
    folder = tmp_path / "submitted"
    for learner, text in (("deep", '{"cells": ' + "[" * 100_000 + "]" * 100_000 + "}"),
                          ("ann", json.dumps(notebook(ALICE)))):
        (folder / learner / LAB).mkdir(parents=True)
        (folder / learner / LAB / f"{LAB}.ipynb").write_text(text)
    result = similarity.compare_submissions(folder, [LAB], RELEASE, 0.8)
    assert result.skipped == [(LAB, "deep", "not compared: RecursionError")] and result.pairs == []


def test_a_copy_moved_out_of_the_exercise_cells_is_still_flagged(tmp_path):
    """Hostile review: only cells marked as exercises (nbgrader solution, or the tag) were compared, and
    the learner edits that metadata: bob's copy of alice's answers, moved into a new unmarked code cell
    (the exercise cells left as released; the functions still defined, so still graded), was never flagged."""
    folder = tmp_path / "submitted"
    moved = notebook({})
    moved["cells"].append({"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
                           "source": "\n\n".join(ALICE.values()).replace("config", "cfg")})
    for learner, nb in (("alice", notebook(ALICE)), ("bob", moved), ("dave", notebook({}))):
        (folder / learner / LAB).mkdir(parents=True)
        (folder / learner / LAB / f"{LAB}.ipynb").write_text(json.dumps(nb))
    result = similarity.compare_submissions(folder, [LAB, "02_kv_cache"], RELEASE, 0.8)   # two labs: each its release
    assert [(p.learner_a, p.learner_b) for p in result.flagged] == [("alice", "bob")]
    assert {p.similarity for p in result.pairs if "dave" in (p.learner_a, p.learner_b)} == {0.0}
