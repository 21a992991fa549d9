"""Tests of the trusted judge (course_grader.judge) and its plain-data codec
(course_grader.remote).

Fast part (no kernel): codec round trips for every type the Lab 1-3 checkers pass or expect,
hostile values refused, malformed data refused, the kernel-side call logic run in-process
(in-place writes and callbacks), redaction, test-cell parsing, seeds, the gradebook step.
Kernel part: real ipykernel kernels started with jupyter_client; the learner's cells run in
them, then the judge judges test cells against the live kernel, including a learner who
patches the checkers, course_lib's contracts, math.isclose and torch.allclose in the kernel.
"""
from __future__ import annotations

import builtins
import json
import math
import os
import re
import subprocess
import sys
import textwrap
import time
from collections import deque
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch

from course_lib.cache.contiguous import KVCache
from course_lib.cache.paged import BlockPool, PagedKVCache, PagedSequence
from course_grader import hostile, judge, preprocessors, remote, sandbox
from course_lib.grading import ContractError, check_int, check_int_list, check_real, check_tensor
from course_lib.grading.lab02 import check_generation
from course_lib.grading.lab03 import normalise_plan as _normalise_plan
from course_lib.grading.tables import Contract, Probe
from course_lib.hardware import REFERENCE_DEVICES
from course_lib.kernels.exercise import NOT_MEASURED
from course_lib.models.config import ModelConfig, toy_config
from course_lib.models.decoder import Decoder
from course_lib.scheduling import Deployment, Request, RequestRecord, StepPlan

REPO = Path(__file__).resolve().parents[1]


# == helpers =====================================================================================
def through_kernel_codec(value):
    """judge encode -> JSON -> kernel decode -> kernel encode -> JSON -> judge decode."""
    enc = remote.CallEncoder()
    node = enc.encode(value)
    payload = json.loads(remote.dumps({"node": node, "objects": enc.table}))
    kernel_side = remote.CallDecoder(payload["objects"]).decode(payload["node"])
    back = remote.dumps(remote.ResultEncoder().encode(kernel_side))   # fresh encoder: no refs
    return kernel_side, remote.decode_value(back)


def from_kernel(value):
    """What the judge decodes when a kernel function returns ``value``."""
    return remote.decode_value(remote.dumps(remote.ResultEncoder().encode(value)))


