"""Reference learner functions for the Lab 2 checker tests (the notebook solution, in plain Python)."""
import math, copy, torch
def apply_rope(x, positions, theta=10000.0):
    D = x.shape[-1]
    omega = 1.0 / theta ** (torch.arange(0, D, 2, dtype=torch.float32) / D)
    angles = positions.to(torch.float32)[..., None] * omega
    angles = angles[None, None] if positions.dim() == 1 else angles[:, None]
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

def attend_with_cache(q, k_new, v_new, k_cache, v_cache, start):
    T = q.shape[-2]
    k_cache[:, :, start:start + T] = k_new
    v_cache[:, :, start:start + T] = v_new
    group = q.shape[1] // k_cache.shape[1]
    k = k_cache[:, :, :start + T].repeat_interleave(group, dim=1)
    v = v_cache[:, :, :start + T].repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    mask = torch.arange(start + T)[None, :] > (torch.arange(T)[:, None] + start)
    return scores.masked_fill(mask, float("-inf")).softmax(-1) @ v

@torch.no_grad()
def generate_with_cache(model, prompt, max_new_tokens):
    cache = model.new_cache(1, prompt.numel() + max_new_tokens)
    logits = model(prompt.view(1, -1), torch.arange(prompt.numel()), cache)[0, -1]
    tokens, all_logits = [], []
    for i in range(max_new_tokens):
        nxt = int(logits.argmax()); tokens.append(nxt); all_logits.append(logits)
        if i + 1 < max_new_tokens:
            logits = model(torch.tensor([[nxt]]), torch.tensor([cache.length]), cache)[0, -1]
    return tokens, torch.stack(all_logits)

def kv_cache_bytes(config, positions, bytes_per_value=4):
    return 2 * config.n_layers * config.n_kv_heads * config.head_dim * bytes_per_value * positions

def measured_kv_bytes(cache):
    per_slot = cache.k[:, :, :, :1].numel() * cache.k.element_size()
    return 2 * per_slot * cache.length

def first_divergence(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y: return i
    return None if len(a) == len(b) else min(len(a), len(b))

@torch.no_grad()
def score_suffixes(model, prefix, suffixes):
    cache = model.new_cache(1, prefix.numel() + max(s.numel() for s in suffixes))
    model(prefix.view(1, -1), torch.arange(prefix.numel()), cache)
    out = []
    for s in suffixes:
        cache.crop(prefix.numel())
        pos = torch.arange(prefix.numel(), prefix.numel() + s.numel())
        out.append(model(s.view(1, -1), pos, cache)[0, -1])
    return out
def paged_append(pool, seq, k, v):
    bs = pool.block_size
    for t in range(k.shape[0]):
        offset = seq.length % bs
        if offset == 0:
            seq.block_table.append(pool.allocate())
        elif pool.ref_counts[seq.block_table[-1]] > 1:
            old, new = seq.block_table[-1], pool.allocate()
            pool.k[new, :offset] = pool.k[old, :offset]; pool.v[new, :offset] = pool.v[old, :offset]
            pool.decref(old); seq.block_table[-1] = new
        block = seq.block_table[-1]
        pool.k[block, offset] = k[t]; pool.v[block, offset] = v[t]; seq.length += 1
def paged_read(pool, seq):
    ids = torch.tensor(seq.block_table, dtype=torch.long)
    return pool.k[ids].reshape(-1, *pool.k.shape[2:])[:seq.length], pool.v[ids].reshape(-1, *pool.v.shape[2:])[:seq.length]
def paged_append_nocow(pool, seq, k, v):
    bs = pool.block_size
    for t in range(k.shape[0]):
        offset = seq.length % bs
        if offset == 0: seq.block_table.append(pool.allocate())
        block = seq.block_table[-1]
        pool.k[block, offset] = k[t]; pool.v[block, offset] = v[t]; seq.length += 1
