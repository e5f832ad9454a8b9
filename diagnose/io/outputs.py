"""Every file a command writes (reports, JSON, exports, workload files) goes through here (issue 33).

* A regular file, or a path that does not exist yet, is written through a temporary file beside it, renamed
  into place only when complete; on any failure, Ctrl-C or SIGTERM the temporary file is removed, so a
  failed write never leaves a half-written file behind, nor a temporary one.
* A character device or a FIFO (``-o /dev/null``, ``-o /dev/stdout`` on a pipe, a named pipe with a reader)
  is written in place: opened for writing without creating or truncating it, never replaced by a rename
  (as root, a rename onto ``/dev/null`` would turn the device node into a file). A FIFO is opened with
  O_NONBLOCK, so one without a reader is a one-line error (ENXIO) instead of a hang.
* A directory, a block device or a socket is refused with a one-line error.
* An output equal to or inside an input (``compare A B --json B/manifest.json``), or a symlink to one, is
  refused before anything is read or written (``check_outputs``), exit 2.

Standard library only: the CLI imports it before pandas.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import FrameType

from diagnose.errors import DiagnoseError, InputError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _real(p: Path) -> Path:
    """``p`` with every symlink resolved, also where the last parts do not exist yet."""
    return Path(os.path.realpath(os.path.abspath(p)))


def check_outputs(outputs: Iterable[tuple[str, Path | None]], inputs: Iterable[Path]) -> None:
    """Refuses (InputError, exit 2) an output that is an input, lies inside an input directory, or (an
    output directory) holds an input: writing it would destroy what is being read. ``outputs``: (option, path)."""
    ins = [(p, _real(p)) for p in inputs]
    for opt, out in outputs:
        if out is None:
            continue
        ro = _real(out)
        for given, ri in ins:
            if ro == ri or ro.is_relative_to(ri) or (ri.is_relative_to(ro) and ro.is_dir()):
                how = "is" if ro == ri else ("is inside" if ro.is_relative_to(ri) else "holds")
                raise InputError(f"{opt} {out} {how} the input {given}: it would be overwritten; "
                                 "choose another output path")


class OutputError(DiagnoseError):
    """An output cannot be written: ``path`` and ``why`` (one line), exit 1."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"cannot write {path}: {why}")
        self.path, self.why = path, why


def _cannot(path: Path, e: OSError | str) -> OutputError:
    return OutputError(path, e if isinstance(e, str) else (e.strerror or str(e)))


def _kind(path: Path) -> str:
    """"new", "file", "dir", "char", "fifo" or "other" (block device, socket), following symlinks."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "new"
    except OSError as e:
        raise _cannot(path, e) from None
    if stat.S_ISREG(st.st_mode):
        return "file"
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    if stat.S_ISCHR(st.st_mode):
        return "char"
    if stat.S_ISFIFO(st.st_mode):
        return "fifo"
    return "block device" if stat.S_ISBLK(st.st_mode) else "socket" if stat.S_ISSOCK(st.st_mode) else "other"


def _open_in_place(path: Path, fifo: bool) -> int:
    """A descriptor to write ``path`` (a device or FIFO) as it is: no O_CREAT, no O_TRUNC; a FIFO with
    O_NONBLOCK (ENXIO, at once, when nothing reads it), then switched back to blocking writes."""
    flags = os.O_WRONLY | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0) | (os.O_NONBLOCK if fifo else 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ENXIO and fifo:
            raise _cannot(path, "a FIFO with no reader (start the reader first)") from None
        raise _cannot(path, e) from None
    if fifo:
        os.set_blocking(fd, True)
    return fd


def _write_fd(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _copy_into(fd: int, src: Path) -> None:
    with open(src, "rb") as f:
        while chunk := f.read(1 << 20):
            _write_fd(fd, chunk)


def write_file(path: Path, write: Callable[[Path], None], *, parents: bool = False) -> None:
    """Call ``write(tmp)`` to fill a temporary file, then put it at ``path`` (module docstring: how each kind
    of path is written). ``parents``: create missing parent directories. A one-line DiagnoseError naming
    ``path`` on failure; any other exception (KeyboardInterrupt included) propagates after the clean-up."""
    path = Path(path)
    kind = _kind(path)
    if kind == "dir":
        raise _cannot(path, "it is a directory")
    if kind in ("char", "fifo"):
        fd = _open_in_place(path, kind == "fifo")
        tmpdir = tempfile.mkdtemp(prefix=".diagnose-out.")
        try:
            staged = Path(tmpdir) / "out"
            write(staged)
            _copy_into(fd, staged)
        except OSError as e:
            raise _cannot(path, e) from None
        finally:
            os.close(fd)
            shutil.rmtree(tmpdir, ignore_errors=True)
        return
    if kind != "new" and kind != "file":
        raise _cannot(path, f"it is a {kind}, not a regular file")
    parent = path.parent if str(path.parent) else Path(".")
    tmp: Path | None = None  # the temporary file, until it is renamed into place
    try:
        if parents:
            parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
        tmp = Path(name)
        os.close(fd)
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it private; an output is an ordinary file
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        raise _cannot(path, e) from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink()


def write_bytes(path: Path, data: bytes, *, parents: bool = False) -> None:
    """``data`` to ``path``, as :func:`write_file` puts it there."""
    path = Path(path)
    kind = _kind(path)
    if kind in ("char", "fifo"):  # no temporary file needed: the bytes are whole already
        fd = _open_in_place(path, kind == "fifo")
        try:
            _write_fd(fd, data)
        except OSError as e:
            raise _cannot(path, e) from None
        finally:
            os.close(fd)
        return
    def fill(tmp: Path) -> None:
        tmp.write_bytes(data)

    write_file(path, fill, parents=parents)


# -- signals ------------------------------------------------------------------------------------------------
def _interrupt(_sig: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def terminate_interrupts() -> Iterator[None]:
    """Within the block SIGTERM unwinds like Ctrl-C (KeyboardInterrupt): the writers above remove their
    temporary files, and the command exits with status 130 (diagnose/cli/main.py) instead of dying at once
    with a half-written temporary file left. The earlier handler is put back after the block."""
    try:
        saved = signal.signal(signal.SIGTERM, _interrupt)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, saved)