def same(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.is_floating_point():
            return torch.allclose(a.double(), b.double(), rtol=0, atol=0, equal_nan=True)
        return torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b) \
            and a.flags.writeable == b.flags.writeable
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, (list, tuple, deque)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if hasattr(a, "__dataclass_fields__"):
        return all(same(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__)
    return a == b


def record(arrival=0.5, times=(1.0, 1.25, 1.5)):
    t = np.array(times, dtype=np.float64)
    t.flags.writeable = False
    return RequestRecord(arrival, 10, len(times), t, 1)


# == codec: round trips ==========================================================================
VALUES = {
    "int": 7, "big int": 10 ** 40, "negative": -3, "float": 0.1, "nan": float("nan"), "inf": -float("inf"),
    "minus zero": -0.0, "bool": True, "none": None, "str": "naïve ✓", "empty list": [],
    "nested": [1, (2.5, "x"), {"k": [None, False]}, {(1, 2): "tuple key", 3: 4.0}],
    "deque": deque([1, 2, 3], maxlen=5),
    "float32 tensor": torch.randn(2, 3, 4), "float64": torch.randn(3, dtype=torch.float64),
    "float16": torch.randn(5).half(), "bfloat16": torch.randn(2, 2).to(torch.bfloat16),
    "int64": torch.arange(6).reshape(2, 3), "int32": torch.tensor([1, -2], dtype=torch.int32),
    "int8": torch.tensor([-1, 2], dtype=torch.int8), "uint8": torch.tensor([0, 255], dtype=torch.uint8),
    "bool tensor": torch.tensor([True, False, True]), "0-dim": torch.tensor(3.5), "empty": torch.zeros(0, 4),
    "nan tensor": torch.tensor([1.0, float("nan")]), "non-contiguous": torch.arange(12.0).reshape(3, 4).t(),
    "ndarray f8": np.linspace(0, 1, 5), "ndarray i4": np.arange(4, dtype=np.int32).reshape(2, 2),
    "ndarray bool": np.array([True, False]), "np.float64": np.float64(2.5), "np.float32": np.float32(0.1),
    "np.int64": np.int64(-9), "np.bool_": np.bool_(True),
    "ModelConfig": toy_config(), "Device": REFERENCE_DEVICES["24GB-1.0"], "Deployment": Deployment(),
    "Request": Request(0.5, 12, 30), "RequestRecord": record(),
    "StepPlan": StepPlan(2, (3,), (0, 1), ((2, 16),)),
    "list of records": [record(), record(1.0, (2.0,))],
}


@pytest.mark.parametrize("name", list(VALUES))
def test_round_trip_keeps_type_dtype_shape_and_value(name):
    value = VALUES[name]
    kernel_side, back = through_kernel_codec(value)
    if name == "non-contiguous":
        value = value.contiguous()
    assert same(kernel_side, value), kernel_side
    assert same(back, value), back


def test_readonly_array_in_a_record_stays_readonly():
    kernel_side, back = through_kernel_codec(record())
    assert not kernel_side.token_times.flags.writeable and not back.token_times.flags.writeable


def test_aliasing_survives_and_state_objects_are_rebuilt():
    pool = BlockPool(8, 4, 2, 3, max_seq_len=20)
    cache = PagedKVCache(pool)
    seq = cache.new_sequence()
    cache.append(seq, torch.randn(6, 2, 3), torch.randn(6, 2, 3))
    fork = cache.fork(seq)
    kv = KVCache.for_model(toy_config(n_layers=2), batch=1, max_len=8)
    kv.length = 3
    t = torch.randn(3)
    enc = remote.CallEncoder()
    nodes = [enc.encode(x) for x in (pool, seq, fork, cache, kv, t, t)]
    payload = json.loads(remote.dumps({"nodes": nodes, "objects": enc.table}))
    dec = remote.CallDecoder(payload["objects"])
    k_pool, k_seq, k_fork, k_cache, k_kv, t1, t2 = [dec.decode(n) for n in payload["nodes"]]
    assert t1 is t2 and torch.equal(t1, t)
    assert k_cache.pool is k_pool and type(k_pool) is BlockPool and type(k_seq) is PagedSequence
    assert k_pool.ref_counts == pool.ref_counts and list(k_pool.free_block_ids) == list(pool.free_block_ids)
    assert isinstance(k_pool.free_block_ids, deque) and torch.equal(k_pool.k, pool.k)
    k_read = PagedKVCache(k_pool).read(k_fork)
    assert all(torch.equal(a, b) for a, b in zip(k_read, cache.read(fork)))
    assert type(k_kv) is KVCache and k_kv.length == 3 and torch.equal(k_kv.v, kv.v) and k_kv.max_len == 8


def _same_state(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if hasattr(a, "__dict__") and not isinstance(a, type):
        return type(a) is type(b) and _same_state(vars(a), vars(b))
    if isinstance(a, dict):
        return type(b) is type(a) and a.keys() == b.keys() and all(_same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple, deque)):
        return type(b) is type(a) and len(a) == len(b) and all(_same_state(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def test_state_classes_declare_their_whole_state():
    """Every attribute of a state object crosses the channel: an attribute added to (or renamed in)
    the class but not to its WIRE_STATE would be missing or stale on the other side."""
    pool = BlockPool(8, 4, 2, 3, max_seq_len=20)
    cache = PagedKVCache(pool)
    seq = cache.new_sequence()
    cache.append(seq, torch.randn(6, 2, 3), torch.randn(6, 2, 3), token_ids=list(range(6)))
    kv = KVCache.for_model(toy_config(n_layers=2), batch=1, max_len=8)
    kv.length = 5
    for obj in (pool, seq, cache, kv):
        enc = remote.CallEncoder()
        payload = json.loads(remote.dumps({"node": enc.encode(obj), "objects": enc.table}))
        rebuilt = remote.CallDecoder(payload["objects"]).decode(payload["node"])
        assert type(rebuilt) is type(obj) and set(vars(rebuilt)) == set(vars(obj)), type(obj).__name__
        assert _same_state(obj, rebuilt), type(obj).__name__


@pytest.mark.parametrize("tied", [False, True])
def test_decoder_is_rebuilt_with_identical_weights(tied):
    model = Decoder.random(toy_config(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=96,
                                      vocab_size=97, tie_embeddings=tied), seed=3)
    enc = remote.CallEncoder()
    node = enc.encode(model)
    payload = json.loads(remote.dumps({"node": node, "objects": enc.table}))
    copy = remote.CallDecoder(payload["objects"]).decode(payload["node"])
    assert type(copy) is Decoder and copy is not model and not copy.training
    ids, pos = torch.randint(0, 97, (1, 9)), torch.arange(9)
    assert torch.equal(copy(ids, pos), model(ids, pos))
    assert (copy.lm_head.weight is copy.embed_tokens.weight) == tied
    assert not any(p.requires_grad for p in copy.parameters())


# == codec: hostile kernel values ================================================================
class EqualsEverything:
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = object.__hash__


class EvilTensor(torch.Tensor):
    pass


class EvilInt(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


class EvilFloat(float):
    def __sub__(self, other):
        return 0.0


def test_rigged_objects_cannot_be_encoded_and_fail_the_contracts():
    for value in (EqualsEverything(), EvilInt(3), EvilFloat(1.0), torch.randn(3).as_subclass(EvilTensor),
                  torch.nn.Parameter(torch.randn(2)), (lambda: 1), range(3), b"bytes", object()):
        got = from_kernel(value)
        assert isinstance(got, remote.Opaque), value
        assert got != 3 and not (got == got.__class__()) and got == got
        with pytest.raises(ContractError):
            check_tensor("out", got)
        with pytest.raises(ContractError):
            check_int("n", got)
        with pytest.raises(ContractError):
            check_real("t", got)
    assert "EvilTensor" in type(from_kernel(torch.randn(1).as_subclass(EvilTensor))).__qualname__
    with pytest.raises(ContractError, match="must be a torch.Tensor, got .*EvilTensor"):
        check_tensor("out", from_kernel(torch.randn(1).as_subclass(EvilTensor)))


def test_rigged_values_inside_containers_and_records():
    got = from_kernel([1, EqualsEverything(), (EvilInt(2),)])
    assert got[0] == 1 and isinstance(got[1], remote.Opaque) and isinstance(got[2][0], remote.Opaque)
    with pytest.raises(ContractError):
        check_int_list("tokens", got)
    plan = from_kernel(StepPlan(EqualsEverything(), (), (0,), ()))
    assert type(plan) is StepPlan
    with pytest.raises(ContractError, match="admitted must be an int"):
        _normalise_plan("schedule_step", plan)


def test_cycles_and_deep_nesting_become_stand_ins():
    loop = [1]
    loop.append(loop)
    got = from_kernel(loop)
    assert got[0] == 1 and isinstance(got[1], remote.Opaque)
    deep = []
    for _ in range(200):
        deep = [deep]
    got = from_kernel(deep)
    while isinstance(got, list):
        got = got[0]
    assert isinstance(got, remote.Opaque)


def test_wrong_dtype_shape_and_nan_are_left_to_the_contracts():
    got = from_kernel(torch.zeros(2, 3, dtype=torch.float64))
    with pytest.raises(ContractError, match="dtype"):
        check_tensor("out", got, dtype=torch.float32)
    with pytest.raises(ContractError, match="shape"):
        check_tensor("out", got, shape=(3, 2))
    with pytest.raises(ContractError, match="NaN"):
        check_tensor("out", from_kernel(torch.tensor([float("nan")])))
    with pytest.raises(ContractError, match="finite"):
        check_real("t", from_kernel(float("nan")))


def _tensor_node(**overrides):
    node = {"$": "tensor", "dtype": "float32", "shape": [2], "data": remote.encode_bytes(b"\0" * 8)}
    node.update(overrides)
    return node


@pytest.mark.parametrize("node", [
    _tensor_node(data="!!!not base64"), _tensor_node(data=remote.encode_bytes(b"\0" * 7)),
    _tensor_node(shape=[2, -1]), _tensor_node(shape=[1 << 40]), _tensor_node(shape="2"),
    _tensor_node(dtype="complex64"), _tensor_node(dtype="object"), _tensor_node(extra=1),
    {"$": "ndarray", "dtype": "|O", "shape": [1], "data": "", "writeable": True},
    {"$": "pickle", "data": "gASVAAAAAAAAAAA="}, {"$": "ref", "id": 0}, {"$": "callback", "id": 0},
    {"$": "decoder", "config": None, "params": []}, {"$": "state", "type": "BlockPool", "fields": []},
    {"$": "value", "type": "os.system", "fields": []}, {"$": "value", "type": "StepPlan", "fields": [["x", 1]]},
    {"$": "dict", "items": [[[1], 2]]}, {"no": "tag"}, {"$": "tuple", "items": "abc"},
])
def test_malformed_kernel_data_is_refused(node):
    with pytest.raises(remote.RemoteDataError):
        remote.decode_value(remote.dumps(node))


def test_malformed_json_and_bool_bytes():
    with pytest.raises(remote.RemoteDataError):
        remote.decode_value("{not json")
    with pytest.raises(remote.RemoteDataError):
        remote.decode_value("[" * 100000 + "]" * 100000)
    odd = remote.decode_value(remote.dumps({"$": "tensor", "dtype": "bool", "shape": [3],
                                            "data": remote.encode_bytes(bytes([0, 1, 2]))}))
    assert odd.tolist() == [False, True, True]


def test_no_code_carrying_format_is_used():
    for path in (Path(remote.__file__), Path(judge.__file__)):
        text = path.read_text()
        for banned in (r"import pickle|pickle\.|from pickle", r"torch\.load\(", r"np\.load\(", r"(?<![.\w])eval\(", r"(?<![.\w])exec\(",
                       r"\bmarshal\b", r"__reduce__"):
            assert not re.search(banned, text), (path.name, banned)


# == the kernel-side call logic, in-process ======================================================
def call_in_process(fn, *args, **kwargs):
    """remote.answer_call as the kernel runs it, with callbacks served by KernelSession.answer_callback."""
    enc = remote.CallEncoder()
    request = json.loads(remote.dumps({"op": "call", "fn": "f", "args": [enc.encode(a) for a in args],
                                       "kwargs": [[k, enc.encode(v)] for k, v in kwargs.items()],
                                       "objects": enc.table, "grad": False}))

    def ask(message):
        message = json.loads(remote.dumps(message))
        return json.loads(remote.dumps(judge.KernelSession.answer_callback(message, enc.callbacks, enc.objects)))

    answer = json.loads(remote.dumps(remote.answer_call({"f": fn}, request, ask)))
    decoder = remote.ResultDecoder(enc.objects)
    decoder.apply_state(answer["state"])
    return answer, (decoder.decode(answer["value"]) if answer["op"] == "returned" else None)


def test_in_place_writes_come_back_to_the_judges_tensors():
    k_cache, v_cache, untouched = torch.zeros(1, 2, 8, 4), torch.zeros(1, 2, 8, 4), torch.ones(3)

    def step(k_new, k_cache, v_cache, untouched, start):
        k_cache[:, :, start:start + k_new.shape[2]] = k_new
        v_cache.add_(1)
        return k_cache                       # an argument returned: the judge gets its own object

    k_new = torch.randn(1, 2, 3, 4)
    answer, out = call_in_process(step, k_new, k_cache, v_cache, untouched, 2)
    assert out is k_cache and torch.equal(k_cache[:, :, 2:5], k_new) and bool((v_cache == 1).all())
    assert [oid for oid, _ in answer["state"]] == [1, 2]          # only the changed arguments come back


def test_paged_append_mutations_reach_the_judges_pool_and_sequence():
    pool, seq = BlockPool(8, 4, 1, 2), PagedSequence()

    def paged_append(pool, seq, k, v):
        PagedKVCache(pool).append(seq, k, v)

    k, v = torch.randn(6, 1, 2), torch.randn(6, 1, 2)
    call_in_process(paged_append, pool, seq, k, v)
    assert seq.length == 6 and len(seq.block_table) == 2 and pool.num_free == 6
    assert isinstance(pool.free_block_ids, deque)
    assert all(torch.equal(a, b) for a, b in zip(PagedKVCache(pool).read(seq), (k, v)))


def test_callbacks_run_in_the_judge():
    seen = []

    def run(rate):
        seen.append(rate)
        return {"ttft99": 1.0 if rate < 1 else 9.0, "itl99": 0.05}

    def find_capacity(run, lo=0.0, hi=2.0, steps=3):
        for _ in range(steps):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if run(mid)["ttft99"] <= 3 else (lo, mid)
        return lo

    answer, out = call_in_process(find_capacity, run, steps=4)
    assert seen == [1.0, 0.5, 0.75, 0.875] and out == 0.875


def test_only_allowed_arguments_are_written_back():
    given, cache = torch.ones(3), torch.zeros(3)

    def f(given, cache):
        given.zero_()
        cache.add_(2)
        return given

    enc = remote.CallEncoder()
    request = json.loads(remote.dumps({"op": "call", "fn": "f", "args": [enc.encode(given), enc.encode(cache)],
                                       "kwargs": [], "objects": enc.table, "grad": False}))
    answer = json.loads(remote.dumps(remote.answer_call({"f": f}, request, None)))
    decoder = remote.ResultDecoder(enc.objects)
    copies = decoder.apply_state(answer["state"], allowed={1})
    out = decoder.decode(answer["value"])
    assert bool((given == 1).all()) and bool((cache == 2).all())      # the input kept, the cache written
    assert out is copies[0] and out is not given and bool((out == 0).all())


def test_a_learner_exception_is_reported_not_raised_in_the_harness():
    def boom(x):
        raise KeyError("no such key")
    answer, _ = call_in_process(boom, 1)
    assert answer["op"] == "raised" and answer["type"] == "KeyError"
    exc = judge.learner_exception("f", answer["type"], answer["message"])
    assert isinstance(exc, KeyError) and isinstance(exc, judge.LearnerRaised) and not isinstance(exc, ContractError)
    assert "f raised KeyError" in str(exc)


def _toy_model(seed=3):
    return Decoder.random(toy_config(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=96,
                                     vocab_size=97), seed=seed)


def probed_call(fn, model, *args):
    """answer_call with the Lab 2 embedding probe on MODEL, then the judge's replay onto MODEL."""
    enc = remote.CallEncoder()
    arg_nodes = [enc.encode(model), *(enc.encode(a) for a in args)]
    probes = remote.probe_request(enc.objects, (Probe(Decoder, "embed_tokens"),))
    request = json.loads(remote.dumps({"op": "call", "fn": "f", "args": arg_nodes, "kwargs": [],
                                       "objects": enc.table, "grad": False, "probes": probes}))
    answer = json.loads(remote.dumps(remote.answer_call({"f": fn}, request, None)))
    remote.replay_probes(answer["probed"], enc.objects, probes)
    return answer, probes


def test_probed_forward_calls_are_replayed_on_the_judges_model():
    model, seen = _toy_model(), []
    handle = model.embed_tokens.register_forward_hook(lambda m, inputs, out: seen.append(tuple(inputs[0].shape)))

    def two_forwards(model, ids):
        model(ids.view(1, -1), torch.arange(ids.numel()))
        model.embed_tokens(ids[:2])
        return 0

    answer, probes = probed_call(two_forwards, model, torch.randint(0, 97, (7,)))
    handle.remove()
    assert probes == [[0, "embed_tokens"]] and answer["op"] == "returned"
    assert seen == [(1, 7), (2,)]                     # the kernel's calls, by shape, on the judge's model


def test_a_probe_cleared_in_the_kernel_records_nothing():
    def clears_its_hooks(model, ids):         # what the hostile no_cache_hooks_cleared sample does
        model.embed_tokens._forward_hooks.clear()
        model(ids.view(1, -1), torch.arange(ids.numel()))

    model, seen = _toy_model(), []
    model.embed_tokens.register_forward_hook(lambda m, inputs, out: seen.append(inputs[0].numel()))
    answer, _ = probed_call(clears_its_hooks, model, torch.randint(0, 97, (5,)))
    assert answer["probed"] == [[]] and seen == []


@pytest.mark.parametrize("records", [
    "x", [], [[[[3], "int64"]], []], [[[[3], "complex64"]]], [[[[-1], "int64"]]], [[[3, "int64"]]],
    [[[[1], "int64"]] * (remote.LIMITS.max_probed_calls + 1)], [[[[remote.LIMITS.max_probed_elements + 1], "int64"]]],
    [[[[2, 2], "float32"]]],                      # a replay the embedding cannot run
])
def test_malformed_or_oversized_probe_records_are_refused(records):
    enc = remote.CallEncoder()
    enc.encode(_toy_model())
    with pytest.raises(remote.RemoteDataError):
        remote.replay_probes(records, enc.objects, [[0, "embed_tokens"]])


def test_probe_and_contract_declarations_are_checked():
    with pytest.raises(ValueError, match="public attributes"):
        Probe(Decoder, "embed_tokens._forward_hooks")
    with pytest.raises(TypeError, match="a class"):
        Probe("Decoder", "embed_tokens")
    with pytest.raises(TypeError, match="tuple of Probe"):
        Contract("test_x", check_generation, ("f",), probes=("embed_tokens",))


def serve_in_process(fn, requests):
    """remote.serve over a scripted stdin channel (what ipykernel's input() is in the harness)."""
    sent, replies = [], iter(requests)

    def channel(prompt):
        assert prompt.startswith(remote.PROMPT)
        sent.append(json.loads(prompt[len(remote.PROMPT):]))
        return remote.dumps(next(replies))

    saved = builtins.input
    builtins.input = channel
    try:
        remote.serve({"f": fn})
    finally:
        assert builtins.input is channel          # serve put back what it found
        builtins.input = saved
    return sent


def test_the_learners_input_raises_during_a_call_and_is_back_afterwards():
    def asks(x):
        return input("your answer? ")

    call = {"op": "call", "fn": "f", "args": [1], "kwargs": [], "objects": [], "grad": False}
    sent = serve_in_process(asks, [call, {"op": "end"}])
    assert [m["op"] for m in sent] == ["ready", "raised"]
    assert sent[1]["type"].endswith("StdinNotImplementedError") and "grader calls your function" in sent[1]["message"]


def test_a_call_runs_on_the_judges_thread_count_and_the_kernels_comes_back():
    before = torch.get_num_threads()
    other = 1 if before != 1 else 2

    def threads():
        return torch.get_num_threads()

    for asked, seen in ((other, other), (0, before), (remote.MAX_THREADS + 1, before), ("2", before), (None, before)):
        request = {"op": "call", "fn": "f", "args": [], "kwargs": [], "objects": [], "grad": False, "threads": asked}
        answer = remote.answer_call({"f": threads}, request, None)
        assert answer["op"] == "returned" and answer["value"] == seen, (asked, answer)
        assert torch.get_num_threads() == before


def test_the_harness_reaches_no_private_ipykernel_attribute():
    for path in (Path(remote.__file__), Path(judge.__file__)):
        assert not re.search(r"kernel\._\w", path.read_text()), path.name


# == redaction ===================================================================================
HIDDEN_MESSAGES = [
    ("prefill_time(case 3: L 40, d 5120, 40 query / 8 KV heads of 128, d_ff 13824, vocab 152064, untied; "
     "80 GB, 3.35 TB/s, 989 TFLOP/s; 7219 tokens, mfu 0.4): expected 0.871234, got 0.348494 (must agree to 4 "
     "significant figures, relative error <= 0.0005); ratio got/expected = 0.4\nDiagnosis: your number equals "
     "the formula with this fault: MFU left out (divided by the peak, not mfu * peak)",
     ["5120", "7219", "0.871234", "0.348494", "152064"], ["case 3", "MFU left out", "ratio got/expected = 0.4"]),
    ("kv_bytes_per_token(case 2: L 66, d 3072, 24 query / 4 KV heads of 128, d_ff 9664, vocab 241709, untied, "
     "2 B/value): expected 135,168 = K and V 2 * layers 66 * KV heads 4 * head_dim 128 * bytes per value 2, got "
     "811,008; your number is what the formula gives with 'K and V' = 12 instead of 2\nDiagnosis: your number "
     "equals the formula with any of these faults (on these inputs they give the same value):\n  - query heads "
     "(24) used instead of KV heads (4): with GQA only the KV heads are cached",
     ["135,168", "811,008", "66", "(24)", "(4)"], ["case 2", "query heads (#) used instead of KV heads (#)"]),
    ("attention output (case 1: B 2, 6 query heads over 3 KV heads, start 5, T 6) differs from the reference: "
     "first over tolerance at index (0, 1, 0, 0), |diff| 0.74 > allowed 1.62e-05 (torch.float32); 192 of 288 "
     "values over; max |diff| 1.86\nDiagnosis: your output equals the reference with this fault: KV-head repeat "
     "misaligned", ["start 5", "1.62e-05"], ["index (0, 1, 0, 0)", "max |diff| 1.86", "torch.float32"]),
    ("decode_step_bound(case 0: L 58, d 3072; batch 597, context 8180): expected 0.0250202, got 0.0454046 "
     "(must agree to 4 significant figures)\n(reference: memory time 0.02038 s, compute time 0.02502 s, "
     "compute-bound)\nDiagnosis: your number equals the formula with this fault: memory time and compute time "
     "added", ["0.02038", "8180", "0.0250202"], ["memory time and compute time added"]),
    ("schedule_step(case 0: running [(261, 228)], queue [(273, 91)], memory 938 positions, budget None, "
     "max_running 256):\n  expected StepPlan(admitted=0, preempted=(3,), decodes=(0,), chunks=())\n  got      "
     "StepPlan(admitted=0, preempted=(0,), decodes=(1,), chunks=())\nDiagnosis: your result equals the reference "
     "with this fault: the oldest running request evicted", ["261", "938", "StepPlan"], ["oldest running"]),
    ("iteration_time(case 4: 3 decodes, chunks [(12, 40)]): expected 0.1233608127 s, got 0.1160398457 s\n"
     "Diagnosis: your result equals the reference with this fault: a chunk's attention charged only its own "
     "tokens, k(k+1)/2, without the k*c term", ["0.1233608127", "(12, 40)"], ["k(k+1)/2"]),
]


@pytest.mark.parametrize("message,gone,kept", HIDDEN_MESSAGES)
def test_redaction_drops_inputs_and_references_but_keeps_the_diagnosis(message, gone, kept):
    text = preprocessors.redact(message)
    for fragment in gone:
        assert fragment not in text, (fragment, text)
    for fragment in kept:
        assert fragment in text, (fragment, text)


# == parsing test cells and seeds ================================================================
def graded_cells(notebook):
    nb = nbformat.read(str(notebook), as_version=4)
    return [c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade")
            and not c.metadata.nbgrader.get("solution")]


def test_every_graded_cell_of_the_solutions_parses():
    found = {}
    for notebook in sorted((REPO / "solutions").glob("*/*.ipynb")):
        for cell in graded_cells(notebook):
            calls, _ = judge.parse_test_cell(cell.source)
            assert calls, cell.metadata.nbgrader["grade_id"]
            assert any(c.hidden for c in calls) and any(not c.hidden for c in calls)
            assert all(judge.FRESH in c.kwargs.values() for c in calls if c.hidden)
            found[cell.metadata.nbgrader["grade_id"]] = calls
    from course_grader.samples import labs, tables
    assert sorted(found) == sorted(c.test for lab in labs() for c in tables(lab).CONTRACTS)   # one cell per contract
    generation = found["test_generate_with_cache"]
    assert generation[0].kwargs["model"] == judge.KernelName("toy") and generation[1].repeat == 2
    assert found["test_paged"][0].functions == ["paged_append", "paged_read"]


@pytest.mark.parametrize("source", [
    "if True:\n    lab01.check_prefill_time(prefill_time, seed=0)",
    "lab01.check_prefill_time(lambda *a: 0, seed=0)",
    "lab01.check_prefill_time(prefill_time, seed=seed + 1)",
    "lab01.check_prefill_time(*fns)",
    "x = lab01.check_prefill_time(prefill_time)",
    "def f(:\n",
])
def test_unsupported_checker_calls_are_refused(source):
    with pytest.raises(judge.UnsupportedCell):
        judge.parse_test_cell(source)


def test_seeds(monkeypatch):
    assert judge.derived_seed(1, "a", 0) == judge.derived_seed(1, "a", 0) != judge.derived_seed(1, "a", 1)
    monkeypatch.delenv("COURSE_JUDGE_SEED", raising=False)
    monkeypatch.setenv("COURSE_GRADING_SEED", "123")
    assert judge.judge_seed() == judge.derived_seed(123, "judge") != 123
    monkeypatch.setenv("COURSE_JUDGE_SEED", "9")
    assert judge.judge_seed() == 9 and judge.judge_seed(4) == 4


# == real kernels ================================================================================
LEARNER = '''
import math, time, os
import torch
from course_lib import roofline
from course_lib import scheduling as sched
from course_lib.cache.paged import PagedKVCache
from course_lib.grading import fresh_seed, lab01, lab02, lab03
from course_lib.grading.lab03 import variant_step as _variant_step
from course_lib.models import generate_full_recompute
from course_lib.models.decoder import generate_cached

def prefill_time(config, device, tokens, mfu=0.5):
    L, d = config.n_layers, config.n_heads * config.head_dim
    return (2 * roofline.n_matmul(config) * tokens + 2 * L * d * tokens ** 2) / (mfu * device.peak_flops)

def prefill_no_mfu(config, device, tokens, mfu=0.5):
    L, d = config.n_layers, config.n_heads * config.head_dim
    return (2 * roofline.n_matmul(config) * tokens + 2 * L * d * tokens ** 2) / device.peak_flops

prefill_reference = roofline.prefill_time

def count_parameters(config):
    return config.parameters(), roofline.n_matmul(config)

def count_untied(config):
    return config.parameters(), roofline.n_matmul(config) + (0 if config.tie_embeddings else config.vocab_size * config.d_model)

def _attend(q, k_new, v_new, k_cache, v_cache, start, interleave=True, write=True):
    B, Hq, T, D = q.shape
    if write:
        k_cache[:, :, start:start + T] = k_new
        v_cache[:, :, start:start + T] = v_new
        k, v = k_cache[:, :, :start + T], v_cache[:, :, :start + T]
    else:
        k = torch.cat([k_cache[:, :, :start], k_new], dim=2)
        v = torch.cat([v_cache[:, :, :start], v_new], dim=2)
    g = Hq // k.shape[1]
    k, v = (k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)) if interleave else (k.repeat(1, g, 1, 1), v.repeat(1, g, 1, 1))
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)
    mask = torch.arange(start + T)[None, :] <= (torch.arange(T)[:, None] + start)
    return scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v

def attend_with_cache(q, k_new, v_new, k_cache, v_cache, start):
    return _attend(q, k_new, v_new, k_cache, v_cache, start)

def attend_misaligned(q, k_new, v_new, k_cache, v_cache, start):
    return _attend(q, k_new, v_new, k_cache, v_cache, start, interleave=False)

def attend_no_write(q, k_new, v_new, k_cache, v_cache, start):
    return _attend(q, k_new, v_new, k_cache, v_cache, start, write=False)

def attend_zeroes_its_query(q, k_new, v_new, k_cache, v_cache, start):
    out = _attend(q.clone(), k_new, v_new, k_cache, v_cache, start)
    q.zero_()                     # right output and cache, but the caller's query is gone
    return out

def _append(pool, seq, k, v, cow=True, refuse=True):
    bs, n, w = pool.block_size, k.shape[0], 0
    if refuse and pool.max_seq_len is not None and seq.length + n > pool.max_seq_len:
        raise ValueError("past max_seq_len")
    while w < n:
        off = seq.length % bs
        if off == 0:
            seq.block_table.append(pool.allocate())
        elif cow and pool.ref_counts[seq.block_table[-1]] > 1:
            old, new = seq.block_table[-1], pool.allocate()
            pool.k[new, :off], pool.v[new, :off] = pool.k[old, :off], pool.v[old, :off]
            pool.decref(old)
            seq.block_table[-1] = new
        b, m = seq.block_table[-1], min(bs - off, n - w)
        pool.k[b, off:off + m], pool.v[b, off:off + m] = k[w:w + m], v[w:w + m]
        seq.length += m
        w += m

def paged_append(pool, seq, k, v):
    _append(pool, seq, k, v)

def paged_append_no_cow(pool, seq, k, v):
    _append(pool, seq, k, v, cow=False)

def paged_append_grows(pool, seq, k, v):
    _append(pool, seq, k, v, refuse=False)

def paged_read(pool, seq):
    ids = torch.tensor(seq.block_table, dtype=torch.long)
    k = pool.k[ids].reshape(-1, pool.k.shape[2], pool.k.shape[3])[:seq.length]
    v = pool.v[ids].reshape(-1, pool.v.shape[2], pool.v.shape[3])[:seq.length]
    return k, v

def find_capacity(run, targets=(3.0, 0.1), lo=0.01, hi=4.0, steps=10):
    for _ in range(steps):
        mid = (lo + hi) / 2
        r = run(mid)
        if r["ttft99"] <= targets[0] and r["itl99"] <= targets[1]:
            lo = mid
        else:
            hi = mid
    return lo

def find_capacity_upper(run, targets=(3.0, 0.1), lo=0.01, hi=4.0, steps=10):
    for _ in range(steps):
        mid = (lo + hi) / 2
        r = run(mid)
        lo, hi = (mid, hi) if r["ttft99"] <= targets[0] and r["itl99"] <= targets[1] else (lo, mid)
    return hi

def schedule_step(running, queue, device, budget=256, max_running=256):
    return sched.chunked_step(running, queue, device, budget=budget, max_running=max_running)

def schedule_oldest(running, queue, device, budget=256, max_running=256):
    return _variant_step(running, queue, device, budget, max_running, evict_newest=False)

def generate_with_cache(model, prompt, max_new_tokens):
    tokens, logits = generate_cached(model, prompt, max_new_tokens)
    return tokens.tolist(), logits

def generate_recompute(model, prompt, max_new_tokens):
    tokens, logits = generate_full_recompute(model, prompt, max_new_tokens)
    return tokens, logits

def raises_value_error(config):
    raise ValueError("not today")

class EvilTensor(torch.Tensor):
    pass

def apply_rope_evil(x, positions, theta):
    return torch.zeros_like(x).as_subclass(EvilTensor)

class Rigged:
    def __eq__(self, other):
        return True

def count_rigged(config):
    return (Rigged(), Rigged())

def sleepy(config):
    time.sleep(60)

not_a_function = 42

def kv_cache_bytes(config, positions, bytes_per_value):
    return 2 * config.n_layers * config.n_kv_heads * config.head_dim * bytes_per_value * positions

def measured_length_trick(cache):       # rewrites the checker's input, then matches it
    cache.length = 0
    return 0

def paged_append_zeroing(pool, seq, k, v):  # allocates like the reference, stores nothing, zeroes its inputs
    bs, n, w = pool.block_size, k.shape[0], 0
    while w < n:
        off = seq.length % bs
        if off == 0:
            seq.block_table.append(pool.allocate())
        elif pool.ref_counts[seq.block_table[-1]] > 1:
            old, new = seq.block_table[-1], pool.allocate()
            pool.decref(old)
            seq.block_table[-1] = new
        m = min(bs - off, n - w)
        seq.length += m
        w += m
    k.zero_()
    v.zero_()
'''

PREFILL_CELL = """lab01.check_prefill_time({fn}, seed=0)
### BEGIN HIDDEN TESTS
lab01.check_prefill_time({fn}, seed=fresh_seed(), cases=12)
### END HIDDEN TESTS
"""


class Kernel:
    """A local ipykernel with its own client for running learner cells."""

    def __init__(self, cwd):
        from jupyter_client import KernelManager

        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(cwd=str(cwd))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        self.session = None

    def run(self, code: str, ok: bool = True) -> dict:
        reply = self.kc.execute_interactive(code, timeout=120, output_hook=lambda msg: None)
        if ok:
            assert reply["content"]["status"] == "ok", reply["content"]
        return reply["content"]

    def judge(self, source: str, **kwargs) -> dict:
        if self.session is None or not self.session.usable:
            self.session = judge.KernelSession.connect(self.km.get_connection_info(session=False),
                                                       interrupt=self.km.interrupt_kernel,
                                                       is_alive=self.km.is_alive, interrupt_grace=10)
        kwargs.setdefault("seed", 1234)
        return judge.judge_cell(self.session, source, grade_id=kwargs.pop("grade_id", "t"), **kwargs)

    def close(self):
        if self.session is not None:
            self.session.shutdown()
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


@pytest.fixture(scope="module")
def learner(tmp_path_factory):
    kernel = Kernel(tmp_path_factory.mktemp("learner"))
    kernel.run(LEARNER)
    yield kernel
    kernel.close()


@pytest.mark.slow
def test_prefill_time_right_passes_wrong_fails_with_the_named_fault(learner):
    verdict = learner.judge(PREFILL_CELL.format(fn="prefill_time"))
    assert verdict["status"] == "passed", verdict
    assert [c["calls"] for c in verdict["checks"]] == [6, 12]
    verdict = learner.judge(PREFILL_CELL.format(fn="prefill_no_mfu"))
    assert verdict["status"] == "failed" and "MFU left out" in verdict["message"]
    assert "case 0: L " in verdict["message"]            # the visible check says everything
    hidden = learner.judge("### BEGIN HIDDEN TESTS\nlab01.check_prefill_time(prefill_no_mfu, seed=fresh_seed())\n"
                           "### END HIDDEN TESTS\n")
    assert hidden["status"] == "failed" and "(hidden test)" in hidden["message"]
    assert "MFU left out" in hidden["message"] and "ratio got/expected" in hidden["message"]
    assert " L " not in hidden["message"] and "TFLOP/s" not in hidden["message"]
    assert "expected #, got #" in hidden["message"]


@pytest.mark.slow
def test_reference_reuse_missing_and_non_function_names(learner):
    verdict = learner.judge("lab01.check_prefill_time(prefill_reference, seed=0)")
    assert verdict["status"] == "failed" and "course_lib's reference" in verdict["message"]
    verdict = learner.judge("lab01.check_prefill_time(no_such_function, seed=0)")
    assert verdict["status"] == "failed" and "not defined" in verdict["message"]
    verdict = learner.judge("lab01.check_prefill_time(not_a_function, seed=0)")
    assert verdict["status"] == "failed" and "must be a function" in verdict["message"]
    verdict = learner.judge("lab01.check_parameter_count(raises_value_error, seed=0)")
    assert verdict["status"] == "failed" and "raised ValueError: not today" in verdict["message"]


@pytest.mark.slow
def test_count_parameters(learner):
    source = ("lab01.check_parameter_count({fn}, seed=0)\n### BEGIN HIDDEN TESTS\n"
              "lab01.check_parameter_count({fn}, seed=fresh_seed(), cases=12)\n### END HIDDEN TESTS\n")
    assert learner.judge(source.format(fn="count_parameters"))["status"] == "passed"
    verdict = learner.judge(source.format(fn="count_untied"))
    assert verdict["status"] == "failed" and "untied input embedding counted in N_matmul" in verdict["message"]
    verdict = learner.judge(source.format(fn="count_rigged"))
    assert verdict["status"] == "failed" and "must be an int, got __main__.Rigged" in verdict["message"]


@pytest.mark.slow
def test_attend_with_cache_writes_in_place(learner):
    source = ("lab02.check_attention_step({fn}, seed=0)\n### BEGIN HIDDEN TESTS\n"
              "lab02.check_attention_step({fn}, seed=fresh_seed(), cases=8)\n### END HIDDEN TESTS\n")
    assert learner.judge(source.format(fn="attend_with_cache"))["status"] == "passed"
    verdict = learner.judge(source.format(fn="attend_misaligned"))
    assert verdict["status"] == "failed" and "KV-head repeat misaligned" in verdict["message"]
    verdict = learner.judge(source.format(fn="attend_no_write"))   # right output, cache never written
    assert verdict["status"] == "failed" and "KV cache after the step" in verdict["message"]
    assert "changed no slot" in verdict["message"]
    verdict = learner.judge(source.format(fn="attend_zeroes_its_query"))   # writes an argument it does not own
    assert verdict["status"] == "failed" and "changed its tensor argument 1 in place" in verdict["message"], verdict


@pytest.mark.slow
def test_paged_append_and_read(learner):
    source = ("lab02.check_paged({fn}, paged_read, seed=0)\n### BEGIN HIDDEN TESTS\n"
              "lab02.check_paged({fn}, paged_read, seed=fresh_seed(), cases=4)\n### END HIDDEN TESTS\n")
    verdict = learner.judge(source.format(fn="paged_append"))
    assert verdict["status"] == "passed", verdict
    verdict = learner.judge(source.format(fn="paged_append_no_cow"))
    assert verdict["status"] == "failed" and "copy-on-write" in verdict["message"]
    verdict = learner.judge(source.format(fn="paged_append_grows"))     # the refusal crosses the judge as a ValueError
    assert verdict["status"] == "failed" and "the cache grew past its context" in verdict["message"], verdict


@pytest.mark.slow
def test_find_capacity_calls_back_into_the_judge(learner):
    source = ("lab03.check_find_capacity({fn}, seed=0)\n### BEGIN HIDDEN TESTS\n"
              "lab03.check_find_capacity({fn}, seed=fresh_seed(), cases=8)\n### END HIDDEN TESTS\n")
    verdict = learner.judge(source.format(fn="find_capacity"))
    assert verdict["status"] == "passed", verdict
    assert verdict["checks"][0]["callbacks"] >= 10 + 3 * 4      # one per probed rate: run(rate) is judge-side
    verdict = learner.judge(source.format(fn="find_capacity_upper"))
    assert verdict["status"] == "failed" and "the upper bound returned" in verdict["message"]


@pytest.mark.slow
def test_schedule_step_and_the_simulation_it_drives(learner):
    source = ("lab03.check_schedule_step({fn}, seed=0)\n### BEGIN HIDDEN TESTS\n"
              "lab03.check_schedule_step({fn}, seed=fresh_seed(), cases=16)\n### END HIDDEN TESTS\n")
    verdict = learner.judge(source.format(fn="schedule_step"))
    assert verdict["status"] == "passed", verdict
    assert sum(c["calls"] for c in verdict["checks"]) > 50          # the simulation drives it step by step
    verdict = learner.judge(source.format(fn="schedule_oldest"))
    assert verdict["status"] == "failed" and "oldest running request evicted" in verdict["message"]


@pytest.mark.slow
def test_generation_token_counts_reach_the_judges_hooks(learner):
    source = "lab02.check_generation({fn}, seed=5, max_new_tokens=8)"
    assert learner.judge(source.format(fn="generate_with_cache"))["status"] == "passed"
    verdict = learner.judge(source.format(fn="generate_recompute"))
    assert verdict["status"] == "failed" and "token ids went through the model" in verdict["message"]


@pytest.mark.slow
def test_blocks_forward_sends_real_weights_through_the_channel(learner):
    """Lab 2's blocks check: SmolLM2's projections (about 3.5 MB each) cross to the kernel as plain data,
    the judge's own SmolLM2 stands in for the notebook's ``smollm2``, and a fault is named through the
    channel as in the kernel."""
    import solutions

    source = solutions.solution_sources("02_kv_cache")["blocks_forward"]
    learner.run(source)
    cell = "lab02.check_blocks_forward(rms_norm, swiglu, seed=0, model=smollm2)"
    verdict = learner.judge(cell)
    assert verdict["status"] == "passed", verdict
    assert [c.get("reached") for c in verdict["checks"]] == [[]], verdict        # no reference ran
    learner.run(source.replace("(gate * torch.sigmoid(gate) * up)", "(gate * torch.sigmoid(gate) + up)"))
    verdict = learner.judge(cell)
    assert verdict["status"] == "failed" and "silu(gate(x)) + up(x)" in verdict["message"], verdict
    learner.run(source + "\n\nfrom course_lib.models import ops as _ops\n\n\ndef rms_norm(x, weight, eps):\n"
                "    return _ops.rms_norm(x, weight, eps) + 0\n")
    verdict = learner.judge(cell)                                   # a wrapper passes, and is seen reaching it
    assert verdict["status"] == "passed" and "course_lib.models.ops.rms_norm" in verdict["checks"][0]["reached"]


@pytest.mark.slow
def test_changes_to_inputs_the_checker_does_not_expect_are_not_mirrored(learner):
    """Two tricks that once passed these checkers in-process: rewriting the input a checker reads
    after the call, and zeroing the K/V that check_paged also used as the truth. The checkers now
    read before the call and hand out clones; independently, the judge mirrors only the arguments
    a checker expects to change (the contract's writes), so both tricks fail there too."""
    for source in ("lab02.check_kv_cache_bytes(kv_cache_bytes, measured_length_trick, seed=0)",
                   "lab02.check_paged(paged_append_zeroing, paged_read, seed=0)"):
        verdict = learner.judge(source)
        assert verdict["status"] == "failed", (source, verdict)
    assert learner.judge("lab02.check_kv_cache_bytes(kv_cache_bytes, lambda_free_measure, seed=0)"
                         )["status"] == "failed"           # (not defined: sanity)


@pytest.mark.slow
def test_a_tensor_subclass_is_refused(learner):
    verdict = learner.judge("lab02.check_apply_rope(apply_rope_evil, seed=0)")
    assert verdict["status"] == "failed" and "EvilTensor" in verdict["message"]


@pytest.mark.slow
def test_a_slow_call_times_out_and_the_kernel_stays_usable(learner):
    start = time.monotonic()
    verdict = learner.judge("lab01.check_parameter_count(sleepy, seed=0)", call_timeout=2.0)
    assert verdict["status"] == "failed" and "did not return within" in verdict["message"]
    assert time.monotonic() - start < 20
    assert learner.judge(PREFILL_CELL.format(fn="prefill_time"))["status"] == "passed"
    learner.run("assert 1 + 1 == 2")


@pytest.mark.slow
def test_input_during_a_call_fails_the_check_and_the_kernel_stays_usable(learner):
    learner.run("def count_asks(config):\n    return int(input('how many? '))\n"
                "def count_raw(config):\n    return int(get_ipython().kernel.raw_input('how many? ') or 0)\n")
    verdict = learner.judge("lab01.check_parameter_count(count_asks, seed=0)")
    assert verdict["status"] == "failed" and "StdinNotImplementedError" in verdict["message"], verdict
    assert "grader calls your function" in verdict["message"]
    start = time.monotonic()
    verdict = learner.judge("lab01.check_parameter_count(count_raw, seed=0)")   # straight to the stdin channel
    assert verdict["status"] == "failed", verdict
    assert "count_raw asked for input ('how many? ') while the grader called it" in verdict["message"]
    assert time.monotonic() - start < 20
    assert learner.judge(PREFILL_CELL.format(fn="prefill_time"))["status"] == "passed"


FORGER = """
import json as _json
from course_grader import remote as _remote
_forging = [False]

def _answer_in_the_harness_place(first):
    ns, kernel = get_ipython().user_ns, get_ipython().kernel
    ask = lambda message: _json.loads(kernel.raw_input(_remote.PROMPT + _remote.dumps(message)))
    _forging[0] = True
    request = ask(first)
    while request.get("op") != "end":
        request = ask(_remote.answer_call(ns, request, ask) if request.get("op") == "call" else
                      {"op": "described", "names": {n: _remote._describe(ns, n) for n in request["names"]}})
    _forging[0] = False

def count_forged(config):
    value = count_parameters(config)
    if not _forging[0]:
        _answer_in_the_harness_place({"op": "returned", "value": value, "state": [], "probed": []})
    return value
"""


@pytest.mark.slow
def test_a_kernel_that_answers_in_the_harness_place_fails_the_cell(learner):
    """Learner code that answers the judge itself through the stdin channel (here with right values)
    leaves the real harness's answer for after the judge's "end": the cell fails, the kernel goes on."""
    learner.run(FORGER)
    verdict = learner.judge("lab01.check_parameter_count(count_forged, seed=0)")
    assert verdict["status"] == "failed", verdict
    assert "answered the judge in the harness's place" in verdict["message"]
    assert learner.judge("lab01.check_parameter_count(count_parameters, seed=0)")["status"] == "passed"


TAMPER = '''
import math, torch, builtins
import course_lib.grading.contracts as contracts
import course_lib.grading.lab01 as _lab01
lab01.check_prefill_time = lambda *a, **k: None
_lab01.check_prefill_time = lambda *a, **k: None
contracts.check_significant = lambda actual, expected, **k: float(actual)
_lab01.check_significant = contracts.check_significant
math.isclose = lambda *a, **k: True
torch.allclose = lambda *a, **k: True
torch.equal = lambda *a, **k: True
fresh_seed = lambda: 0
'''


@pytest.mark.slow
def test_patching_checkers_in_the_kernel_does_not_fool_the_judge(tmp_path):
    kernel = Kernel(tmp_path)
    try:
        kernel.run(LEARNER)
        kernel.run(TAMPER)
        cell = PREFILL_CELL.format(fn="prefill_no_mfu")
        assert kernel.run(cell)["status"] == "ok"        # in the kernel, the wrong function now "passes"
        verdict = kernel.judge(cell)
        assert verdict["status"] == "failed" and "MFU left out" in verdict["message"]
        assert kernel.judge(PREFILL_CELL.format(fn="prefill_time"))["status"] == "passed"
        attention = "lab02.check_attention_step(attend_misaligned, seed=0)"
        assert kernel.judge(attention)["status"] == "failed"
        # a forged harness: every result becomes 1.0 (it cannot know the judge's references)
        kernel.run("from course_grader import remote as _r\n"
                   "_r.ResultEncoder.encode = lambda self, value, depth=0: 1.0")
        verdict = kernel.judge(PREFILL_CELL.format(fn="prefill_time"))
        assert verdict["status"] == "failed", verdict
        # a broken base64 module: what the harness sends is malformed; an error, never a pass
        kernel.run("import base64\nbase64.b64encode = lambda *a, **k: b'%%%'")
        verdict = kernel.judge("lab02.check_attention_step(attend_with_cache, seed=0)")
        assert verdict["status"] == "error" and "ProtocolError" in verdict["message"], verdict
    finally:
        kernel.close()


@pytest.mark.slow
def test_a_kernel_that_dies_fails_the_rest_of_the_cell(tmp_path):
    kernel = Kernel(tmp_path)
    try:
        kernel.run("from course_lib.grading import lab01\nimport os\n"
                   "def count_parameters(config):\n    os._exit(3)\n")
        verdict = kernel.judge("lab01.check_parameter_count(count_parameters, seed=0)\n"
                               "lab01.check_parameter_count(count_parameters, seed=1)\n")
        assert verdict["status"] == "error" and "KernelDied" in verdict["message"], verdict
        assert [c["status"] for c in verdict["checks"]] == ["error", "skipped"]
        assert kernel.session.dead
    finally:
        kernel.close()


# == nbgrader: the Execute step and the gradebook ================================================
def _graded(source, grade_id, points=1):
    return nbformat.v4.new_code_cell(source, metadata={"nbgrader": {
        "grade": True, "grade_id": grade_id, "locked": True, "points": points, "schema_version": 3,
        "solution": False, "task": False}})


DIES_WHEN_JUDGED = """def dies(config):
    import sys
    frame = sys._getframe()
    while frame is not None:              # a learner who notices the judge and kills the kernel
        if frame.f_code.co_name == "answer_call":
            os._exit(1)
        frame = frame.f_back
    return count_parameters(config)
"""


SLEEPS_WHEN_JUDGED = DIES_WHEN_JUDGED.replace("def dies", "def sleeps").replace("os._exit(1)", "time.sleep(60)")


def _load_sandbox():
    from course_grader import sandbox

    return sandbox


@pytest.mark.slow
def test_judged_sandbox_execute(tmp_path):
    """CourseJudge, the sandbox's SandboxExecute that judges: its client reaches the sandboxed kernel
    (IPC); a cell only the kernel passed gets a JudgeVerdict error; a timed-out call is interrupted
    through the sandbox; a kernel killed while being judged follows the sandbox's rule (later cells
    not run, KernelDied)."""
    sandbox = _load_sandbox()
    ok, why = sandbox.sandbox_status()
    if not ok:
        pytest.skip(f"no sandbox here: {why}")
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell(LEARNER + DIES_WHEN_JUDGED + SLEEPS_WHEN_JUDGED),
        nbformat.v4.new_code_cell(TAMPER),
        _graded(PREFILL_CELL.format(fn="prefill_no_mfu"), "test_prefill", 2),
        _graded("lab01.check_parameter_count(sleeps, seed=0)", "test_sleeps", 1),
        _graded("lab03.check_find_capacity(find_capacity, seed=0)", "test_capacity", 1),
        _graded("lab01.check_parameter_count(dies, seed=0)\n### BEGIN HIDDEN TESTS\n"
                "lab01.check_parameter_count(dies, seed=fresh_seed())\n### END HIDDEN TESTS", "test_dies", 1),
        _graded("print('after')\nlab01.check_parameter_count(count_parameters, seed=0)", "test_after", 1),
    ])
    out = tmp_path / "verdicts.json"
    judge.CourseJudge(timeout=120, call_timeout=3, seed=7, verdict_path=str(out), kernel_name="python3").preprocess(
        nb, {"metadata": {"path": str(tmp_path)}})
    verdicts = {v["grade_id"]: v for v in json.loads(out.read_text())["cells"]}
    assert {k: v["status"] for k, v in verdicts.items()} == {
        "test_prefill": "failed", "test_sleeps": "failed", "test_capacity": "passed", "test_dies": "error",
        "test_after": "error"}
    assert verdicts["test_prefill"]["in_kernel_passed"] and verdicts["test_prefill"]["disagrees"]
    errors = [o for o in nb.cells[2].outputs if o.output_type == "error"]
    assert [o.ename for o in errors] == ["JudgeVerdict"] and "MFU left out" in errors[0].evalue
    assert not verdicts["test_capacity"]["disagrees"]
    assert "did not return within" in verdicts["test_sleeps"]["message"]
    # the kernel passed test_dies and died while being judged: an error, 0 points, later cells not run
    assert verdicts["test_dies"]["in_kernel_passed"] and "died" in verdicts["test_dies"]["message"]
    assert [o.ename for o in nb.cells[5].outputs if o.output_type == "error"] == ["JudgeVerdict"]
    assert [o.ename for o in nb.cells[6].outputs if o.output_type == "error"] == [sandbox.KERNEL_DIED]
    assert not any("after" in o.get("text", "") for o in nb.cells[6].outputs)


def test_read_verdicts_keeps_records_where_they_belong_and_lists_the_disagreements(tmp_path):
    record = {"student": "ann", "assignment": "01_roofline", "notebook": "01_roofline", "cells": [
        {"grade_id": "a", "status": "failed", "in_kernel_passed": True, "message": "MFU left out", "points": 2,
         "disagrees": True},
        {"grade_id": "b", "status": "passed", "in_kernel_passed": False, "message": "", "points": 3, "disagrees": True},
        {"grade_id": "c", "status": "passed", "in_kernel_passed": True, "message": "", "points": 1, "disagrees": False},
        {"grade_id": "d", "status": "unjudged", "in_kernel_passed": True, "message": "", "points": 1,
         "disagrees": False},
    ]}
    path = tmp_path / "autograded" / "ann" / "01_roofline" / ("01_roofline" + judge.VERDICT_SUFFIX)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(record))
    forged = dict(record, cells=[dict(c, status="passed") for c in record["cells"]])
    (path.parent / ("other" + judge.VERDICT_SUFFIX)).write_text(json.dumps(forged))   # names another notebook
    (path.parent.parent / ("01_roofline" + judge.VERDICT_SUFFIX)).write_text(json.dumps(forged))  # wrong folder
    records = judge.read_verdicts(tmp_path / "autograded")
    assert [r["path"] for r in records] == [str(path)]
    assert judge.read_verdicts(tmp_path / "autograded", student="bob") == []
    flagged = judge.disagreements(records)
    assert [(f["cell"], f["in_kernel"], f["judge"], f["points"], f["score"]) for f in flagged] == [
        ("a", "passed", "failed", 2, 0.0), ("b", "failed", "passed", 3, 0.0)]
    assert flagged[0]["learner"] == "ann" and flagged[0]["message"] == "MFU left out"


def test_configure_nbgrader_puts_the_judge_in_the_execute_step_in_either_order():
    from nbgrader.preprocessors import Execute, SaveAutoGrades
    from traitlets.config import Config

    from course_grader import sandbox

    for order in ((sandbox.configure_nbgrader, judge.configure_nbgrader),
                  (judge.configure_nbgrader, sandbox.configure_nbgrader)):
        c = Config()
        c.Autograde.autograde_preprocessors = [Execute, SaveAutoGrades]
        for configure in order:
            configure(c)
        assert c.Autograde.autograde_preprocessors == [judge.CourseJudge, SaveAutoGrades]
    c = Config()
    assert judge.configure_nbgrader(c) is judge.CourseJudge                  # nbgrader's default list
    assert judge.CourseJudge in c.Autograde.autograde_preprocessors
    c.Autograde.autograde_preprocessors = [SaveAutoGrades]
    with pytest.raises(sandbox.SandboxError, match="no Execute step"):
        judge.configure_nbgrader(c)
    lines = "\n".join(judge.nbgrader_config_lines())
    assert "configure_nbgrader(c)" in lines and "from course_grader import judge" in lines


@pytest.mark.slow
def test_nbgrader_autograde_with_the_judge(tmp_path):
    """Stock `nbgrader autograde` with the judge configured: a tampering learner scores 0 on the
    test it tampered with, the test source comes from the gradebook, and the driver step flags it.
    The source's demonstration cell (which would kill the kernel) is not run."""
    course = tmp_path / "course"
    lab = "01_judge"
    source = course / "source" / lab
    source.mkdir(parents=True)
    setup = nbformat.v4.new_code_cell("from course_lib.grading import fresh_seed, lab01\nfrom course_lib import roofline")
    solution = nbformat.v4.new_code_cell(
        "def prefill_time(config, device, tokens, mfu=0.5):\n    ### BEGIN SOLUTION\n"
        "    L, d = config.n_layers, config.n_heads * config.head_dim\n"
        "    return (2 * roofline.n_matmul(config) * tokens + 2 * L * d * tokens ** 2) / (mfu * device.peak_flops)\n"
        "    ### END SOLUTION",
        metadata={"nbgrader": {"grade": False, "grade_id": "prefill", "locked": False, "schema_version": 3,
                               "solution": True, "task": False}})
    # a demonstration that would kill the kernel before the test: stock autograde must skip it
    demonstration = nbformat.v4.new_code_cell("import os\nos._exit(1)", metadata={"tags": ["demonstration"]})
    test = _graded(PREFILL_CELL.format(fn="prefill_time"), "test_prefill", 2)
    for cell, role in ((setup, "setup"), (solution, "exercise"), (test, "check")):
        cell.metadata["tags"] = [role]
    nb = nbformat.v4.new_notebook(cells=[setup, solution, demonstration, test])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(source / f"{lab}.ipynb"))
    (course / "nbgrader_config.py").write_text("\n".join([
        "import os", "c = get_config()",
        f"load_subconfig('nbgrader_config.py', {str(REPO / 'autograder')!r})",
        "_root = os.path.dirname(os.path.abspath(__file__))", "c.CourseDirectory.root = _root",
        "c.CourseDirectory.source_directory = 'source'", "c.CourseDirectory.release_directory = 'release'",
        "c.CourseDirectory.submitted_directory = 'submitted'", "c.CourseDirectory.autograded_directory = 'autograded'",
        "c.CourseDirectory.db_url = 'sqlite:///' + os.path.join(_root, 'gradebook.db')",
        "c.CourseJudge.call_timeout = 30",
        *judge.nbgrader_config_lines()]) + "\n")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "COURSE_GRADING_SEED": "5"}

    def nbgrader(*args):
        proc = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    nbgrader("generate_assignment", lab, "--force")
    release = nbformat.read(str(course / "release" / lab / f"{lab}.ipynb"), as_version=4)
    right = solution.source.replace("    ### BEGIN SOLUTION\n", "").replace("    ### END SOLUTION", "")
    signature = "def prefill_time(config, device, tokens, mfu=0.5):\n"
    learners = {
        "honest": right,
        "tamperer": signature + "    return 1.0\n" + textwrap.dedent(TAMPER),
        # a wrong answer that makes IPython display the number 2 in the test cell (stock nbgrader
        # would take it for the cell's score)
        "displayed": signature + "    import sys\n    sys.displayhook(2)\n    return 1.0\n",
        # an unfinished exercise whose message UTF-8 cannot encode (a lone surrogate)
        "surrogate": signature + "    raise ValueError('not done yet \\ud800')\n",
        # a right answer, then builtins replaced under the kernel: its messages fail verification
        "breach": right + "\n" + hostile.BREAK_THE_KERNEL,
    }
    for learner, text in learners.items():
        copy = nbformat.from_dict(json.loads(json.dumps(release)))
        copy.cells[1].source = text
        folder = course / "submitted" / learner / lab
        folder.mkdir(parents=True)
        nbformat.write(copy, str(folder / f"{lab}.ipynb"))
        nbgrader("autograde", lab, "--student", learner)
    from nbgrader.api import Gradebook

    db = f"sqlite:///{course / 'gradebook.db'}"
    with Gradebook(db) as gb:
        scores = {learner: gb.find_grade("test_prefill", lab, lab, learner).auto_score for learner in learners}
    assert scores == {"honest": 2, "tamperer": 0, "displayed": 0, "surrogate": 0, "breach": 0}

    def outputs(learner):
        nb = nbformat.read(str(course / "autograded" / learner / lab / f"{lab}.ipynb"), as_version=4)
        return [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]

    assert preprocessors.SKIPPED_NOTE in [o.get("text") for o in outputs("honest")]   # the demonstration
    # the autograded notebook was written (stock nbgrader deletes it when writing fails) and shows
    # the failure; ipykernel itself may replace a message it cannot encode by its encoding error
    errors = [o.evalue for o in outputs("surrogate") if o.output_type == "error"]
    assert any("ud800" in e for e in errors), errors
    died = [o.evalue for o in outputs("breach") if o.output_type == "error" and o.ename == "KernelDied"]
    assert died and sandbox.PROTOCOL_BROKEN in died[0], died    # not a timeout
    records = judge.read_verdicts(course / "autograded")
    statuses = {r["student"]: r["cells"][0]["status"] for r in records}
    assert statuses == {"honest": "passed", "tamperer": "failed", "displayed": "failed", "surrogate": "failed",
                        "breach": "error"}
    flagged = judge.disagreements(records)
    assert [(f["learner"], f["in_kernel"], f["judge"]) for f in flagged] == [("tamperer", "passed", "failed")]


