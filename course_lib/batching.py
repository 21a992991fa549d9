"""Batching on the reference decoder (course Lab 6): the batch sweep against the roofline, a row decoded
alone against the same row in a batch, and the price of batch-invariant mode.

- :func:`batch_sweep` times prefill and every decode step of left-padded batches of B = 1, 2, 4, 8, 16
  and sets the median step beside two roofline bounds (``roofline.step_time_bound``): the weights alone
  (read once per step, 2 N B FLOPs; ``docs/roofline.md#cost-calculator``) and with attention (each row's
  KV cache read too, and ``roofline.attention_flops`` per row; ``docs/roofline.md#decode-step-bound``), with the
  bandwidth and peak measured on this machine (``roofline.measure_gemv_bandwidth``, ``measure_matmul`` and
  ``estimate_roof``, Lab 1).
- :func:`context_sweep` times one decode step at long cached contexts (a cache of random keys and values, no
  prefill), where the two bounds part: the attention bound follows the context, the weights-only one does not.
- :func:`divergence_report` compares a solo run with the same row's run inside a batch. Logits are
  compared on the common prefix only: the logits at the first step whose tokens differ were still
  computed from the same context, later ones are not (course Lab 6; the same rule as the grading
  contracts' logit check).
- :func:`padding_divergence` decodes one prompt alone and as a row with 0, 8, 32, ... pad slots, and
  reports where each batched run's tokens first differ from the solo run (``divergence.first_divergence``).
- :func:`invariant_cost` times one decode step with and without ``Decoder.batch_invariant_mode``,
  interleaved in one run. Run ``python -m course_lib.batching`` for both measurements.

Times are wall-clock seconds (``time.perf_counter``, CUDA-synchronised on a GPU), medians after warm-up.
"""
from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass, fields
from typing import Sequence

import torch

from .divergence import first_divergence, top2_gap
from .models.config import weight_bytes
from .models.decoder import Decoder, generate_batch, left_pad, positions_from_mask
from .roofline import MeasuredRoof, attention_flops, kv_bytes_per_sequence, step_time_bound
from .timing import timed
from .validation import instance, integer, materialized, positive_integer

__all__ = ["DivergenceReport", "REPORT_KEYS", "divergence_report", "batch_sweep", "padding_divergence",
           "context_sweep", "invariant_cost", "main"]

BATCHES = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class DivergenceReport:
    """A row decoded alone against the same row decoded in a batch.

    Attributes:
        tokens_equal: the two greedy token sequences are identical.
        first_difference: the first step whose tokens differ, or None.
        compared_steps: steps whose logits are compared: all of them, or first_difference + 1.
        max_logit_difference: max |solo - batched| over the compared steps (float32 logits).
        smallest_top2_gap: the smallest (largest - second largest) solo logit over the compared steps.
        gap_step: the step where that gap is smallest.
    """

    tokens_equal: bool
    first_difference: int | None
    compared_steps: int
    max_logit_difference: float
    smallest_top2_gap: float
    gap_step: int


#: The report's keys, in order (what Lab 6's learner function returns as a dict).
REPORT_KEYS = tuple(f.name for f in fields(DivergenceReport))


def _tokens_and_logits(name: str, tokens, logits) -> tuple[list[int], torch.Tensor]:
    instance(f"{name}_tokens", tokens, torch.Tensor)
    instance(f"{name}_logits", logits, torch.Tensor)
    materialized(f"{name}_tokens", tokens)
    materialized(f"{name}_logits", logits)
    if tokens.dim() != 1 or tokens.dtype != torch.int64 or tokens.numel() == 0:
        raise ValueError(f"{name}_tokens must be a non-empty (n,) int64 tensor, got {tuple(tokens.shape)} {tokens.dtype}")
    if logits.dim() != 2 or logits.shape[0] != tokens.numel() or not logits.dtype.is_floating_point:
        raise ValueError(f"{name}_logits must be (n, vocab) floating with n = {tokens.numel()}, got "
                         f"{tuple(logits.shape)} {logits.dtype}")
    return tokens.tolist(), logits


