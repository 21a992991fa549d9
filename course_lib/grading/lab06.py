"""Graded checks for Lab 6 (batching determinism).

Each ``check_*`` takes the learner's *functions*, draws its own inputs from a seed (fixed for the visible
checks, ``fresh_seed()`` for the hidden tests) and compares against a contract:

* ``check_pad_batch``: a left-padded batch with position ids from the mask. The layout is checked first
  (each row's tokens in its last columns, the mask 0 then 1, a real token's position = the real tokens
  before it); then the contract: on a toy decoder, each padded row's last-position logits equal the row
  run alone, in prefill and over the cached decode steps that continue from the learner's positions,
  within the float32 logit tolerance.
* ``check_divergence_report``: the solo-versus-batched report on synthetic runs whose tokens agree, or
  diverge at the first, a middle or the last step, and whose logits past the divergence differ a lot.
  Logits count only on the common prefix (up to and including the first differing step).
* ``check_invariant_linear``: a row-wise product y = x @ weight.T whose rows are *bitwise* independent of
  the batch: a fixed row placed at the start, middle and end of batches of 1 to 16 rows must give
  identical bits (``torch.equal``) at SmolLM2's matrix shapes and at ragged ones, and agree with a
  float64 product within float32 rounding.
* ``check_rms_norm_kernel``: the learner's Triton RMSNorm kernel (one program per row), launched by the
  course under Triton's interpreter with its loads and stores traced: right within float32 rounding, and
  each row's bits the same alone, in a batch of 16 and at another position of another batch.

When a contract fails, the checker names the listed fault that matches (docs/batching_determinism.md#exercises-and-contracts).
"""
from __future__ import annotations

import contextlib
import math
import random
from typing import Callable

import torch

from ..batching import REPORT_KEYS, divergence_report
from ..divergence import first_divergence, top2_gap
from ..models.config import toy_config
from ..models.decoder import Decoder
from ..kernels.batch_invariant.triton_ops import reference_rms_norm
from .contracts import (ContractError, attempts, call_on_copies, check_logits_close, check_own_function, check_real, check_tensor,
                        diagnose, with_diagnosis)
from .kernel_checks import check_all_stored, launch_case
from .tables import Contract, Edit, Fault, check_tables

#: Decode steps each padded batch continues for after its prefill.
DECODE_STEPS = 8

# -- pad_batch -----------------------------------------------------------------------------------


def _toy(seed: int) -> Decoder:
    return Decoder.random(toy_config(n_layers=2, vocab_size=256, max_seq_len=128), seed)


def _layout_errors(prompts: list[torch.Tensor], pad_id: int, ids: torch.Tensor, mask: torch.Tensor,
                   positions: torch.Tensor) -> str:
    """The first layout problem of row by row (empty string: none)."""
    T = ids.shape[1]
    for r, p in enumerate(prompts):
        n, pads = len(p), T - len(p)
        real = mask[r].to(torch.bool)
        if pads and bool(real[:n].all()) and not bool(real[n:].any()):
            return (f"row {r} (a prompt of {n} tokens in {T} columns) is right-padded: its mask is 1 in columns 0..{n - 1} "
                    f"and 0 after, so its last column is a pad and the model would read the pad as the row's last "
                    f"token. Pad on the left, so that every row ends with its own last token")
        want_mask = [0] * pads + [1] * n
        if real.int().tolist() != want_mask:
            return f"row {r}: attention_mask is {real.int().tolist()}, expected {want_mask} (pads first, then the prompt)"
        if ids[r, pads:].tolist() != p.tolist():
            return f"row {r}: its last {n} columns hold {ids[r, pads:].tolist()}, not the prompt {p.tolist()}"
        if pads and ids[r, :pads].tolist() != [pad_id] * pads:
            return f"row {r}: its {pads} pad columns hold {ids[r, :pads].tolist()}, not pad_id {pad_id}"
        got = positions[r, pads:].tolist()
        if got != list(range(n)):
            if pads and got == list(range(pads, T)):
                return (f"row {r} ({pads} pads): its real tokens have positions {got[:4]}...: they count the pad "
                        f"columns (positions from the column index, ignoring padding); a row's first real token is at "
                        f"position 0 whatever precedes it: cumsum(mask) - 1")
            return f"row {r}: the positions of its real tokens are {got}, expected 0..{n - 1}"
        if pads and (int(positions[r, :pads].min()) < 0):
            return f"row {r}: pad positions must be valid positions (>= 0; clamp cumsum - 1 at 0), got {positions[r, :pads].tolist()}"
    return ""


