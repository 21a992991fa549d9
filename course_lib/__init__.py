"""course_lib: the shared library of the LLM inference systems lab course.

Modules: ``models`` (config, toy and reference decoders, RoPE, attention), ``cache``
(contiguous and paged KV caches), ``data`` (artifact manifests and loaders), ``grading``
(contract checkers), ``widgets`` (ipywidgets explorers), ``exercises`` (a lab notebook's
exercises, and the ``requires`` guard of a cell that needs one), ``kernels`` (Triton kernels),
``hardware`` and ``roofline`` (device specs and Lab 1 bounds), ``scheduling`` (Lab 3 serving
simulator, metrics and capacity search).
"""
__version__ = "0.1.0"
