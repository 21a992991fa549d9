"""The model runner: one batched forward of the reference decoder over the paged KV cache.

An iteration's chunks (one per scheduled sequence: k new positions on top of its cached ones) are
packed into one row of N = sum(k) tokens, as nano-vllm and vLLM do, so every projection runs once
for the whole batch and reads each weight once. Per layer (``Block.qkv`` -> write -> attention ->
``Block.finish``):

- the N new K/V rows go to their slots in the layer's block storage (``write_slots``);
- decode chunks (k = 1) attend together through ``paged_decode_attention`` (the PyTorch gather on
  CPU, the Triton kernel on CUDA), with block tables padded to the widest row;
- prefill chunks (k > 1) attend one at a time over their gathered blocks with the causal rule of
  ``models.attention.attend`` (queries at positions start .. start + k - 1);
- every operation goes through ``models.ops``, so in batch-invariant mode (Lab 6,
  ``Decoder.batch_invariant_mode``) the projections, norms and attention are the fixed-order ones;
  the batched paged decode function has no fixed-order version, so in that mode decode chunks too
  attend one at a time over their gathered blocks (``ops.attention``), and each sequence's logits
  are bitwise those it gets served alone.

Logits are computed only at the last position of the chunks that complete their sequence's target
(the ones that yield a token).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence as Seq

import torch

from ..kernels.paged_attention import gather_blocks, paged_decode_attention_unchecked, write_slots
from ..models import ops
from ..models.decoder import Decoder

__all__ = ["ModelRunner", "ChunkInput"]


@dataclass(frozen=True)
class ChunkInput:
    """One chunk of an iteration: ``token_ids`` (k ids) at positions start .. start + k - 1, written to
    ``slots`` (flat block_id * block_size + offset, from ``BlockManager.reserve``) of a sequence whose
    block table (after the reservation) is ``block_table``; ``emit``: whether its last position's
    logits are wanted."""

    start: int
    token_ids: list[int]
    slots: list[int]
    block_table: list[int]
    emit: bool


class ModelRunner:
    """K/V block storage for every layer and the batched forward over it.

    Args:
        model: a ``Decoder`` (its dtype and device are the storage's).
        num_blocks, block_size: the pool's geometry (the ``BlockManager``'s).
        decode_attention: the batched paged decode function, called as ``f(q, k_cache, v_cache,
            block_tables, context_lens, max_context)`` (``kernels.paged_attention``'s
            ``paged_decode_attention_unchecked``, the PyTorch path, or ``paged_decode_kernel_unchecked``,
            the Triton kernel); None picks the kernel for a model on CUDA and the PyTorch path otherwise.

    Attributes:
        k_cache, v_cache: lists (one per layer) of (num_blocks, block_size, n_kv_heads, head_dim) tensors.
    """

    def __init__(self, model: Decoder, num_blocks: int, block_size: int,
                 decode_attention: Callable | None = None) -> None:
        c = model.config
        weight = model.embed_tokens.weight
        shape = (num_blocks, block_size, c.n_kv_heads, c.head_dim)
        self.model = model
        self.block_size = block_size
        self.k_cache = [torch.zeros(shape, dtype=weight.dtype, device=weight.device) for _ in range(c.n_layers)]
        self.v_cache = [torch.zeros(shape, dtype=weight.dtype, device=weight.device) for _ in range(c.n_layers)]
        if decode_attention is None:
            if weight.device.type == "cuda":
                from ..kernels.paged_attention import paged_decode_kernel_unchecked as decode_attention
            else:
                decode_attention = paged_decode_attention_unchecked
        self.decode_attention = decode_attention

    def storage_bytes(self) -> int:
        """Bytes of the K/V block storage of all layers."""
        return 2 * sum(t.numel() * t.element_size() for t in self.k_cache)

    @torch.no_grad()
    def run(self, chunks: Seq[ChunkInput]) -> torch.Tensor:
        """Run one iteration; returns float32 logits (n_emit, vocab), one row per chunk with ``emit``, in
        the order of ``chunks``."""
        model, device = self.model, self.model.embed_tokens.weight.device
        # Decodes first, then prefill chunks: the decodes' queries are then one contiguous slice.
        order = sorted(range(len(chunks)), key=lambda j: len(chunks[j].token_ids) > 1)
        packed = [chunks[j] for j in order]
        n_decode = sum(1 for ch in packed if len(ch.token_ids) == 1)
        ids = torch.tensor([t for ch in packed for t in ch.token_ids], dtype=torch.int64, device=device)
        positions = torch.cat([torch.arange(ch.start, ch.start + len(ch.token_ids)) for ch in packed]).to(device)
        slots = torch.tensor([s for ch in packed for s in ch.slots], dtype=torch.int64, device=device)
        tables = [torch.tensor(ch.block_table, dtype=torch.int32, device=device)[None] for ch in packed]
        decode = None
        if n_decode and not ops.batch_invariant_enabled():        # else decodes attend one at a time
            width = max(len(ch.block_table) for ch in packed[:n_decode])
            table = torch.zeros(n_decode, width, dtype=torch.int32)
            for i, ch in enumerate(packed[:n_decode]):
                table[i, :len(ch.block_table)] = torch.tensor(ch.block_table, dtype=torch.int32)
            lens = [ch.start + 1 for ch in packed[:n_decode]]
            decode = (table.to(device), torch.tensor(lens, dtype=torch.int64, device=device), max(lens))

        x = model.embed_tokens(ids[None])                                      # (1, N, d)
        rope = model.rotary(positions, 1)
        for layer, block in enumerate(model.layers):
            q, k, v = block.qkv(x, rope)                                       # (1, H, N, D)
            k_cache, v_cache = self.k_cache[layer], self.v_cache[layer]
            write_slots(k_cache, v_cache, k[0].transpose(0, 1), v[0].transpose(0, 1), slots)
            pieces, row = [], 0
            if decode is not None:
                out = self.decode_attention(q[0, :, :n_decode].transpose(0, 1), k_cache, v_cache, *decode)
                pieces.append(out.transpose(0, 1)[None])                     # (1, Hq, n_decode, D)
                row = n_decode
            for ch, table in zip(packed[row:], tables[row:]):
                n = len(ch.token_ids)
                keys = gather_blocks(k_cache, table, ch.start + n).transpose(1, 2)    # (1, Hkv, S, D)
                values = gather_blocks(v_cache, table, ch.start + n).transpose(1, 2)
                pieces.append(ops.attention(q[:, :, row:row + n], keys, values, ch.start))
                row += n
            x = block.finish(x, torch.cat(pieces, dim=2) if len(pieces) > 1 else pieces[0])

        ends, row = {}, 0
        for j, ch in zip(order, packed):
            row += len(ch.token_ids)
            if ch.emit:
                ends[j] = row - 1
        wanted = [ends[j] for j in range(len(chunks)) if j in ends]
        if not wanted:
            return torch.empty(0, model.config.vocab_size)
        return model.lm_head(model.norm(x[:, wanted]))[0].to(torch.float32)
