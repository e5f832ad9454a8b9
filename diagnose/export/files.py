"""Writing an export: through a temporary file (or folder) beside the target, renamed into place only when
complete, and removed when anything fails, so a failed export never leaves a half-written file behind."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from diagnose.errors import DiagnoseError

# the file a parquet export writes into its folder; a folder that has it may be replaced by a new export
SCHEMA_FILE = "schema.json"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _cannot(path: Path, e: OSError) -> DiagnoseError:
    return DiagnoseError(f"cannot write {path}: {e.strerror or e}")


def write_file(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` to fill a temporary file beside ``path``, then rename it to ``path``."""
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise DiagnoseError(f"cannot write {path}: it is a directory")
    try:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
    except OSError as e:
        raise _cannot(path, e) from None
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it private; an export is an ordinary file
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise _cannot(path, e) from None
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_bytes(path: Path, data: bytes) -> None:
    def write(tmp: Path) -> None:
        tmp.write_bytes(data)

    write_file(path, write)


@contextlib.contextmanager
def output_dir(path: Path) -> Iterator[Path]:
    """A temporary folder beside ``path`` to write into; on success it replaces ``path`` (which must not exist,
    be empty, or be an earlier export: it holds ``schema.json``), on failure it is removed."""
    if path.exists() and not path.is_dir():
        raise DiagnoseError(f"cannot write {path}: it exists and is not a directory")
    if path.is_dir() and any(path.iterdir()) and not (path / SCHEMA_FILE).is_file():
        raise DiagnoseError(f"cannot write {path}: the directory is not empty and holds no earlier export "
                            f"({SCHEMA_FILE}); choose another -o")
    parent = path.parent if str(path.parent) else Path(".")
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent))
    except OSError as e:
        raise _cannot(path, e) from None
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())
        old = None
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=parent))
            os.replace(path, old / "x")
        try:
            os.replace(tmp, path)
        except OSError:
            if old is not None:  # put the earlier export back
                os.replace(old / "x", path)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _cannot(path, e) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
