"""A local Flower deployment for tests: a real SuperLink and SuperNodes on 127.0.0.1.

:class:`LocalDeployment` (a context manager) starts ``flower-superlink`` and
``flower-supernode`` processes in insecure mode with runtime dependency
installation off, each with its own ``FLWR_HOME`` (as on separate machines),
runs ``flwr`` CLI commands against them through a connection in a private
``config.toml``, and on exit stops exactly the processes it started:

* every process is started with ``start_new_session=True``, so it leads its own
  process group; its SuperExec, ServerApp and ClientApp children are found in
  that group or, because the SuperLink detaches its SuperExec into a new session,
  by an environment variable (``FLWR_DP_DEPLOY_TAG=<uuid>``) every process of this
  deployment inherits and no other process has (Linux: ``/proc/<pid>/environ``);
* stopping is SIGTERM to those processes (and groups), a wait, then SIGKILL.

The binaries are taken from the directory of ``sys.executable`` (the venv that
runs the tests), and that directory is put first on ``PATH``, because the
SuperLink and SuperNode launch ``flower-superexec`` by name. The checkout comes
first on ``PYTHONPATH``: the apps import ``flwr_dp_experiments``, which the
wheel does not ship, and the checkout's library is the one under test.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BIN_DIR = Path(sys.executable).parent
BINARIES = ("flwr", "flower-superlink", "flower-supernode", "flower-superexec")
TAG_VAR = "FLWR_DP_DEPLOY_TAG"
CONNECTION = "test-deploy"
REPO = str(Path(__file__).resolve().parents[1])
#: ``sitecustomize`` of every started process: the heartbeat at Flower's 10 s minimum (tests/deployment_site/)
SITE = str(Path(__file__).resolve().parent / "deployment_site")

#: Offline, quiet, no ``uv sync`` of the app's dependencies.
BASE_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "RAY_DISABLE_USAGE_STATS": "1",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "PYTHONUNBUFFERED": "1",
    "NO_COLOR": "1",
}


def missing_binaries() -> list[str]:
    """The Flower executables that are not installed next to ``sys.executable``."""
    return [name for name in BINARIES if not (BIN_DIR / name).exists()]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_open(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def wait_for(
    condition: Callable[[], Any],
    timeout: float,
    what: str,
    interval: float = 0.5,
    diagnostics: Callable[[], str] = lambda: "",
) -> Any:
    """Poll ``condition`` until it returns something truthy; TimeoutError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}\n{diagnostics()}")
        time.sleep(interval)


