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
from typing import TYPE_CHECKING

from ..validation import ArgumentTypeError, boolean, instance, is_integer, one_of, positive_integer, positive_number

if TYPE_CHECKING:
    from torch import nn


#: Largest ``max_seq_len`` accepted: float32 (in which RoPE angles are computed, as in Hugging
#: Face's Llama) represents every integer position exactly only up to 2**24 = 16,777,216; beyond
#: it neighbouring positions round to the same float and get the same rotation.
MAX_POSITIONS: int = 2 ** 24

_SIZE_FIELDS = ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff", "vocab_size", "max_seq_len")

#: RoPE scaling types the reference decoder implements (``RopeScaling.rope_type``).
ROPE_SCALING_TYPES: tuple[str, ...] = ("linear", "llama3")
_LLAMA3_KEYS = ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


@dataclass(frozen=True)
class RopeScaling:
    """A rescaling of the RoPE frequencies for a context longer than the pre-training one, as a
    checkpoint's ``rope_scaling`` declares it (``course_lib.models.rope.scale_frequencies``
    applies it).

    Attributes:
        rope_type: "linear" (position interpolation: every frequency divided by ``factor``;
            Chen et al., "Extending Context Window of Large Language Models via Positional
            Interpolation", 2023) or "llama3" (Llama 3.1's frequency-dependent rule: long
            wavelengths divided by ``factor``, short ones kept, a linear blend between; Meta's
            llama-models reference code, as transformers' ``_compute_llama3_parameters``).
        factor: the context extension factor, a finite number > 0 (32 for Llama 3.2).
        low_freq_factor, high_freq_factor: "llama3" only: wavelengths above
            original_max_position_embeddings / low_freq_factor are scaled, those below
            original_max_position_embeddings / high_freq_factor kept; low < high (1 and 4 for
            Llama 3.x). None for "linear".
        original_max_position_embeddings: "llama3" only: the pre-training context in positions
            (8192 for Llama 3.x). None for "linear".

    Raises:
        ArgumentTypeError: a field of the wrong type.
        ValueError: an unknown ``rope_type``, a non-positive number, "llama3" without one of its
            three fields or with low_freq_factor >= high_freq_factor, "linear" with any of them.
    """

    rope_type: str
    factor: float
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None

    def __post_init__(self) -> None:
        one_of("RopeScaling.rope_type", self.rope_type, ROPE_SCALING_TYPES)
        positive_number("RopeScaling.factor", self.factor)
        given = [key for key in _LLAMA3_KEYS if getattr(self, key) is not None]
        if self.rope_type == "linear":
            if given:
                raise ValueError(f"RopeScaling: rope_type 'linear' takes only a factor, got {', '.join(given)}")
            return
        missing = [key for key in _LLAMA3_KEYS if key not in given]
        if missing:
            raise ValueError(f"RopeScaling: rope_type 'llama3' needs {', '.join(missing)}")
        positive_number("RopeScaling.low_freq_factor", self.low_freq_factor)
        positive_number("RopeScaling.high_freq_factor", self.high_freq_factor)
        object.__setattr__(self, "original_max_position_embeddings", positive_integer(
            "RopeScaling.original_max_position_embeddings", self.original_max_position_embeddings))
        if self.low_freq_factor >= self.high_freq_factor:
            raise ValueError(f"RopeScaling: low_freq_factor ({self.low_freq_factor}) must be below "
                             f"high_freq_factor ({self.high_freq_factor}): the blend divides by their difference")


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
        rope_scaling: a ``RopeScaling`` of the RoPE frequencies, or None (plain RoPE). A dict of
            its fields is accepted and converted (``to_dict`` writes one).

    The size fields are stored as Python ints (a numpy integer is converted).
    ``attention_width`` = n_heads * head_dim is the width the attention FLOPs scale with; it
    equals d_model for the course's models but not for every checkpoint (Qwen3-0.6B: d_model
    1,024, 16 query heads of 128 = 2,048).

    Raises:
        ArgumentTypeError (a TypeError and a ValueError, see ``course_lib.validation``): a size
            that is not an int (bool and float included), a non-bool ``tie_embeddings``, a
            non-number ``rope_theta`` or ``norm_eps``, a ``rope_scaling`` that is neither None, a
            RopeScaling nor a dict.
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
    rope_scaling: RopeScaling | None = None

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
        if isinstance(self.rope_scaling, dict):
            object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
        elif self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise ArgumentTypeError(f"ModelConfig.rope_scaling must be None, a RopeScaling or a dict of its "
                                    f"fields, got {type(self.rope_scaling).__qualname__}")

    @property
    def group_size(self) -> int:
        """Query heads per KV head (n_heads // n_kv_heads)."""
        return self.n_heads // self.n_kv_heads

    @property
    def attention_width(self) -> int:
        """n_heads * head_dim: the output width of the q projection (the input of o), and the width
        the attention FLOPs scale with (``docs/roofline.md#flops-per-token``)."""
        return self.n_heads * self.head_dim

    def block_parameters(self) -> int:
        """Parameters of one decoder block: attention, SwiGLU and two RMSNorm vectors."""
        d, q_out, kv_out = self.d_model, self.attention_width, self.n_kv_heads * self.head_dim
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


