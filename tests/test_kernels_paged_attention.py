"""Tests of course_lib.kernels.paged_attention: the PyTorch reference, the dispatch, and the Triton kernel.

TRITON_INTERPRET is handled as in tests/test_kernels_gemv.py: tests named ``test_triton_kernel_*`` run
the kernel in this process when it can (native CUDA, or TRITON_INTERPRET=1 already in the environment)
and skip otherwise; ``test_interpreter_subprocess`` reruns exactly those in a fresh pytest with
TRITON_INTERPRET=1 set from the start, and fails if any of them fails or skips.

Ground truth is contiguous attention: each sequence's keys and values are also kept as plain
(1, Hkv, L, D) tensors, and ``course_lib.models.attention.attend`` (the decoder's own attention) runs
the newest query over them with start = L - 1. The paged copies live in a pool whose physical blocks
are a random permutation (non-consecutive, out of order), whose table rows are padded to the widest
row with garbage (-1, ids past the pool, the largest int), and whose every slot that no sequence
owns (the tail of a partly filled last block, blocks no table names) holds NaN or another
sequence's stale values: the kernel must give the same bits as with zeros there.

Tolerances: float32: rtol 1e-5, atol 1e-5 (only the order of the float32 sums and base-2 against
base-e exponentials differ from the ground truth); bfloat16: rtol 1.6e-2, atol 1e-2 and float16:
rtol 2e-3, atol 2e-3 (the output is rounded once to the 8- or 11-bit significand of the dtype, and
both sides round a float32 value that may straddle a rounding boundary).
"""
from __future__ import annotations

import math

import pytest
import torch
from kernel_interpreter import run_kernel_tests_in_interpreter, run_without_triton

import course_lib.kernels as kernels_pkg
from course_lib.kernels import TritonMode, triton_mode
from course_lib.kernels import paged_attention as pa
from course_lib.kernels.paged_attention import (
    MIN_SPLIT_POSITIONS,
    PROGRAMS_PER_SM,
    decode_attention_bytes,
    decode_attention_flops,
    default_num_splits,
    paged_decode_attention,
    paged_decode_kernel_unchecked,
    reference_paged_decode_attention,
)
from course_lib.models.attention import attend
from course_lib.validation import ArgumentTypeError

MODE = triton_mode()
KERNEL_RUNS_HERE = MODE in ("native", "interpreter")
DEVICE = "cuda" if MODE == "native" else "cpu"
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2),
       torch.float16: dict(rtol=2e-3, atol=2e-3)}
DTYPE_IDS = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}

needs_kernel = pytest.mark.skipif(
    not KERNEL_RUNS_HERE,
    reason=f"triton mode here is {str(MODE)!r} ({MODE.reason}); these run in test_interpreter_subprocess",
)


