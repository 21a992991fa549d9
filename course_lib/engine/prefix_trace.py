"""A seeded trace of requests that share prefixes, served with each prefix cache: where they differ and why.

Run: ``python -m course_lib.engine.prefix_trace [--model toy|smollm2] [--seed 0] [--num-blocks 96]``.

The trace (:func:`shared_prefix_trace`) has the three kinds of sharing a serving engine meets:

- **conversations**: each turn's prompt is the previous turn's prompt, the model's own greedy answer to it
  and a new user message, and it arrives ``gap`` seconds after the previous turn (after it finished, on
  a model as fast as the toy's or SmolLM2-135M's on a laptop);
- **few-shot**: one long template (instructions and examples) followed by different questions, arriving
  one after another;
- **branches**: one prompt with several continuations, ``branch_gap`` seconds apart (0.25 s: after the first
  one's prefill wrote the shared blocks, while it still decodes). Branches that arrive within one iteration
  are admitted together and each computes the shared prompt: no cache shares blocks not yet written.

:func:`compare_prefix_caches` serves the same trace with ``Engine(prefix_cache="hash")`` and
``Engine(prefix_cache="radix")`` in one run and returns, per cache and kind of request: positions
reused from the cache, positions computed (prefill and decode, re-prefills after preemption included),
blocks evicted and the median TTFT. Both caches must give every request the same tokens (the engine's
contract; checked, the run stops otherwise). TTFT is measured on the engine's clock (each iteration's
wall time, ``docs/engine.md``, "Time"), or on the clock passed as ``timer``.

Why they differ: the hash chain finds a block only while a live request holds it, so a conversation's
next turn, arriving after the previous one finished, recomputes the whole history; the radix tree keeps
finished requests' full blocks until the pool needs them. Requests that share a prefix *while running*
(branches that arrive together, few-shot questions that overlap) find it in either cache, once the
first request has written the shared blocks.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Callable

import torch

from ..models.decoder import Decoder, generate_cached
from ..validation import instance, positive_integer, positive_number
from .block_manager import PREFIX_CACHES
from .engine import Engine

__all__ = ["KINDS", "shared_prefix_trace", "compare_prefix_caches", "main"]

#: The kinds of requests in the trace, in the order the table lists them.
KINDS = ("conversation", "few-shot", "branch")


def shared_prefix_trace(model: Decoder, *, seed: int = 0, conversations: int = 2, turns: int = 3,
                        message: int = 10, template: int = 40, questions: int = 3, question: int = 6,
                        branches: int = 3, branch_prompt: int = 24, branch_suffix: int = 4, new: int = 4,
                        gap: float = 1.0, branch_gap: float = 0.25) -> list[tuple[float, list[int], int, str]]:
    """The trace (module docstring) as (arrival s, prompt ids, max_new_tokens, kind) in arrival order.

    Token ids are drawn uniformly from the model's vocabulary with a generator seeded by SEED (the
    caches see only ids); a conversation's answers are the model's own greedy tokens
    (``generate_cached``), so its next turn extends what the engine cached. Conversations start at 0,
    the few-shot questions at 0.5 s (one ``gap`` apart per turn or question), the branches at 0.75 s,
    ``branch_gap`` apart.

    Raises: ArgumentTypeError / ValueError for sizes that are not positive ints, a gap or branch_gap that is
        not a positive number, or a trace longer than the model's max_seq_len.
    """
    model = instance("model", model, Decoder)
    sizes = dict(conversations=conversations, turns=turns, message=message, template=template, questions=questions,
                 question=question, branches=branches, branch_prompt=branch_prompt, branch_suffix=branch_suffix,
                 new=new)
    sizes = {k: positive_integer(k, v) for k, v in sizes.items()}
    gap, branch_gap = float(positive_number("gap", gap)), float(positive_number("branch_gap", branch_gap))
    longest = sizes["turns"] * (sizes["message"] + sizes["new"])
    if max(longest, sizes["template"] + sizes["question"], sizes["branch_prompt"] + sizes["branch_suffix"]) \
            + sizes["new"] > model.config.max_seq_len:
        raise ValueError(f"the trace's longest request does not fit the model's max_seq_len {model.config.max_seq_len}")
    g = torch.Generator().manual_seed(int(seed))

    def ids(n: int) -> list[int]:
        return torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist()

    entries = []
    for c in range(sizes["conversations"]):
        history: list[int] = []
        for t in range(sizes["turns"]):
            prompt = history + ids(sizes["message"])
            entries.append((t * gap + 0.01 * c, prompt, sizes["new"], "conversation"))
            answer, _ = generate_cached(model, torch.tensor(prompt), sizes["new"])
            history = prompt + answer.tolist()
    shared = ids(sizes["template"])
    entries += [(0.5 + q * gap, shared + ids(sizes["question"]), sizes["new"], "few-shot")
                for q in range(sizes["questions"])]
    root = ids(sizes["branch_prompt"])
    entries += [(0.75 + branch_gap * b, root + ids(sizes["branch_suffix"]), sizes["new"], "branch")
                for b in range(sizes["branches"])]
    return sorted(entries, key=lambda e: e[0])


def compare_prefix_caches(model: Decoder, trace, *, num_blocks: int = 96, block_size: int = 4,
                          budget: int | None = 64, max_running: int = 4,
                          timer: Callable[[], float] | None = None) -> list[dict]:
    """Serve TRACE (``shared_prefix_trace``'s entries) with each prefix cache, in one run; return a row per
    cache and kind: ``cache``, ``kind``, ``requests``, ``reused`` (positions taken from the cache),
    ``computed`` (positions the forwards computed), ``evicted_blocks`` (the cache's, for the whole run),
    ``ttft50`` (s, median). A ``timer`` (a fresh one per cache: a factory's call) makes the clock
    reproducible; None reads ``time.perf_counter``.

    Raises: RuntimeError when the two caches give any request different tokens (the engine's contract);
        what ``Engine`` and ``Engine.run`` raise for bad sizes or trace entries.
    """
    rows, outputs = [], {}
    for cache in PREFIX_CACHES:
        engine = Engine(model, num_blocks, block_size, budget, max_running, prefix_cache=cache,
                        timer=timer() if timer is not None else time.perf_counter)
        records = engine.run([(a, p, n) for a, p, n, _ in trace])
        outputs[cache] = [engine.output_ids(rid).tolist() for rid in range(len(trace))]
        computed = [0] * len(trace)
        for report in engine.history:
            for (k, _), rid in zip(report.chunks, report.rids):
                computed[rid] += k
        evicted = engine.blocks.radix.evicted_blocks if engine.blocks.radix is not None else 0
        for kind in KINDS:
            mine = [i for i, entry in enumerate(trace) if entry[3] == kind]
            if mine:
                rows.append({"cache": cache, "kind": kind, "requests": len(mine),
                             "reused": sum(engine.sequences[i].reused for i in mine),
                             "computed": sum(computed[i] for i in mine), "evicted_blocks": evicted,
                             "ttft50": statistics.median(records[i].ttft for i in mine)})
    differ = [i for i, (a, b) in enumerate(zip(*outputs.values())) if a != b]
    if differ:
        raise RuntimeError(f"the two prefix caches gave requests {differ} different tokens: the engine's contract "
                           "is that every request gets its solo tokens with either cache")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.engine.prefix_trace",
                                     description="The shared-prefix trace served with each prefix cache, in one run.")
    parser.add_argument("--model", choices=("toy", "smollm2"), default="smollm2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-blocks", type=int, default=96)
    parser.add_argument("--block-size", type=int, default=4)
    args = parser.parse_args(argv)
    if args.model == "toy":
        from ..models.decoder import toy_decoder

        model = toy_decoder()
    else:
        from ..data import load_smollm2

        model, _, _ = load_smollm2()
    trace = shared_prefix_trace(model, seed=args.seed)
    rows = compare_prefix_caches(model, trace, num_blocks=args.num_blocks, block_size=args.block_size)
    print(f"model: {args.model}; {len(trace)} requests (seed {args.seed}); blocks {args.num_blocks} x "
          f"{args.block_size} positions; TTFT on the engine's clock (this machine, this run)")
    print(f"{'cache':<6} {'kind':<13} {'requests':>8} {'reused':>7} {'computed':>9} {'evicted':>8} {'TTFT p50 (ms)':>14}")
    for r in rows:
        print(f"{r['cache']:<6} {r['kind']:<13} {r['requests']:>8} {r['reused']:>7} {r['computed']:>9} "
              f"{r['evicted_blocks']:>8} {1000 * r['ttft50']:>14.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
