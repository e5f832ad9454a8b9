"""Outputs, signals and exports of the analysis-side commands (issue 33, items 1, 7 and 8).

* Every writer (analyze -o/--json, compare -o/--json, export perfetto/speedscope/parquet, workload -o) goes
  through diagnose/io/outputs.py: a device node or a FIFO is written in place and stays what it was (as root a
  rename onto /dev/null used to turn it into a regular file holding the report), a FIFO without a reader is a
  one-line error at once, a directory is a one-line error, and an output that is, lies inside, or links to an
  input is refused (exit 2) before anything is written: `compare A B --json B/manifest.json` used to destroy B.
* SIGTERM (or Ctrl-C) while an output is being put in place exits 130 with no output and no temporary file
  left; an earlier parquet export interrupted mid-swap is kept whole.
* An export whose every stream is garbage warns per stream and exits 1 without writing a file.

No test depends on timing: signals are sent by the process to itself at a chosen call (the rename of the
output), FIFOs are opened by the test before the command runs.
"""

from __future__ import annotations

import gzip
import os
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from diagnose.cli import exits
from diagnose.cli.main import cli

ROOT = Path(__file__).resolve().parent.parent
HEALTHY = ROOT / "sample_traces" / "vllm_cpu_healthy" / "bundle"  # has py-spy stacks (speedscope)

# (name, argv before the output path, option naming the output, what the output starts with)
WRITERS = [
    ("analyze-o", ["analyze", str(HEALTHY), "-q", "-o"], b"<!"),
    ("analyze-json", ["analyze", str(HEALTHY), "-q", "-o", "{tmp}/r.html", "--json"], b"{"),
    ("compare-o", ["compare", str(HEALTHY), str(HEALTHY), "-q", "--resamples", "100", "-o"], b"<!"),
    ("compare-json", ["compare", str(HEALTHY), str(HEALTHY), "-q", "--resamples", "100", "--json"], b"{"),
    ("export-perfetto", ["export", str(HEALTHY), "-q", "--format", "perfetto", "-o"], b"{"),
    ("export-speedscope", ["export", str(HEALTHY), "-q", "--format", "speedscope", "-o"], b"{"),
    ("workload-o", ["workload", str(HEALTHY), "-q", "-o"], b"{"),
]
WRITER_IDS = [w[0] for w in WRITERS]


def _argv(argv: list[str], tmp: Path, out: Path | str) -> list[str]:
    return [a.replace("{tmp}", str(tmp)) for a in argv] + [str(out)]


def _invoke(args: list[str]) -> tuple[int, str]:
    r = CliRunner().invoke(cli, args)
    return r.exit_code, r.output


def _one_line_error(output: str) -> str:
    lines = [ln for ln in output.strip().splitlines() if not ln.startswith("warning:")]
    assert len(lines) == 1 and lines[0].startswith("diagnose: error:") and "Traceback" not in output, output
    return lines[0]


def _null_device(tmp: Path) -> Path:
    """A device node like /dev/null (char 1:3) inside tmp: never risk the real one."""
    node = tmp / "null"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("creating a device node needs root")
    return node


# -- special files as outputs ---------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, head", [w[1:] for w in WRITERS], ids=WRITER_IDS)
def test_a_device_output_is_written_in_place_and_stays_a_device(tmp_path: Path, argv: list[str], head: bytes) -> None:
    node = _null_device(tmp_path)
    code, out = _invoke(_argv(argv, tmp_path, node))
    assert code == exits.OK, out
    assert stat.S_ISCHR(os.lstat(node).st_mode), "the device node was replaced by a file"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("argv, head", [w[1:] for w in WRITERS], ids=WRITER_IDS)
def test_a_fifo_with_a_reader_receives_the_output_and_stays_a_fifo(tmp_path: Path, argv: list[str],
                                                                   head: bytes) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # the reader exists before the command runs
    keep = os.open(fifo, os.O_WRONLY)  # holds EOF off until the command is done
    os.set_blocking(rfd, True)
    got = bytearray()

    def drain() -> None:
        while chunk := os.read(rfd, 1 << 16):
            got.extend(chunk)

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    try:
        code, out = _invoke(_argv(argv, tmp_path, fifo))
    finally:
        os.close(keep)
        t.join(60)
        os.close(rfd)
    assert code == exits.OK, out
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was replaced by a file"
    assert bytes(got).lstrip().startswith(head) and len(got) > 100, bytes(got[:200])


