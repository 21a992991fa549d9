"""Model configuration and parameter accounting for Llama-style decoders.

One dataclass describes both the random-weight toy decoder of Lab 2 and the real
SmolLM2 checkpoints. Parameter accounting follows course "Lab 1: roofline":
four attention projections (q: d x n_h*d_head, o: n_h*d_head x d, k, v: d x n_kv*d_head), three SwiGLU
projections (d x d_ff each), two RMSNorm vectors per block, a final norm, the input
embedding and (when untied) an output head.
"""
from __future__ import annotations

from dataclasses import dataclass, asdict
from numbers import Real

from ..validation import ArgumentTypeError, boolean, is_integer, positive_integer, positive_number


#: Largest ``max_seq_len`` accepted: float32 (in which RoPE angles are computed, as in Hugging
#: Face's Llama) represents every integer position exactly only up to 2**24 = 16,777,216; beyond
#: it neighbouring positions round to the same float and get the same rotation.
MAX_POSITIONS: int = 2 ** 24

_SIZE_FIELDS = ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff", "vocab_size", "max_seq_len")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a Llama-style decoder (pre-norm, GQA, split-half RoPE, SwiGLU).

    Attributes:
        n_layers: number of decoder blocks L.
        d_model: residual width d.
        n_heads: query heads.
        n_kv_heads: key/value heads; must divide ``n_heads`` (GQA group = n_heads // n_kv_heads).
        head_dim: width of one head, even (RoPE turns pairs); ``n_heads * head_dim`` is the q
            projection's output width.
        d_ff: SwiGLU hidden width.
        vocab_size: token vocabulary; token ids are 0 .. vocab_size - 1.
        tie_embeddings: output head shares the input embedding matrix (a bool).
        rope_theta: RoPE base (omega_i = theta^(-2i/head_dim)), a finite number > 0.
        norm_eps: RMSNorm epsilon, a finite number > 0.
        max_seq_len: longest sequence the model and its caches serve, in positions; valid
            positions are 0 .. max_seq_len - 1 (at most ``MAX_POSITIONS`` = 2**24).

    The size fields are stored as Python ints (a numpy integer is converted).

    Raises:
        ArgumentTypeError (a TypeError and a ValueError, see ``course_lib.validation``): a size
            that is not an int (bool and float included), a non-bool ``tie_embeddings``, a
            non-number ``rope_theta`` or ``norm_eps``.
        ValueError: a size < 1, ``max_seq_len`` > 2**24, an odd ``head_dim``, ``n_kv_heads``
            that does not divide ``n_heads``, ``rope_theta`` or ``norm_eps`` not > 0 and finite.
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
        for name in _SIZE_FIELDS:
            maximum, note = (MAX_POSITIONS, "float32 RoPE angles are exact only for positions up to 2**24") \
                if name == "max_seq_len" else (None, None)
            value = positive_integer(f"ModelConfig.{name}", getattr(self, name), maximum=maximum, note=note)
            object.__setattr__(self, name, value)  # frozen: normalise numpy ints to int
        boolean("ModelConfig.tie_embeddings", self.tie_embeddings)
        positive_number("ModelConfig.rope_theta", self.rope_theta)
        positive_number("ModelConfig.norm_eps", self.norm_eps)
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"ModelConfig.n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads} "
                "(each KV head serves a whole group of query heads)")
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim must be even for RoPE pairs, got {self.head_dim}")

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
        """KV-cache bytes one position costs: 2 (K and V) * L * n_kv * d_head * bytes_per_value.

        An int for an int ``bytes_per_value`` (exact), else a float (0.5 for int4).
        Raises: ArgumentTypeError / ValueError for a ``bytes_per_value`` that is not a number > 0."""
        positive_number("bytes_per_value", bytes_per_value)
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * bytes_per_value

    def to_dict(self) -> dict:
        """The fields as a plain dict (``ModelConfig(**config.to_dict())`` rebuilds it)."""
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
    """Build a ModelConfig from a transformers ``LlamaConfig`` (or its ``to_dict()``).

    Keys read: num_hidden_layers, hidden_size, num_attention_heads, intermediate_size,
    vocab_size (required); num_key_value_heads (default: num_attention_heads), head_dim
    (default: hidden_size // num_attention_heads), tie_word_embeddings (False), rope_theta
    (or rope_parameters["rope_theta"], 10000), rms_norm_eps (1e-5), max_position_embeddings (2048).

    Raises:
        ArgumentTypeError: ``hf_config`` is None, a str or a number.
        ValueError: a required key is missing; then as ``ModelConfig``.
    """
    if hf_config is None or isinstance(hf_config, (str, bytes, Real)):
        raise ArgumentTypeError(f"hf_config must be a transformers config or a dict, got "
                                f"{type(hf_config).__qualname__}")
    get = (lambda k, d=None: hf_config.get(k, d)) if isinstance(hf_config, dict) else \
        (lambda k, d=None: getattr(hf_config, k, d))
    required = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
    missing = [key for key in required if get(key) is None]
    if missing:
        raise ValueError(f"hf_config lacks {', '.join(missing)} (needed to build a ModelConfig)")
    n_heads = get("num_attention_heads")
    d_model = get("hidden_size")
    rope_theta = get("rope_theta")
    if rope_theta is None:  # transformers >= 5 keeps it in rope_parameters
        rope_theta = (get("rope_parameters") or {}).get("rope_theta", 10000.0)
    return ModelConfig(
        n_layers=get("num_hidden_layers"), d_model=d_model, n_heads=n_heads,
        n_kv_heads=get("num_key_value_heads") or n_heads,
        head_dim=get("head_dim") or (d_model // n_heads if is_integer(n_heads) and n_heads > 0 and is_integer(d_model)
                                     else None),  # None: ModelConfig names the bad n_heads / d_model
        d_ff=get("intermediate_size"),
        vocab_size=get("vocab_size"), tie_embeddings=bool(get("tie_word_embeddings", False)),
        rope_theta=float(rope_theta), norm_eps=float(get("rms_norm_eps", 1e-5)),
        max_seq_len=get("max_position_embeddings") or 2048)
