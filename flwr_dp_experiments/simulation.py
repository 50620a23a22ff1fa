"""Running a Flower app the supported way (Flower 1.41): a local SuperLink in simulation mode + ``flwr run``.

``flwr.simulation.run_simulation`` is deprecated in Flower 1.41 ("use `flwr run`
in the CLI instead"). What ``flwr run`` does for a local federation is: start a
``flower-superlink --simulation`` (the ``:local:`` address in
``~/.flwr/config.toml``), build the app's FAB from its folder (the one with
``pyproject.toml``), submit it with the run config and the federation config
(``num-supernodes``, client resources), and stream the run's logs. Flower's own
``:local:`` SuperLink is left running in the background on a fixed port with its
state in ``~/.flwr``; :class:`LocalSimulation` does the same steps with a
SuperLink it owns instead:

1. a private ``FLWR_HOME`` (temporary folder: the SuperLink connection, the
   installed FAB) and a free port, so that nothing in ``~/.flwr`` is read or
   written and two runs never meet;
2. ``flower-superlink --insecure --simulation
   --disable-runtime-dependency-installation`` (offline: the app runs in this
   interpreter's environment, no ``uv sync``), in its own process group, which
   :meth:`LocalSimulation.close` ends (SIGTERM, then SIGKILL) on exit, on an
   exception and on Ctrl-C;
3. ``flwr run <app> <connection> --run-config <file.toml> --federation-config
   "num-supernodes=N ..." --stream`` per run; the streamed lines (Flower's and
   Ray's logs, the apps' prints) go to a log file, and to a callback (a
   progress bar), and to stdout only when ``verbose``.

The apps then get their settings from ``context.run_config`` (pyproject's
``[tool.flwr.app.config]`` overridden by the run config given here); the
ServerApp writes its results file, which :func:`run_app` reads back.
:func:`resolve_run_config` still layers an environment variable between the
defaults and the run config, for apps started some other way.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any, Optional

OFFLINE_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "RAY_DISABLE_USAGE_STATS": "1",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
}
#: The checkout (flwr_dp_strategies, client_mods, flwr_dp_experiments): first on the apps' path.
REPO = str(Path(__file__).resolve().parents[1])
#: Name of the SuperLink connection written into the private FLWR_HOME.
CONNECTION = "local-simulation"
STARTUP_TIMEOUT_S = 60.0
#: Environment variable that every process a LocalSimulation starts inherits (its value is unique per
#: instance): how close() finds the detached SuperExec, simulation and Ray processes to end them.
MARKER = "FLWR_DP_LOCAL_SIMULATION"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def prepare_process(folders: Iterable[str]) -> None:
    """Make ``folders`` importable here and in child processes; switch Flower, Ray and HF offline."""
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    for folder in folders:
        folder = os.path.abspath(folder)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        if folder not in paths:
            paths.insert(0, folder)
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)


def resolve_run_config(
    defaults: Mapping[str, Any], env_var: str, run_config: Optional[Mapping[str, Any]] = None
) -> dict[str, Any]:
    """``defaults`` < JSON in ``env_var`` < ``run_config`` (later wins)."""
    config = dict(defaults)
    config.update(json.loads(os.environ.get(env_var, "") or "{}"))
    if run_config is not None:
        config.update(run_config)
    return config


def app_config(app_dir: str | os.PathLike) -> dict[str, Any]:
    """The ``[tool.flwr.app.config]`` table of the app's pyproject.toml."""
    with open(Path(app_dir) / "pyproject.toml", "rb") as handle:
        return dict(tomllib.load(handle)["tool"]["flwr"]["app"]["config"])