def check_pad_batch(fn: Callable, seed: int = 0, cases: int = 2) -> None:
    """``fn(prompts, pad_id) -> (input_ids, attention_mask, position_ids)``, each (B, T) with T the longest
    prompt; input_ids int64, attention_mask int64 0/1 or bool, position_ids int64.

    Raises: ContractError naming the row, the column and, when it matches, the fault."""
    check_own_function("pad_batch", fn)
    rng = random.Random(seed)
    for case in range(cases):
        model = _toy(rng.randrange(2 ** 31))
        V = model.config.vocab_size
        base = rng.randrange(4, 12)
        lengths = [base + 7, base + 6, base, base + 7][: 3 + case % 2]   # 0, 1 and 7 pads (and a tie)
        rng.shuffle(lengths)
        g = torch.Generator().manual_seed(rng.randrange(2 ** 31))
        prompts = [torch.randint(1, V, (n,), generator=g) for n in lengths]
        pad_id = rng.choice([0, int(prompts[0][0])])                      # a pad id may equal a real token's
        what = f"case {case}: prompts of lengths {lengths}, pad_id {pad_id}"
        result = call_on_copies(f"pad_batch({what})", fn, list(prompts), pad_id)
        if type(result) is not tuple or len(result) != 3:
            raise ContractError(f"{what}: pad_batch must return a tuple (input_ids, attention_mask, position_ids), "
                                f"got {type(result).__qualname__}")
        B, T = len(prompts), max(lengths)
        ids = check_tensor("input_ids", result[0], shape=(B, T), dtype=torch.int64)
        raw_mask = result[1]
        is_bool = type(raw_mask) is torch.Tensor and raw_mask.dtype == torch.bool
        mask = check_tensor("attention_mask (int64 0/1 or bool)", raw_mask, shape=(B, T),
                            dtype=torch.bool if is_bool else torch.int64)
        positions = check_tensor("position_ids", result[2], shape=(B, T), dtype=torch.int64)
        if mask.dtype == torch.int64 and not bool(((mask == 0) | (mask == 1)).all()):
            raise ContractError(f"{what}: attention_mask must hold only 0 and 1")
        problem = _layout_errors(prompts, pad_id, ids, mask, positions)
        if problem:
            raise ContractError(f"{what}: {problem}")
        if int(positions.max()) >= model.config.max_seq_len or int(ids.max()) >= V or int(ids.min()) < 0:
            raise ContractError(f"{what}: token ids must lie in 0..{V - 1} and positions below the model's "
                                f"max_seq_len {model.config.max_seq_len}")
        _check_padded_logits(model, prompts, ids, mask.to(torch.int64), positions, what)


@torch.no_grad()
def _check_padded_logits(model: Decoder, prompts, ids, mask, positions, what: str) -> None:
    """Each row's logits in the padded batch equal the row alone: prefill, then DECODE_STEPS cached steps."""
    B, T = ids.shape
    cache = model.new_cache(B, T + DECODE_STEPS)
    steps = [model(ids, positions, cache, attention_mask=mask)[:, -1]]
    position = positions[:, -1:] + 1
    for _ in range(DECODE_STEPS):
        mask = torch.cat([mask, mask.new_ones(B, 1)], 1)
        steps.append(model(steps[-1].argmax(-1, keepdim=True), position, cache, attention_mask=mask)[:, -1])
        position = position + 1
    batched = torch.stack(steps, 1)                                    # (B, steps, V)
    for r, p in enumerate(prompts):
        solo_cache = model.new_cache(1, len(p) + DECODE_STEPS)
        solo = [model(p[None], torch.arange(len(p)), solo_cache)[0, -1]]
        for _ in range(DECODE_STEPS):
            solo.append(model(solo[-1].argmax().view(1, 1), torch.tensor([solo_cache.length]), solo_cache)[0, -1])
        solo = torch.stack(solo)
        try:
            check_logits_close(batched[r], solo, what=f"{what}: row {r}'s logits in the padded batch (step 0 = prefill)",
                               tokens_actual=batched[r].argmax(-1).tolist(), tokens_expected=solo.argmax(-1).tolist())
        except ContractError as err:
            raise with_diagnosis(err, "the layout is right, so the batch's positions or mask reach the model wrongly: "
                                      "check that decode continues each row at its own position "
                                      "(its last position + 1)") from None


