"""Measure the serving engine on SmolLM2-135M: batched against sequential serving, paged against contiguous.

Run: ``python -m course_lib.engine.bench [--requests 8 --prompt 64 --new 64 --context 1024 --batches 1,8]
[--weights float32|int4]`` (int4: the GGUF file's Q4_1 codes as packed int4, ``course_lib.quant.int4_cpu``).

1. **Throughput.** The same ``--requests`` prompts (windows of the course's text) with ``--new`` greedy
   tokens each, served (a) one after another with ``generate_cached`` and (b) all at once by the
   ``Engine`` (every request arrives at 0, ``max_running`` = the number of requests). Both are timed
   end to end in this process; the tokens must be equal (the run stops otherwise). Reported: output
   tokens per second of each and their ratio, end to end (prefill included) and for decode alone
   (the engine's all-decode iterations against each solo run's time past its first token).
2. **Paged against contiguous decode step.** One decode step of B sequences at ``--context`` cached
   positions through the engine's model runner (paged K/V, block tables, the PyTorch gather path)
   and through ``Decoder.forward`` with the contiguous ``KVCache`` (``models.bench.decode_step``), the
   same K/V content (copied from the contiguous prefill into the blocks), measured side by side:
   median of ``--repeats`` timed calls after ``--warmup`` untimed ones, and their ratio.

Every figure is a measurement of this machine in this run; nothing is asserted about speed
(``docs/engine.md`` records what was measured and the targets).
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from ..models.bench import count_argument, decode_step, parse_batches
from ..models.decoder import Decoder, generate_cached
from ..timing import Timing, load_note, measure
from .block_manager import BlockManager
from .engine import Engine
from .runner import ChunkInput, ModelRunner

__all__ = ["paged_decode_step", "throughput", "text_prompts", "main"]


def text_prompts(tokenizer, count: int, length: int) -> list[torch.Tensor]:
    """``count`` prompts of ``length`` tokens: consecutive windows of the course's evaluation text
    (``data.load_text``), tokenized with the model's tokenizer."""
    from ..data import load_text

    text, _ = load_text(verbose=False)
    ids = tokenizer(text[: 40 * count * length], return_tensors="pt")["input_ids"][0]
    if len(ids) < count * length:
        raise ValueError(f"the text holds {len(ids)} tokens, fewer than {count} prompts of {length}")
    return [ids[i * length:(i + 1) * length].clone() for i in range(count)]


