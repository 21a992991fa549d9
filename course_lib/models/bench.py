"""The reference decoder against the weight-streaming floor and against transformers, in one run.

Run: ``python -m course_lib.models.bench [--context 128] [--batches 1,8,16] [--prefill 512]
[--repeats 15] [--warmup 3] [--rounds 1] [--no-transformers] [--no-int4] [--no-llama-cpp] [--perplexity 4]
[--quick]``.

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
- **prefill** of ``--prefill`` tokens (batch 1, logits of the last position) for both;
- the **int4 model** (``course_lib.quant.int4_cpu``: the embedded GGUF file's Q4_1 projections as packed int4
  through PyTorch's CPU int4 matmul, bfloat16 activations, float16 head): its own floor (the bytes a
  decode step of it reads, ``int4_streamed_bytes``, over the same bandwidth), its products alone, its decode
  step at each batch size and its prefill, unless ``--no-int4``; after the rounds, the perplexity of both
  models on ``--perplexity`` of Lab 4's evaluation windows (``perplexities``);
- **llama.cpp's step** on the same GGUF file (``llama_cpp.Llama``, batch 1, the same context and threads)
  and its own floor (the file's tensor bytes over the same bandwidth), when the optional ``llama_cpp``
  package (llama-cpp-python, which compiles llama.cpp on install) imports; otherwise a note says it was
  skipped.

Each line is ``course_lib.timing.measure``: warm-up calls, then the median of the timed calls (decode
rows: ``--warmup`` and ``--repeats``; prefill and the floor's stream: fewer, see ``benchmark`` and the
``calls`` column), with the fastest and slowest call; ``--rounds N`` repeats the whole measurement N
times and prints each round (the spread between rounds is the noise of this machine). Ratios are to
the floor of the same round and of the same model (decode rows only: prefill is compute-bound): the float32
rows to the float32 floor, the int4 rows to the int4 floor, llama.cpp's to its file's floor. All figures are
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
           "peer_prefill", "llama_cpp_model", "llama_cpp_decode_step", "gguf_tensor_bytes", "perplexities",
           "benchmark", "parse_batches", "main"]


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
    """The matrix-vector products of a batch-1 decode step and nothing else: ``F.linear`` of one float32 row
    through every ``nn.Linear`` of the model (the 7 projections of each block, then the head), in order,
    on the model's own weights. An int4 model's ``Int4Linear`` and ``CastLinear`` layers are called as
    modules (their casts to and from bfloat16 / float16 included)."""
    from ..quant.int4_cpu import CastLinear, Int4Linear

    layers = [m for m in model.modules() if isinstance(m, (torch.nn.Linear, Int4Linear, CastLinear))]
    widths = {m.weight.shape[1] if isinstance(m, CastLinear) else m.in_features for m in layers}
    inputs = {k: torch.randn(1, k, device=model.embed_tokens.weight.device) for k in widths}

    def products() -> None:
        for m in layers:
            if isinstance(m, torch.nn.Linear):
                F.linear(inputs[m.in_features], m.weight)
            else:
                m(inputs[m.weight.shape[1] if isinstance(m, CastLinear) else m.in_features])

    return measure(products, model.embed_tokens.weight.device, warmup, repeats)


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


def llama_cpp_model(path, context: int, threads: int):
    """llama.cpp's model of a GGUF file (``llama_cpp.Llama``, the optional llama-cpp-python package):
    ``context + 1`` positions of context, ``threads`` threads for decode and prefill, quiet.

    Raises: ImportError without llama_cpp."""
    from llama_cpp import Llama

    return Llama(model_path=str(path), n_ctx=context + 1, n_threads=threads, n_threads_batch=threads,
                 verbose=False)


def llama_cpp_decode_step(llm, context: int = 128, warmup: int = 3, repeats: int = 15) -> Timing:
    """llama.cpp's decode step at batch 1 and ``context`` cached positions: a prefill of ``context`` random
    tokens once (``Llama.eval``), then every timed call sets ``n_tokens`` back to ``context`` and evaluates
    one token (``Llama.eval`` first drops the cached positions from ``n_tokens`` on, so each call is the same
    step; llama-cpp-python ``llama.py``)."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, llm.n_vocab(), (context + 1,), generator=gen).tolist()
    llm.reset()
    llm.eval(ids[:context])

    def step() -> None:
        llm.n_tokens = context
        llm.eval(ids[context:])

    return measure(step, "cpu", warmup, repeats)


