"""Prompt lookup against plain greedy decoding on SmolLM2-135M, side by side in one run.

Run: ``python -m course_lib.speculative.bench [--gamma 4] [--tokens 64] [--repeats 3] [--quick]
[--no-self-draft] [--weights float32|int4]`` (int4: the target with the GGUF file's Q4_1 codes as packed int4,
``course_lib.quant.int4_cpu``).

The prompts ask the model to quote or edit a passage (repeat a paragraph, fix its typos, rename a
variable in code, add type hints to code, quote a letter), the case prompt lookup decoding
(Saxena, 2023, https://github.com/apoorvumang/prompt-lookup-decoding) is made for: most output
tokens already occur in the prompt, so a draft that copies what followed the last n-gram is
accepted often, at no model cost. The prompts go through the tokenizer's chat template (the
artifact is the Instruct model), which makes the model copy rather than continue.

For every prompt, plain greedy ``generate_cached`` and ``generate_speculative`` with each draft
run in interleaved rounds (warm-up rounds first, then the median of the timed ones), on the same
prompt and the same number of tokens; the tokens must be identical to greedy's
(``docs/speculative_decoding.md#greedy-contract``), and a row says so if they are not. Then the
truncated self-drafts (the first 12 and 26 of 30 layers, LayerSkip-style, arXiv:2404.16710):
on the first two prompts: correct, but on this model slower than plain greedy. All times are
measurements of this machine; the last line prints the load average, since other processes
competing for the cores make them unreliable.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from typing import Callable, Mapping

import pandas as pd
import torch

from ..models.decoder import Decoder, generate_cached
from ..timing import load_note
from .costs import timed
from .drafts import Draft, PromptLookupDraft, truncated_draft
from .greedy import generate_speculative

PARAGRAPH = (
    "The lighthouse keeper climbed the narrow stairs every evening at dusk. He carried a brass lantern, "
    "a notebook and a small tin of oil for the great lamp. From the gallery he could see the fishing boats "
    "returning to the harbour, their sails dark against the orange sky. He wrote the time, the wind and the "
    "state of the sea in his notebook, then lit the lamp and watched its beam sweep across the water.")

TYPOS = (
    "Our team met on Tuesday to discus the new schedule for the spring term. Everyone agred that the "
    "morning sessions should start at nine o'clock insted of eight, because many students travel a long "
    "way by bus. The library will stay open untill seven in the evening, and the computer room will be "
    "avaliable on Saturdays. Please send any questions to the office befor the end of the week.")

CODE = (
    "def tally(words):\n"
    "    x = 0\n"
    "    for word in words:\n"
    "        if word.strip():\n"
    "            x = x + 1\n"
    "    print('non-empty words:', x)\n"
    "    return x\n")

LETTER = (
    "Dear Anna,\n\nThank you for your letter and for the photographs from the mountains. Anna, you were "
    "right about the weather: it rained for three days after you left, and the river rose over the lower "
    "path. The garden is green again now, and the apple tree has more blossom than last year. We hope "
    "to see you in the summer, Anna, when the days are long.\n\nWith love,\nMartha")

TYPED = (
    "def mean_length(lines, skip_blank):\n"
    "    total = 0\n"
    "    count = 0\n"
    "    for line in lines:\n"
    "        if skip_blank and not line.strip():\n"
    "            continue\n"
    "        total += len(line)\n"
    "        count += 1\n"
    "    return total / count if count else 0.0\n")

#: The benchmark's requests, quoted or edited passages: name -> the user's message. (Phrasings that
#: SmolLM2-135M-Instruct answers by quoting the passage: asked to "rename x in:" or to rewrite a
#: letter, it mostly explains or paraphrases instead, and prompt lookup has little to copy.)
PROMPTS: dict[str, str] = {
    "repeat paragraph": f"Repeat the following paragraph exactly:\n\n{PARAGRAPH}",
    "fix typos": f"Correct the spelling mistakes in the following paragraph and repeat it in full:\n\n{TYPOS}",
    "rename variable": f"Repeat this Python function exactly, but rename the variable x to count:\n\n"
                       f"```python\n{CODE}```",
    "add type hints": f"Repeat this Python function exactly, adding type hints:\n\n```python\n{TYPED}```",
    "quote letter": f"Repeat this letter exactly, word for word:\n\n{LETTER}",
}


def prompt_ids(tokenizer, text: str) -> torch.Tensor:
    """Token ids (T0,) int64 of one user message under the tokenizer's chat template (with the
    assistant's turn opened), or of the plain text when the tokenizer has no template."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return torch.tensor(tokenizer(text)["input_ids"], dtype=torch.int64)