# -- divergence_report -----------------------------------------------------------------------------


def _runs(rng: random.Random, case: int):
    """Synthetic (solo_tokens, batch_tokens, solo_logits, batch_logits, first_difference) with known answers.

    Case kinds: 0 identical tokens; 1 divergence in the middle; 2 at step 0; 3 at the last step. Before the
    divergence the two runs differ by float32-sized noise; at it, by a small flip of a near-tie (the batch
    raises the runner-up or lowers the leader); after it, by a lot (other contexts), and the solo run has
    its smallest top-2 gap there, so a report that reads past the divergence gets both numbers wrong. In
    kind 1, two earlier steps that flip nothing hold the largest logit difference and the smallest gap of
    the common prefix, so a report that reads the first differing step alone is wrong too; in kinds 2 and
    3 the first differing step holds both, so a report that leaves it out is wrong."""
    n, V = rng.randrange(12, 30), rng.randrange(40, 120)
    g = torch.Generator().manual_seed(rng.randrange(2 ** 31))
    solo = torch.randn(n, V, generator=g) * 3
    top = solo.topk(2, dim=-1)
    # keep each step's top-2 gap at least 0.05 so that noise never flips a token by accident
    bump = (0.05 - (top.values[:, 0] - top.values[:, 1])).clamp(min=0)
    solo[torch.arange(n), top.indices[:, 0]] += bump
    batch = solo + torch.randn(n, V, generator=g) * rng.choice([1e-6, 1e-5, 1e-4])
    kind = case % 4
    first = None if kind == 0 else {1: rng.randrange(2, n - 3), 2: 0, 3: n - 1}[kind]
    if first is not None:
        a, b = solo[first].topk(2).indices.tolist()
        solo[first, b] = solo[first, a] - 1e-3                              # a near-tie in the solo run ...
        batch[first] = solo[first] + torch.randn(V, generator=g) * 1e-5
        if rng.random() < 0.5:                                              # ... that the batch flips
            batch[first, b] = solo[first, a] + 1e-3
        else:
            batch[first, a] = solo[first, b] - 1e-3
        if kind == 1:
            e, e2 = rng.sample(range(first), 2)
            c = int(solo[e].argmin())                                       # the largest |diff|, no flip
            batch[e, c] = solo[e, c] + rng.choice([-1, 1]) * 5e-3
            x, y = solo[e2].topk(2).indices.tolist()                        # the smallest gap, no flip
            solo[e2, y] = solo[e2, x] - 3e-4
            batch[e2, x], batch[e2, y] = solo[e2, x], solo[e2, y]
        if first + 1 < n:
            batch[first + 1:] = torch.randn(n - first - 1, V, generator=g) * 3
            late = rng.randrange(first + 1, n)
            x, y = solo[late].topk(2).indices.tolist()
            solo[late, y] = solo[late, x] - 1e-4                            # the smallest gap, past the divergence
            batch[late, y] = batch[late].max() + 1.0                       # and a token that differs there
    solo_tokens, batch_tokens = solo.argmax(-1), batch.argmax(-1)
    if first_divergence(solo_tokens.tolist(), batch_tokens.tolist()) != first:
        raise RuntimeError("Lab 6 grader: a synthetic run diverged at another step than planned (a grader bug)")
    return solo_tokens, batch_tokens, solo, batch, first


