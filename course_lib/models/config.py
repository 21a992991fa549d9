"""Model configuration and parameter accounting for Llama-style decoders.

One dataclass describes both the random-weight toy decoder of Lab 2 and the real
SmolLM2 checkpoints. Parameter accounting follows course "Lab 1: roofline":
four attention projections (q: d x n_h*d_head, o: n_h*d_head x d, k, v: d x n_kv*d_head), three SwiGLU
projections (d x d_ff each), two RMSNorm vectors per block, a final norm, the input
embedding and (when untied) an output head.
"""
from __future__ import annotations

from dataclasses import dataclass, asdict


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a Llama-style decoder (pre-norm, GQA, split-half RoPE, SwiGLU).

    Attributes:
        n_layers: number of decoder blocks L.
        d_model: residual width d.
        n_heads: query heads.
        n_kv_heads: key/value heads; must divide ``n_heads`` (GQA group = n_heads // n_kv_heads).
        head_dim: width of one head; ``n_heads * head_dim`` is the q projection's output width.
        d_ff: SwiGLU hidden width.
        vocab_size: token vocabulary.
        tie_embeddings: output head shares the input embedding matrix.
        rope_theta: RoPE base (omega_i = theta^(-2i/head_dim)).
        norm_eps: RMSNorm epsilon.
        max_seq_len: longest sequence the caches are sized for, in positions.

    Raises:
        ValueError: a non-positive size, or ``n_kv_heads`` that does not divide ``n_heads``.
    """

    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    vocab_size: int
    tie_embeddings: bool = False
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    max_seq_len: int = 2048

    def __post_init__(self) -> None:
        for name in ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff",
                     "vocab_size", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"ModelConfig.n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads} "
                "(each KV head serves a whole group of query heads)")
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim must be even for RoPE pairs, got {self.head_dim}")
        if not self.rope_theta > 0:
            raise ValueError(f"ModelConfig.rope_theta must be > 0, got {self.rope_theta}")

    @property
    def group_size(self) -> int:
        """Query heads per KV head (n_heads // n_kv_heads)."""
        return self.n_heads // self.n_kv_heads

    def block_parameters(self) -> int:
        """Parameters of one decoder block: attention, SwiGLU and two RMSNorm vectors."""
        d, q_out, kv_out = self.d_model, self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        attention = d * q_out + 2 * d * kv_out + q_out * d
        mlp = 3 * d * self.d_ff
        return attention + mlp + 2 * d

    def parameters(self) -> int:
        """All parameters, counting a tied embedding once (course Lab 1)."""
        embed = self.vocab_size * self.d_model
        head = 0 if self.tie_embeddings else embed
        return self.n_layers * self.block_parameters() + self.d_model + embed + head

    def kv_bytes_per_token(self, bytes_per_value: int = 4) -> int:
        """KV-cache bytes one position costs: 2 (K and V) * L * n_kv * d_head * bytes."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * bytes_per_value

    def to_dict(self) -> dict:
        return asdict(self)


def toy_config(**overrides) -> ModelConfig:
    """The Lab 2 toy decoder: 4 blocks, width 256, 8 query / 2 KV heads of 32, SwiGLU 688,
    vocab 512, untied; 3,033,344 parameters (course Lab 2)."""
    fields = dict(n_layers=4, d_model=256, n_heads=8, n_kv_heads=2, head_dim=32, d_ff=688,
                  vocab_size=512, tie_embeddings=False, rope_theta=10000.0, norm_eps=1e-5,
                  max_seq_len=512)
    fields.update(overrides)
    return ModelConfig(**fields)


def smollm2_135m_config(**overrides) -> ModelConfig:
    """SmolLM2-135M: 30 layers, width 576, 9 query / 3 KV heads of 64, SwiGLU 1536,
    vocab 49,152, tied, RoPE theta 100,000; 134,515,008 parameters (README "Artifacts and offline use")."""
    fields = dict(n_layers=30, d_model=576, n_heads=9, n_kv_heads=3, head_dim=64, d_ff=1536,
                  vocab_size=49152, tie_embeddings=True, rope_theta=100000.0, norm_eps=1e-5,
                  max_seq_len=8192)
    fields.update(overrides)
    return ModelConfig(**fields)


def smollm2_360m_config(**overrides) -> ModelConfig:
    """SmolLM2-360M: 32 layers, width 960, 15 query / 5 KV heads of 64, SwiGLU 2560,
    vocab 49,152, tied, RoPE theta 100,000; 361,821,120 parameters (the checkpoint's
    config.json on the model hub, HuggingFaceTB/SmolLM2-360M)."""
    fields = dict(n_layers=32, d_model=960, n_heads=15, n_kv_heads=5, head_dim=64, d_ff=2560,
                  vocab_size=49152, tie_embeddings=True, rope_theta=100000.0, norm_eps=1e-5,
                  max_seq_len=8192)
    fields.update(overrides)
    return ModelConfig(**fields)


def config_from_hf(hf_config) -> ModelConfig:
    """Build a ModelConfig from a transformers ``LlamaConfig`` (or its ``to_dict()``)."""
    get = (lambda k, d=None: hf_config.get(k, d)) if isinstance(hf_config, dict) else \
        (lambda k, d=None: getattr(hf_config, k, d))
    n_heads = get("num_attention_heads")
    d_model = get("hidden_size")
    rope_theta = get("rope_theta")
    if rope_theta is None:  # transformers >= 5 keeps it in rope_parameters
        rope_theta = (get("rope_parameters") or {}).get("rope_theta", 10000.0)
    return ModelConfig(
        n_layers=get("num_hidden_layers"), d_model=d_model, n_heads=n_heads,
        n_kv_heads=get("num_key_value_heads") or n_heads,
        head_dim=get("head_dim") or d_model // n_heads, d_ff=get("intermediate_size"),
        vocab_size=get("vocab_size"), tie_embeddings=bool(get("tie_word_embeddings", False)),
        rope_theta=float(rope_theta), norm_eps=float(get("rms_norm_eps", 1e-5)),
        max_seq_len=int(get("max_position_embeddings", 2048)))