#: Lab 4's evaluation windows: consecutive windows of 512 tokens of the course's text from token 0.
LAB4_WINDOW = 512


def perplexities(models: dict, tokenizer, n_windows: int = 4, window: int = LAB4_WINDOW) -> tuple[dict, str]:
    """Perplexity of each model on Lab 4's evaluation windows: the course's text (``data.load_text``), its
    first 400,000 characters tokenised, ``n_windows`` consecutive windows of ``window`` tokens from token 0
    (``quant.perplexity.token_windows``, as Lab 4's ``split_windows`` cuts them; Lab 4 uses 4, 1 in its
    quick mode), each scored by ``quant.perplexity.perplexity`` (docs/quantization.md#perplexity).

    Args:
        models: label -> a model called as ``model(ids (1, T), positions (T,)) -> logits``.
        tokenizer: the models' transformers tokenizer. n_windows, window: ints >= 1 and >= 2.

    Returns:
        ({label: perplexity}, a one-line description of the windows and the text's provenance).

    Raises: ValueError for a text shorter than the windows; as ``perplexity``."""
    from ..data import load_text
    from ..quant.perplexity import perplexity, token_windows

    text, provenance = load_text(verbose=False)
    ids = torch.tensor(tokenizer(text[:400_000])["input_ids"], dtype=torch.int64)
    windows, _ = token_windows(ids, window, n_windows, 0)
    with torch.no_grad():
        values = {label: perplexity(m, windows) for label, m in models.items()}
    return values, f"{n_windows} x {window} tokens from token 0 of {provenance.name} ({provenance.source})"


def gguf_tensor_bytes(path) -> int:
    """The bytes of every tensor of a GGUF file (``gguf.GGUFReader``): what llama.cpp's decode step
    streams, its tied output head (the token embedding) counted once."""
    from gguf import GGUFReader

    return sum(int(t.n_bytes) for t in GGUFReader(str(path)).tensors)


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
INT4_FLOOR_ROW = "int4 floor: int4 weights / streaming bandwidth"
LLAMA_FLOOR_ROW = "llama.cpp floor: file's tensors / streaming bandwidth"


