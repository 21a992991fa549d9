"""Shared by the kernel test files: rerun a file's ``triton_kernel`` tests in Triton's interpreter.

Triton reads TRITON_INTERPRET when a kernel is defined, so a process that imported the kernel
without it cannot switch; the tests run again in a child process with the variable set.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from course_lib.kernels import triton_mode

REPO_ROOT = Path(__file__).resolve().parents[1]


def run_kernel_tests_in_interpreter(test_file: str) -> None:
    """Run TEST_FILE's tests named ``triton_kernel`` with TRITON_INTERPRET=1 in a subprocess and
    require that all of them ran and passed. Skips where the kernels already ran in this process
    or triton does not import."""
    mode = triton_mode()
    if mode in ("native", "interpreter"):
        pytest.skip(f"triton mode here is {str(mode)!r}: the kernel tests ran in this process")
    try:
        import triton  # noqa: F401
    except Exception as exc:
        pytest.skip(f"triton does not import here ({exc}); the kernel is Linux x86_64 only")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, "-m", "pytest", str(Path(test_file).resolve()), "-q", "-rs",
           "-p", "no:cacheprovider", "-k", "triton_kernel"]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"interpreter run failed (rc {proc.returncode}):\n{out[-6000:]}"
    summary = out.strip().splitlines()[-1]
    assert "passed" in summary and "skipped" not in summary, f"kernel tests did not all run:\n{out[-6000:]}"


def run_without_triton(code: str) -> subprocess.CompletedProcess:
    """Run CODE in a fresh interpreter where ``import triton`` fails (as on macOS or Windows) and
    TRITON_INTERPRET is unset; returns the finished process (stdout, stderr, returncode)."""
    blocked = "import sys; sys.modules['triton'] = None; sys.modules['triton.language'] = None\n"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-c", blocked + code], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
