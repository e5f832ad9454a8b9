"""Engine settings read from what the engine exposes (its command line, its config-info metric), recorded in
the bundle and used by the rules instead of guessed from load (regression: "Batch at its cap: 2.0 running
(cap n/a)" while --max-num-seqs 2 was on the engine's command line)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from diagnose.engines.detect import server_cmdline_settings, settings_from_cmdline


def test_vllm_sglang_llamacpp_flags() -> None:
    argv = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--max-num-seqs", "2",
            "--max-num-batched-tokens=256", "--no-enable-prefix-caching", "--enforce-eager", "-tp", "4",
            "--api-key", "sk-secret", "--block-size", "junk"]
    assert settings_from_cmdline(argv) == {"max_num_seqs": 2.0, "max_num_batched_tokens": 256.0,
                                           "prefix_caching": 0.0, "cuda_graphs": 0.0, "tensor_parallel_size": 4.0}
    assert settings_from_cmdline(["sglang", "--max-running-requests", "64", "--disable-radix-cache"]) == {
        "max_num_seqs": 64.0, "prefix_caching": 0.0}
    assert settings_from_cmdline(["llama-server", "-np", "2", "-c", "4096", "-t", "3"]) == {
        "max_num_seqs": 2.0, "context_size": 4096.0, "threads": 3.0}
    assert settings_from_cmdline(["vllm", "serve", "m"]) == {}  # nothing stated: nothing guessed


def test_llamacpp_settings_from_user_reports() -> None:
    """Issue 34's families: continuous batching, the prompt cache, the physical batch, top-k and a server-wide
    grammar or JSON schema (its value, even one that looks like a flag's value, is never parsed)."""
    argv = ["llama-server", "-np", "4", "--no-cont-batching", "--no-cache-prompt", "-ub", "64", "--top-k", "0",
            "--grammar", "root ::= [a-z ]*"]
    assert settings_from_cmdline(argv) == {"max_num_seqs": 4.0, "continuous_batching": 0.0, "prefix_caching": 0.0,
                                           "ubatch_tokens": 64.0, "sampling_top_k": 0.0, "constrained_decoding": 1.0}
    assert settings_from_cmdline(["llama-server", "-nocb", "-j", '{"type": "object"}']) == {
        "continuous_batching": 0.0, "constrained_decoding": 1.0}
    assert settings_from_cmdline(["llama-server", "--json-schema-file=/s.json", "-cb", "--cache-prompt"]) == {
        "constrained_decoding": 1.0, "continuous_batching": 1.0, "prefix_caching": 1.0}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_reads_the_command_line_of_the_process_listening_on_the_port() -> None:
    port = _free_port()
    code = ("import socket,sys,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1);"
            f"s.bind(('127.0.0.1',{port})); s.listen(); time.sleep(30)")
    proc = subprocess.Popen([sys.executable, "-c", code, "--max-num-seqs", "7", "--api-key", "sk-planted-secret"])
    try:
        deadline = time.monotonic() + 10
        settings, where = {}, None
        while time.monotonic() < deadline and not settings:
            settings, where = server_cmdline_settings(f"http://127.0.0.1:{port}")
            time.sleep(0.1)
        assert settings == {"max_num_seqs": 7.0}
        assert where is not None and f"pid {proc.pid}" in where and "max_num_seqs=7" in where
        assert "sk-planted-secret" not in where  # only the recognised flags are named, never the command line
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("url", ["http://10.1.2.3:8000", "http://example.invalid:8000", "not a url"])
def test_a_remote_server_is_not_looked_up(url: str) -> None:
    assert server_cmdline_settings(url) == ({}, None)