def check_divergence_report(fn: Callable, seed: int = 0, cases: int = 4) -> None:
    """``fn(solo_tokens, batch_tokens, solo_logits, batch_logits) -> dict`` with the keys ``REPORT_KEYS``.

    Raises: ContractError naming the key, both values and, when it matches, the fault."""
    check_own_function("divergence_report", fn)
    rng = random.Random(seed)
    for case in range(max(cases, 4)):
        st, bt, sl, bl, first = _runs(rng, case)
        want = divergence_report(st, bt, sl, bl)
        where = "identical tokens" if first is None else f"tokens first differ at step {first}"
        what = f"case {case} ({len(st)} steps, {where})"
        got = call_on_copies(f"divergence_report({what})", fn, st, bt, sl, bl)
        if type(got) is not dict:
            raise ContractError(f"{what}: divergence_report must return a dict with keys {list(REPORT_KEYS)}, got "
                                f"{type(got).__qualname__}")
        missing = [k for k in REPORT_KEYS if k not in got]
        if missing:
            raise ContractError(f"{what}: the report lacks the keys {missing} (expected {list(REPORT_KEYS)})")
        if type(got["tokens_equal"]) is not bool or got["tokens_equal"] != want.tokens_equal:
            raise ContractError(f"{what}: tokens_equal must be the bool {want.tokens_equal}, got {got['tokens_equal']!r}")
        for key in ("first_difference", "compared_steps", "gap_step"):
            value, expected = got[key], getattr(want, key)
            if value != expected or (value is not None and type(value) is not int):
                kind = "an int, or None when the tokens are equal" if key == "first_difference" else "an int"
                message = f"{what}: {key} must be {expected!r} ({kind}), got {value!r}"
                if key == "gap_step":
                    message += _tie_note(value, expected, sl[:want.compared_steps])
                raise ContractError(_with_fault(message, key, value, st, bt, sl, bl, first))
        for key in ("max_logit_difference", "smallest_top2_gap"):
            value = check_real(key, got[key])
            expected = getattr(want, key)
            if not math.isclose(value, expected, rel_tol=1e-5, abs_tol=1e-7):
                raise ContractError(_with_fault(f"{what}: {key} must be {expected:.6g}, got {value:.6g}",
                                                key, value, st, bt, sl, bl, first))


def _tie_note(value, expected: int, logits: torch.Tensor) -> str:
    """When VALUE is another compared step whose top-2 gap is within float32 rounding (relative 1e-6) of
    the smallest, the rule that decides such a tie; else ""."""
    gaps = top2_gap(logits).double()
    if type(value) is not int or not 0 <= value < len(gaps) or value == expected:
        return ""
    smallest = float(gaps[expected])
    if not math.isclose(float(gaps[value]), smallest, rel_tol=1e-6):
        return ""
    return (f": steps {min(value, expected)} and {max(value, expected)} tie at the smallest top-2 gap "
            f"({float(gaps[value]):.8g} and {smallest:.8g}, equal to float32 rounding), and on a tie gap_step is the "
            "first such step (as torch.argmin returns it)")


def _with_fault(message: str, key: str, value, st, bt, sl, bl, first) -> ContractError:
    """MESSAGE with a diagnosis when VALUE is what comparing every step, or stopping before the first
    differing step, gives."""
    if first is None:
        return ContractError(message)
    n = len(st)
    variants = {}
    for label, steps in (("all", n), ("before", first)):
        if steps == 0:
            continue
        diff = float((sl[:steps].double() - bl[:steps].double()).abs().max())
        gaps = top2_gap(sl[:steps])
        variants[label] = {"compared_steps": steps, "max_logit_difference": diff,
                           "smallest_top2_gap": float(gaps.min()), "gap_step": int(gaps.argmin())}

    def same(a, b):
        return a == b if type(b) is int else (type(a) in (int, float) and math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-7))

    if key not in ("compared_steps", "max_logit_difference", "smallest_top2_gap", "gap_step"):
        return ContractError(message)
    if "all" in variants and same(value, variants["all"][key]) and first + 1 < n:
        return with_diagnosis(message, f"compared logits past the first divergence: after step {first} the two runs "
                                       f"read different tokens, so their logits differ for that reason alone; compare "
                                       f"steps 0..{first} only (the logits at step {first} still saw the same context)")
    if "before" in variants and same(value, variants["before"][key]):
        return with_diagnosis(message, f"left out step {first}, the first differing step: its logits were computed "
                                       f"from the same context as the solo run's, so they belong to the comparison")
    return ContractError(message)


# -- invariant_linear ------------------------------------------------------------------------------

#: (K, N) of SmolLM2-135M's projections (q/o, k/v, gate/up, down), and ragged ones drawn per case.
SMOLLM2_SHAPES = ((576, 576), (576, 192), (576, 1536), (1536, 576))
BATCHES = (1, 2, 3, 4, 5, 8, 9, 16)
#: Intra-op threads the learner's function runs on, at least (the judge asks its kernel for as many).
THREADS = 2


