# The server and chat tests: the real `lineage` binary (LINEAGE_BIN) started on loopback over small
# seeded checkpoints with GPT-2's real vocabulary (tests/pyutil/tiny_checkpoints.py), talked to with
# the standard library's HTTP client and raw sockets.
import http.client
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pyutil"))
from tiny_checkpoints import write_tiny_gpt2, write_tiny_hybrid  # noqa: E402


def lineage_bin() -> str:
    path = os.environ.get("LINEAGE_BIN")
    assert path and Path(path).is_file(), f"LINEAGE_BIN={path!r} is not the lineage binary (run through ctest)"
    return path


class Server:
    """`lineage serve --port 0 ...` in a process of its own; the port is read from its first line."""

    def __init__(self, model: Path, *args: str):
        self.proc = subprocess.Popen([lineage_bin(), "serve", "--model", str(model), "--port", "0", "--threads", "1", *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        line = self.proc.stderr.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert m, f"lineage serve did not start: {line}{self.proc.stderr.read() if self.proc.poll() is not None else ''}"
        self.port = int(m.group(1))

    def request(self, method: str, path: str, body=None, headers=None, timeout: float = 60):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
        conn.request(method, path, body=data, headers=headers or {"Content-Type": "application/json"})
        r = conn.getresponse()
        raw = r.read()
        conn.close()
        return r.status, r.getheader("Content-Type", ""), raw

    def post(self, path: str, body, **kw):
        """Status and parsed JSON of a plain (not streamed) request."""
        status, _, raw = self.request("POST", path, body, **kw)
        return status, json.loads(raw)

    def stream(self, path: str, body: dict):
        """The data: events of a streamed request, parsed, up to [DONE] (asserted to be last)."""
        status, ctype, raw = self.request("POST", path, {**body, "stream": True})
        assert status == 200, raw
        assert ctype.startswith("text/event-stream"), ctype
        events = [line[len("data: "):] for line in raw.decode().split("\n") if line.startswith("data: ")]
        assert events and events[-1] == "[DONE]", f"the stream does not end with data: [DONE]: {events[-3:]}"
        return [json.loads(e) for e in events[:-1]]

    def get_json(self, path: str):
        status, _, raw = self.request("GET", path)
        assert status == 200, raw
        return json.loads(raw)

    def metrics(self) -> dict:
        status, _, raw = self.request("GET", "/metrics")
        assert status == 200
        out = {}
        for line in raw.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def wait_idle(self, seconds: float = 10):
        """Until no slot is busy and nothing is queued; returns /health."""
        deadline = time.time() + seconds
        while True:
            h = self.get_json("/health")
            if h["slots_processing"] == 0 and h["queued"] == 0:
                return h
            assert time.time() < deadline, f"the server is still busy after {seconds} s: {h}"
            time.sleep(0.02)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("lineage serve did not stop on SIGTERM")
        assert self.proc.returncode == 0, f"lineage serve exited {self.proc.returncode}: {self.proc.stderr.read()}"


@pytest.fixture(scope="session")
def gpt2_dir(tmp_path_factory) -> Path:
    return write_tiny_gpt2(tmp_path_factory.mktemp("gpt2"), seed=1)


@pytest.fixture(scope="session")
def hybrid_dir(tmp_path_factory) -> Path:
    return write_tiny_hybrid(tmp_path_factory.mktemp("hybrid"))


@pytest.fixture(scope="session")
def quantized_dir(hybrid_dir, tmp_path_factory) -> Path:
    """The tiny hybrid written by `lineage quantize` as int4 (group 32): compressed-tensors codes in
    every projection, its MLA and experts included."""
    out = tmp_path_factory.mktemp("quantized") / "w4a16"
    run_lineage("quantize", str(hybrid_dir), str(out), "--scheme", "W4A16", "--group", "32")
    return out


@pytest.fixture(scope="module")
def gpt2_server(gpt2_dir):
    s = Server(gpt2_dir, "--ctx", "64", "--slots", "4")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def hybrid_server(hybrid_dir):
    s = Server(hybrid_dir, "--ctx", "512", "--slots", "4", "--checkpoint-every", "16")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def quantized_server(quantized_dir):
    s = Server(quantized_dir, "--ctx", "512", "--slots", "4")
    yield s
    s.stop()


def run_lineage(*args: str, stdin: str = None, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([lineage_bin(), *args], input=stdin, capture_output=True, text=True, timeout=300)
    if check:
        assert p.returncode == 0, f"lineage {' '.join(args)} exited {p.returncode}: {p.stderr}"
    return p
