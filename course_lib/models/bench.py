"""The reference decoder against the weight-streaming floor and against transformers, in one run.

Run: ``python -m course_lib.models.bench [--context 128] [--batches 1,8,16] [--prefill 512]
[--repeats 15] [--warmup 3] [--rounds 1] [--no-transformers] [--quick]``.

On SmolLM2-135M (float32, the course's artifact, ``course_lib.data.load_smollm2``) it measures, one
after another in the same process and with the same threads:

- the **floor**: the model's weight bytes (every parameter once; the tied head counted once) over the
  bandwidth a large float32 matrix-vector product reaches when it streams that many bytes
  (``course_lib.roofline.measure_gemv_bandwidth``): what a decode step, which reads every weight once,
  cannot beat on this machine;
- the **matrix-vector products alone**: the 210 projections and the output head of one decode step,
  back to back on the model's own weights (``F.linear``, no other work): the part of a step the
  matrix library decides;
- **our decode step** (``Decoder.forward`` of one new token per sequence at position ``context`` over a
  KV cache holding ``context`` positions, ``last_only``) at each batch size;
- **transformers' step** (``LlamaForCausalLM`` on the same weights, its ``DynamicCache`` at the same
  context, batch 1), when transformers is installed;
- **prefill** of ``--prefill`` tokens (batch 1, logits of the last position) for both.

Each line is ``course_lib.timing.measure``: warm-up calls, then the median of the timed calls (decode
rows: ``--warmup`` and ``--repeats``; prefill and the floor's stream: fewer, see ``benchmark`` and the
``calls`` column), with the fastest and slowest call; ``--rounds N`` repeats the whole measurement N
times and prints each round (the spread between rounds is the noise of this machine). Ratios are to
the floor of the same round (decode rows only: prefill is compute-bound). All figures are
measurements of this machine; the last line prints the load average, since other processes
competing for the cores make them unreliable. Numbers and method:
``docs/decoder_performance.md``.
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn.functional as F

from ..roofline import measure_gemv_bandwidth
from ..timing import Timing, load_note, measure
from ..validation import integer
from .config import weight_bytes
from .decoder import Decoder

__all__ = ["decode_step", "projections_alone", "prefill", "peer_model", "peer_decode_step",
           "peer_prefill", "benchmark", "parse_batches", "main"]


def _tokens(model: Decoder, batch: int, length: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    weight = model.embed_tokens.weight
    return torch.randint(0, model.config.vocab_size, (batch, length), generator=gen).to(weight.device)


@torch.no_grad()
def decode_step(model: Decoder, batch: int = 1, context: int = 128, warmup: int = 3, repeats: int = 15) -> Timing:
    """One decode step of ``batch`` sequences at ``context`` cached positions: the cache is filled once by
    a prefill of random tokens, then every timed call feeds one token per sequence at position ``context``
    and crops the cache back to ``context`` (the same step each time).

    Raises: ArgumentTypeError / ValueError for sizes that are not ints >= 1 or past max_seq_len."""
    batch = integer("batch", batch, minimum=1)
    context = integer("context", context, minimum=1, maximum=model.config.max_seq_len - 1)
    cache = model.new_cache(batch, context + 1)
    model(_tokens(model, batch, context), torch.arange(context, device=cache.k.device), cache, last_only=True)
    token, position = _tokens(model, batch, 1, seed=1), torch.tensor([context], device=cache.k.device)

    def step() -> None:
        model(token, position, cache, last_only=True)
        cache.crop(context)

    return measure(step, cache.k.device, warmup, repeats)


@torch.no_grad()
def projections_alone(model: Decoder, warmup: int = 3, repeats: int = 15) -> Timing:
    """The matrix-vector products of a batch-1 decode step and nothing else: ``F.linear`` of one row
    through every ``nn.Linear`` of the model (the 7 projections of each block, then the head), in order,
    on the model's own weights."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {m.in_features: torch.randn(1, m.in_features, device=m.weight.device) for m in linears}

    def products() -> None:
        for m in linears:
            F.linear(inputs[m.in_features], m.weight)

    return measure(products, linears[0].weight.device, warmup, repeats)


@torch.no_grad()
def prefill(model: Decoder, tokens: int = 512, warmup: int = 1, repeats: int = 5) -> Timing:
    """One prefill of ``tokens`` random tokens, batch 1, without a cache, logits of the last position."""
    ids = _tokens(model, 1, integer("tokens", tokens, minimum=1, maximum=model.config.max_seq_len))
    positions = torch.arange(ids.shape[1], device=ids.device)
    return measure(lambda: model(ids, positions, last_only=True), ids.device, warmup, repeats)


