"""Artifact manifests and loaders: verified models and evaluation text with provenance.

``manifests`` (schema, lookup, ``ArtifactError``), ``sources`` (hub / PyPI / stdlib
lookups, hashing, ``Provenance``), ``artifacts`` (model resolution and the converted
cache, ``load_smollm2``), ``text`` (``load_text``). Nothing here downloads at import time.
"""
from .artifacts import ResolvedModel, cache_root, gguf_fallback_path, load_smollm2, model_status, resolve_model
from .manifests import ArtifactError, check_manifest, load_manifest, manifest_dir, manifest_names
from .sources import Provenance, sha256_file
from .text import load_text, text_status

__all__ = ["ArtifactError", "Provenance", "ResolvedModel", "cache_root", "check_manifest", "gguf_fallback_path",
           "load_manifest",
           "load_smollm2", "load_text", "manifest_dir", "manifest_names", "model_status", "resolve_model",
           "sha256_file", "text_status"]
