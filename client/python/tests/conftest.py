"""Fixtures: a private gpuqd for the session, private ones for tests that break
theirs, and a fake daemon for what a real one never sends.

Environment: ``GPUQ_BUILD`` (default ``build`` at the repository root) holds
``gpuqd``; ``GPUQ_TEST_BACKEND`` is ``host`` (default) or ``cuda``. On a
machine where the backend has no device every test is skipped, and the session
says so in one line per reason, with its count (``skipped 40 tests: no cuda
device: ...``), as the C suite does. The session ends with one line,
``RESULT python[-cuda]: N passed, N failed, N skipped``, that tests/run.sh sums.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, List, Optional

import pytest

import gpuq
from gpuq.wire import encode_frame

REPO = Path(__file__).resolve().parents[3]
BUILD = Path(os.environ.get("GPUQ_BUILD") or REPO / "build")
if not BUILD.is_absolute():
    BUILD = REPO / BUILD
BACKEND = os.environ.get("GPUQ_TEST_BACKEND", "host")
TIER = "python" if BACKEND == "host" else f"python-{BACKEND}"
GPUQD = BUILD / "gpuqd"

_probe: Optional[str] = None


def probe_backend() -> Optional[str]:
    """None when the backend has a device, else why not (cached)."""
    global _probe
    if _probe is None:
        if not GPUQD.exists():
            _probe = f"no {GPUQD} (run make first)"
        else:
            run = subprocess.run([str(GPUQD), "--probe", "--backend", BACKEND],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, timeout=120)
            lines = run.stdout.strip().splitlines()
            _probe = "" if run.returncode == 0 else (lines[-1] if lines else "probe failed")
    return _probe or None


class Daemon:
    """A gpuqd of its own on a socket in a temporary directory."""

    def __init__(self, *args: str, env: Optional[dict] = None) -> None:
        self.dir = tempfile.mkdtemp(prefix="gpuq-py.")
        self.socket = os.path.join(self.dir, "gpuqd.sock")
        self.log = os.path.join(self.dir, "gpuqd.log")
        argv = [str(GPUQD), "--backend", BACKEND, "--socket", self.socket,
                "--log-level", "warn", *args]
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=log,
                                         env=dict(os.environ, **(env or {})))
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gpuqd exited {self.proc.returncode}: {self.read_log()}")
            try:
                with gpuq.Client(self.socket, timeout=5) as c:
                    c.ping()
                return
            except ConnectionError:
                time.sleep(0.02)
        raise RuntimeError(f"gpuqd did not answer within 30 s: {self.read_log()}")

    def read_log(self) -> str:
        with open(self.log) as f:
            return f.read()

    def client(self, **kw) -> gpuq.Client:
        return gpuq.Client(self.socket, **kw)

    def stop(self) -> int:
        """SIGTERM, then SIGKILL after 20 s; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)
        return self.proc.returncode


@pytest.fixture(scope="session")
def daemon() -> Iterator[Daemon]:
    """The daemon most tests share: each test uses buffer names of its own."""
    why = probe_backend()
    if why:
        pytest.skip(f"no {BACKEND} device: {why}")
    d = Daemon()
    yield d
    d.stop()


@pytest.fixture
def private_daemon() -> Iterator[Callable[..., Daemon]]:
    """Starts daemons of the test's own (with extra options); stops them after."""
    why = probe_backend()
    if why:
        pytest.skip(f"no {BACKEND} device: {why}")
    started: List[Daemon] = []

    def start(*args: str, env: Optional[dict] = None) -> Daemon:
        d = Daemon(*args, env=env)
        started.append(d)
        return d
    yield start
    for d in started:
        d.stop()


class Stalled:
    """A private daemon whose device 0 runs a put (into ``w@0``) from a pipe that
    nothing feeds: the job runs until it is fed and ended, or cancelled. The
    daemon keeps one job in flight per device (``--max-inflight=1``), so that
    later jobs there stay queued behind the put."""

    def __init__(self, daemon: Daemon, timeout: float) -> None:
        self.daemon = daemon
        self.client = daemon.client(timeout=timeout)
        self.client.alloc("w", nbytes=1 << 16)
        r, self._w = os.pipe()
        self._end_lock = threading.Lock()
        try:
            self.job = self.client.put(r, "w", detach=True)
        finally:
            os.close(r)
        deadline = time.monotonic() + 10
        while self.job.refresh().state == "queued" and time.monotonic() < deadline:
            time.sleep(0.002)
        assert self.job.state == "running", self.job

    def feed(self, data: bytes) -> None:
        os.write(self._w, data)

    def end(self) -> None:
        """Closes the pipe: the put ends with what it was fed. Under a lock: a
        timer thread's end() and the teardown's may overlap, since the job can
        finish (EOF seen) before the timer's thread returns from close."""
        with self._end_lock:
            w, self._w = self._w, None
        if w is not None:
            os.close(w)

    def close(self) -> None:
        self.end()
        self.client.close()