def test_a_message_that_would_balloon_when_parsed_is_refused_before_parsing():
    """Nested empty lists cost ~60 bytes each once parsed: a message with more JSON elements than
    the item limit allows is refused from a count of its brackets and commas, quickly."""
    bomb = "[" + "[]," * (2 * remote.LIMITS.max_items) + "[]]"
    start = time.monotonic()
    with pytest.raises(remote.RemoteDataError, match="JSON elements"):
        remote.loads(bomb)
    assert time.monotonic() - start < 5
    assert remote.loads("[" + "[]," * 1000 + "[]]")[0] == []   # a normal message still parses


def test_verdict_records_are_never_copied_by_nbgrader(tmp_path):
    """The course config keeps nbgrader from copying *.judge.json between its folders: not into
    the feedback (the record holds the judge's seed), not from a submission into the autograded
    folder (a forged record)."""
    from nbgrader.utils import find_all_files
    from traitlets.config import Config

    from course_grader.config import configure

    c = Config()
    configure(c, root=str(tmp_path))
    (tmp_path / f"lab{judge.VERDICT_SUFFIX}").write_text("{}")
    (tmp_path / "data.txt").write_text("kept")
    found = {os.path.basename(f) for f in find_all_files(str(tmp_path), c.CourseDirectory.ignore + ["*.ipynb"])}
    assert "data.txt" in found and f"lab{judge.VERDICT_SUFFIX}" not in found


