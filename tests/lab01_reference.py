"""Reference learner functions for the Lab 1 checker tests (the notebook solution, in plain Python)."""
import math
def count_parameters(config):
    d, L = config.d_model, config.n_layers
    q, kv = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
    block = d * q + 2 * d * kv + q * d + 3 * d * config.d_ff + 2 * d
    table = config.vocab_size * d
    n = L * block + d + table + (0 if config.tie_embeddings else table)
    n_matmul = n - (0 if config.tie_embeddings else table)
    return n, n_matmul
def kv_bytes_per_token(config, bytes_per_value=2):
    return 2 * config.n_layers * config.n_kv_heads * config.head_dim * bytes_per_value
def prefill_time(config, device, tokens, mfu=0.5):
    _, nmm = count_parameters(config)
    flops = 2 * nmm * tokens + 2 * config.n_layers * config.d_model * tokens ** 2
    return flops / (mfu * device.dense_tflops * 1e12)
def decode_step_bound(config, device, batch, context, weight_bytes, kv_bytes_per_value=2):
    _, nmm = count_parameters(config)
    memory = (weight_bytes + batch * kv_bytes_per_token(config, kv_bytes_per_value) * context) / (device.bandwidth_tbps * 1e12)
    compute = (2 * nmm * batch + 4 * config.n_layers * config.d_model * batch * context) / (device.dense_tflops * 1e12)
    return max(memory, compute)
def gemv_intensity(m, n, b):
    return 2 * m * n / (b * (m * n + m + n))
def gemm_intensity(m, n, B, b):
    return 2 * m * n * B / (b * (m * n + n * B + m * B))
def requests_that_fit(config, device, weight_bytes, prompt_tokens, output_tokens, overhead_gb=2.5):
    free = device.capacity_gb * 1e9 - weight_bytes - overhead_gb * 1e9
    return max(0, math.floor(free / (kv_bytes_per_token(config, 2) * (prompt_tokens + output_tokens))))