def tail(path: Path, chars: int = 3000) -> str:
    """The last ``chars`` characters of a text file ('' if it does not exist)."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    return text[-chars:]


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    except OSError:
        return True


def _all_pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()] if os.path.isdir("/proc") else []


def tagged_pids(tag: str, pids: Iterable[int] | None = None) -> set[int]:
    """Live processes (of ``pids``, default all) whose environment holds ``FLWR_DP_DEPLOY_TAG=tag``.

    Linux ``/proc`` only; other users' processes are unreadable and skipped.
    """
    needle = f"{TAG_VAR}={tag}".encode()
    found: set[int] = set()
    for pid in _all_pids() if pids is None else pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                environ = handle.read()
        except OSError:  # gone, or not ours
            continue
        if needle in environ.split(b"\0") and _pid_alive(pid):
            found.add(pid)
    return found


def cmdline(pid: int) -> str:
    """The command line of ``pid`` ('' if it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _process_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group id) of every live process (from /proc/<pid>/stat)."""
    table = {}
    for pid in _all_pids():
        try:
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            table[pid] = (int(fields[1]), int(fields[2]))
    return table


def _signal_all(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


@dataclass
class Daemon:
    """One started process (leader of its own process group) and its log file."""

    name: str
    popen: subprocess.Popen
    log: Path
    port: int
    home: Path
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        return self.popen.poll() is None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


class LocalDeployment:
    """SuperLink + SuperNodes on loopback, insecure; see the module docstring.

    Usage::

        with LocalDeployment() as dep:
            dep.start_superlink()
            dep.start_supernode(0, 2); dep.start_supernode(1, 2)
            proc = dep.flwr("run", app_dir, CONNECTION, "--stream", timeout=300)
    """

    def __init__(self, root: Path | None = None) -> None:
        self._tmp = None if root is not None else tempfile.TemporaryDirectory(prefix="flwr-deploy-")
        self.root = Path(root if root is not None else self._tmp.name)
        self.root.mkdir(parents=True, exist_ok=True)
        self.tag = uuid.uuid4().hex
        self.daemons: list[Daemon] = []
        self.superlink: Daemon | None = None
        self.cli_home = self.root / "cli-home"
        self.started_pids: set[int] = set()
        self.leftovers: set[int] = set()

    # ------------------------------------------------------------------ environment
    def env(self, home: Path) -> dict[str, str]:
        """The environment of every process: offline settings, own FLWR_HOME, venv first on PATH, the tag."""
        env = dict(os.environ, **BASE_ENV)
        env["FLWR_HOME"] = str(home)
        env["PATH"] = os.pathsep.join([str(BIN_DIR), env.get("PATH", "")])
        env["PYTHONPATH"] = os.pathsep.join(
            [SITE, REPO] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in (REPO, SITE)]
        )
        env[TAG_VAR] = self.tag
        return env

    def write_cli_config(self, port: int) -> Path:
        """``$FLWR_HOME/config.toml`` of the CLI with the connection ``test-deploy`` to the SuperLink."""
        self.cli_home.mkdir(parents=True, exist_ok=True)
        path = self.cli_home / "config.toml"
        path.write_text(
            "[superlink]\n"
            f'default = "{CONNECTION}"\n\n'
            f"[superlink.{CONNECTION}]\n"
            f'address = "127.0.0.1:{port}"\n'
            "insecure = true\n"
        )
        return path

    # ------------------------------------------------------------------ processes
    def _spawn(self, name: str, argv: list[str], port: int, home: Path | None = None) -> Daemon:
        home = home or self.root / name
        home.mkdir(parents=True, exist_ok=True)
        log = self.root / f"{name}.log"
        with open(log, "ab") as handle:
            popen = subprocess.Popen(
                argv,
                stdout=handle,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env(home),
                cwd=home,
                start_new_session=True,
            )
        daemon = Daemon(name, popen, log, port, home)
        self.daemons.append(daemon)
        self.started_pids.add(popen.pid)
        return daemon

    def start_superlink(
        self, name: str = "superlink", port: int | None = None, database: Path | None = None, timeout: float = 60
    ) -> Daemon:
        """``flower-superlink --insecure --host 127.0.0.1 --port P --disable-runtime-dependency-installation``.

        ``database``: ``--database FILE`` (SQLite state that survives a restart;
        default: in-memory state).
        """
        port = port or free_port()
        argv = [
            str(BIN_DIR / "flower-superlink"),
            "--insecure",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--disable-runtime-dependency-installation",
        ]
        if database is not None:
            argv += ["--database", str(database)]
        daemon = self._spawn(name, argv, port)
        self.superlink = daemon
        self.write_cli_config(port)
        wait_for(
            lambda: port_open(port) or not daemon.running(),
            timeout,
            f"{name} to listen on {port}",
            diagnostics=self.diagnostics,
        )
        if not daemon.running():
            raise RuntimeError(f"{name} exited with {daemon.popen.returncode}\n{self.diagnostics()}")
        return daemon

    def start_supernode(
        self,
        partition_id: int,
        num_partitions: int,
        name: str | None = None,
        timeout: float = 60,
        node_config: str = "",
    ) -> Daemon:
        """``flower-supernode --insecure --superlink 127.0.0.1:P --node-config "partition-id=i num-partitions=n ..."``
        (``node_config``: more ``key=value`` pairs, e.g. the node's roster files).

        Waits until the node is registered at the SuperLink (its log shows
        ``SuperNode ID: N``, printed after the SuperLink activated it); the node
        ID is kept in ``daemon.extra["node_id"]``.
        """
        assert self.superlink is not None, "start the SuperLink first"
        name = name or f"supernode-{partition_id}"
        port = free_port()
        argv = [
            str(BIN_DIR / "flower-supernode"),
            "--insecure",
            "--superlink",
            f"127.0.0.1:{self.superlink.port}",
            "--node-config",
            f"partition-id={partition_id} num-partitions={num_partitions}" + (f" {node_config}" if node_config else ""),
            "--port",
            str(port),
        ]
        daemon = self._spawn(name, argv, port)
        daemon.extra["partition_id"] = partition_id
        wait_for(
            lambda: node_id(daemon.log_text()) or not daemon.running(),
            timeout,
            f"{name} to register at the SuperLink",
            diagnostics=self.diagnostics,
        )
        if not daemon.running():
            raise RuntimeError(f"{name} exited with {daemon.popen.returncode}\n{self.diagnostics()}")
        daemon.extra["node_id"] = node_id(daemon.log_text())
        return daemon

    def flwr(self, *args: str, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess:
        """Run a ``flwr`` CLI command with this deployment's FLWR_HOME (the connection ``test-deploy``)."""
        self.cli_home.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [str(BIN_DIR / "flwr"), *args],
            env=self.env(self.cli_home),
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"flwr {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def flwr_background(self, *args: str, log_name: str = "flwr-run") -> Daemon:
        """Start a ``flwr`` CLI command in the background (e.g. ``run ... --stream``), output to a log file."""
        return self._spawn(log_name, [str(BIN_DIR / "flwr"), *args], 0, home=self.cli_home)

    # ------------------------------------------------------------------ stopping
    def is_ours(self, pid: int) -> bool:
        """Whether ``pid`` is a live process of this deployment (it carries this deployment's tag)."""
        return pid in tagged_pids(self.tag, [pid])

    def processes_of(self, daemon: Daemon) -> set[int]:
        """Live processes of ``daemon``: its process group and its descendants (also in other sessions)."""
        table = _process_table()
        pids = {pid for pid, (_, pgid) in table.items() if pgid == daemon.pid}
        if daemon.running():
            pids.add(daemon.pid)
        frontier = set(pids)
        while frontier:
            children = {pid for pid, (ppid, _) in table.items() if ppid in frontier} - pids
            pids |= children
            frontier = children
        return {pid for pid in pids if self.is_ours(pid)}

    def our_pids(self) -> set[int]:
        """Live processes of this deployment: every tagged process, and the started ones' groups."""
        pids = tagged_pids(self.tag)
        for daemon in self.daemons:
            pids |= self.processes_of(daemon)
        pids.discard(os.getpid())
        return pids

    def kill(self, daemon: Daemon) -> set[int]:
        """SIGKILL ``daemon``'s process group (a crash: the SuperNode, its SuperExec and ClientApps).

        Returns the processes of ``daemon`` still alive afterwards (should be none).
        """
        targets = self.processes_of(daemon)
        try:
            os.killpg(daemon.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        daemon.popen.wait(timeout=10)
        _signal_all(self._alive_of(targets), signal.SIGKILL)  # any descendant outside the group
        deadline = time.monotonic() + 10
        while self._alive_of(targets) and time.monotonic() < deadline:
            time.sleep(0.1)
        return self._alive_of(targets)

    def _alive_of(self, pids: Iterable[int]) -> set[int]:
        return {pid for pid in pids if self.is_ours(pid)}

    def stop(self, daemon: Daemon, grace: float = 15) -> None:
        """SIGTERM ``daemon``'s group and descendants, wait up to ``grace`` s, then SIGKILL what is left."""
        self._terminate([daemon], grace)

    def _terminate(self, daemons: Iterable[Daemon], grace: float) -> None:
        daemons = list(daemons)
        # Snapshot first: once a leader dies, its children are re-parented and cannot be found by parent.
        targets: set[int] = set()
        for daemon in daemons:
            targets |= self.processes_of(daemon)
        for daemon in daemons:
            if daemon.running():
                try:
                    os.killpg(daemon.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace
        for daemon in daemons:
            try:
                daemon.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(daemon.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                daemon.popen.wait(timeout=10)
        # Children in other sessions (the SuperLink's SuperExec, its ServerApp) and stragglers.
        self._stop_pids(targets, max(2.0, deadline - time.monotonic()))

    def _stop_pids(self, pids: set[int], grace: float) -> None:
        """SIGTERM the (still ours) ``pids``, wait up to ``grace`` s, SIGKILL the rest."""
        pids = self._alive_of(pids)
        _signal_all(pids, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            time.sleep(0.2)
            pids = self._alive_of(pids)
        _signal_all(pids, signal.SIGKILL)

    def close(self, grace: float = 15) -> set[int]:
        """Stop everything this deployment started (CLI and SuperNodes first, then SuperLinks).

        Returns the processes of this deployment still alive afterwards (also kept
        in :attr:`leftovers`; it should be empty).
        """
        links = [d for d in self.daemons if d.name.startswith("superlink")]
        self._terminate([d for d in self.daemons if d not in links], grace)
        self._terminate(links, grace)
        self._stop_pids(self.our_pids(), grace)
        time.sleep(0.2)
        self.leftovers = self.our_pids()
        return self.leftovers

    def __enter__(self) -> "LocalDeployment":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.close()
        finally:
            if self._tmp is not None:
                self._tmp.cleanup()

    # ------------------------------------------------------------------ runs
    def run_status(self, run_id: int, connection: str = CONNECTION) -> dict[str, Any]:
        """``flwr ls CONNECTION --run-id N --format json``'s entry for the run (``status``: e.g. ``finished:completed``)."""
        proc = self.flwr("ls", connection, "--run-id", str(run_id), "--format", "json", timeout=60)
        try:
            data = json.loads(proc.stdout)
            runs = data["runs"]
        except (ValueError, KeyError) as err:
            raise RuntimeError(f"flwr ls: unexpected output ({err})\n{proc.stdout}\n{proc.stderr}") from None
        return next(run for run in runs if int(run["run-id"]) == int(run_id))

    def diagnostics(self, chars: int = 2500) -> str:
        """Tails of every log, for assertion messages."""
        parts = []
        for log in sorted(self.root.glob("*.log")):
            parts.append(f"----- {log.name} (tail) -----\n{tail(log, chars)}")
        return "\n".join(parts)


def node_id(log_text: str) -> int | None:
    """The last ``SuperNode ID: N`` in a SuperNode's log (the ID the SuperLink gave it)."""
    found = re.findall(r"SuperNode ID: (\d+)", log_text)
    return int(found[-1]) if found else None


def parse_run_id(text: str) -> int | None:
    """The run ID in ``flwr run``'s 'Successfully started run N' line."""
    match = re.search(r"Successfully started run (\d+)", text)
    return int(match.group(1)) if match else None


# ---------------------------------------------------------------------- shared by the deployment tests
def roster_node_config(directory, partition_id: int, **extra) -> str:
    """The node config that gives SuperNode ``partition_id`` its identity in a demo roster written to ``directory``
    (``flwr_dp_strategies.cli.write_demo_roster``), plus ``extra`` keys."""
    pairs = {
        "dp-signing-key": f"{directory}/node-{partition_id}.pem",
        "dp-roster": f"{directory}/roster.json",
        "dp-roster-signer": f"{directory}/operator.pub",
        **extra,
    }
    return " ".join(f'{k}="{v}"' if isinstance(v, str) else f"{k}={v}" for k, v in pairs.items())


def run_config(**settings: object) -> str:
    """``--run-config`` text: strings and paths quoted, booleans lower-case, numbers as they are."""

    def value(v: object) -> str:
        if isinstance(v, bool):
            return str(v).lower()
        return f"'{v}'" if isinstance(v, (str, Path)) else str(v)

    return " ".join(f"{key}={value(v)}" for key, v in settings.items())


def wait_finished(dep: LocalDeployment, run_id: int, timeout: float = 60, interval: float = 2) -> dict:
    """``flwr ls`` entry of the run once its status is ``finished:*``."""

    def finished() -> dict | None:
        run = dep.run_status(run_id)
        return run if run["status"].startswith("finished") else None

    return wait_for(finished, timeout, f"run {run_id} to finish", interval=interval, diagnostics=dep.diagnostics)


def finished_run(dep: LocalDeployment, output: str, timeout: float = 60, interval: float = 2) -> dict:
    """The run started in ``output`` (``flwr run``'s), once finished; asserts it completed."""
    run_id = parse_run_id(output)
    assert run_id is not None, output[-4000:] + dep.diagnostics()
    run = wait_finished(dep, run_id, timeout, interval)
    assert run["status"] == "finished:completed", f"{run}\n{output[-4000:]}{dep.diagnostics()}"
    return run


def kill_while_training(dep: LocalDeployment, victim: Daemon, cli: Daemon, nth_message: int, timeout: float) -> None:
    """Wait until ``victim`` receives its ``nth_message``-th train message and its ClientApp runs, then
    SIGKILL it (SuperNode, SuperExec and ClientApp); asserts it had replied to the earlier ones only."""
    wait_for(
        lambda: (
            len(re.findall(r"Receiving: train message", victim.log_text())) >= nth_message
            or cli.popen.poll() is not None
        ),
        timeout,
        f"the victim's train message {nth_message}",
        interval=0.2,
        diagnostics=dep.diagnostics,
    )
    wait_for(
        lambda: any("flwr-clientapp" in cmdline(pid) for pid in dep.processes_of(victim)),
        60,
        "the victim's ClientApp process",
        interval=0.1,
        diagnostics=dep.diagnostics,
    )
    assert not dep.kill(victim), "processes of the killed SuperNode survived"
    replied = len(re.findall(r"Sending: train message", victim.log_text()))  # its log is final now
    assert replied == nth_message - 1, f"the victim had replied {replied} times\n" + dep.diagnostics()


def no_reply_counts(metrics: dict) -> bool:
    """The round's metrics hold no count of failed or rejected replies (those stay in the server's log)."""
    return not any(key.startswith(("replies/", "rejected/")) for key in metrics)
