"""Evaluation text (WikiText-2 test split, or the stdlib fallback) with provenance.

Primary: the pinned parquet file of the hub dataset, read with pandas when it is in the
local hub cache (or downloaded when allowed). Fallback: English prose that ships with
the interpreter (``pydoc_data.topics``, the Python language reference), hashed at run
time; its provenance names the module, the Python version and the text's sha256, and
its notes say that it is not WikiText-2 (README "Artifacts and offline use").
"""
from __future__ import annotations

import hashlib
import importlib
import os
import platform

from .manifests import ArtifactError, load_manifest
from .sources import Provenance, allow_download as _allow, hub_file, verify_file


def load_text(name: str = "wikitext-2", manifest: str | os.PathLike | dict | None = None,
              allow_download: bool | None = None, hub_cache_dir: str | os.PathLike | None = None,
              verbose: bool = True) -> tuple[str, Provenance]:
    """The evaluation text of a text artifact; prints one ``[artifact]`` provenance line.

    Args:
        name: manifest name (ignored when ``manifest`` is given).
        manifest: a manifest dict or path.
        allow_download: allow fetching the pinned hub file (default: env
            ``COURSE_LIB_ALLOW_DOWNLOAD=1``); otherwise only the local hub cache is read.
        hub_cache_dir: the huggingface_hub cache folder (default: huggingface_hub's own).
        verbose: print the provenance line.

    Returns:
        (text, provenance). From the hub: the manifest's ``text_column`` rows joined with
        its ``join`` string (WikiText-2: two newlines). From the stdlib fallback: the
        module's topics in sorted order joined with two newlines; ``provenance.sha256``
        is the sha256 of the returned text (UTF-8).

    Raises:
        ArtifactError: not a text artifact, a pinned hash/size mismatch, or neither source usable.
    """
    m = load_manifest(manifest if manifest is not None else name)
    if m["kind"] != "text":
        raise ArtifactError(f"artifact {m['name']} is a {m['kind']} artifact, not text; use resolve_model")
    primary = m["primary"]
    entry = next(e for e in primary["files"] if e["role"] == "data")
    path = hub_file(m, entry, hub_cache_dir, _allow(allow_download))
    if path is not None:
        import pandas as pd

        ref = f"{primary['repo_id']}@{primary['revision']}"
        sha, verification = verify_file(path, entry.get("size"), entry.get("sha256"),
                                        f"artifact {m['name']} (hub {ref} {entry['path']})",
                                        f"delete {path} from the hub cache and download it again")
        rows = pd.read_parquet(path, columns=[primary["text_column"]])[primary["text_column"]]
        text = primary["join"].join(rows.tolist())
        prov = Provenance(m["name"], "hub", "hub", f"{primary['repo_id']} {entry['path']}", primary["revision"],
                          sha, verification, notes=f"{len(rows):,} rows, {len(text):,} characters",
                          licence=m["licence"])
    elif (m.get("fallback") or {}).get("type") == "python-stdlib":
        fb = m["fallback"]
        topics = getattr(importlib.import_module(fb["module"]), "topics", None)
        if not isinstance(topics, dict) or not topics:
            raise ArtifactError(f"artifact {m['name']}: stdlib fallback {fb['module']} has no 'topics' dict "
                                "in this Python. Fix: use the pinned Python 3.11, or put the hub file in the cache.")
        text = "\n\n".join(topics[k] for k in sorted(topics))
        version = platform.python_version()
        prov = Provenance(m["name"], "stdlib-fallback", "stdlib-fallback", f"{fb['module']}, Python {version}",
                          f"Python {version}", hashlib.sha256(text.encode("utf-8")).hexdigest(),
                          "of the returned text, computed at run time",
                          notes=f"{fb['notes']}; {len(text):,} characters", licence=fb["licence"])
    else:
        raise ArtifactError(
            f"artifact {m['name']}: {primary['repo_id']}@{primary['revision']} {entry['path']} is not in the "
            "local hub cache and the manifest has no stdlib fallback. Fix: allow downloads with "
            "COURSE_LIB_ALLOW_DOWNLOAD=1 on a machine with network, or add a fallback to the manifest.")
    if verbose:
        print(prov.line())
    return text, prov


def text_status(manifest: str | os.PathLike | dict, hub_cache_dir=None) -> tuple[str, str | None, bool]:
    """What ``load_text`` would use, without downloading: (status, sha256 or None, usable)."""
    m = load_manifest(manifest)
    entry = next(e for e in m["primary"]["files"] if e["role"] == "data")
    if hub_file(m, entry, hub_cache_dir, download=False) is not None:
        try:
            _, prov = load_text(manifest=m, allow_download=False, hub_cache_dir=hub_cache_dir, verbose=False)
        except ArtifactError as exc:
            return f"in hub cache but unusable ({exc})", None, False
        return f"in hub cache ({prov.verification})", prov.sha256, True
    if (m.get("fallback") or {}).get("type") == "python-stdlib":
        _, prov = load_text(manifest=m, allow_download=False, hub_cache_dir=hub_cache_dir, verbose=False)
        return f"fallback available ({prov.detail}; not WikiText-2)", prov.sha256, True
    return "missing (not in the local hub cache, no fallback)", None, False
