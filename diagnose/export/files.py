"""Writing an export: through a temporary file (or folder) beside the target, renamed into place only when
complete, and removed when anything fails (Ctrl-C and SIGTERM included), so a failed export never leaves a
half-written file behind. Files go through diagnose/io/outputs.py, the writer of every output."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from diagnose.errors import DiagnoseError
from diagnose.io import outputs

# the file a parquet export writes into its folder; a folder that has it may be replaced by a new export
SCHEMA_FILE = "schema.json"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _cannot(path: Path, e: OSError) -> DiagnoseError:
    return DiagnoseError(f"cannot write {path}: {e.strerror or e}")


class NothingExported(DiagnoseError):
    """Nothing usable was read to export (every stream empty or unreadable): no file is written; ``warnings``
    say what was skipped (the CLI prints them before the one-line error), exit 1."""

    def __init__(self, message: str, warnings: list[str]) -> None:
        super().__init__(message)
        self.warnings = warnings


# one writer for every output (diagnose/io/outputs.py): temp file and rename for a regular file, in place for
# a device or FIFO, refused for a directory
write_file = outputs.write_file
write_bytes = outputs.write_bytes


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
        try:
            if path.exists():
                old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=parent))
                os.replace(path, old / "x")
            os.replace(tmp, path)
        except BaseException:  # a failed rename, or Ctrl-C / SIGTERM between the two: the earlier export back
            if old is not None:
                if (old / "x").exists() and not path.exists():
                    os.replace(old / "x", path)
                shutil.rmtree(old, ignore_errors=True)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _cannot(path, e) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
