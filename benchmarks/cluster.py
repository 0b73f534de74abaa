"""Launching and inspecting a ``veil serve --replicas N`` subprocess (benchmarks and tests).

``launch_cluster`` returns once every replica answers ``/health``. Replica processes are found
through the line each replica prints when it is ready (``veil replica <id> ready: pid <pid>``),
which Ray forwards to the server's log.
"""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

READY = re.compile(r"veil replica (\w+) ready: pid (\d+)")


@dataclass
class ClusterServer:
    proc: subprocess.Popen
    url: str
    key: str
    log: Path

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=30).json()

    def replica_pids(self) -> dict[str, int]:
        """Every replica that has started so far (dead ones included), by replica id."""
        return {m[1]: int(m[2]) for m in READY.finditer(self.log.read_text(errors="replace"))}

    def running(self) -> list[str]:
        return [r["id"] for r in self.health().get("replica_status", []) if r["status"] == "ok"]

    def wait_replicas(self, n: int, timeout_s: float = 300, without: str | None = None) -> float:
        """Seconds until ``n`` replicas are healthy (none of them ``without``) and each one's
        ready line is in the log."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log.read_text()[-2000:]}")
            try:
                ids = self.running()
            except (httpx.HTTPError, ValueError):
                ids = []
            if len(ids) >= n and without not in ids and set(ids) <= set(self.replica_pids()):
                return time.monotonic() - t0
            time.sleep(0.5)
        raise RuntimeError(f"{n} replicas not healthy after {timeout_s:.0f} s: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)


def launch_cluster(tmp: Path, replicas: int, scopes: tuple[str, ...] = ("plaintext", "protected"),
                   serve_args: list[str] | None = None, cwd: Path | None = None) -> ClusterServer:
    from veil.benchmarks.engine_throughput import launch_server

    proc, url, key = launch_server(tmp, scopes, ["--replicas", str(replicas), *(serve_args or [])], cwd)
    srv = ClusterServer(proc, url, key, tmp / "server.log")
    try:
        srv.wait_replicas(replicas)
    except BaseException:
        srv.stop()
        raise
    return srv


def tree_peak_rss(pid: int) -> int:
    """Sum of VmHWM (peak resident set) over a process and its descendants, in bytes (Linux):
    the whole server, Ray's processes included. The peaks need not be simultaneous."""
    import psutil

    total = 0
    for p in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
        try:
            for line in open(f"/proc/{p.pid}/status"):
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass  # gone meanwhile
    return total