@contextlib.contextmanager
def _threads(at_least: int):
    """torch's intra-op threads raised to AT_LEAST for the block (a grader with one thread per job
    must check what a learner's machine with several does), then put back."""
    before = torch.get_num_threads()
    torch.set_num_threads(max(at_least, before))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _ragged_shape(rng: random.Random) -> tuple[int, int]:
    """(K, N) with K and N not multiples of 4 and N >= 64: the rows of x then start at addresses of
    every alignment, where a matrix-vector product per row (x[i:i+1] @ weight.T) on several threads
    adds in an order that follows the address (MKL, measured: such a row differs from itself alone
    in nearly every place), and the split of N over threads is uneven."""
    for _ in attempts("Lab 6"):
        K, N = rng.randrange(100, 700), rng.randrange(64, 400)
        if K % 4 and N % 4:
            return K, N
    raise AssertionError("unreachable")


def check_invariant_linear(fn: Callable, seed: int = 0, cases: int = 2) -> None:
    """``fn(x, weight) -> y``: x (M, K) float32, weight (N, K) float32, y (M, N) float32 = x @ weight.T, with
    each row's bits independent of the other rows and of M, on ``THREADS`` or more threads. Case 0 is one of
    SmolLM2-135M's projections, case 1 a ragged shape (``_ragged_shape``); each row is checked in several
    places of batches of ``BATCHES`` rows. fn must leave x and weight as they were.

    Raises: ContractError naming the batch size and place where a row changed, or the accuracy failure."""
    check_own_function("invariant_linear", fn)
    rng = random.Random(seed)
    shapes = list(SMOLLM2_SHAPES)
    rng.shuffle(shapes)
    with _threads(THREADS):
        for case in range(cases):
            K, N = shapes[case % len(shapes)] if case % 2 == 0 else _ragged_shape(rng)
            g = torch.Generator().manual_seed(rng.randrange(2 ** 31))
            weight = torch.randn(N, K, generator=g) / math.sqrt(K)
            row = torch.randn(1, K, generator=g)
            what = f"case {case}: weight ({N}, {K})"
            call = f"{what}: invariant_linear(x (1, {K}), weight)"
            alone = check_tensor(call, call_on_copies(call, fn, row, weight), shape=(1, N), dtype=torch.float32)[0]
            for M in BATCHES:
                for place in sorted({0, rng.randrange(M), M - 1}):
                    _check_row_in_batch(fn, what, weight, row, alone, M, place, rng, g)


def _check_row_in_batch(fn: Callable, what: str, weight: torch.Tensor, row: torch.Tensor, alone: torch.Tensor,
                        M: int, place: int, rng: random.Random, g: torch.Generator) -> None:
    """ROW at row PLACE of a batch of M drawn rows: y must be x @ weight.T to float32 rounding, and that
    row exactly a power-of-two multiple of ALONE."""
    N, K = weight.shape
    # the row comes back scaled by a power of two: exact in float32, so a product that adds in a
    # fixed order gives exactly scale * alone (and a memo of rows seen before cannot answer)
    scale = rng.choice([-1.0, 1.0]) * 2.0 ** rng.randrange(-3, 4)
    x = torch.randn(M, K, generator=g)
    x[place] = row[0] * scale
    call = f"{what}: invariant_linear(x ({M}, {K}), weight)"
    y = check_tensor(call, call_on_copies(call, fn, x, weight), shape=(M, N), dtype=torch.float32)
    exact = x.double() @ weight.double().T
    bound = 2 * (K + 2) * 2.0 ** -24 * (x.double().abs() @ weight.double().abs().T) + 1e-30
    over = (y.double() - exact).abs() > bound
    if bool(over.any()):
        r, c = (int(i) for i in over.nonzero()[0])
        raise ContractError(f"{what}, M = {M}: y[{r}, {c}] = {float(y[r, c]):.7g} but x @ weight.T is "
                            f"{float(exact[r, c]):.7g} (more than float32 rounding, {float(bound[r, c]):.2g}, "
                            f"apart): y must be x @ weight.T, every row of it")
    if torch.equal(y[place], alone * scale):
        return
    diff = float((y[place] - alone * scale).abs().max())
    err = (f"{what}: a row gives other bits at row {place} of a batch of {M} than alone (the row entered scaled by "
           f"{scale:g}, which is exact, so the result must be exactly {scale:g} times the row's result alone; max "
           f"|diff| {diff:.3g}): a row's result changes with the batch it is in")
    fix = "call the product only on tiles of a fixed number of rows (pad the last tile with zero rows)"
    if torch.equal(y[place], (x @ weight.T)[place]):
        raise with_diagnosis(err, "a reduction whose split depends on the batch size: one product over all M rows "
                                  f"lets the matrix library pick its kernel and its order of additions from M; {fix}")
    raise with_diagnosis(err, "a product per row: a one-row product (x[i:i+1] @ weight.T) runs a matrix-vector "
                              "kernel whose order of additions on several threads can follow where the row sits in "
                              f"memory, so the row's place in the batch changes its bits; {fix}")