def peer_model(resolved):
    """transformers' ``LlamaForCausalLM`` (eval mode) on the float32 weights of a resolved artifact
    (``course_lib.data.resolve_model``): the weights ``load_smollm2`` gives our decoder.

    Raises: ImportError without transformers; ValueError for weights its model does not take."""
    from transformers import LlamaConfig, LlamaForCausalLM

    peer = LlamaForCausalLM(LlamaConfig.from_dict(resolved.hf_config)).eval()
    missing, unexpected = peer.load_state_dict(resolved.load_state_dict(), strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise ValueError(f"transformers' model does not take these weights: missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}")
    return peer


@torch.no_grad()
def peer_decode_step(peer, vocab_size: int, context: int = 128, warmup: int = 3, repeats: int = 15) -> Timing:
    """transformers' decode step at batch 1 and ``context`` cached positions (its ``DynamicCache``,
    cropped back by one position after every timed step)."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab_size, (1, context), generator=gen)
    out = peer(ids, use_cache=True)
    cache_arg = "cache" if hasattr(out, "cache") else "past_key_values"      # renamed in transformers 5
    cache = getattr(out, cache_arg)
    token = torch.randint(0, vocab_size, (1, 1), generator=gen)

    def step() -> None:
        peer(token, **{cache_arg: cache}, use_cache=True, logits_to_keep=1)
        cache.crop(-1)

    return measure(step, "cpu", warmup, repeats)


@torch.no_grad()
def peer_prefill(peer, vocab_size: int, tokens: int = 512, warmup: int = 1, repeats: int = 5) -> Timing:
    """transformers' prefill of ``tokens`` random tokens, batch 1, no cache, logits of the last position."""
    ids = torch.randint(0, vocab_size, (1, tokens), generator=torch.Generator().manual_seed(0))
    return measure(lambda: peer(ids, use_cache=False, logits_to_keep=1), "cpu", warmup, repeats)


@dataclass(frozen=True)
class Row:
    what: str
    timing: Timing
    floor_s: float | None        # None: a row the weight floor says nothing about (prefill)

    def record(self) -> dict:
        t = self.timing
        return {"measurement": self.what, "median (ms)": t.median_s * 1e3, "min-max (ms)": t.spread(),
                "calls": f"{t.warmup}+{t.repeats}",
                "x B=1 floor": math.nan if self.floor_s is None else t.median_s / self.floor_s}


FLOOR_ROW = "floor: weights / streaming bandwidth"


def benchmark(model: Decoder, peer=None, *, context: int = 128, batches=(1, 8, 16), prefill_tokens: int = 512,
              warmup: int = 3, repeats: int = 15) -> tuple[pd.DataFrame, dict]:
    """One round of every measurement (module docstring), in a fixed order on this process's threads.
    CPU only: the floor is measured on the CPU, so ``model`` (and ``peer``) must be on the CPU.

    Decode rows take ``warmup`` untimed and ``repeats`` timed calls; prefill rows, which take seconds,
    1 and max(3, repeats // 3); the stream of the floor 2 and max(5, repeats // 2) (the ``calls`` column).

    Returns:
        (table, facts): a DataFrame with columns ``measurement, median (ms), min-max (ms), calls,
        x B=1 floor`` (one row per measurement; ``x B=1 floor`` is the median over the batch-1 weight floor
        of this round, which leaves out the KV bytes of larger batches; NaN for prefill, which is
        compute-bound) and a dict with ``bandwidth_gb_s``, ``floor_ms``, ``weight_bytes``,
        ``streamed_bytes``, ``matrices`` and ``threads``.

    Raises: ValueError for a model not on the CPU; as ``decode_step`` and ``course_lib.timing.measure``."""
    if model.embed_tokens.weight.device.type != "cpu":
        raise ValueError(f"benchmark measures the floor on the CPU; the model is on {model.embed_tokens.weight.device}")
    nbytes = weight_bytes(model)
    gemv = measure_gemv_bandwidth(nbytes, warmup=2, repeats=max(5, repeats // 2))
    floor_s = gemv.floor_s(nbytes)
    scale = nbytes / gemv.streamed_bytes                 # the stream's times, for the model's bytes
    t = gemv.timing
    rows = [Row(FLOOR_ROW, Timing(floor_s, t.min_s * scale, t.max_s * scale, t.repeats, t.warmup), floor_s),
            Row("matrix-vector products alone (B=1)", projections_alone(model, warmup, repeats), floor_s)]
    for b in batches:
        rows.append(Row(f"ours: decode step B={b}", decode_step(model, b, context, warmup, repeats), floor_s))
    if peer is not None:
        rows.append(Row("transformers: decode step B=1",
                        peer_decode_step(peer, model.config.vocab_size, context, warmup, repeats), floor_s))
    if prefill_tokens:
        few = max(3, repeats // 3)
        rows.append(Row(f"ours: prefill {prefill_tokens} tokens", prefill(model, prefill_tokens, 1, few), None))
        if peer is not None:
            rows.append(Row(f"transformers: prefill {prefill_tokens} tokens",
                            peer_prefill(peer, model.config.vocab_size, prefill_tokens, 1, few), None))
    facts = {"bandwidth_gb_s": gemv.bandwidth / 1e9, "floor_ms": floor_s * 1e3, "weight_bytes": nbytes,
             "streamed_bytes": gemv.streamed_bytes, "matrices": gemv.matrices, "threads": torch.get_num_threads()}
    return pd.DataFrame([r.record() for r in rows]), facts


def parse_batches(text: str) -> tuple[int, ...]:
    """``--batches``: comma-separated ints >= 1 ("1,8,16"). Raises: argparse.ArgumentTypeError."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 1,8,16, got {text!r}")
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"batch sizes must differ from each other, got {text!r}")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be >= 1, got {text!r}")
    return values


def count_argument(minimum: int):
    """An argparse type: an int >= minimum."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}")
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value
    return parse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.models.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=count_argument(1), default=128, help="cached positions of the decode steps")
    parser.add_argument("--batches", type=parse_batches, default=(1, 8, 16), help="decode batch sizes, e.g. 1,8,16")
    parser.add_argument("--prefill", type=count_argument(0), default=512, help="prefill length in tokens (0: skip)")
    parser.add_argument("--repeats", type=count_argument(1), default=15, help="timed calls per measurement (median)")
    parser.add_argument("--warmup", type=count_argument(0), default=3, help="untimed calls before each measurement")
    parser.add_argument("--rounds", type=count_argument(1), default=1, help="repeat the whole measurement this many times")
    parser.add_argument("--no-transformers", action="store_true", help="skip transformers' rows")
    parser.add_argument("--quick", action="store_true", help="batch 1 only, 5 repeats, prefill of at most 128 tokens (overrides --batches and --repeats)")
    args = parser.parse_args(argv)
    if args.quick:
        args.batches, args.repeats, args.prefill = (1,), 5, min(args.prefill, 128)

    from ..data import load_smollm2, resolve_model

    model, _, _ = load_smollm2()                    # prints the artifact's provenance line
    longest = model.config.max_seq_len
    if args.context >= longest or args.prefill > longest:
        parser.error(f"--context must be < {longest} and --prefill <= {longest} (the model's max_seq_len)")
    peer = None
    if not args.no_transformers:
        try:
            peer = peer_model(resolve_model("smollm2-135m"))
        except ImportError as exc:
            print(f"transformers rows skipped: {exc}")
    print(f"SmolLM2-135M float32, {torch.get_num_threads()} threads, cpu; decode at context {args.context}; "
          f"each row: the median of its timed calls after its warm-up calls (column calls); times are "
          f"measurements of this machine")
    for round_ in range(1, args.rounds + 1):
        table, facts = benchmark(model, peer, context=args.context, batches=args.batches,
                                 prefill_tokens=args.prefill, warmup=args.warmup, repeats=args.repeats)
        print(f"\nround {round_}: {facts['weight_bytes'] / 1e6:.1f} MB of weights; streaming bandwidth "
              f"{facts['bandwidth_gb_s']:.1f} GB/s (x @ W over {facts['streamed_bytes'] / 1e6:.1f} MB in "
              f"{facts['matrices']} float32 matrices of 4096 rows) -> floor {facts['floor_ms']:.2f} ms per decode step")
        print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}", na_rep="-"))
        ours = table.set_index("measurement")["median (ms)"]
        if peer is not None and "ours: decode step B=1" in ours:
            ratio = ours["transformers: decode step B=1"] / ours["ours: decode step B=1"]
            print(f"at B=1 ours is {ratio:.2f}x as fast as transformers (transformers' median step / ours)")
    print("\n" + load_note())
    return 0


if __name__ == "__main__":
    sys.exit(main())
