"""``python -m course_lib doctor``: what this machine can run, and which artifacts it has.

Prints the Python, torch, transformers and triton versions, the device and thread
count, how Triton kernels would run (natively on CUDA, in the interpreter, or not at
all, with the reason), and one line per manifest with its status and sha256. It never
downloads and never runs the 16 s GGUF conversion unless ``--convert`` is given
(hashing the 98 MB fallback file, about 0.1 s, is fine). Exit code 0 when the default
model is usable, 1 otherwise.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import platform
import sys

DEFAULT_MODEL = "smollm2-135m"


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def run(convert: bool = False, cache_dir=None, hub_cache_dir=None) -> int:
    """Print the report; return the exit code (0 when the default model is usable)."""
    import torch

    from .data import load_manifest, manifest_dir, manifest_names, model_status, resolve_model, text_status
    from .data.artifacts import cache_root
    from .kernels import triton_mode

    cuda = torch.cuda.is_available()
    device = f"cuda ({torch.cuda.get_device_name(0)}, {torch.cuda.device_count()} visible)" if cuda else "cpu (no CUDA device)"
    mode = triton_mode()      # one definition of the modes, shared with the kernels
    reason = mode.reason
    if mode == "unavailable" and importlib.util.find_spec("triton") is not None:
        reason += ("; the notebooks set TRITON_INTERPRET=1 before importing triton, so their kernels run in "
                   "Triton's interpreter on this CPU (set it yourself elsewhere)")
    rows = [("python", f"{platform.python_version()} ({sys.executable})"),
            ("torch", torch.__version__),
            ("transformers", _version("transformers") or "not installed"),
            ("triton", _version("triton") or "not installed"),
            ("device", device),
            ("torch threads", str(torch.get_num_threads())),
            ("triton kernels", f"{mode}: {reason}"),
            ("manifests", str(manifest_dir())),
            ("cache", str(cache_root(cache_dir)))]
    print("course_lib doctor")
    for key, value in rows:
        print(f"  {key:<15} {value}")
    if convert:
        resolve_model(DEFAULT_MODEL, cache_dir=cache_dir, hub_cache_dir=hub_cache_dir)
    print("artifacts")
    usable_default = False
    names = manifest_names()
    for name in names:
        try:
            kind = load_manifest(name)["kind"]
            status, sha, usable = (model_status(name, cache_dir, hub_cache_dir) if kind == "model"
                                   else text_status(name, hub_cache_dir))
        except Exception as exc:  # one broken manifest must not hide the others
            status, sha, usable = f"error ({type(exc).__name__}: {exc})", None, False
        if not usable and name != DEFAULT_MODEL:
            status += " [optional: the labs fall back to the embedded model or text without it]"
        print(f"  {name:<15} {status}  sha256={sha or '-'}")
        usable_default |= name == DEFAULT_MODEL and usable
    if DEFAULT_MODEL not in names:
        print(f"  {DEFAULT_MODEL:<15} missing (no manifest)")
    print(f"default model {DEFAULT_MODEL}: {'usable' if usable_default else 'NOT usable (see its line above)'}")
    return 0 if usable_default else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``python -m course_lib doctor [--convert]``."""
    parser = argparse.ArgumentParser(prog="python -m course_lib doctor", description=__doc__.splitlines()[0])
    parser.add_argument("--convert", action="store_true",
                        help=f"resolve {DEFAULT_MODEL} now (runs the one-time conversion if needed)")
    args = parser.parse_args(argv)
    return run(convert=args.convert)
