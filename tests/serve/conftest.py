# The server and chat tests: the real `lineage` binary (LINEAGE_BIN) started on loopback over small
# seeded checkpoints with GPT-2's real vocabulary (tests/pyutil/tiny_checkpoints.py), talked to with
# the standard library's HTTP client and raw sockets.
import http.client
import json
import os
import re
import signal
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


def serve_ranks() -> int:
    """LINEAGE_SERVE_RANKS=P (ctest's serve_server_ranks2): every server of these tests runs under
    mpirun on P ranks over shared memory, each matrix split among them (tests/dist/mpirun.sh's set-up)."""
    return int(os.environ.get("LINEAGE_SERVE_RANKS", "1"))


def launcher() -> tuple:
    """The command prefix and environment a server starts with."""
    ranks = serve_ranks()
    if ranks <= 1:
        return [], None
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", LINEAGE_TP_MIN_BYTES="0")
    env["ASAN_OPTIONS"] = ":".join(filter(None, [env.get("ASAN_OPTIONS"), "detect_leaks=0"]))
    return ["mpirun", "--oversubscribe", "-np", str(ranks), "--mca", "btl", "self,vader",
            "--mca", "btl_vader_single_copy_mechanism", "none", "--mca", "oob_tcp_if_include", "lo",
            "--bind-to", "none", "-x", "LINEAGE_TP_MIN_BYTES"], env


def rank0_pid(mpirun_pid: int, seconds: float = 10) -> int:
    """The pid of mpirun's child with OMPI_COMM_WORLD_RANK=0."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                env = (d / "environ").read_bytes().split(b"\0")
            except (OSError, IndexError, ValueError):
                continue
            if ppid == mpirun_pid and b"OMPI_COMM_WORLD_RANK=0" in env:
                return int(d.name)
        time.sleep(0.05)
    raise AssertionError(f"mpirun {mpirun_pid} has no rank 0")


class Server:
    """`lineage serve --port 0 ...` in a process of its own; the port is read from its first line.
    Under LINEAGE_SERVE_RANKS=P, the same command under mpirun on P ranks (rank 0 serves)."""

    def __init__(self, model: Path, *args: str):
        prefix, env = launcher()
        self.proc = subprocess.Popen([*prefix, lineage_bin(), "serve", "--model", str(model), "--port", "0", "--threads", "1", *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        line = self.proc.stderr.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert m, f"lineage serve did not start: {line}{self.proc.stderr.read() if self.proc.poll() is not None else ''}"
        self.port = int(m.group(1))
        if serve_ranks() > 1:
            assert f"{serve_ranks()} ranks over MPI" in line, line
        # The process that serves (and takes the stop signal): rank 0 under mpirun.
        self.pid = rank0_pid(self.proc.pid) if serve_ranks() > 1 else self.proc.pid

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
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
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
        """SIGTERM to the serving process: under mpirun, rank 0 stops the others and mpirun exits 0,
        rank 0 reporting the row gathers its steps made (some, when it ran a step)."""
        steps = None  # unknown behind an API key (or where the server no longer answers)
        try:
            if serve_ranks() > 1 and self.proc.poll() is None and self.request("GET", "/metrics")[0] == 200:
                steps = self.metrics().get("lineage_steps_total", 0)
        except OSError:
            pass  # the signal below still stops it: no server is left running
        os.kill(self.pid, signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("lineage serve did not stop on SIGTERM")
        rest = self.proc.stderr.read()
        assert self.proc.returncode == 0, f"lineage serve exited {self.proc.returncode}: {rest}"
        if serve_ranks() > 1:
            m = re.search(rf"lineage: {serve_ranks()} ranks over .*: (\d+) row gathers", rest)
            assert m, f"rank 0 did not report its gathers: {rest}"
            assert steps is None or (int(m.group(1)) > 0) == (steps > 0), f"{steps} steps, {m.group(1)} gathers"


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
