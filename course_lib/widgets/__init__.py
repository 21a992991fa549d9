"""ipywidgets explorers used in the labs."""
from .rope import rope_explorer, rope_explorer_figure, rope_explorer_state

__all__ = ["rope_explorer", "rope_explorer_figure", "rope_explorer_state"]
