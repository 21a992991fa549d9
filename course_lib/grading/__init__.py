"""Contract checkers for graded cells (the course's grading contracts)."""
from .contracts import (LOGIT_TOLERANCES, ContractError, check_bytes, check_close, check_int, check_int_list,
                        check_logits_close, check_own_function, check_real, check_significant, check_tensor,
                        first_divergence, fresh_seed, significant_tolerance, top2_gap)

__all__ = ["LOGIT_TOLERANCES", "ContractError", "check_bytes", "check_close", "check_int", "check_int_list",
           "check_logits_close", "check_own_function", "check_real", "check_significant", "check_tensor",
           "first_divergence", "fresh_seed", "significant_tolerance", "top2_gap"]