# -- rms_norm_kernel -------------------------------------------------------------------------------
#: BLOCK_D values the checker launches with: the kernel must be right, and batch-invariant, for each.
RMS_BLOCKS = (16, 32, 64)
RMS_ROWS = 16      # rows of the largest batch; each also runs alone, and one elsewhere


def _rms_stray(n_cols: int) -> Callable[[dict], str]:
    """The diagnosis of an RMSNorm kernel's stray access (``kernel_checks.launch_case``'s name_stray)."""
    def name(v: dict) -> str:
        tensor, index, steps = v["tensor"], v["index"], v.get("steps") or []
        if not v["inside_buffer"]:
            return ("an address far from every tensor: an offset is wrong (row r, column c of x is "
                    "x_ptr + r * stride_xr + c, of y y_ptr + r * stride_yr + c; weight[c] is w_ptr + c)")
        if tensor in ("x", "y") and len(index) == 2 and index[0] != v["program"][0]:
            stride = "stride_xr" if tensor == "x" else "stride_yr"
            return (f"program {v['program'][0]} reached row {index[0]} of {tensor}: row r of {tensor} starts r * {stride} "
                    f"elements after its pointer ({stride}, not D or the other tensor's stride), and program r owns "
                    "row r only")
        if tensor in ("x", "y") and len(index) == 2 and index[1] >= n_cols:
            what = "load of x" if v["op"] == "load" else "store to y"
            return (f"the tail mask is left out of the {what}: the last tile of BLOCK_D columns goes past column "
                    f"{n_cols - 1} (mask the columns with cols < D)")
        if tensor == "weight" and index[0] >= n_cols:
            return (f"the tail mask is left out of weight's load: the last tile goes past element {n_cols - 1} "
                    "(mask it with cols < D)")
        return ""
    return name


def _rms_cases(rng: random.Random, cases: int) -> list[tuple[int, int, float]]:
    """(D, BLOCK_D, eps) per case: D is never a multiple of BLOCK_D and spans at least two tiles on case 0."""
    drawn = []
    for case in range(cases):
        block = RMS_BLOCKS[rng.randrange(len(RMS_BLOCKS))]
        tiles = rng.randint(2, 4) if case == 0 else rng.randint(1, 4)
        drawn.append((block * tiles + rng.randint(1, block - 1), block, rng.choice((1e-5, 1e-6, 1e-3))))
    return drawn


