#!/usr/bin/env python
"""Regenerate the sample submissions in autograder/samples/ from labs/ and solutions/.

    python -m course_grader.samples          (or: make samples)

For each lab in FAULTS this writes, as nbgrader's submitted layout
``samples/{learner}/{lab}/{lab}.ipynb``:
- ``solution``: the learner release with every solution cell filled in from solutions/
  (markers removed) - what a learner who solved everything hands in;
- ``release``: the untouched learner release (every exercise still raises);
- one ``fault_*`` learner per injected fault of the lab: the solution with one small,
  realistic edit in one solution cell.

The expected scores are NOT generated: ``samples/expected_scores.csv`` is written by hand
from what each fault should lose, so a grader that stops catching a fault fails CI.
"""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import nbformat

from .paths import REPO_ROOT as ROOT
from .paths import SAMPLES

MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")

# lab -> learner -> list of (solution cell grade_id, text to find, replacement). Each edit
# must match exactly once, so a change to the solution cannot silently disable a fault.
FAULTS: dict[str, dict[str, list[tuple[str, str, str]]]] = {
    "01_roofline": {
        "fault_untied_embedding_in_nmatmul": [(
            "count_parameters",
            "n_matmul = n_params - (0 if config.tie_embeddings else table)",
            "n_matmul = n_params")],
        "fault_kv_factor_two_missing": [(
            "kv_bytes_per_token",
            "return 2 * config.n_layers * config.n_kv_heads",
            "return config.n_layers * config.n_kv_heads")],
        "fault_query_heads_for_kv": [(
            "kv_bytes_per_token",
            "config.n_kv_heads * config.head_dim",
            "config.n_heads * config.head_dim")],
        "fault_gib_for_gb": [(
            "requests_that_fit",
            "free = device.capacity_gb * 1e9 - weight_bytes - overhead_gb * 1e9",
            "free = device.capacity_gb * 2**30 - weight_bytes - overhead_gb * 2**30")],
        "fault_sum_not_max": [(
            "decode_step_bound",
            "return max(bytes_moved / bandwidth, flops / peak)",
            "return bytes_moved / bandwidth + flops / peak")],
    },
    "03_scheduling": {
        "fault_cost_sum_not_max": [(
            "iteration_time",
            "return max(memory_s, compute_s)",
            "return memory_s + compute_s")],
        "fault_chunk_attention_without_kc": [(
            "iteration_time",
            "sum(k * c + k * (k + 1) // 2 for k, c in chunks)",
            "sum(k * (k + 1) // 2 for k, c in chunks)")],
        "fault_preempt_oldest": [(
            "schedule_step",
            "evicted.append(live[-1])",
            "evicted.append(live[0])")],
        "fault_reprefill_forgets_generated": [(
            "schedule_step",
            "cost = prompt + generated",
            "cost = prompt")],
        "fault_tpot_divides_by_n_out": [(
            "serving_metrics",
            "/ (r.output - 1) for r in records if r.output > 1]",
            "/ r.output for r in records if r.output > 1]")],
        "fault_p99_mean_of_per_request_p99": [(
            "serving_metrics",
            '"itl99": float(np.quantile(itl, 0.99))',
            '"itl99": float(np.mean([np.quantile(g, 0.99) for g in gaps if len(g)]))')],
    },
    "02_kv_cache": {
        "fault_rope_off_by_one": [(
            "generate_with_cache",
            "position = torch.tensor([cache.length])",
            "position = torch.tensor([cache.length + 1])")],
        "fault_frozen_position": [(
            "generate_with_cache",
            "position = torch.tensor([cache.length])",
            "position = torch.tensor([prompt.numel()])")],
        "fault_position_reset": [(
            "generate_with_cache",
            "position = torch.tensor([cache.length])",
            "position = torch.arange(1)                        # positions restart at 0 on every append")],
        "fault_kv_repeat_misaligned": [(
            "attend_with_cache",
            "k = k_cache[:, :, :start + T].repeat_interleave(group, dim=1)\n"
            "    v = v_cache[:, :, :start + T].repeat_interleave(group, dim=1)",
            "k = k_cache[:, :, :start + T].repeat(1, group, 1, 1)\n"
            "    v = v_cache[:, :, :start + T].repeat(1, group, 1, 1)")],
        "fault_cache_never_cropped": [
            ("score_suffixes",
             "max_len=P + max(s.numel() for s in suffixes)",
             "max_len=P + sum(s.numel() for s in suffixes)"),
            ("score_suffixes",
             "        cache.crop(P)                                       # forget the previous branch\n",
             "")],
    },
}


def _grade_id(cell) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def _solution_sources(lab: str) -> dict[str, str]:
    source = nbformat.read(ROOT / "solutions" / lab / f"{lab}.ipynb", as_version=4)
    out = {}
    for cell in source.cells:
        if cell.get("metadata", {}).get("nbgrader", {}).get("solution"):
            lines = [ln for ln in cell.source.splitlines() if ln.strip() not in MARKERS]
            out[_grade_id(cell)] = "\n".join(lines)
    return out


def build(lab: str) -> dict[str, nbformat.NotebookNode]:
    release = nbformat.read(ROOT / "labs" / lab / f"{lab}.ipynb", as_version=4)
    solved = copy.deepcopy(release)
    sources = _solution_sources(lab)
    for cell in solved.cells:
        if _grade_id(cell) in sources:
            cell.source = sources[_grade_id(cell)]
    notebooks = {"solution": solved, "release": release}
    for learner, edits in FAULTS[lab].items():
        nb = copy.deepcopy(solved)
        for grade_id, old, new in edits:
            cell = next(c for c in nb.cells if _grade_id(c) == grade_id)
            if cell.source.count(old) != 1:
                sys.exit(f"make_samples: {learner}: expected exactly one {old!r} in cell {grade_id}, "
                         f"found {cell.source.count(old)}; update FAULTS to the new solution")
            cell.source = cell.source.replace(old, new)
        notebooks[learner] = nb
    return notebooks


def main() -> None:
    for lab in FAULTS:
        for learner, nb in build(lab).items():
            path = SAMPLES / learner / lab / f"{lab}.ipynb"
            path.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, path)
            print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