def divergence_report(solo_tokens: torch.Tensor, batch_tokens: torch.Tensor, solo_logits: torch.Tensor,
                      batch_logits: torch.Tensor) -> DivergenceReport:
    """Compare the greedy run of a row alone with its run inside a batch.

    Args:
        solo_tokens, batch_tokens: (n,) int64, the tokens each run emitted.
        solo_logits, batch_logits: (n, vocab) floating, the logits that chose each token.

    Returns:
        A :class:`DivergenceReport`; logits are compared on steps 0 .. compared_steps - 1 only.

    Raises:
        ArgumentTypeError: a non-tensor. ValueError: shapes or dtypes that do not fit, runs of
        different lengths or vocabularies, or a tensor on the meta device.
    """
    a, la = _tokens_and_logits("solo", solo_tokens, solo_logits)
    b, lb = _tokens_and_logits("batch", batch_tokens, batch_logits)
    if la.shape != lb.shape:
        raise ValueError(f"the two runs must have the same steps and vocabulary, got {tuple(la.shape)} and "
                         f"{tuple(lb.shape)}")
    first = first_divergence(a, b)
    steps = len(a) if first is None else first + 1
    diff = (la[:steps].to(torch.float64) - lb[:steps].to(torch.float64)).abs().max()
    gaps = top2_gap(la[:steps])
    return DivergenceReport(tokens_equal=first is None, first_difference=first, compared_steps=steps,
                            max_logit_difference=float(diff), smallest_top2_gap=float(gaps.min()),
                            gap_step=int(gaps.argmin()))


def _median_step(model: Decoder, prompts: Sequence[torch.Tensor], new_tokens: int):
    """(prefill seconds, decode step seconds list) of one greedy run of a left-padded batch."""
    device = model.embed_tokens.weight.device
    ids, mask = left_pad(list(prompts))
    ids, mask = ids.to(device), mask.to(device)
    B, T0 = ids.shape
    cache = model.new_cache(B, T0 + new_tokens)
    with torch.no_grad():
        logits, prefill_s = timed(lambda: model(ids, positions_from_mask(mask), cache, attention_mask=mask,
                                                last_only=True), device)
        position = positions_from_mask(mask)[:, -1:] + 1
        steps = []
        for _ in range(new_tokens - 1):
            mask = torch.cat([mask, mask.new_ones(B, 1)], 1)
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            logits, seconds = timed(lambda: model(nxt, position, cache, attention_mask=mask), device)
            steps.append(seconds)
            position = position + 1
    return prefill_s, steps


def _bounds(model: Decoder, roof: MeasuredRoof, batch: int, context: int):
    """(weights-only, with-attention) ``StepBound`` of one decode step of ``batch`` rows at ``context``."""
    c = model.config
    served = dict(weight_bytes=weight_bytes(model), n_params=sum(p.numel() for p in model.parameters()),
                  batch=batch, bandwidth=roof.bandwidth, peak_flops=roof.peak_flops)
    kv = kv_bytes_per_sequence(n_layers=c.n_layers, n_kv_heads=c.n_kv_heads, head_dim=c.head_dim, context=context,
                               bytes_per_value=model.embed_tokens.weight.element_size())
    return (step_time_bound(**served, kv_bytes_per_sequence=0),
            step_time_bound(**served, kv_bytes_per_sequence=kv, attention_flops_per_sequence=attention_flops(
                n_layers=c.n_layers, width=c.attention_width, context=context)))


