"""ipywidgets explorers used in the labs."""
from .quant import quant_explorer, quant_explorer_figure, quant_numbers
from .rope import rope_explorer, rope_explorer_figure, rope_explorer_state, rope_frequency_figure, scaled_frequencies

__all__ = ["quant_explorer", "quant_explorer_figure", "quant_numbers", "rope_explorer", "rope_explorer_figure",
           "rope_explorer_state", "rope_frequency_figure", "scaled_frequencies"]