def _toml_value(key: str, value: Any) -> str:
    """One TOML value of a run config (bool, int, finite float or string)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"run config {key!r}: {value} is not a finite float (Flower's run config is TOML)")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string
    raise TypeError(f"run config {key!r}: {type(value).__name__} is not bool, int, float or str")


def write_run_config(path: str | os.PathLike, run_config: Mapping[str, Any]) -> str:
    """``run_config`` as a flat TOML file for ``flwr run --run-config <file>`` (quoted keys); returns the path."""
    lines = [f"{json.dumps(str(key))} = {_toml_value(str(key), value)}" for key, value in run_config.items()]
    Path(path).write_text("\n".join(lines) + "\n")
    return str(path)


def _free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _executable(name: str) -> str:
    """A console script of this interpreter's environment (``flwr``, ``flower-superlink``)."""
    candidate = Path(sys.executable).with_name(name)
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"`{name}` not found next to {sys.executable} nor on PATH: is flwr installed?")
    return found


class LocalSimulation:
    """A private local SuperLink in simulation mode; :meth:`run` submits an app to it with ``flwr run``.

    Use it as a context manager (the SuperLink and everything it started end on
    exit, exception or Ctrl-C included)::

        with LocalSimulation("results/flower.log") as sim:
            sim.run("examples/quickstart", {"num-server-rounds": 3}, num_supernodes=10)

    ``log_file`` receives the SuperLink's output and every streamed line of
    every run (appended); ``verbose`` echoes them to stdout as well.
    ``pythonpath`` folders (default: the checkout) come first on the apps'
    ``sys.path``, so the checkout's library is the one the apps import.
    """

    def __init__(
        self,
        log_file: str | os.PathLike,
        *,
        verbose: bool = False,
        pythonpath: Iterable[str] = (REPO,),
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
    ) -> None:
        self.log_file = Path(log_file).resolve()
        self.verbose = verbose
        self.pythonpath = [os.path.abspath(p) for p in pythonpath]
        self.startup_timeout_s = startup_timeout_s
        self.port: Optional[int] = None
        self.home: Optional[str] = None
        self._process: Optional[subprocess.Popen] = None
        self._runs: list[subprocess.Popen] = []
        self._log: Optional[IO[str]] = None
        self._log_lock = threading.Lock()
        self._reader: Optional[threading.Thread] = None
        self._marker = f"{os.getpid()}-{time.time_ns()}"

    # -- environment ------------------------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """The environment of the SuperLink and of ``flwr run``: offline, private FLWR_HOME, the path first."""
        env = dict(os.environ)
        for key, value in OFFLINE_ENV.items():
            env.setdefault(key, value)
        paths = self.pythonpath + [
            p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in self.pythonpath
        ]
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env["FLWR_HOME"] = str(self.home)
        env[MARKER] = self._marker
        # The SuperLink starts flower-superexec, flwr-simulation, ... by name: this environment's first.
        env["PATH"] = os.pathsep.join([os.path.dirname(_executable("flwr")), env.get("PATH", "")])
        env["PYTHONUNBUFFERED"] = "1"
        # SuperExec looks for new runs every second by default; a run waits for that twice (ServerApp, simulation).
        env.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.1")
        return env

    def _write(self, line: str) -> None:
        """One line to the log file (and to stdout when verbose)."""
        with self._log_lock:
            if self._log is not None:
                self._log.write(line)
                self._log.flush()
            if self.verbose:
                sys.stdout.write(line)
                sys.stdout.flush()

    def _pump(self, stream: IO[str], on_line: Optional[Callable[[str], None]] = None) -> None:
        """Copy ``stream`` line by line to the log (ANSI colours removed), calling ``on_line`` on each."""
        for raw in stream:
            line = _ANSI.sub("", raw)
            self._write(line)
            if on_line is not None:
                on_line(line.rstrip("\n"))

    # -- lifecycle --------------------------------------------------------------------------------------------
    def start(self) -> "LocalSimulation":
        """Start the SuperLink (simulation mode, own process group) and wait until it answers /health."""
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_file, "a", encoding="utf-8")
        self.home = tempfile.mkdtemp(prefix="flwr-home-")
        self.port = _free_port()
        Path(self.home, "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "127.0.0.1:{self.port}"\ninsecure = true\n'
        )
        command = [
            _executable("flower-superlink"),
            "--insecure",
            "--simulation",
            "--disable-runtime-dependency-installation",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        self._write(f"$ {' '.join(command)}\n")
        self._process = subprocess.Popen(
            command,
            env=self.env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._pump, args=(self._process.stdout,), daemon=True)
        self._reader.start()
        deadline = time.monotonic() + self.startup_timeout_s
        while not self._healthy():
            if self._process.poll() is not None:
                raise RuntimeError(f"flower-superlink exited with code {self._process.returncode}; see {self.log_file}")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"flower-superlink did not answer within {self.startup_timeout_s:.0f} s; see {self.log_file}"
                )
            time.sleep(0.2)
        return self

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def close(self) -> None:
        """End every process this SuperLink started (``flwr run``, SuperExec, simulation, Ray), then itself.

        The SuperLink starts SuperExec and the simulation detached (own sessions),
        so its process group is not enough: every process that inherited this
        instance's :data:`MARKER` environment variable is ended (SIGTERM, then
        SIGKILL after a grace period), the SuperLink's group included.
        """
        for proc in self._runs:
            _terminate(proc, group=False, grace_s=2.0)
        self._runs.clear()
        if self._process is not None:
            leftover = _processes_with(MARKER, self._marker) - {os.getpid()}
            _signal_all(leftover, signal.SIGTERM)
            _terminate(self._process, group=True)
            deadline = time.monotonic() + 10.0
            while (leftover := _processes_with(MARKER, self._marker) - {os.getpid()}) and time.monotonic() < deadline:
                time.sleep(0.2)
            _signal_all(leftover, signal.SIGKILL)
            if self._reader is not None:
                self._reader.join(timeout=5)
            self._process = None
        if self._log is not None:
            with self._log_lock:
                self._log.close()
                self._log = None
        if self.home is not None:
            shutil.rmtree(self.home, ignore_errors=True)
            self.home = None

    def __enter__(self) -> "LocalSimulation":
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- runs -------------------------------------------------------------------------------------------------
    def run(
        self,
        app_dir: str | os.PathLike,
        run_config: Mapping[str, Any],
        *,
        num_supernodes: int,
        num_cpus: int = 1,
        num_gpus: float = 0.0,
        on_line: Optional[Callable[[str], None]] = None,
        federation_config: Optional[Mapping[str, Any]] = None,
        timeout_s: Optional[float] = None,
    ) -> None:
        """``flwr run app_dir`` with ``run_config`` on ``num_supernodes`` simulated SuperNodes; wait for the end.

        Keys of ``run_config`` must be in the app's ``[tool.flwr.app.config]``
        (Flower refuses others). ``on_line`` gets every streamed line (no ANSI
        colours). ``federation_config`` adds other simulation settings (e.g.
        ``{"init-args-num-cpus": 2}``: the CPUs Ray may use). Raises when ``flwr
        run`` fails; whether the app succeeded is for the caller to check (the
        file it writes).
        """
        if self._process is None or self.home is None:
            raise RuntimeError("LocalSimulation.run() before start() (use it as a context manager)")
        app_dir = Path(app_dir).resolve()
        unknown = sorted(set(run_config) - set(app_config(app_dir)))
        if unknown:
            raise ValueError(f"run config keys {unknown} are not in {app_dir / 'pyproject.toml'}")
        config_file = write_run_config(
            Path(self.home) / f"run-config-{len(self._runs)}-{time.time_ns()}.toml", run_config
        )
        federation = {
            "num-supernodes": int(num_supernodes),
            "client-resources-num-cpus": int(num_cpus),
            "client-resources-num-gpus": float(num_gpus),
            **(federation_config or {}),
        }
        federation = " ".join(f"{key}={_toml_value(key, value)}" for key, value in federation.items())
        command = [
            _executable("flwr"),
            "run",
            str(app_dir),
            CONNECTION,
            "--run-config",
            config_file,
            "--federation-config",
            federation,
            "--stream",
        ]
        self._write(f"$ {' '.join(command)}\n")
        proc = subprocess.Popen(
            command,
            env=self.env(),
            cwd=str(app_dir),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._runs.append(proc)
        try:
            self._pump(proc.stdout, on_line)
            code = proc.wait(timeout=timeout_s)
        finally:
            if proc.poll() is None:
                _terminate(proc, group=False)
            self._runs.remove(proc)
        if code != 0:
            raise RuntimeError(f"`flwr run` exited with code {code}; see {self.log_file}")
        if self._process.poll() is not None:
            raise RuntimeError(f"flower-superlink exited during the run; see {self.log_file}")


def _terminate(proc: subprocess.Popen, *, group: bool, grace_s: float = 10.0) -> None:
    """SIGTERM ``proc`` (its process group when ``group``), SIGKILL after ``grace_s``."""
    if proc.poll() is not None and not group:
        return

    def send(sig: int) -> None:
        try:
            if group:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)
        except (ProcessLookupError, PermissionError):
            pass

    send(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    send(signal.SIGKILL)  # what is left of the group (Ray workers) even when the leader has exited
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass


def _processes_with(name: str, value: str) -> set[int]:
    """PIDs whose environment has ``name=value`` (Linux /proc; empty elsewhere)."""
    needle = b"\0" + f"{name}={value}".encode() + b"\0"
    pids = set()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return pids
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                if needle in b"\0" + handle.read() + b"\0":
                    pids.add(int(entry))
        except OSError:
            continue
    return pids


def _signal_all(pids: Iterable[int], sig: int) -> None:
    """Send ``sig`` to each PID (gone ones are skipped)."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def run_app(
    app_dir: str | os.PathLike,
    run_config: Mapping[str, Any],
    *,
    num_supernodes: int,
    results_path: str | os.PathLike,
    log_file: Optional[str | os.PathLike] = None,
    simulation: Optional[LocalSimulation] = None,
    verbose: bool = False,
    num_cpus: float = 1,
    num_gpus: float = 0.0,
    federation_config: Optional[Mapping[str, Any]] = None,
    echo: Optional[str] = None,
    on_line: Optional[Callable[[str], None]] = None,
) -> Any:
    """Run the Flower app in ``app_dir`` once and return the JSON its ServerApp wrote to ``results_path``.

    With ``simulation`` (a started :class:`LocalSimulation`) the run goes to
    that SuperLink; otherwise one is started for this run, logging to
    ``log_file`` (default: ``flower.log`` next to ``results_path``), and ended
    after it. ``echo`` (a regular expression) prints the streamed lines it
    matches (the app's own per-round lines, say) to stdout; everything goes to
    the log file. ``num_cpus`` per simulated client is rounded up to a whole
    CPU (Flower's federation config takes an integer). ``results_path`` is
    removed first, so a stale file is never mistaken for this run's output.
    """
    results_path = Path(results_path).resolve()
    if results_path.exists():
        results_path.unlink()
    if simulation is None:
        log_file = log_file if log_file is not None else results_path.parent / "flower.log"
        with LocalSimulation(log_file, verbose=verbose) as sim:
            return run_app(
                app_dir,
                run_config,
                num_supernodes=num_supernodes,
                results_path=results_path,
                simulation=sim,
                num_cpus=num_cpus,
                num_gpus=num_gpus,
                federation_config=federation_config,
                echo=echo,
                on_line=on_line,
            )
    callback = on_line
    if echo is not None and not simulation.verbose:
        pattern = re.compile(echo)

        def callback(line: str) -> None:
            if pattern.search(line):
                print(line, flush=True)
            if on_line is not None:
                on_line(line)

    simulation.run(
        app_dir,
        run_config,
        num_supernodes=num_supernodes,
        num_cpus=max(1, math.ceil(num_cpus)),
        num_gpus=num_gpus,
        federation_config=federation_config,
        on_line=callback,
    )
    if not results_path.exists():
        raise RuntimeError(f"the ServerApp did not write {results_path}; see the Flower log {simulation.log_file}")
    with open(results_path) as handle:
        return json.load(handle)


__all__ = [
    "OFFLINE_ENV",
    "REPO",
    "LocalSimulation",
    "app_config",
    "prepare_process",
    "resolve_run_config",
    "run_app",
    "write_run_config",
]