def throughput(model: Decoder, prompts: list[torch.Tensor], max_new_tokens: int, block_size: int = 16,
               budget: int = 256) -> dict:
    """Serve ``prompts`` one after another with ``generate_cached``, then together with the ``Engine``.

    Returns a dict: sequential_s, engine_s (wall seconds, end to end), tokens (output tokens of each),
    sequential_decode_s (each solo run's time past its first token, summed), engine_decode_s (the engine's
    all-decode iterations, summed), engine_decode_tokens, iterations.

    Raises: RuntimeError if a request's engine tokens differ from its solo tokens (the engine's contract)."""
    solo, first_token_s, total_s = [], 0.0, 0.0
    for p in prompts:
        start = time.perf_counter()
        generate_cached(model, p, 1)
        first_token_s += time.perf_counter() - start
        start = time.perf_counter()
        tokens, _ = generate_cached(model, p, max_new_tokens)
        total_s += time.perf_counter() - start
        solo.append(tokens)
    need = sum(-(-(len(p) + max_new_tokens) // block_size) for p in prompts)
    engine = Engine(model, num_blocks=need + len(prompts) + 1, block_size=block_size, budget=budget,
                    max_running=len(prompts))
    start = time.perf_counter()
    engine.run([(0.0, p, max_new_tokens) for p in prompts])
    engine_s = time.perf_counter() - start
    for rid, tokens in enumerate(solo):
        if not torch.equal(engine.output_ids(rid), tokens):
            raise RuntimeError(f"request {rid}: the engine's tokens differ from generate_cached's")
    decode_steps = [r for r in engine.history if all(k == 1 for k, _ in r.chunks)]
    return {"sequential_s": total_s, "engine_s": engine_s, "tokens": len(prompts) * max_new_tokens,
            "sequential_decode_s": total_s - first_token_s, "engine_decode_s": sum(r.duration for r in decode_steps),
            "engine_decode_tokens": sum(len(r.chunks) for r in decode_steps),
            "sequential_decode_tokens": len(prompts) * (max_new_tokens - 1), "iterations": len(engine.history)}


@torch.no_grad()
def paged_decode_step(model: Decoder, batch: int, context: int, block_size: int = 16, warmup: int = 3,
                      repeats: int = 15) -> Timing:
    """One decode step of ``batch`` sequences at ``context`` cached positions through the engine's runner.

    The blocks are filled with the K/V of a contiguous prefill of random tokens (the content
    ``models.bench.decode_step`` decodes over); each timed call writes position ``context`` and computes
    the logits of the new token of every sequence, as an engine iteration of ``batch`` decodes does."""
    c = model.config
    blocks = BlockManager(batch * (-(-(context + 1) // block_size)), block_size)
    runner = ModelRunner(model, blocks.num_blocks, block_size)
    cache = model.new_cache(batch, context)
    ids = torch.randint(0, c.vocab_size, (batch, context), generator=torch.Generator().manual_seed(0))
    model(ids, torch.arange(context), cache, last_only=True)
    inputs = []
    for b in range(batch):
        table = [blocks.allocator.allocate() for _ in range(-(-(context + 1) // block_size))]
        slots = torch.tensor([table[p // block_size] * block_size + p % block_size for p in range(context + 1)])
        for layer in range(c.n_layers):
            for store, filled in ((runner.k_cache[layer], cache.k[layer, b]), (runner.v_cache[layer], cache.v[layer, b])):
                store.view(-1, c.n_kv_heads, c.head_dim)[slots[:context]] = filled.transpose(0, 1)
        inputs.append(ChunkInput(context, [int(ids[b, -1])], [int(slots[context])], table, emit=True))
    return measure(lambda: runner.run(inputs), model.embed_tokens.weight.device, warmup, repeats)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.engine.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=count_argument(1), default=8, help="concurrent requests")
    parser.add_argument("--prompt", type=count_argument(1), default=64, help="prompt length in tokens")
    parser.add_argument("--new", type=count_argument(2), default=64, help="tokens generated per request")
    parser.add_argument("--context", type=count_argument(1), default=1024, help="cached positions of the step")
    parser.add_argument("--batches", type=parse_batches, default=(1, 8), help="decode batch sizes, e.g. 1,8")
    parser.add_argument("--repeats", type=count_argument(1), default=11, help="timed calls per step measurement")
    parser.add_argument("--warmup", type=count_argument(0), default=3, help="untimed calls before each")
    parser.add_argument("--skip-throughput", action="store_true", help="only the paged/contiguous steps")
    parser.add_argument("--weights", choices=("float32", "int4"), default="float32",
                        help="the model's weights: float32 (the reference) or int4 (the GGUF file's Q4_1 codes "
                             "through PyTorch's CPU int4 matmul, course_lib.quant.int4_cpu)")
    args = parser.parse_args(argv)

    from ..data import load_smollm2

    model, tokenizer, _ = load_smollm2(weights=args.weights)
    if args.context >= model.config.max_seq_len:
        parser.error(f"--context must be < the model's max_seq_len {model.config.max_seq_len}")
    print(f"SmolLM2-135M {args.weights}, {torch.get_num_threads()} threads, cpu; every figure measured in this run")
    if not args.skip_throughput:
        prompts = text_prompts(tokenizer, args.requests, args.prompt)
        r = throughput(model, prompts, args.new)
        print(f"\n{args.requests} requests of {args.prompt} prompt tokens, {args.new} new tokens each "
              f"(tokens equal to generate_cached's: yes)")
        print(f"  sequential generate_cached: {r['sequential_s']:.2f} s, {r['tokens'] / r['sequential_s']:.1f} tokens/s")
        print(f"  engine, all at once:        {r['engine_s']:.2f} s, {r['tokens'] / r['engine_s']:.1f} tokens/s "
              f"({r['iterations']} iterations)")
        print(f"  end to end: the engine serves {r['sequential_s'] / r['engine_s']:.2f}x the tokens per second")
        seq_rate = r["sequential_decode_tokens"] / r["sequential_decode_s"]
        eng_rate = r["engine_decode_tokens"] / r["engine_decode_s"]
        print(f"  decode alone: sequential {seq_rate:.1f} tokens/s, engine {eng_rate:.1f} tokens/s: "
              f"{eng_rate / seq_rate:.2f}x")
    print(f"\ndecode step at context {args.context} (median of {args.repeats} after {args.warmup} warm-up calls)")
    print(f"{'B':>3} {'contiguous (ms)':>16} {'paged (ms)':>11} {'paged / contiguous':>19}")
    for batch in args.batches:
        contiguous = decode_step(model, batch, args.context, args.warmup, args.repeats)
        paged = paged_decode_step(model, batch, args.context, warmup=args.warmup, repeats=args.repeats)
        print(f"{batch:>3} {contiguous.median_s * 1e3:>16.1f} {paged.median_s * 1e3:>11.1f} "
              f"{paged.median_s / contiguous.median_s:>19.2f}")
    print("\n" + load_note())
    return 0


if __name__ == "__main__":
    sys.exit(main())