def weight_bytes(model: nn.Module) -> int:
    """Bytes of a built model's weights: every parameter once, each at its own dtype's size.

    ``nn.Module.parameters()`` yields a shared tensor once, so a tied output head (SmolLM2's)
    is counted once with the embedding, as ``ModelConfig.parameters`` counts it: a float32
    model gives 4 * ``config.parameters()`` bytes. A decode step reads every weight once, so
    this is its weight-streaming term (``docs/roofline.md#decode-step-bound``).

    Args:
        model: a torch ``nn.Module`` (e.g. ``course_lib.models.Decoder``).

    Returns:
        The bytes, an int.

    Raises:
        ArgumentTypeError: ``model`` is not a torch nn.Module.
    """
    from torch import nn   # here: the configs themselves need no torch

    instance("model", model, nn.Module, note="a torch nn.Module, e.g. a Decoder")
    return sum(p.numel() * p.element_size() for p in model.parameters())


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


#: ``model_type`` values ``config_from_hf`` accepts: architectures the reference decoder computes
#: as the checkpoint does ("mistral" only without an active sliding window). A config without a
#: ``model_type`` (a hand-written dict) is read as "llama".
SUPPORTED_MODEL_TYPES: tuple[str, ...] = ("llama", "mistral")

#: What the reference decoder lacks, for model types a Llama-shaped loader meets.
_MODEL_TYPE_GAPS = {
    "qwen2": "biases on the q, k and v projections",
    "qwen3": "an RMSNorm on every query and key head (QK norm)",
    "olmo2": "an RMSNorm on the queries and keys (QK norm) and norms after, not before, each sublayer",
    "gemma": "a GeGLU MLP, embeddings scaled by sqrt(d_model) and RMSNorm weights stored as w - 1",
    "smollm3": "layers without RoPE (NoPE)",
}

#: Boolean config fields that add computation the reference decoder does not do, when true.
_FLAG_GAPS = (
    ("attention_bias", "biases on the q, k, v and o projections"),
    ("mlp_bias", "biases on the gate, up and down projections"),
    ("use_qk_norm", "an RMSNorm on every query and key head (QK norm)"),
    ("qk_norm", "an RMSNorm on every query and key head (QK norm)"),
)


def _unsupported(field: str, value, gap: str) -> ValueError:
    return ValueError(f"hf_config {field}={value!r} is not supported: the reference decoder has no {gap}, so its "
                      f"outputs would differ from the checkpoint's")


def _rope_from_hf(get) -> tuple[float, RopeScaling | None]:
    """(rope_theta, RopeScaling or None) from ``rope_scaling`` (transformers < 5, next to a
    top-level ``rope_theta``) or ``rope_parameters`` (transformers >= 5: theta and scaling in one
    dict)."""
    params: dict = {}
    for key in ("rope_scaling", "rope_parameters"):
        value = get(key)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise ArgumentTypeError(f"hf_config {key} must be a dict or None, got {type(value).__qualname__}")
        if any(isinstance(v, dict) for v in value.values()):
            raise _unsupported(key, value, "per-layer RoPE parameters (one RoPE for every layer only)")
        params.update(value)
    theta = get("rope_theta")
    if theta is None:
        theta = params.get("rope_theta", 10000.0)
    partial = params.get("partial_rotary_factor", get("partial_rotary_factor"))
    if partial is not None and partial != 1:
        raise _unsupported("partial_rotary_factor", partial, "partial rotation (it turns every pair of a head)")
    rope_type = params.get("rope_type") or params.get("type") or ("default" if "factor" not in params else None)
    if rope_type == "default":
        return theta, None
    if rope_type not in ROPE_SCALING_TYPES:
        raise ValueError(
            f"hf_config rope_scaling (rope_parameters in transformers >= 5) has rope_type {rope_type!r}, which the "
            f"reference decoder does not implement (it implements {', '.join(ROPE_SCALING_TYPES)}); plain RoPE "
            f"would turn queries and keys by other angles than the checkpoint's")
    keys = ("factor",) + (_LLAMA3_KEYS if rope_type == "llama3" else ())
    try:
        return theta, RopeScaling(rope_type, **{key: params.get(key) for key in keys})
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"hf_config rope_scaling: {exc}") from None