@pytest.mark.parametrize("argv, head", [w[1:] for w in WRITERS], ids=WRITER_IDS)
def test_a_fifo_without_a_reader_is_a_one_line_error_not_a_hang(tmp_path: Path, argv: list[str],
                                                                head: bytes) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    code, out = _invoke(_argv(argv, tmp_path, fifo))
    assert code == exits.ERROR, out
    line = _one_line_error(out)
    assert str(fifo) in line and "no reader" in line
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.parametrize("argv, head", [w[1:] for w in WRITERS], ids=WRITER_IDS)
def test_a_directory_output_is_a_one_line_error(tmp_path: Path, argv: list[str], head: bytes) -> None:
    d = tmp_path / "dir"
    d.mkdir()
    code, out = _invoke(_argv(argv, tmp_path, d))
    assert code == exits.ERROR, out
    assert str(d) in _one_line_error(out) and list(d.iterdir()) == []


@pytest.mark.parametrize("kind", ["block-device", "socket"])
@pytest.mark.parametrize("argv", [WRITERS[0][1], WRITERS[4][1]], ids=["analyze-o", "export-perfetto"])
def test_a_block_device_or_socket_output_is_refused_never_opened(tmp_path: Path, argv: list[str], kind: str) -> None:
    """Written in place, a block device would be a disk overwritten: refused, one line, the node untouched."""
    import socket

    node = tmp_path / "node"
    if kind == "block-device":
        try:  # a device number nothing answers to: even a wrong open could not write anywhere
            os.mknod(node, 0o600 | stat.S_IFBLK, os.makedev(250, 250))
        except PermissionError:
            pytest.skip("creating a device node needs root")
        is_kind = stat.S_ISBLK
    else:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(node))
        is_kind = stat.S_ISSOCK
    code, out = _invoke(_argv(argv, tmp_path, node))
    assert code == exits.ERROR, out
    line = _one_line_error(out)
    assert str(node) in line and kind.replace("-", " ") in line
    assert is_kind(os.lstat(node).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node"]


def _copy_input(tmp: Path) -> Path:
    b = tmp / "input"
    shutil.copytree(HEALTHY, b)
    return b


def _tree(p: Path) -> dict[str, bytes]:
    return {str(f.relative_to(p)): f.read_bytes() for f in sorted(p.rglob("*")) if f.is_file()}


@pytest.mark.parametrize("where", ["manifest", "new-file-inside", "symlink-to-manifest", "the-bundle-itself"])
@pytest.mark.parametrize("argv, head", [w[1:] for w in WRITERS], ids=WRITER_IDS)
def test_an_output_into_an_input_is_refused_and_the_input_kept(tmp_path: Path, argv: list[str], head: bytes,
                                                               where: str) -> None:
    """`compare A B --json B/manifest.json` overwrote B's manifest (B unreadable after); the same for every
    writer: an output equal to, inside, or a symlink into an input is exit 2 naming both, nothing written."""
    b = _copy_input(tmp_path)
    before = _tree(b)
    out = {"manifest": b / "manifest.json", "new-file-inside": b / "report.out", "the-bundle-itself": b,
           "symlink-to-manifest": tmp_path / "link"}[where]
    if where == "symlink-to-manifest":
        out.symlink_to(b / "manifest.json")
    args = [a if a != str(HEALTHY) else str(b) for a in _argv(argv, tmp_path, out)]
    if args[0] == "compare":  # the output lies in B, the second input
        args[1] = str(HEALTHY)
    code, text = _invoke(args)
    assert code == exits.USAGE, text
    line = _one_line_error(text)
    assert str(out) in line and str(b) in line and "input" in line
    assert _tree(b) == before


def test_a_parquet_export_into_its_input_or_onto_a_special_file_is_refused(tmp_path: Path) -> None:
    b = _copy_input(tmp_path)
    before = _tree(b)
    for out, code in ((b / "tables", exits.USAGE), (b, exits.USAGE), (tmp_path, exits.USAGE)):
        c, text = _invoke(["export", str(b), "--format", "parquet", "-o", str(out)])
        assert c == code, text
        assert str(b) in _one_line_error(text)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    c, text = _invoke(["export", str(b), "--format", "parquet", "-o", str(fifo)])
    assert c == exits.ERROR and "not a directory" in _one_line_error(text)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and _tree(b) == before


# -- special files as inputs ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["fifo", "device", "empty-dir"])
@pytest.mark.parametrize("command", ["analyze", "compare", "export", "workload"])
def test_a_special_input_is_a_one_line_error_never_a_hang(tmp_path: Path, command: str, kind: str) -> None:
    src = tmp_path / "src"
    if kind == "fifo":
        os.mkfifo(src)  # never opened: a read would block for ever
    elif kind == "device":
        src = _null_device(tmp_path)
    else:
        src.mkdir()
    args = {"analyze": ["analyze", str(src), "-o", str(tmp_path / "r.html")],
            "compare": ["compare", str(HEALTHY), str(src)],
            "export": ["export", str(src), "-o", str(tmp_path / "e.json")],
            "workload": ["workload", str(src), "-o", str(tmp_path / "w.jsonl")]}[command]
    code, out = _invoke(args)
    assert code in (exits.ERROR, exits.USAGE), out
    assert str(src) in _one_line_error(out)


# -- signals --------------------------------------------------------------------------------------------------
# sends itself SIG (once) when the output is about to be renamed into place (the temporary file is complete)
DRIVER = r"""
import os, signal, sys
real = os.replace
sent = []
def replace(src, dst, *a, **k):
    if os.fspath(dst) == os.environ["KILL_DST"] and not sent:
        sent.append(1)
        os.kill(os.getpid(), getattr(signal, os.environ["KILL_SIG"]))
    return real(src, dst, *a, **k)
os.replace = replace
from diagnose.cli.main import main
sys.argv = ["diagnose", *sys.argv[1:]]
main()
"""


def _driven(args: list[str], out: Path, sig: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KILL_DST": str(out), "KILL_SIG": sig}
    return subprocess.run([sys.executable, "-c", DRIVER, *args], capture_output=True, text=True, env=env,
                          timeout=300)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("argv", [
    ["analyze", str(HEALTHY), "-q", "-o"],
    ["compare", str(HEALTHY), str(HEALTHY), "-q", "--resamples", "100", "--json"],
    ["export", str(HEALTHY), "-q", "--format", "perfetto", "-o"],
    ["export", str(HEALTHY), "-q", "--format", "parquet", "-o"],
    ["workload", str(HEALTHY), "-q", "-o"],
], ids=["analyze", "compare", "export-perfetto", "export-parquet", "workload"])
def test_a_signal_while_writing_leaves_no_output_and_no_temporary_file(tmp_path: Path, argv: list[str],
                                                                        sig: str) -> None:
    """SIGTERM used to kill compare and export at once (status -15) with the temporary file left beside the
    output; now it unwinds like Ctrl-C: exit 130, "diagnose: interrupted", nothing left in the folder."""
    out = tmp_path / "out"
    p = _driven([*argv, str(out)], out, sig)
    assert p.returncode == exits.INTERRUPTED, (p.returncode, p.stderr)
    assert "diagnose: interrupted" in p.stderr and "Traceback" not in p.stderr
    assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_an_interrupted_parquet_re_export_keeps_the_earlier_export(tmp_path: Path, sig: str) -> None:
    """The new export replaces an earlier one in two renames (earlier aside, new in); a signal between them
    used to leave no export at `-o` and the earlier one in a hidden `.old` folder."""
    out = tmp_path / "tables"
    code, text = _invoke(["export", str(HEALTHY), "--format", "parquet", "-q", "-o", str(out)])
    assert code == 0, text
    before = _tree(out)
    p = _driven(["export", str(HEALTHY), "-q", "--format", "parquet", "-o", str(out)], out, sig)
    assert p.returncode == exits.INTERRUPTED, (p.returncode, p.stderr)
    assert [x.name for x in tmp_path.iterdir()] == ["tables"] and _tree(out) == before


# -- exports of garbage ---------------------------------------------------------------------------------------
def _garbage(tmp: Path) -> Path:
    """The healthy sample with every stream replaced by records that do not match its schema, no artifacts."""
    b = _copy_input(tmp)
    shutil.rmtree(b / "artifacts")
    for f in b.glob("*.jsonl.gz"):
        with gzip.open(f, "wb") as g:
            g.write(b'{"rid": 5, "sent_ns": "x", "t_ns": "q", "t_s": "bad", "phase": "z"}\nnot json\n')
    return b


@pytest.mark.parametrize("fmt", ["perfetto", "parquet", "speedscope"])
def test_an_export_of_garbage_warns_per_stream_and_fails(tmp_path: Path, fmt: str) -> None:
    """Every stream garbage: perfetto and parquet exited 0 and wrote a file of nothing; now one counted warning
    per damaged stream, exit 1 and no file."""
    b = _garbage(tmp_path)
    out = tmp_path / "out"
    code, text = _invoke(["export", str(b), "--format", fmt, "-o", str(out)])
    assert code == exits.ERROR, text
    _one_line_error(text)
    warnings = [ln for ln in text.splitlines() if ln.startswith("warning:")]
    if fmt != "speedscope":  # speedscope reads only the stacks: it says there are none
        for stream in ("requests", "chunks", "metrics", "phases", "client_health"):
            mine = [w for w in warnings if f"{stream}.jsonl.gz: skipped" in w]
            # one line per class: the record that does not match the schema, the line that is not JSON
            assert len(mine) == 2, (stream, warnings)
            assert any("skipped 1 record(s) that do not match the schema" in w for w in mine)
            assert any("skipped 1 unreadable line(s)" in w for w in mine)
        assert len(warnings) == len(set(warnings)), "a warning printed twice"
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["input"]