def compare(target: Decoder, prompts: Mapping[str, torch.Tensor],
            drafts: Mapping[str, Callable[[], Draft | Decoder]], *, gamma: int = 4, max_new_tokens: int = 64,
            repeats: int = 3, warmup: int = 1) -> pd.DataFrame:
    """Time plain greedy decoding and speculative decoding with each draft on the same prompts.

    ``warmup`` untimed rounds on the first prompt (they warm what every prompt shares: the first
    calls of each kernel, the allocator, the thread pool), then ``repeats`` timed rounds on every
    prompt; a round runs ``generate_cached`` and then ``generate_speculative`` with a fresh draft
    from each factory (the factory call is inside the timing, as the cache allocation is for
    greedy). Times are medians over the timed rounds.

    Args:
        target: the target ``Decoder``.
        prompts: name -> prompt ids (T0,) int64.
        drafts: label -> a function returning a new draft (a ``Draft`` or a draft ``Decoder``).
        gamma: drafted tokens per iteration. max_new_tokens: tokens per generation.
        repeats: timed rounds per prompt (>= 1). warmup: untimed rounds, on the first prompt (>= 0).

    Returns:
        a DataFrame, one row per (prompt, method) and a "total" row per method, with columns
        prompt, method, prompt_tokens, tokens, same_tokens (identical to greedy's), iterations,
        proposed, accepted, alpha (accepted / proposed), tokens_per_iteration, min_top2_gap,
        seconds (median), tokens_per_s, speedup (greedy's seconds / this method's, same prompt);
        for the speculative methods the stream a client would see (nan for greedy, which keeps no
        per-step times): decode_s (median time after the prefill, the sum of the iterations'
        ``SpeculativeStats.iteration_s``), mean_gap_s (decode_s / iterations: the mean gap between
        chunks, one chunk per iteration), max_gap_s (the longest iteration of any timed round) and
        tpot_s (decode_s / tokens: the time per output token after the prefill).
        The total row sums tokens, iterations, proposals, median seconds and decode_s over the
        prompts, and takes the largest max_gap_s.

    Raises:
        ValueError: repeats < 1, warmup < 0; as ``generate_speculative``.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
    device = target.embed_tokens.weight.device
    rows = []
    for index, (name, ids) in enumerate(prompts.items()):
        methods: dict[str, Callable[[], tuple]] = {
            "greedy": lambda: (generate_cached(target, ids, max_new_tokens)[0], None)}
        for label, factory in drafts.items():
            methods[label] = (lambda factory=factory:
                              generate_speculative(target, factory(), ids, max_new_tokens, gamma))
        seconds: dict[str, list[float]] = {label: [] for label in methods}
        decode: dict[str, list[float]] = {label: [] for label in methods}      # time after the prefill
        gaps: dict[str, list[float]] = {label: [] for label in methods}        # every timed iteration
        results: dict[str, tuple] = {}
        untimed = warmup if index == 0 else 0
        for round_ in range(untimed + repeats):
            for label, run in methods.items():
                results[label], elapsed = timed(run, device)
                if round_ >= untimed:
                    seconds[label].append(elapsed)
                    stats = results[label][1]
                    if stats is not None:
                        decode[label].append(sum(stats.iteration_s))
                        gaps[label].extend(stats.iteration_s)
        greedy_tokens = results["greedy"][0]
        for label, (tokens, stats) in results.items():
            rows.append(dict(
                prompt=name, method=label, prompt_tokens=int(ids.numel()), tokens=int(tokens.numel()),
                same_tokens=bool(torch.equal(tokens, greedy_tokens)),
                iterations=stats.iterations if stats else int(tokens.numel()),
                proposed=stats.proposed if stats else 0, accepted=stats.accepted if stats else 0,
                min_top2_gap=stats.min_top2_gap if stats else math.nan,
                seconds=statistics.median(seconds[label]),
                decode_s=statistics.median(decode[label]) if decode[label] else math.nan,
                max_gap_s=max(gaps[label]) if gaps[label] else math.nan))
    table = pd.DataFrame(rows)
    totals = (table.groupby("method", sort=False)
              .agg(prompt_tokens=("prompt_tokens", "sum"), tokens=("tokens", "sum"), same_tokens=("same_tokens", "all"),
                   iterations=("iterations", "sum"), proposed=("proposed", "sum"), accepted=("accepted", "sum"),
                   min_top2_gap=("min_top2_gap", "min"), seconds=("seconds", "sum"),
                   decode_s=("decode_s", lambda d: d.sum(min_count=1)), max_gap_s=("max_gap_s", "max"))
              .reset_index().assign(prompt="total"))
    table = pd.concat([table, totals[table.columns]], ignore_index=True)
    table["alpha"] = table.accepted / table.proposed.where(table.proposed > 0)
    table["tokens_per_iteration"] = table.tokens / table.iterations
    table["tokens_per_s"] = table.tokens / table.seconds
    table["mean_gap_s"] = table.decode_s / table.iterations
    table["tpot_s"] = table.decode_s / table.tokens
    greedy_seconds = table[table.method == "greedy"].set_index("prompt").seconds
    table["speedup"] = table.prompt.map(greedy_seconds) / table.seconds
    return table[["prompt", "method", "prompt_tokens", "tokens", "same_tokens", "iterations", "proposed",
                  "accepted", "alpha", "tokens_per_iteration", "min_top2_gap", "seconds", "tokens_per_s",
                  "speedup", "decode_s", "mean_gap_s", "max_gap_s", "tpot_s"]]


def print_table(table: pd.DataFrame) -> None:
    """The comparison as aligned text, a mismatch of tokens named under it."""
    shown = table.drop(columns=["iterations", "proposed", "accepted", "decode_s", "max_gap_s"])
    print(shown.to_string(index=False, float_format=lambda v: f"{v:.3g}", na_rep="-"))
    for row in table[~table.same_tokens].itertuples():
        print(f"MISMATCH: {row.method} on {row.prompt!r} did not reproduce greedy's tokens")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gamma", type=int, default=4, help="drafted tokens per iteration")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per prompt")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds per prompt (median)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds per prompt")
    parser.add_argument("--quick", action="store_true", help="2 prompts, 32 tokens, 1 timed round")
    parser.add_argument("--no-self-draft", action="store_true", help="skip the truncated self-draft rows")
    parser.add_argument("--weights", choices=("float32", "int4"), default="float32",
                        help="the model's weights: float32 (the reference) or int4 (the GGUF file's Q4_1 codes "
                             "through PyTorch's CPU int4 matmul, course_lib.quant.int4_cpu)")
    args = parser.parse_args(argv)

    from ..data import load_smollm2

    model, tokenizer, provenance = load_smollm2(weights=args.weights)
    print(provenance)
    names = list(PROMPTS)[:2] if args.quick else list(PROMPTS)
    tokens, repeats = (min(args.tokens, 32), 1) if args.quick else (args.tokens, args.repeats)
    prompts = {name: prompt_ids(tokenizer, PROMPTS[name]) for name in names}
    print(f"SmolLM2-135M {args.weights}, {torch.get_num_threads()} threads, {model.embed_tokens.weight.device}; "
          f"gamma {args.gamma}, "
          f"{tokens} new tokens per prompt; median of {repeats} timed rounds after {args.warmup} warm-up; "
          f"times are measurements of this machine")
    print("\nprompt lookup (max_ngram 3) against plain greedy:")
    table = compare(model, prompts, {"prompt lookup": PromptLookupDraft}, gamma=args.gamma,
                    max_new_tokens=tokens, repeats=repeats, warmup=args.warmup)
    print_table(table)
    ok = bool(table.same_tokens.all())
    if not args.no_self_draft:
        n = model.config.n_layers
        self_drafts = {f"self {k}/{n}": truncated_draft(model, k) for k in (12, 26) if k < n}
        first_two = dict(list(prompts.items())[:2])
        print("\ntruncated self-drafts (correct, but slower here), the first two prompts, one timed round:")
        table = compare(model, first_two, {label: (lambda d=d: d) for label, d in self_drafts.items()},
                        gamma=args.gamma, max_new_tokens=tokens, repeats=1, warmup=0)
        print_table(table)
        ok = ok and bool(table.same_tokens.all())
    print("\n" + load_note())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