def benchmark(model: Decoder, peer=None, *, int4: Decoder | None = None, llama=None, llama_bytes: int | None = None,
              context: int = 128, batches=(1, 8, 16), prefill_tokens: int = 512, warmup: int = 3,
              repeats: int = 15) -> tuple[pd.DataFrame, dict]:
    """One round of every measurement (module docstring), in a fixed order on this process's threads.
    CPU only: the floor is measured on the CPU, so ``model`` (and ``peer``, ``int4``) must be on the CPU.

    Args:
        model: the float32 ``Decoder``. peer: transformers' model of the same weights, or None.
        int4: the int4 ``Decoder`` (``quant.int4_cpu.load_int4_decoder``), or None.
        llama: a ``llama_cpp.Llama`` (``llama_cpp_model``) of the GGUF file, or None; then ``llama_bytes``
            (``gguf_tensor_bytes`` of that file, an int >= 1) sets its floor.
        context, batches, prefill_tokens, warmup, repeats: as the command's options.

    Decode rows take ``warmup`` untimed and ``repeats`` timed calls; prefill rows, which take seconds,
    1 and max(3, repeats // 3); the stream of the floor 2 and max(5, repeats // 2) (the ``calls`` column).
    One bandwidth measurement serves every floor of the round.

    Returns:
        (table, facts): a DataFrame with columns ``measurement, median (ms), min-max (ms), calls,
        x B=1 floor`` (one row per measurement; ``x B=1 floor`` is the median over the batch-1 weight floor
        of the row's own model in this round (float32, int4 or llama.cpp's file), which leaves out the KV
        bytes of larger batches; NaN for prefill, which is compute-bound) and a dict with ``bandwidth_gb_s``,
        ``floor_ms``, ``weight_bytes``, ``streamed_bytes``, ``matrices`` and ``threads`` (and
        ``int4_weight_bytes``, ``int4_floor_ms``, ``llama_weight_bytes``, ``llama_floor_ms`` for those models).

    Raises: ValueError for a model not on the CPU, an int4 model of another config, llama without
        llama_bytes; as ``decode_step`` and ``course_lib.timing.measure``."""
    from ..quant.int4_cpu import int4_streamed_bytes

    for name, m in (("model", model), ("int4", int4)):
        if m is not None and m.embed_tokens.weight.device.type != "cpu":
            raise ValueError(f"benchmark measures the floor on the CPU; {name} is on {m.embed_tokens.weight.device}")
    if int4 is not None and int4.config != model.config:
        raise ValueError(f"int4 must be the same model as model (config {model.config}), got {int4.config}")
    if llama is not None:
        llama_bytes = integer("llama_bytes", llama_bytes, minimum=1, note="gguf_tensor_bytes of llama's file")
    nbytes = weight_bytes(model)
    gemv = measure_gemv_bandwidth(nbytes, warmup=2, repeats=max(5, repeats // 2))
    floor_s = gemv.floor_s(nbytes)
    t = gemv.timing

    def floor_row(what: str, n: int) -> Row:
        scale = n / gemv.streamed_bytes                 # the stream's times, for these bytes
        return Row(what, Timing(gemv.floor_s(n), t.min_s * scale, t.max_s * scale, t.repeats, t.warmup),
                   gemv.floor_s(n))

    rows = [floor_row(FLOOR_ROW, nbytes),
            Row("matrix-vector products alone (B=1)", projections_alone(model, warmup, repeats), floor_s)]
    for b in batches:
        rows.append(Row(f"ours: decode step B={b}", decode_step(model, b, context, warmup, repeats), floor_s))
    if peer is not None:
        rows.append(Row("transformers: decode step B=1",
                        peer_decode_step(peer, model.config.vocab_size, context, warmup, repeats), floor_s))
    facts = {"bandwidth_gb_s": gemv.bandwidth / 1e9, "floor_ms": floor_s * 1e3, "weight_bytes": nbytes,
             "streamed_bytes": gemv.streamed_bytes, "matrices": gemv.matrices, "threads": torch.get_num_threads()}
    if int4 is not None:
        int4_bytes = int4_streamed_bytes(int4)
        rows.append(floor_row(INT4_FLOOR_ROW, int4_bytes))
        int4_floor = rows[-1].floor_s
        rows.append(Row("int4: products alone (B=1)", projections_alone(int4, warmup, repeats), int4_floor))
        for b in batches:
            rows.append(Row(f"int4: decode step B={b}", decode_step(int4, b, context, warmup, repeats), int4_floor))
        facts.update(int4_weight_bytes=int4_bytes, int4_floor_ms=int4_floor * 1e3)
    if llama is not None:
        rows.append(floor_row(LLAMA_FLOOR_ROW, llama_bytes))
        rows.append(Row("llama.cpp: decode step B=1", llama_cpp_decode_step(llama, context, warmup, repeats),
                        rows[-1].floor_s))
        facts.update(llama_weight_bytes=llama_bytes, llama_floor_ms=rows[-2].floor_s * 1e3)
    if prefill_tokens:
        few = max(3, repeats // 3)
        rows.append(Row(f"ours: prefill {prefill_tokens} tokens", prefill(model, prefill_tokens, 1, few), None))
        if peer is not None:
            rows.append(Row(f"transformers: prefill {prefill_tokens} tokens",
                            peer_prefill(peer, model.config.vocab_size, prefill_tokens, 1, few), None))
        if int4 is not None:
            rows.append(Row(f"int4: prefill {prefill_tokens} tokens", prefill(int4, prefill_tokens, 1, few), None))
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
    parser.add_argument("--no-int4", action="store_true", help="skip the int4 model's rows")
    parser.add_argument("--perplexity", type=count_argument(0), default=4,
                        help="with the int4 model: perplexity of both models on this many of Lab 4's windows of 512 "
                             "tokens (0: skip; --quick: at most 1)")
    parser.add_argument("--no-llama-cpp", action="store_true",
                        help="skip llama.cpp's rows (they run only where the optional llama_cpp package imports)")
    parser.add_argument("--quick", action="store_true", help="batch 1 only, 5 repeats, prefill of at most 128 tokens (overrides --batches and --repeats)")
    args = parser.parse_args(argv)
    if args.quick:
        args.batches, args.repeats, args.prefill = (1,), 5, min(args.prefill, 128)
        args.perplexity = min(args.perplexity, 1)

    from ..data import ArtifactError, gguf_fallback_path, load_smollm2, resolve_model
    from ..quant.int4_cpu import int4_kernel_error, load_int4_decoder

    model, tokenizer, _ = load_smollm2()            # prints the artifact's provenance line
    longest = model.config.max_seq_len
    if args.context >= longest or args.prefill > longest:
        parser.error(f"--context must be < {longest} and --prefill <= {longest} (the model's max_seq_len)")
    peer = int4 = llama = llama_bytes = None
    if not args.no_transformers:
        try:
            peer = peer_model(resolve_model("smollm2-135m"))
        except ImportError as exc:
            print(f"transformers rows skipped: {exc}")
    path = None
    if not (args.no_int4 and args.no_llama_cpp):
        try:
            path = gguf_fallback_path("smollm2-135m")
        except ArtifactError as exc:
            print(f"int4 and llama.cpp rows skipped (they read the GGUF file): {exc}")
    if path is not None and not args.no_int4:
        int4 = load_int4_decoder(path, model.config)
        why = int4_kernel_error()
        print(f"int4: {path.name}'s Q4_1 projections as packed int4 (group 32), bfloat16 activations, float16 "
              f"head; " + ("PyTorch's CPU int4 kernel" if why is None else f"FALLBACK, dequantise and multiply: {why}"))
    if path is not None and not args.no_llama_cpp:
        try:
            llama = llama_cpp_model(path, args.context, torch.get_num_threads())
            llama_bytes = gguf_tensor_bytes(path)
            import llama_cpp
            print(f"llama.cpp: llama-cpp-python {getattr(llama_cpp, '__version__', '?')} on {path.name}, "
                  f"{torch.get_num_threads()} threads")
        except ImportError as exc:
            print(f"llama.cpp rows skipped: the optional llama_cpp package does not import ({exc}); "
                  f"`pip install -e .[llama]` (llama-cpp-python, which compiles llama.cpp) adds them")
    print(f"SmolLM2-135M float32, {torch.get_num_threads()} threads, cpu; decode at context {args.context}; "
          f"each row: the median of its timed calls after its warm-up calls (column calls); times are "
          f"measurements of this machine")
    for round_ in range(1, args.rounds + 1):
        table, facts = benchmark(model, peer, int4=int4, llama=llama, llama_bytes=llama_bytes, context=args.context,
                                 batches=args.batches, prefill_tokens=args.prefill, warmup=args.warmup,
                                 repeats=args.repeats)
        print(f"\nround {round_}: {facts['weight_bytes'] / 1e6:.1f} MB of weights; streaming bandwidth "
              f"{facts['bandwidth_gb_s']:.1f} GB/s (x @ W over {facts['streamed_bytes'] / 1e6:.1f} MB in "
              f"{facts['matrices']} float32 matrices of 4096 rows) -> floor {facts['floor_ms']:.2f} ms per decode step")
        if int4 is not None:
            print(f"int4 model: {facts['int4_weight_bytes'] / 1e6:.1f} MB read per decode step -> floor "
                  f"{facts['int4_floor_ms']:.2f} ms")
        if llama is not None:
            print(f"llama.cpp: {facts['llama_weight_bytes'] / 1e6:.1f} MB of tensors in the file -> floor "
                  f"{facts['llama_floor_ms']:.2f} ms")
        print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}", na_rep="-"))
        ours = table.set_index("measurement")["median (ms)"]
        if peer is not None and "ours: decode step B=1" in ours:
            ratio = ours["transformers: decode step B=1"] / ours["ours: decode step B=1"]
            print(f"at B=1 ours is {ratio:.2f}x as fast as transformers (transformers' median step / ours)")
        if int4 is not None and "int4: decode step B=1" in ours:
            ratio = ours["ours: decode step B=1"] / ours["int4: decode step B=1"]
            print(f"at B=1 the int4 step is {ratio:.2f}x as fast as the float32 step (float32 median / int4)")
            if llama is not None:
                ratio = ours["llama.cpp: decode step B=1"] / ours["int4: decode step B=1"]
                print(f"at B=1 the int4 step is {ratio:.2f}x as fast as llama.cpp's (llama.cpp median / int4)")
    if int4 is not None and args.perplexity and tokenizer is not None:
        values, what = perplexities({"float32": model, "int4": int4}, tokenizer, args.perplexity)
        change = values["int4"] / values["float32"] - 1
        print(f"\nperplexity on Lab 4's windows ({what}): float32 {values['float32']:.3f}, int4 {values['int4']:.3f} "
              f"({change:+.2%}; the same codes, bfloat16 activations and scales, float16 head)")
    print("\n" + load_note())
    return 0


if __name__ == "__main__":
    sys.exit(main())