def batch_sweep(model: Decoder, prompts: Sequence[torch.Tensor], roof: MeasuredRoof, *,
                batches: Sequence[int] = BATCHES, new_tokens: int = 64, progress: bool = True):
    """Prefill and decode of left-padded batches of each size in ``batches`` against the roofline.

    Row i of a batch of B is ``prompts[i % len(prompts)]``. Each B runs once untimed (warm-up, 4 new
    tokens), then once timed: the prefill forward and each of the new_tokens - 1 decode steps.

    Args:
        model: a ``Decoder``. prompts: (T_i,) int64 tensors. roof: this machine's ``MeasuredRoof``.
        batches: increasing ints >= 1. new_tokens: tokens per row, an int >= 2. progress: a tqdm bar.

    Returns:
        pandas DataFrame, one row per B: ``batch, prefill_s, decode_step_s`` (median), ``tokens_per_s``
        (per sequence, 1 / step), ``aggregate_tokens_per_s`` (B / step), ``weights_bound_s`` (the
        bound with the weights alone: their bytes, 2 N B FLOPs), ``predicted_step_s`` (the bound with
        attention at the run's mean context: the cached keys and values read as well, and
        4 * L * width * context * B FLOPs more, ``docs/roofline.md#decode-step-bound``), ``binding``
        ("memory" or "compute", of the latter), and ``measured_over_predicted`` (against the latter). ``attrs``: threads, device, new_tokens, bandwidth, peak_flops.

    Raises:
        ArgumentTypeError / ValueError: a non-Decoder, no prompts, bad batches or new_tokens.
    """
    import pandas as pd

    instance("model", model, Decoder)
    instance("roof", roof, MeasuredRoof)
    new_tokens = integer("new_tokens", new_tokens, minimum=2)
    batches = [positive_integer("batches[]", b) for b in batches]
    if not prompts:
        raise ValueError("prompts must hold at least one prompt")
    weight = model.embed_tokens.weight
    bar = batches
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(batches, desc="batch sweep", unit="B")
    rows = []
    for B in bar:
        batch = [prompts[i % len(prompts)] for i in range(B)]
        _median_step(model, batch, 4)                                  # warm-up
        prefill_s, steps = _median_step(model, batch, new_tokens)
        step = statistics.median(steps)
        weights_only, bound = _bounds(model, roof, B, max(len(p) for p in batch) + new_tokens // 2)
        rows.append({"batch": B, "prefill_s": prefill_s, "decode_step_s": step, "tokens_per_s": 1 / step,
                     "aggregate_tokens_per_s": B / step, "weights_bound_s": weights_only.bound_s,
                     "predicted_step_s": bound.bound_s, "binding": bound.binding,
                     "measured_over_predicted": step / bound.bound_s})
    table = pd.DataFrame(rows)
    table.attrs.update(threads=torch.get_num_threads(), device=str(weight.device), new_tokens=new_tokens,
                       bandwidth=roof.bandwidth, peak_flops=roof.peak_flops)
    return table


def context_sweep(model: Decoder, roof: MeasuredRoof, *, batch: int = 4, contexts: Sequence[int] = (64, 1024, 4096),
                  warmup: int = 1, repeats: int = 3):
    """One decode step of ``batch`` rows at each cached context, against both roofline bounds.

    The cache is filled with random keys and values instead of a prefill (a decode step's cost depends
    on how many positions it reads, not on their values), so long contexts cost only their steps.
    Each context: ``warmup`` untimed and ``repeats`` timed decode steps, the cache cropped back after
    each; the median is kept.

    Args:
        model: a ``Decoder``. roof: this machine's ``MeasuredRoof``. batch: rows, an int >= 1.
        contexts: cached positions, ints in [1, max_seq_len - 1]. warmup (>= 0), repeats (>= 1): ints.

    Returns:
        pandas DataFrame, one row per context: ``context, decode_step_s`` (median), ``weights_bound_s``,
        ``predicted_step_s`` (with attention), ``binding`` and ``measured_over_predicted``, as
        ``batch_sweep``. ``attrs``: threads, device, batch, warmup, repeats.

    Raises: ArgumentTypeError / ValueError for a non-Decoder, a non-MeasuredRoof or bad sizes."""
    import pandas as pd

    instance("model", model, Decoder)
    instance("roof", roof, MeasuredRoof)
    B = positive_integer("batch", batch)
    warmup, repeats = integer("warmup", warmup, minimum=0), positive_integer("repeats", repeats)
    contexts = [integer("contexts[]", t, minimum=1, maximum=model.config.max_seq_len - 1) for t in contexts]
    device = model.embed_tokens.weight.device
    gen = torch.Generator().manual_seed(0)
    rows = []
    for context in contexts:
        cache = model.new_cache(B, context + 1)
        cache.k.copy_(torch.randn(cache.k.shape, generator=gen))
        cache.v.copy_(torch.randn(cache.v.shape, generator=gen))
        cache.length = context
        token = torch.randint(0, model.config.vocab_size, (B, 1), generator=gen).to(device)
        position = torch.tensor([context], device=device)
        times = []
        for r in range(warmup + repeats):
            with torch.no_grad():
                _, seconds = timed(lambda: model(token, position, cache), device)
            cache.crop(context)
            if r >= warmup:
                times.append(seconds)
        del cache
        step = statistics.median(times)
        weights_only, bound = _bounds(model, roof, B, context)
        rows.append({"context": context, "decode_step_s": step, "weights_bound_s": weights_only.bound_s,
                     "predicted_step_s": bound.bound_s, "binding": bound.binding,
                     "measured_over_predicted": step / bound.bound_s})
    table = pd.DataFrame(rows)
    table.attrs.update(threads=torch.get_num_threads(), device=str(device), batch=B, warmup=warmup, repeats=repeats)
    return table


def padding_divergence(model: Decoder, prompt: torch.Tensor, filler: torch.Tensor, *,
                       pads: Sequence[int] = (0, 8, 32), new_tokens: int = 64):
    """Where a row's greedy tokens first differ from its solo run, for several padding lengths.

    The prompt is decoded alone (``generate_batch`` with one row), then once per ``p`` in ``pads`` as
    row 0 of a batch of two whose row 1 is ``filler[:len(prompt) + p]``: left padding gives row 0
    exactly ``p`` pad slots (``p = 0``: batched, unpadded). Each batched row is compared with the solo
    run by ``divergence_report`` (logits on the common prefix only), with the model's current kernels.

    Args:
        model: a ``Decoder``. prompt: (T,) int64 token ids. filler: (F,) int64 token ids with
        F >= T + max(pads). pads: ints >= 0. new_tokens: tokens per run, an int >= 1.

    Returns:
        pandas DataFrame, one row per pad length: ``pads`` and the ``REPORT_KEYS`` columns
        (``first_difference`` is None where the runs agree). ``attrs``: threads, device, new_tokens,
        batch (2), batch_invariant.

    Raises:
        ArgumentTypeError / ValueError: a non-Decoder, a prompt or filler that is not a 1-D int64
        tensor, a filler too short for the largest pad, a negative pad, no pads, bad new_tokens;
        and as ``generate_batch`` (a run past the model's ``max_seq_len``).
    """
    import pandas as pd

    instance("model", model, Decoder)
    for name, ids in (("prompt", prompt), ("filler", filler)):
        instance(name, ids, torch.Tensor)
        materialized(name, ids)
        if ids.dim() != 1 or ids.dtype != torch.int64 or ids.numel() == 0:
            raise ValueError(f"{name} must be a non-empty (n,) int64 tensor, got {tuple(ids.shape)} {ids.dtype}")
    pads = [integer("pads[]", p, minimum=0) for p in pads]
    if not pads:
        raise ValueError("pads must hold at least one padding length")
    n = positive_integer("new_tokens", new_tokens)
    T = prompt.numel()
    if filler.numel() < T + max(pads):
        raise ValueError(f"filler holds {filler.numel()} tokens; the largest pad needs len(prompt) + {max(pads)} "
                         f"= {T + max(pads)}")
    solo_tokens, solo_logits = generate_batch(model, [prompt], n)
    rows = []
    for p in pads:
        tokens, logits = generate_batch(model, [prompt, filler[:T + p]], n)
        report = divergence_report(solo_tokens[0], tokens[0], solo_logits[0], logits[0])
        rows.append({"pads": p, **{key: getattr(report, key) for key in REPORT_KEYS}})
    table = pd.DataFrame(rows, columns=["pads", *REPORT_KEYS])
    table.attrs.update(threads=torch.get_num_threads(), device=str(model.embed_tokens.weight.device), new_tokens=n,
                       batch=2, batch_invariant=model.batch_invariant)
    return table


def invariant_cost(model: Decoder, *, batches: Sequence[int] = (1, 8, 16), context: int = 128,
                   warmup: int = 2, repeats: int = 7):
    """One decode step at each batch size, default path against ``batch_invariant_mode``, in one run.

    For each B: a (B, context) random prompt is prefilled once (default path) into a cache per mode; then,
    ``warmup`` untimed and
    ``repeats`` timed rounds, each timing one decode step of each mode in turn (interleaved, so a
    change of machine load hits both), the cache cropped back after each step.

    Returns:
        pandas DataFrame: ``batch, default_s, invariant_s`` (medians) and ``ratio`` (invariant / default);
        ``attrs``: threads, device, context, warmup, repeats.

    Raises: ArgumentTypeError / ValueError for a non-Decoder or bad sizes."""
    import pandas as pd

    instance("model", model, Decoder)
    context = integer("context", context, minimum=1, maximum=model.config.max_seq_len - 1)
    warmup, repeats = integer("warmup", warmup, minimum=0), positive_integer("repeats", repeats)
    device = model.embed_tokens.weight.device
    gen = torch.Generator().manual_seed(0)
    rows = []
    for B in (positive_integer("batches[]", b) for b in batches):
        ids = torch.randint(0, model.config.vocab_size, (B, context + 1), generator=gen).to(device)
        filled = model.new_cache(B, context + 1)
        with torch.no_grad():                           # the cached K/V only need to exist: prefill once
            model(ids[:, :context], torch.arange(context, device=device), filled, last_only=True)
        caches = {False: filled, True: filled.clone()}
        times = {False: [], True: []}
        position = torch.tensor([context], device=device)
        for r in range(warmup + repeats):
            for mode in (False, True):
                with torch.no_grad(), model.batch_invariant_mode(mode):
                    _, seconds = timed(lambda: model(ids[:, context:], position, caches[mode]), device)
                caches[mode].crop(context)
                if r >= warmup:
                    times[mode].append(seconds)
        default, invariant = statistics.median(times[False]), statistics.median(times[True])
        rows.append({"batch": B, "default_s": default, "invariant_s": invariant, "ratio": invariant / default})
    table = pd.DataFrame(rows)
    table.attrs.update(threads=torch.get_num_threads(), device=str(device), context=context, warmup=warmup,
                       repeats=repeats)
    return table


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m course_lib.batching``: the cost of batch-invariant mode and the batch sweep on SmolLM2-135M."""
    parser = argparse.ArgumentParser(prog="python -m course_lib.batching", description=main.__doc__)
    parser.add_argument("--context", type=int, default=128, help="cached tokens in the invariant-cost step")
    parser.add_argument("--repeats", type=int, default=7, help="timed decode steps per mode and batch")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens per row in the sweep")
    parser.add_argument("--no-sweep", action="store_true", help="time the invariant mode only")
    args = parser.parse_args(argv)
    import pandas as pd

    from .data import load_smollm2
    from .roofline import estimate_roof, measure_gemv_bandwidth, measure_matmul

    model, tokenizer, _ = load_smollm2()
    print(f"threads {torch.get_num_threads()}, device cpu, float32, median of {args.repeats} after 2 warm-up steps")
    with pd.option_context("display.width", 160, "display.float_format", "{:.4g}".format):
        cost = invariant_cost(model, context=args.context, repeats=args.repeats)
        print(f"\none decode step, context {args.context}: default path against batch_invariant_mode\n{cost}")
        if not args.no_sweep:
            roof = estimate_roof(measure_matmul(d=4096, batches=(1, 256), progress=False),
                                 measure_gemv_bandwidth(weight_bytes(model)))
            print(f"\nroof: {roof.bandwidth / 1e9:.1f} GB/s (measure_gemv_bandwidth over the model's weight bytes), "
                  f"{roof.peak_flops / 1e9:.0f} GFLOP/s (measure_matmul, d 4096)")
            prompts = [torch.tensor(tokenizer(text)["input_ids"]) for text in (
                "The key-value cache stores the keys and values of earlier tokens.",
                "Batching many requests together raises throughput because",
                "A roofline plot shows two limits:")]
            print(batch_sweep(model, prompts, roof, new_tokens=args.new_tokens, progress=False))


if __name__ == "__main__":
    main()