def check_rms_norm_kernel(kernel, seed: int = 0, cases: int = 2) -> None:
    """Contract: the learner's ``@triton.jit`` RMSNorm kernel, launched by the course
    (``course_lib.kernels.exercise.launch_rms_norm``: one program per row, BLOCK_D from ``RMS_BLOCKS``)
    under Triton's interpreter on D that are not multiples of BLOCK_D:

    - every lane it loads or stores addresses an element of x, weight or y (rows of x and y sit in
      buffers wider than D, so a missing column mask shows on every row);
    - y equals ``reference_rms_norm`` within float32 rounding (|diff| <= 1e-5 |ref| + 1e-6);
    - batch invariance, bit for bit: every row of a batch of ``RMS_ROWS`` rows equals that row computed
      alone, in a batch of one (``torch.equal``), and a row moved to another position of another batch
      keeps its bits. Rows span magnitudes from 1e-3 to 1e3, so eps matters for some."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    for case, (D, block, eps) in enumerate(_rms_cases(rng, cases)):
        scales = torch.tensor([10.0 ** rng.uniform(-3, 3) for _ in range(RMS_ROWS)])[:, None]
        x = torch.randn(RMS_ROWS, D, generator=gen) * scales
        weight = 1.0 + 0.1 * torch.randn(D, generator=gen)
        what = f"rms_norm_kernel(case {case}: x {RMS_ROWS} x {D}, BLOCK_D {block}, eps {eps:g})"

        def run(rows: torch.Tensor, label: str) -> torch.Tensor:
            y = launch_case(kernel, "rms_norm", f"{what}, {label}", _rms_stray(D), rows, weight, eps, block_d=block)
            y = check_tensor(f"{what}, {label}: y", y, shape=tuple(rows.shape), dtype=torch.float32, allow_nan=True)
            check_all_stored(f"{what}, {label}", y, "Program r owns row r")
            return y

        y = run(x, f"all {RMS_ROWS} rows")
        expected = reference_rms_norm(x, weight, eps)
        err = (y.double() - expected.double()).abs()
        bound = 1e-5 * expected.double().abs() + 1e-6
        if not bool((err <= bound).all()):
            r, c = (int(i) for i in (err > bound).nonzero()[0])
            failure = ContractError(f"{what}: y[{r}, {c}] = {float(y[r, c]):.6g}, expected {float(expected[r, c]):.6g} "
                                    f"(|diff| {float(err[r, c]):.3g} > allowed {float(bound[r, c]):.3g}); "
                                    f"{int((err > bound).sum())} of {y.numel()} values over")
            ms = x.double().pow(2).mean(dim=1, keepdim=True)
            w = weight.double()
            raise diagnose(failure, y, {
                "eps added after the square root (1 / (sqrt(mean(x^2)) + eps) instead of 1 / sqrt(mean(x^2) + eps))":
                    lambda: x.double() / (ms.sqrt() + eps) * w,
                "eps added to the scale (1 / sqrt(mean(x^2)) + eps instead of 1 / sqrt(mean(x^2) + eps))":
                    lambda: x.double() * (1 / ms.sqrt() + eps) * w,
                "the weight left out": lambda: x.double() / (ms + eps).sqrt(),
                f"the mean taken over the padded tiles (divided by a multiple of BLOCK_D, not by D = {D})":
                    lambda: x.double() / (ms * D / (block * -(-D // block)) + eps).sqrt() * w,
                "the sum of squares used without dividing by D": lambda: x.double() / (ms * D + eps).sqrt() * w,
                f"the sum of squares divided by the number of rows R = {RMS_ROWS}, not by D = {D}":
                    lambda: x.double() / (ms * D / RMS_ROWS + eps).sqrt() * w,
                "eps left out": lambda: x.double() / ms.sqrt() * w,
                f"the sum of squares divided by BLOCK_D = {block}, not by D = {D}":
                    lambda: x.double() / (ms * D / block + eps).sqrt() * w,
                "masked lanes loaded as 1.0 (other=1.0): the padding of the last tile adds to the sum of squares; "
                "use other=0.0": lambda: x.double() / ((ms * D + block * -(-D // block) - D) / D + eps).sqrt() * w,
                "multiplied by sqrt(mean(x^2) + eps) instead of its inverse (1 / sqrt, tl.rsqrt)":
                    lambda: x.double() * (ms + eps).sqrt() * w,
            }, lambda got, cand: bool(((got.double() - cand).abs() <= 1e-4 * cand.abs() + 1e-6).all()))
        for r in range(RMS_ROWS):
            alone = run(x[r:r + 1], f"row {r} alone")
            _same_bits(what, y[r], alone[0], f"row {r} in the batch of {RMS_ROWS}", f"row {r} alone (a batch of 1)")
        t = rng.randrange(RMS_ROWS)
        order = [i for i in range(RMS_ROWS) if i != t]
        rng.shuffle(order)
        moved = rng.randrange(1, 4)
        other = torch.cat([x[order[:moved]], x[t:t + 1], torch.randn(2, D, generator=gen) * 5.0])
        placed = run(other, f"row {t} at position {moved} of another batch")
        _same_bits(what, y[t], placed[moved], f"row {t} at position {t} of {RMS_ROWS}",
                   f"the same row at position {moved} of a batch of {len(other)}")


def _same_bits(what: str, a: torch.Tensor, b: torch.Tensor, where_a: str, where_b: str) -> None:
    if torch.equal(a, b):
        return
    differ = int((a != b).sum())
    raise with_diagnosis(ContractError(
        f"{what}: {where_a} and {where_b} differ in {differ} of {a.numel()} values (max |diff| "
        f"{float((a.double() - b.double()).abs().max()):.3g}): the kernel is not batch-invariant"),
        "the reduction order depends on the batch: how many rows the call has, or where the row sits. Fix it "
        "once for every call (tiles of BLOCK_D columns from 0 upward, then one tl.sum), and never read R or the "
        "program id to choose it", likely=False)


# -- the tables ------------------------------------------------------------------------------------

CONTRACTS = (
    Contract("test_pad_batch", check_pad_batch, ("pad_batch",),
             references=("course_lib.models.decoder.left_pad", "course_lib.models.decoder.positions_from_mask",
                         "course_lib.models.decoder.generate_batch")),
    Contract("test_divergence_report", check_divergence_report, ("divergence_report",),
             references=("course_lib.batching.divergence_report",)),
    Contract("test_invariant_linear", check_invariant_linear, ("invariant_linear",),
             references=("course_lib.kernels.batch_invariant.torch_ops.linear",
                         "course_lib.kernels.batch_invariant.triton_ops.matmul")),
    Contract("test_rms_norm_kernel", check_rms_norm_kernel, ("rms_norm_kernel",), launcher="rms_norm",
             references=("course_lib.kernels.batch_invariant.triton_ops.reference_rms_norm",
                         "course_lib.kernels.batch_invariant.triton_ops.rms_norm",
                         "course_lib.kernels.batch_invariant.torch_ops.rms_norm")),
)

FAULTS = (
    Fault("positions_from_column_index",
          (Edit("pad_batch", "positions = (mask.cumsum(-1) - 1).clamp(min=0)",
                "positions = torch.arange(T).expand(len(prompts), T).clone()"),),
          {"test_pad_batch": r"positions from the column index"},
          "numbers positions by column, so a padded row's first real token is not at position 0"),
    Fault("right_padding",
          (Edit("pad_batch", "ids[i, T - len(p):] = p\n        mask[i, T - len(p):] = 1",
                "ids[i, :len(p)] = p\n        mask[i, :len(p)] = 1"),),
          {"test_pad_batch": r"right-padded: .*last column is a pad"},
          "pads on the right, so a short row's last column, the one read for its next token, is a pad"),
    Fault("split_depends_on_batch_size",
          (Edit("invariant_linear", "rows = torch.cat([x, x.new_zeros(-M % tile, K)])",
                "rows = x                                             # no tiles"),
           Edit("invariant_linear", "out = torch.cat([rows[i:i + tile] @ weight.T for i in range(0, len(rows), tile)])",
                "out = rows @ weight.T"),),
          {"test_invariant_linear": r"split depends on the batch size"},
          "computes the whole batch in one product, whose order of additions the library picks from M"),
    Fault("logits_past_divergence",
          (Edit("divergence_report", "steps = len(a) if first is None else first + 1", "steps = len(a)"),),
          {"test_divergence_report": r"past the first divergence"},
          "compares logits after the first differing token, where the two runs read different contexts"),
    Fault("rms_tail_mask_left_out",
          (Edit("rms_norm_kernel", "xv = tl.load(x_row + cols, mask=cols < D, other=0.0)", "xv = tl.load(x_row + cols)"),),
          {"test_rms_norm_kernel": r"tail mask is left out of the load of x"},
          "sums the squares of the last tile without a column mask, reading past column D - 1"),
    Fault("rms_reduction_depends_on_rows",
          (Edit("rms_norm_kernel", "        acc += xv * xv\n",
                "        if R > 4:    # a large batch: fold each tile into one lane at once\n"
                "            acc += tl.where(cols == d0, tl.sum(xv * xv, axis=0), 0.0)\n"
                "        else:\n"
                "            acc += xv * xv\n"),),
          {"test_rms_norm_kernel": r"not batch-invariant.*\n.*reduction order depends on the batch"},
          "chooses how to sum the squares from the number of rows R, so a row's bits change with the batch"),
    Fault("rms_eps_outside_sqrt",
          (Edit("rms_norm_kernel", "rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / D + eps)",
                "rstd = 1.0 / (tl.sqrt(tl.sum(acc, axis=0) / D) + eps)"),),
          {"test_rms_norm_kernel": r"eps added after the square root"},
          "adds eps after the square root instead of under it"),
)
check_tables(CONTRACTS, FAULTS)