def _case(lens, Hq=4, Hkv=2, D=16, block_size=4, dtype=torch.float32, seed=0, fill=float("nan"),
          spare_blocks=3, pad_columns=1, table_dtype=torch.int32, device="cpu"):
    """A paged batch and its contiguous twin.

    Returns a dict: q (B, Hq, D); k_cache, v_cache (num_blocks, block_size, Hkv, D) with every slot no
    sequence owns set to ``fill``; tables (B, W) with garbage padding; lens (B,) int64; keys, values:
    per sequence (1, Hkv, L, D) contiguous tensors (the same values); owned: (num_blocks, block_size)
    bool, True at the slots some sequence owns.
    """
    g = torch.Generator().manual_seed(seed)
    counts = [-(-L // block_size) for L in lens]
    num_blocks = sum(counts) + spare_blocks
    physical = torch.randperm(num_blocks, generator=g).tolist()      # non-consecutive, out of order
    width = max(counts) + pad_columns
    big = 2 ** 31 - 1 if table_dtype == torch.int32 else 2 ** 40
    garbage = [-1, num_blocks + 7, big]
    tables = torch.empty(len(lens), width, dtype=table_dtype)
    k_cache = torch.full((num_blocks, block_size, Hkv, D), fill, dtype=dtype)
    v_cache = torch.full((num_blocks, block_size, Hkv, D), fill, dtype=dtype)
    owned = torch.zeros(num_blocks, block_size, dtype=torch.bool)
    keys, values, used = [], [], 0
    for b, L in enumerate(lens):
        row = physical[used:used + counts[b]]
        used += counts[b]
        tables[b] = torch.tensor(row + [garbage[(b + j) % 3] for j in range(width - len(row))], dtype=table_dtype)
        k = torch.randn(L, Hkv, D, generator=g).to(dtype)
        v = torch.randn(L, Hkv, D, generator=g).to(dtype)
        for p in range(L):
            k_cache[row[p // block_size], p % block_size] = k[p]
            v_cache[row[p // block_size], p % block_size] = v[p]
            owned[row[p // block_size], p % block_size] = True
        keys.append(k.transpose(0, 1)[None])
        values.append(v.transpose(0, 1)[None])
    q = torch.randn(len(lens), Hq, D, generator=g).to(dtype)
    lens_t = torch.tensor(lens, dtype=torch.int64)
    return dict(q=q.to(device), k_cache=k_cache.to(device), v_cache=v_cache.to(device), tables=tables.to(device),
                lens=lens_t.to(device), keys=keys, values=values, owned=owned)


def _args(c):
    return c["q"], c["k_cache"], c["v_cache"], c["tables"], c["lens"]


def _contiguous(c) -> torch.Tensor:
    """The ground truth: ``attend`` of each sequence's newest query over its contiguous K/V, (B, Hq, D)."""
    rows = []
    for b, (k, v) in enumerate(zip(c["keys"], c["values"])):
        L = k.shape[2]
        rows.append(attend(c["q"][b:b + 1, :, None].cpu(), k, v, start=L - 1)[:, :, 0])
    return torch.cat(rows)


def _with_unowned(c, value: float) -> dict:
    """The same case with every slot no sequence owns set to ``value``."""
    c = dict(c)
    for name in ("k_cache", "v_cache"):
        cache = c[name].clone()
        cache[~c["owned"].to(cache.device)] = value
        c[name] = cache
    return c


# ---------------------------------------------------------------- reference, counts and validation


def test_reference_matches_contiguous_attention_one_sequence():
    c = _case([13], Hq=9, Hkv=3, D=64, block_size=16, fill=0.0)
    out = reference_paged_decode_attention(*_args(c))
    assert out.shape == (1, 9, 64) and out.dtype == torch.float32
    torch.testing.assert_close(out, _contiguous(c), **TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_reference_matches_contiguous_attention_batch_of_lengths(dtype):
    """Different lengths in one batch: each row is masked to its own context (stale finite values
    in the unowned slots; the reference is not asked to survive NaN there)."""
    c = _case([1, 5, 8, 9, 17], Hq=6, Hkv=2, D=8, block_size=4, dtype=dtype, fill=7.0)
    out = reference_paged_decode_attention(*_args(c))
    assert out.dtype == dtype
    torch.testing.assert_close(out, _contiguous(c), **TOL[dtype])


def test_decode_attention_bytes_and_flops_are_the_formula():
    # K and V of 1024 + 4096 positions, 3 KV heads of 64 in bfloat16, plus q and the output of 9 heads.
    assert decode_attention_bytes([1024, 4096], 9, 3, 64, 2) == 2 * 5120 * 3 * 64 * 2 + 2 * 2 * 9 * 64 * 2
    assert decode_attention_bytes(torch.tensor([1024, 4096]), 9, 3, 64, 2) == 3_936_768
    assert decode_attention_flops([1024, 4096], 9, 64) == 4 * 5120 * 9 * 64
    # Intensity 2 (Hq / Hkv) / e, up to the q and output bytes: 3 FLOP/byte for SmolLM2 in bfloat16.
    ratio = decode_attention_flops([10 ** 6], 9, 64) / decode_attention_bytes([10 ** 6], 9, 3, 64, 2)
    assert math.isclose(ratio, 3.0, rel_tol=1e-4)
    with pytest.raises(ValueError, match="context_lens"):
        decode_attention_bytes([4, 0], 9, 3, 64, 2)
    with pytest.raises(ValueError, match="n_kv_heads"):
        decode_attention_bytes([4], 9, 0, 64, 2)


def test_default_num_splits():
    """One split off a GPU or when B * Hkv programs fill it; else about PROGRAMS_PER_SM programs per SM,
    each split keeping MIN_SPLIT_POSITIONS positions."""
    assert default_num_splits(3, 4096, None) == 1
    assert default_num_splits(PROGRAMS_PER_SM * 132, 4096, 132) == 1
    wanted = -(-PROGRAMS_PER_SM * 132 // 3)                       # B = 1, Hkv = 3 on a 132-SM GPU
    assert default_num_splits(3, 4096, 132) == min(wanted, 4096 // MIN_SPLIT_POSITIONS)
    assert default_num_splits(96, 10 ** 6, 132) == -(-PROGRAMS_PER_SM * 132 // 96)
    assert default_num_splits(3, MIN_SPLIT_POSITIONS - 1, 132) == 1   # too short to split
    with pytest.raises(ValueError, match="sm_count"):
        default_num_splits(3, 4096, 0)


def _bad_inputs():
    c = _case([5, 9], Hq=4, Hkv=2, D=8, block_size=4, fill=0.0, pad_columns=0)
    return dict(q=c["q"], k_cache=c["k_cache"], v_cache=c["v_cache"], block_tables=c["tables"],
                context_lens=c["lens"])


@pytest.mark.parametrize(
    "change, error, match",
    [
        (lambda a: a.update(q=a["q"][:, :, None]), ValueError, r"q must be \(B, Hq, D\)"),
        (lambda a: a.update(k_cache=a["k_cache"][0]), ValueError, "k_cache and v_cache must both be"),
        (lambda a: a.update(v_cache=a["v_cache"][..., :4]), ValueError, "k_cache and v_cache must both be"),
        (lambda a: a.update(q=torch.zeros(2, 3, 8)), ValueError, r"KV heads \(2\) must divide query heads \(3\)"),
        (lambda a: a.update(k_cache=a["k_cache"].to(torch.bfloat16)), ArgumentTypeError, "share one floating dtype"),
        (lambda a: a.update(q=a["q"].to(torch.int32)), ArgumentTypeError, "share one floating dtype"),
        (lambda a: a.update(context_lens=torch.tensor([0, 9])), ValueError, r"context_lens must be in 1 \.\. "),
        (lambda a: a.update(context_lens=torch.tensor([5, 13])), ValueError, r"W \* block_size = 12"),
        (lambda a: a.update(context_lens=torch.tensor([5])), ValueError, r"context_lens must be \(B=2,\)"),
        (lambda a: a.update(block_tables=a["block_tables"].to(torch.int16)), ArgumentTypeError,
         "block_tables must be int32 or int64"),
        (lambda a: a.update(block_tables=a["block_tables"].float()), ArgumentTypeError,
         "block_tables must be int32 or int64"),
        (lambda a: a.update(context_lens=a["context_lens"].float()), ArgumentTypeError,
         "context_lens must be int32 or int64"),
        (lambda a: a.update(block_tables=a["block_tables"][0]), ValueError, r"block_tables must be \(B=2, W >= 1\)"),
        (lambda a: a.update(q=a["q"].tolist()), TypeError, "q"),
        (lambda a: a["block_tables"].__setitem__((1, 2), -1), ValueError,
         r"block_tables\[1, 2\] is -1, not a block of the pool \(0 \.\. 7\); row 1 has 9 positions"),
        (lambda a: a["block_tables"].__setitem__((0, 1), 8), ValueError, r"block_tables\[0, 1\] is 8, not a block"),
        (lambda a: a["block_tables"].__setitem__((0, 0), 10 ** 9), ValueError, "is 1000000000, not a block"),
        (lambda a: a.update(k_cache=a["k_cache"][:, :, :0], v_cache=a["v_cache"][:, :, :0]), ValueError,
         "at least one KV head"),
        (lambda a: a.update(k_cache=a["k_cache"][:, :0], v_cache=a["v_cache"][:, :0]), ValueError,
         "a block size >= 1"),
    ],
    ids=["q-rank", "cache-rank", "cache-shapes", "gqa", "cache-dtype", "q-int", "len-0", "len-too-long",
         "lens-shape", "table-int16", "table-float", "lens-float", "table-rank", "q-list", "id-minus-one",
         "id-past-pool", "id-huge", "no-kv-head", "block-size-0"],
)
@pytest.mark.parametrize("fn", [reference_paged_decode_attention, paged_decode_attention],
                         ids=["reference", "dispatch"])
def test_invalid_inputs_raise(fn, change, error, match):
    args = _bad_inputs()
    change(args)
    with pytest.raises(error, match=match):
        fn(**args)


_BAD_IDS = (-1, -(2 ** 31), 10 ** 9, 2 ** 31 - 1)


def _fuzz_cases(n: int, device: str = "cpu"):
    """(case, bad) pairs from seeded random batches: padding past each row's context always holds
    garbage (-1, ids past the pool, the largest int); in about half the cases one entry inside some
    row's context is replaced by an id outside the pool, and ``bad`` says where ((row, column), or None)."""
    import random

    rng = random.Random(2029)
    for i in range(n):
        lens = [rng.randint(1, 23) for _ in range(rng.randint(1, 4))]
        c = _case(lens, Hq=4, Hkv=rng.choice([1, 2]), D=8, block_size=rng.choice([1, 3, 4, 8]), seed=i,
                  fill=0.0, pad_columns=rng.randint(0, 3), table_dtype=rng.choice([torch.int32, torch.int64]),
                  device=device)
        bad = None
        if rng.random() < 0.5:
            b = rng.randrange(len(lens))
            j = rng.randrange(-(-lens[b] // c["k_cache"].shape[1]))
            num_blocks = c["k_cache"].shape[0]
            value = rng.choice(_BAD_IDS + (num_blocks, num_blocks + rng.randint(1, 50)))
            if c["tables"].dtype == torch.int32 or abs(value) < 2 ** 31:
                c["tables"][b, j] = value
                bad = (b, j)
        yield c, bad


def _fuzz(fn, n: int, device: str = "cpu") -> None:
    """FN over ``_fuzz_cases``: a bad id inside a context is refused naming its entry; otherwise the
    result equals contiguous attention (never a read of block 0 or outside the pool)."""
    refused = 0
    for c, bad in _fuzz_cases(n, device):
        if bad is not None:
            with pytest.raises(ValueError, match=rf"block_tables\[{bad[0]}, {bad[1]}\] is -?\d+, not a block"):
                fn(*_args(c))
            refused += 1
        else:
            torch.testing.assert_close(fn(*_args(c)).cpu(), _contiguous(c), **TOL[torch.float32])
    assert 0 < refused < n


@pytest.mark.parametrize("fn", [reference_paged_decode_attention, paged_decode_attention],
                         ids=["reference", "dispatch"])
def test_fuzzed_block_tables_are_refused_inside_the_context_and_free_outside(fn):
    _fuzz(fn, 40)


def test_dispatch_refuses_float64_and_bad_options():
    args = _bad_inputs()
    a64 = {**args, **{k: args[k].double() for k in ("q", "k_cache", "v_cache")}}
    assert reference_paged_decode_attention(**a64).dtype == torch.float64      # the reference takes it
    with pytest.raises(ArgumentTypeError, match="float32, bfloat16 and float16"):
        paged_decode_attention(**a64)
    for bad in (0, 24, 1.5):
        with pytest.raises(ValueError, match="power of two"):
            paged_decode_attention(**args, block_n=bad)
    with pytest.raises(ValueError, match="num_splits"):
        paged_decode_attention(**args, num_splits=0)


def test_fallback_when_triton_is_unavailable(monkeypatch, capsys):
    """Without triton (or a GPU, or the interpreter) the dispatch answers with the reference and says so once."""
    monkeypatch.setattr(pa, "triton_mode", lambda: TritonMode("unavailable", "no triton in this test"))
    monkeypatch.setattr(kernels_pkg, "_NOTICES_SHOWN", set())
    c = _case([3, 9], Hq=4, Hkv=2, D=8, fill=0.0)
    y1, y2 = paged_decode_attention(*_args(c)), paged_decode_attention(*_args(c))
    assert torch.equal(y1, reference_paged_decode_attention(*_args(c))) and torch.equal(y1, y2)
    torch.testing.assert_close(y1, _contiguous(c), **TOL[torch.float32])
    assert capsys.readouterr().err == (
        "course_lib.kernels.paged_attention: using the PyTorch reference (no triton in this test).\n")


def test_result_in_this_process():
    """Whatever the mode here (kernel or reference fallback), the dispatch gives the right answer."""
    c = _case([2, 11], Hq=6, Hkv=3, D=16, fill=0.0, device=DEVICE)
    torch.testing.assert_close(paged_decode_attention(*_args(c)).cpu(), _contiguous(c), **TOL[torch.float32])


def test_empty_batch():
    c = _case([3], fill=0.0)
    q, k, v, t, lens = _args(c)
    out = paged_decode_attention(q[:0], k, v, t[:0], lens[:0])
    assert out.shape == (0, 4, 16) and out.dtype == q.dtype


def test_module_imports_and_falls_back_without_triton():
    """A fresh interpreter where ``import triton`` fails (as on macOS/Windows): the module imports and
    the dispatch returns the reference's answer with the notice."""
    code = (
        "import torch\n"
        "from course_lib.kernels import paged_attention as pa\n"
        "assert pa._paged_decode_kernel is None and not pa.KERNEL_INTERPRETED\n"
        "g = torch.Generator().manual_seed(0)\n"
        "q = torch.randn(2, 4, 8, generator=g); k = torch.randn(5, 4, 2, 8, generator=g); v = torch.randn_like(k)\n"
        "t = torch.tensor([[3, 1], [0, -1]], dtype=torch.int32); n = torch.tensor([6, 2])\n"
        "out = pa.paged_decode_attention(q, k, v, t, n)\n"
        "assert torch.equal(out, pa.reference_paged_decode_attention(q, k, v, t, n))\n"
        "print('ok')\n"
    )
    proc = run_without_triton(code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr
    assert ("course_lib.kernels.paged_attention: using the PyTorch reference (triton does not import"
            in proc.stderr)


# ---------------------------------------------------------------- the Triton kernel


def _check_kernel(c, dtype=torch.float32, **options):
    """Run the kernel on case c; compare with the reference (on a zero-filled copy, which the reference
    handles) and with contiguous attention. Returns the kernel's output."""
    out = paged_decode_attention(*_args(c), **options)
    B, Hq, D = c["q"].shape
    assert out.shape == (B, Hq, D) and out.dtype == dtype and out.device == c["q"].device
    assert torch.isfinite(out).all(), f"{(~torch.isfinite(out)).sum().item()} non-finite outputs"
    torch.testing.assert_close(out.cpu(), _contiguous(c), **TOL[dtype])
    ref = reference_paged_decode_attention(*_args(_with_unowned(c, 0.0)))
    torch.testing.assert_close(out, ref, **TOL[dtype])
    return out


@needs_kernel
@pytest.mark.parametrize(
    "Hq, Hkv, D",
    [(4, 4, 16), (9, 3, 64), (8, 2, 32), (12, 3, 16), (6, 1, 8)],
    ids=["mha-g1", "smollm2-g3", "toy-g4", "g4", "mqa-g6"],
)
def test_triton_kernel_gqa_groups(Hq, Hkv, D):
    c = _case([1, 15, 16, 17, 33], Hq=Hq, Hkv=Hkv, D=D, block_size=16, seed=Hq * 10 + Hkv, device=DEVICE)
    _check_kernel(c)


@needs_kernel
@pytest.mark.parametrize("block_size", [1, 4, 8, 32])
def test_triton_kernel_block_sizes(block_size):
    c = _case([1, 15, 16, 17, 33], Hq=6, Hkv=2, D=16, block_size=block_size, seed=block_size, device=DEVICE)
    _check_kernel(c)


@needs_kernel
@pytest.mark.parametrize("num_splits, block_n", [(1, 16), (2, 16), (3, 16), (16, 16), (4, 32), (None, None)],
                         ids=["1x16", "2x16", "3x16", "16x16-empty-splits", "4x32", "default"])
def test_triton_kernel_splits_and_tiles(num_splits, block_n):
    """Split contexts: splits past a short sequence's context are empty (weight 0 when combined)."""
    c = _case([1, 15, 16, 17, 33, 70], Hq=6, Hkv=3, D=16, block_size=8, seed=3, device=DEVICE)
    _check_kernel(c, num_splits=num_splits, block_n=block_n)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_triton_kernel_half_precision(dtype, num_splits):
    c = _case([1, 17, 33], Hq=9, Hkv=3, D=32, block_size=16, dtype=dtype, seed=5, device=DEVICE)
    _check_kernel(c, dtype=dtype, num_splits=num_splits, block_n=16)


@needs_kernel
@pytest.mark.parametrize("num_splits", [1, 2])
def test_triton_kernel_never_reads_unowned_slots(num_splits):
    """NaN, inf or another sequence's stale values in every slot no sequence owns (the tail of each
    partly filled last block, spare blocks) leave the output finite and bit for bit unchanged."""
    c = _case([1, 6, 9, 13], Hq=4, Hkv=2, D=16, block_size=4, seed=11, fill=float("nan"), spare_blocks=4,
              device=DEVICE)
    out_nan = _check_kernel(c, num_splits=num_splits, block_n=16)
    for value in (0.0, float("inf"), -3.0e38):
        assert torch.equal(paged_decode_attention(*_args(_with_unowned(c, value)), num_splits=num_splits,
                                                  block_n=16), out_nan), value


@needs_kernel
def test_triton_kernel_freed_and_reused_blocks():
    """Sequence A fills blocks and is freed; B reuses some of them, with A's values still in the slots
    past B's context: B's result is A-free (equal to contiguous attention over B alone)."""
    g = torch.Generator().manual_seed(21)
    Hq, Hkv, D, bs = 6, 2, 16, 4
    k_cache = torch.randn(8, bs, Hkv, D, generator=g)                   # all of it: A's (stale) values
    v_cache = torch.randn(8, bs, Hkv, D, generator=g)
    row_b, L = [6, 2, 5], 10                                            # B: 10 positions, last block half full
    kb, vb = torch.randn(L, Hkv, D, generator=g), torch.randn(L, Hkv, D, generator=g)
    for p in range(L):
        k_cache[row_b[p // bs], p % bs], v_cache[row_b[p // bs], p % bs] = kb[p], vb[p]
    q = torch.randn(1, Hq, D, generator=g)
    table = torch.tensor([row_b + [-1]], dtype=torch.int64)
    c = dict(q=q.to(DEVICE), k_cache=k_cache.to(DEVICE), v_cache=v_cache.to(DEVICE), tables=table.to(DEVICE),
             lens=torch.tensor([L]).to(DEVICE), keys=[kb.transpose(0, 1)[None]], values=[vb.transpose(0, 1)[None]])
    out = paged_decode_attention(*_args(c), block_n=16)
    torch.testing.assert_close(out.cpu(), _contiguous(c), **TOL[torch.float32])
    torch.testing.assert_close(out, reference_paged_decode_attention(*_args(c)), **TOL[torch.float32])


@needs_kernel
@pytest.mark.parametrize("table_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_triton_kernel_garbage_padding_and_index_dtypes(table_dtype):
    """Rows padded with -1, ids past the pool and the largest int (several padding columns), int32 lengths."""
    c = _case([2, 5, 33], Hq=4, Hkv=2, D=8, block_size=4, seed=7, pad_columns=3, table_dtype=table_dtype,
              device=DEVICE)
    assert (c["tables"] < 0).any() and (c["tables"] >= c["k_cache"].shape[0]).any()
    out = _check_kernel(c)
    c32 = {**c, "lens": c["lens"].to(torch.int32)}
    assert torch.equal(paged_decode_attention(*_args(c32)), out)


@needs_kernel
def test_triton_kernel_fuzzed_block_tables():
    """The kernel (interpreted in test_interpreter_subprocess, a child process, so a read far outside
    the pool would end it instead of this run) behind the same checks: refused or right."""
    _fuzz(paged_decode_attention, 24, DEVICE)


@needs_kernel
def test_triton_kernel_strided_views_and_odd_head_dim():
    """q a non-contiguous view, the caches one layer of a larger pool, D = 12 (padded to 16 with masks)."""
    c = _case([3, 14], Hq=6, Hkv=2, D=12, block_size=4, seed=9, device=DEVICE)
    layers_k = torch.stack([torch.full_like(c["k_cache"], float("nan")), c["k_cache"]], dim=1)  # (N, 2, bs, H, D)
    layers_v = torch.stack([torch.full_like(c["v_cache"], float("nan")), c["v_cache"]], dim=1)
    q_buf = torch.full((2, 2 * 6, 12), float("nan"), device=DEVICE)
    q_buf[:, ::2] = c["q"]
    strided = {**c, "q": q_buf[:, ::2], "k_cache": layers_k[:, 1], "v_cache": layers_v[:, 1]}
    assert not strided["q"].is_contiguous() and not strided["k_cache"].is_contiguous()
    out = _check_kernel(strided)
    assert torch.equal(out, paged_decode_attention(*_args(c)))


@needs_kernel
@pytest.mark.parametrize("max_context, num_splits", [(None, 1), (None, 4), (33, 3), (40, None)])
def test_triton_kernel_unchecked_launch(max_context, num_splits):
    """The engine's inner path: no checks, no host read of context_lens; the splits sized from
    max_context (default W * block_size, here 3 padding columns wider than the longest row)."""
    c = _case([1, 17, 33], Hq=6, Hkv=2, D=16, block_size=4, seed=13, pad_columns=3, device=DEVICE)
    out = paged_decode_kernel_unchecked(*_args(c), max_context, num_splits=num_splits, block_n=16)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    torch.testing.assert_close(out.cpu(), _contiguous(c), **TOL[torch.float32])


@needs_kernel
def test_triton_kernel_actually_used(monkeypatch):
    """In a kernel-capable process the dispatch must not fall back to the reference. The notice prints
    once per process, so the check is on the path: the reference is replaced by one that fails."""
    import course_lib.kernels.paged_attention as module

    def refuse(*args, **kwargs):
        raise AssertionError("paged_decode_attention fell back to the PyTorch reference")

    monkeypatch.setattr(module, "paged_decode_attention_unchecked", refuse)
    c = _case([3, 17], Hq=4, Hkv=2, D=16, block_size=4, seed=3, device=DEVICE)
    torch.testing.assert_close(paged_decode_attention(*_args(c)).cpu(), _contiguous(c), **TOL[torch.float32])


# ---------------------------------------------------------------- the interpreter run


@pytest.mark.slow  # starts kernels (pyproject's marker); about 8 s on one idle core
def test_interpreter_subprocess():
    run_kernel_tests_in_interpreter(__file__)