def config_from_hf(hf_config) -> ModelConfig:
    """Build a ModelConfig from a transformers ``LlamaConfig`` (or its ``to_dict()``, or a
    checkpoint's config.json as a dict).

    Keys read: num_hidden_layers, hidden_size, num_attention_heads, intermediate_size,
    vocab_size (required); num_key_value_heads (default: num_attention_heads), head_dim
    (default: hidden_size // num_attention_heads), tie_word_embeddings (False), rope_theta
    (or rope_parameters["rope_theta"], 10000), rope_scaling / rope_parameters (rope_type
    "default", "linear" or "llama3", as ``RopeScaling``), rms_norm_eps (1e-5),
    max_position_embeddings (2048).

    A config that asks for computation the reference decoder does not do is refused rather than
    loaded as plain Llama: a ``model_type`` outside ``SUPPORTED_MODEL_TYPES`` (qwen3's QK norm,
    qwen2's q/k/v biases, ...), a true attention_bias, mlp_bias, use_qk_norm or qk_norm, a
    hidden_act other than "silu", a sliding_window shorter than max_position_embeddings (unless
    use_sliding_window is False), layer_types other than "full_attention", a
    partial_rotary_factor other than 1, per-layer RoPE parameters, or a RoPE scaling type other
    than linear and llama3 (dynamic, yarn, longrope, ...). Fields that do not change the
    forward pass at inference (attention_dropout, pretraining_tp, token ids, ...) are ignored.

    Raises:
        ArgumentTypeError: ``hf_config`` is None, a str or a number; rope_scaling or
            rope_parameters not a dict.
        ValueError: a required key is missing; an unsupported field, naming it; then as
            ``ModelConfig`` and ``RopeScaling``.
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
    model_type = get("model_type")
    if model_type is not None and model_type not in SUPPORTED_MODEL_TYPES:
        gap = _MODEL_TYPE_GAPS.get(model_type) or _MODEL_TYPE_GAPS.get(str(model_type).rstrip("0123456789"))
        raise ValueError(f"hf_config model_type={model_type!r} is not supported: the reference decoder computes "
                         f"{', '.join(SUPPORTED_MODEL_TYPES)} models only"
                         + (f" and has no {gap}" if gap else ""))
    for field, gap in _FLAG_GAPS:
        if get(field):
            raise _unsupported(field, get(field), gap)
    activation = get("hidden_act")
    if activation is not None and activation != "silu":
        raise _unsupported("hidden_act", activation, "MLP activation other than SiLU (SwiGLU)")
    max_seq_len = get("max_position_embeddings") or 2048
    window = get("sliding_window")
    if window is not None and get("use_sliding_window") is not False and \
            not (isinstance(window, Real) and window >= max_seq_len):
        raise _unsupported("sliding_window", window, "sliding-window attention (every position attends to the "
                           "whole causal prefix)")
    layer_types = get("layer_types")
    if layer_types is not None and any(kind != "full_attention" for kind in layer_types):
        raise _unsupported("layer_types", sorted(set(layer_types)), "attention other than full causal attention")
    rope_theta, rope_scaling = _rope_from_hf(get)
    n_heads = get("num_attention_heads")
    d_model = get("hidden_size")
    return ModelConfig(
        n_layers=get("num_hidden_layers"), d_model=d_model, n_heads=n_heads,
        n_kv_heads=get("num_key_value_heads") or n_heads,
        head_dim=get("head_dim") or (d_model // n_heads if is_integer(n_heads) and n_heads > 0 and is_integer(d_model)
                                     else None),  # None: ModelConfig names the bad n_heads / d_model
        d_ff=get("intermediate_size"),
        vocab_size=get("vocab_size"), tie_embeddings=bool(get("tie_word_embeddings", False)),
        rope_theta=float(rope_theta), norm_eps=float(get("rms_norm_eps", 1e-5)),
        max_seq_len=max_seq_len, rope_scaling=rope_scaling)
