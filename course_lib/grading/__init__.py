"""Contract checkers for graded cells (the course's grading contracts)."""
from .contracts import (LIKELY, LOGIT_TOLERANCES, ContractError, attempts, call_on_copies, check_bytes, check_close,
                        check_int, check_int_list, check_logits_close, check_own_function, check_real,
                        check_significant, check_tensor, close, diagnose, fresh_seed, named_faults,
                        significant_tolerance)
from ..divergence import first_divergence, top2_gap

__all__ = ["LIKELY", "LOGIT_TOLERANCES", "ContractError", "attempts", "call_on_copies", "check_bytes", "check_close",
           "check_int", "check_int_list", "check_logits_close", "check_own_function", "check_real", "check_significant",
           "check_tensor", "close", "diagnose", "first_divergence", "fresh_seed", "named_faults",
           "significant_tolerance", "top2_gap"]
