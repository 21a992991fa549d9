"""Model configs, the toy decoder and the SmolLM2 reference decoder."""
from .config import (MAX_POSITIONS, ModelConfig, RopeScaling, config_from_hf, smollm2_135m_config, smollm2_360m_config,
                     toy_config, weight_bytes)
from .decoder import Decoder, generate_cached, generate_full_recompute, toy_decoder
from .rope import (apply_rope, ntk_frequencies, rope_angles, rope_cos_sin, rope_frequencies, rotate_pairs,
                   scale_frequencies, scaled_frequencies, yarn_attention_factor, yarn_frequencies)
from .attention import attend_with_cache, causal_attention, repeat_kv

__all__ = ["MAX_POSITIONS", "ModelConfig", "RopeScaling", "config_from_hf", "smollm2_135m_config", "smollm2_360m_config",
           "toy_config", "weight_bytes", "Decoder", "generate_cached", "generate_full_recompute", "toy_decoder",
           "apply_rope", "rope_angles", "rope_cos_sin", "rope_frequencies", "rotate_pairs", "scale_frequencies",
           "ntk_frequencies", "yarn_attention_factor", "yarn_frequencies", "scaled_frequencies",
           "attend_with_cache", "causal_attention", "repeat_kv"]