KERNEL_LEARNER = '''
import os
import sys
os.environ.setdefault("TRITON_INTERPRET", "1")
import torch
from course_lib.grading import lab01
from course_lib.kernels.exercise import triton, tl

''' + (Path(__file__).parent / "kernel_attacks" / "honest_reduce.py").read_text().replace(   # a helper, and a print
    "    tl.store(", "    print(\"a kernel may print\", y)\n    tl.store(") + '''

@triton.jit
def stub_kernel(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    tl.store(y_ptr + rows, tl.zeros((BLOCK_M,), dtype=tl.float32), mask=rows < M)

@triton.jit
def endless_kernel(w_ptr, x_ptr, y_ptr, M, N, stride_wm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    i = 0
    while i < 1:
        i = i * 1

_clone = torch.Tensor.clone

def _answer(self, *args, **kwargs):     # the launcher's last step clones y: write W @ x into it first
    frame = sys._getframe(1)
    while frame is not None and "y_view" not in frame.f_locals:
        frame = frame.f_back
    if frame is not None:
        frame.f_locals["y_view"].copy_(frame.f_locals["W"].float() @ frame.f_locals["x"].float())
    return _clone(self, *args, **kwargs)

torch.Tensor.clone = _answer
'''


@pytest.mark.slow
def test_a_kernel_exercise_is_launched_in_a_process_the_notebook_cannot_change(tmp_path):
    """The notebook replaced torch.Tensor.clone, which the launcher calls: in its own process a stub kernel
    passes. The judge launches the kernel from its source in a process of its own (course_grader.kernel_runner):
    the stub fails there, an honest kernel that prints passes, an endless one times out and the next launch
    starts a new process."""
    kernel = Kernel(tmp_path)
    try:
        kernel.run(KERNEL_LEARNER)
        assert kernel.run("lab01.check_gemv_kernel(stub_kernel)")["status"] == "ok"     # the attack works in place
        verdict = kernel.judge("lab01.check_gemv_kernel(stub_kernel)")
        assert verdict["status"] == "failed" and "y[0] = 0, expected" in verdict["message"], verdict
        verdict = kernel.judge("lab01.check_gemv_kernel(gemv_kernel)")
        assert verdict["status"] == "passed" and kernel.session.runner.started == 1
        assert verdict["speed"] == {"measured": False, "text": NOT_MEASURED}       # the interpreter: no speed
        verdict = kernel.judge("lab01.check_gemv_kernel(endless_kernel)", call_timeout=8.0)
        assert verdict["status"] == "failed" and "did not return within the time limit" in verdict["message"], verdict
        assert kernel.judge("lab01.check_gemv_kernel(gemv_kernel)")["status"] == "passed"
        assert kernel.session.runner.started == 2
        verdict = kernel.judge("lab01.check_gemv_kernel(_answer)")       # refused where it was defined, as before
        assert verdict["status"] == "failed" and "must be a function decorated with @triton.jit" in verdict["message"]
        # a forged export that answers in the launch's place (what a launch returns, with no launch)
        kernel.run("from course_grader import remote as _r\n"
                   "_r.answer_export = lambda ns, request: {'op': 'returned', 'value': 1.0}")
        verdict = kernel.judge("lab01.check_gemv_kernel(gemv_kernel)")
        assert verdict["status"] == "error" and "answered the export of gemv_kernel with 'returned'" in verdict["message"]
    finally:
        kernel.close()


def test_kernel_speed_is_the_largest_timed_launch_against_the_measured_bandwidth_or_not_measured():
    assert judge.kernel_speed([]) is None
    interpreted = {"mode": "interpreter", "bytes": 4096, "seconds": None, "bandwidth_gbps": None}
    assert judge.kernel_speed([interpreted] * 3) == {"measured": False, "text": NOT_MEASURED}
    timed = [{"mode": "compiled", "bytes": 10 ** 9, "seconds": 0.004, "bandwidth_gbps": 3000.0},
             {"mode": "compiled", "bytes": 10 ** 6, "seconds": 1e-5, "bandwidth_gbps": 3000.0}]
    speed = judge.kernel_speed(timed)
    assert speed["measured"] and speed["gbps"] == 250.0 and speed["bytes"] == 10 ** 9
    assert speed["text"].startswith("250 GB/s, 8% of the 3000 GB/s measured")
    for bad in ("fast", float("nan"), -1.0, 0, True):     # what a report that is not a measurement holds
        assert judge.kernel_speed([dict(timed[0], seconds=bad)])["measured"] is False