@pytest.fixture
def stalled(private_daemon) -> Iterator[Callable[..., Stalled]]:
    """Starts a :class:`Stalled` daemon (with extra gpuqd options, a client timeout)."""
    made: List[Stalled] = []

    def start(*args: str, timeout: float = gpuq.DEFAULT_TIMEOUT) -> Stalled:
        s = Stalled(private_daemon("--max-inflight=1", *args), timeout)
        made.append(s)
        return s
    yield start
    for s in made:
        s.close()


@pytest.fixture
def client(daemon: Daemon) -> Iterator[gpuq.Client]:
    with daemon.client() as c:
        yield c


@pytest.fixture
def name(request) -> str:
    """A buffer name of this test's own, valid for gpuqd (1 to 64 of [A-Za-z0-9_.-])."""
    base = request.node.name.replace("[", "-").replace("]", "").replace("/", "-")
    return "".join(ch if ch.isalnum() or ch in "_.-" else "_" for ch in base)[-48:].lstrip(".-")


def host_only() -> None:
    if BACKEND != "host":
        pytest.skip("needs the host backend's test hooks")


class FakeDaemon:
    """A UNIX socket server that answers as the test says, for what gpuqd never does.

    ``handler(conn, requests)`` runs in a thread for the first connection;
    ``requests`` receives each decoded request map as it is read by
    :meth:`read_request`.
    """

    def __init__(self, handler: Callable[["FakeDaemon", socket.socket], None]) -> None:
        self.dir = tempfile.mkdtemp(prefix="gpuq-fake.")
        self.socket = os.path.join(self.dir, "fake.sock")
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.socket)
        self.server.listen(4)
        self.requests: List[dict] = []
        self.fds: List[int] = []
        self._handler = handler
        self._buf = b""
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.server.settimeout(20)
        try:
            conn, _ = self.server.accept()
        except OSError:
            return
        conn.settimeout(20)
        try:
            self._handler(self, conn)
        except OSError:
            pass
        finally:
            self.conn_done = True

    def read_request(self, conn: socket.socket) -> dict:
        import msgpack
        while True:
            if len(self._buf) >= 4:
                n = int.from_bytes(self._buf[:4], "big")
                if len(self._buf) >= 4 + n:
                    req = msgpack.unpackb(self._buf[4:4 + n], raw=False)
                    self._buf = self._buf[4 + n:]
                    self.requests.append(req)
                    return req
            data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 4)
            self.fds.extend(fds)
            if not data:
                raise OSError("client closed")
            self._buf += data

    @staticmethod
    def reply(conn: socket.socket, req: dict, **body) -> None:
        conn.sendall(encode_frame({"id": req["id"], "ok": True, **body}))

    def close(self) -> None:
        self.server.close()
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def fake() -> Iterator[Callable[..., FakeDaemon]]:
    made: List[FakeDaemon] = []

    def start(handler: Callable[[FakeDaemon, socket.socket], None]) -> FakeDaemon:
        f = FakeDaemon(handler)
        made.append(f)
        return f
    yield start
    for f in made:
        f.close()


DAEMON_FIXTURES = {"daemon", "private_daemon", "stalled", "client"}


def pytest_collection_modifyitems(config, items) -> None:
    """On a device backend, only the tests that talk to a gpuqd run: the others
    (error classes, the wire, a fake daemon) do not depend on it and run in
    the host tier."""
    if BACKEND == "host":
        return
    keep = [i for i in items if DAEMON_FIXTURES & set(getattr(i, "fixturenames", ()))]
    dropped = [i for i in items if i not in keep]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def skip_reason(report) -> str:
    """A skipped test's reason, without pytest's "Skipped: " prefix."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text[len("Skipped: "):] if text.startswith("Skipped: ") else text


def pytest_terminal_summary(terminalreporter) -> None:
    stats = terminalreporter.stats
    passed = len(stats.get("passed", []))
    failed = len(stats.get("failed", [])) + len(stats.get("error", []))
    skipped = len(stats.get("skipped", []))
    # One line per distinct reason with its count, as the C harness prints:
    # "skipped 40 tests: no cuda device: ...".
    reasons: dict = {}
    for report in stats.get("skipped", []):
        reason = skip_reason(report)
        count, first = reasons.get(reason, (0, report.nodeid))
        reasons[reason] = (count + 1, first)
    for reason, (count, first) in reasons.items():
        if count == 1:
            terminalreporter.write_line(f"skipped 1 test ({TIER}/{first}): {reason}")
        else:
            terminalreporter.write_line(f"skipped {count} tests: {reason}")
    terminalreporter.write_line(f"RESULT {TIER}: {passed} passed, {failed} failed, "
                                f"{skipped} skipped")
