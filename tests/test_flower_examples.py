"""Drop-in, checked against Flower's own example apps (issue 20).

``tests/flower_examples/`` holds Flower's quickstart-pytorch, quickstart-sklearn and opacus
examples as published (source commit and every changed line in its README: only imports,
to read local data and to replace torchvision). Each test copies one app, applies the change
a user would make -- the ``strategy = FedAvg(...)`` line swapped for one of our strategies,
plus its import -- runs it with ``NODES`` simulated SuperNodes for ``ROUNDS`` rounds
(``run_example.py``: Flower's simulation path with the app's own run config, as ``flwr run``),
and checks that

* the app runs to the end, and every round's train metrics carry ``privacy/epsilon`` and
  ``privacy/delta`` (finite for the DP strategies; ``inf`` for ``AccountedFedAvg`` over clients
  that declare nothing -- the ledger's honest answer for an undeclared dense update);
* nothing is printed or warned beyond what the unmodified app prints with Flower's ``FedAvg``
  (the baseline: run once per app and session, and checked to complete its rounds; it is not a case
  of its own, which would only compare that run with itself): no Python warning, no WARNING or
  ERROR log line that Flower's own run does not show;
* no log line is printed twice by two handlers, and no handler was added to the root logger
  (for the Opacus app: none beyond the one Opacus' own import adds in Flower's unmodified run,
  which already prints its lines twice).

The Opacus app's clients also declare each round's DP-SGD spend, read from their own
``PrivacyEngine`` (one import and one changed line, ``OPACUS_CLIENT_DECLARED_REPLY``: :func:`client_mods.declare_opacus_round`); its check adds that
Flower's example reports the same per-round epsilon every round while the ledger's grows.

Each run is a subprocess, so imported apps, Ray and logging state never leak between cases.
Differences from Flower that these runs show are listed in ``docs/differences-from-flower.md``.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE / "flower_examples"
NODES = 4
ROUNDS = 2
RUN_TIMEOUT_S = 300


@dataclass(frozen=True)
class Example:
    folder: str
    package: str
    run_config: dict


APPS = {
    "quickstart-pytorch": Example("quickstart-pytorch", "pytorchexample", {"num-server-rounds": ROUNDS}),
    "quickstart-sklearn": Example("quickstart-sklearn", "sklearnexample", {"num-server-rounds": ROUNDS}),
    "opacus": Example("opacus", "opacus_fl", {"num-server-rounds": ROUNDS}),
}

FLOWER_IMPORT = "from flwr.serverapp.strategy import FedAvg\n"


def _wrap(template: str):
    def change(line: str) -> str:
        indent, _, call = line.rstrip("\n").partition("strategy = ")
        if not call.endswith(")"):
            raise ValueError(f"not a one-line FedAvg(...) call: {line!r}")
        return f"{indent}strategy = {template.format(call=call)}\n"

    return change


# The one line: what ``strategy = FedAvg(...)`` in the example's server_app.py becomes.
# Flower's keyword names throughout (DifferentialPrivacyServerSideFixedClipping /
# ...AdaptiveClipping(strategy, noise_multiplier, ..., num_sampled_clients)).
DROP_IN = {
    "FedAvg": lambda line: line,  # the unmodified example: Flower's own output, the baseline
    "AccountedFedAvg": lambda line: line.replace("= FedAvg(", "= AccountedFedAvg("),
    "AccountedServerSideFixedClipping": _wrap(
        "AccountedServerSideFixedClipping({call}, noise_multiplier=0.1, clipping_norm=1.0, "
        f"num_sampled_clients={NODES})"
    ),
    "AccountedPoissonFixedClipping": _wrap(
        f"AccountedPoissonFixedClipping({{call}}, noise_multiplier=0.1, clipping_norm=1.0, num_sampled_clients={NODES})"
    ),
    "AccountedAdaptiveClipping": _wrap(
        f"AccountedAdaptiveClipping({{call}}, noise_multiplier=0.1, num_sampled_clients={NODES})"
    ),
    # a server optimizer inside the DP wrapper: FedAvg( becomes FedAdam( (same arguments), released mean first
    "AccountedServerSideFixedClipping(FedAdam)": lambda line: _wrap(
        "AccountedServerSideFixedClipping({call}, noise_multiplier=0.1, clipping_norm=1.0, "
        f"num_sampled_clients={NODES})"
    )(line.replace("= FedAvg(", "= FedAdam(")),
}

STRATEGY_IMPORTS = {"AccountedServerSideFixedClipping(FedAdam)": ["AccountedServerSideFixedClipping", "FedAdam"]}
"""The names a changed line needs beyond Flower's FedAvg (default: the strategy itself)."""


def import_lines(strategy: str) -> list[str]:
    """The import lines a user adds for ``strategy``: ours from flwr_dp_strategies, Flower's from its module."""
    names = STRATEGY_IMPORTS.get(strategy, [strategy])
    return [
        f"from flwr_dp_strategies import {name}"
        if name.startswith("Accounted")
        else f"from flwr.serverapp.strategy import {name}"
        for name in names
    ]


# Flower's Opacus example: its clients already run DP-SGD; they declare each round's spend
# (read from their own PrivacyEngine's accountant) so that AccountedFedAvg can book it.
OPACUS_CLIENT_IMPORT_ANCHOR = "from opacus_fl.task import Net, load_data, test, train\n"
OPACUS_CLIENT_IMPORTS = "from client_mods import declare_opacus_round\n"
OPACUS_CLIENT_REPLY = (
    "    return Message(\n        content=RecordDict({\"arrays\": out_arrays, \"metrics\": out_metrics}),\n"
)
OPACUS_CLIENT_DECLARED_REPLY = (  # the documented two-line change: this line and the import
    "    return Message(\n"
    "        content=declare_opacus_round(RecordDict({\"arrays\": out_arrays, \"metrics\": out_metrics}), "
    "privacy_engine, public_sample_rate=True),\n"
)

# Every strategy runs in at least one of Flower's apps (a simulation each: about 30 s on 2 cores); the cheap
# text check (the change is one line) runs on the full matrix below.
CASES = [
    ("quickstart-pytorch", "AccountedFedAvg"),
    ("quickstart-pytorch", "AccountedAdaptiveClipping"),
    ("quickstart-sklearn", "AccountedPoissonFixedClipping"),
    ("quickstart-sklearn", "AccountedServerSideFixedClipping(FedAdam)"),
    ("opacus", "AccountedFedAvg"),
]
ALL_CHANGES = [
    (app, strategy)
    for app in ("quickstart-pytorch", "quickstart-sklearn")
    for strategy in (
        "FedAvg",
        "AccountedFedAvg",
        "AccountedServerSideFixedClipping",
        "AccountedPoissonFixedClipping",
        "AccountedAdaptiveClipping",
        "AccountedServerSideFixedClipping(FedAdam)",
    )
] + [("opacus", "FedAvg"), ("opacus", "AccountedFedAvg")]


def changed_sources(app: str, strategy: str) -> dict[str, tuple[str, str]]:
    """{relative path: (Flower's source, the changed source)} of the files the change touches."""
    package = EXAMPLES / APPS[app].folder / APPS[app].package
    server = (package / "server_app.py").read_text()
    lines = server.splitlines(keepends=True)
    [index] = [i for i, line in enumerate(lines) if line.lstrip().startswith("strategy = FedAvg(")]
    lines[index] = DROP_IN[strategy](lines[index])
    new_server = "".join(lines)
    if strategy != "FedAvg":
        assert new_server.count(FLOWER_IMPORT) == 1
        new_server = new_server.replace(
            FLOWER_IMPORT, FLOWER_IMPORT + "".join(f"{x}\n" for x in import_lines(strategy))
        )
    out = {f"{APPS[app].package}/server_app.py": (server, new_server)}
    if app == "opacus" and strategy != "FedAvg":
        client = (package / "client_app.py").read_text()
        assert client.count(OPACUS_CLIENT_IMPORT_ANCHOR) == 1 and client.count(OPACUS_CLIENT_REPLY) == 1
        new_client = client.replace(OPACUS_CLIENT_IMPORT_ANCHOR, OPACUS_CLIENT_IMPORT_ANCHOR + OPACUS_CLIENT_IMPORTS)
        new_client = new_client.replace(OPACUS_CLIENT_REPLY, OPACUS_CLIENT_DECLARED_REPLY)
        out[f"{APPS[app].package}/client_app.py"] = (client, new_client)
    return out


def _changed_lines(before: str, after: str) -> tuple[list[str], list[str]]:
    diff = list(difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0))
    removed = [d[1:] for d in diff if d.startswith("-") and not d.startswith("---")]
    added = [d[1:] for d in diff if d.startswith("+") and not d.startswith("+++")]
    return removed, added


@pytest.mark.parametrize("app,strategy", ALL_CHANGES)
def test_the_change_is_the_strategy_line_and_its_import(app, strategy):
    """What a user edits: Flower's one ``strategy = FedAvg(...)`` line, and one import (Opacus: its clients too)."""
    for path, (before, after) in changed_sources(app, strategy).items():
        removed, added = _changed_lines(before, after)
        if path.endswith("server_app.py"):
            if strategy == "FedAvg":
                assert removed == added == []
                continue
            assert len(removed) == 1 and removed[0].strip().startswith("strategy = FedAvg("), (path, removed)
            assert added == [
                *import_lines(strategy),
                DROP_IN[strategy](removed[0] + "\n").rstrip("\n"),
            ], (path, added)
        else:  # the Opacus ClientApp: one import, and the reply's content declared as it is sent
            assert removed == ['        content=RecordDict({"arrays": out_arrays, "metrics": out_metrics}),']
            assert added == [
                "from client_mods import declare_opacus_round",
                OPACUS_CLIENT_DECLARED_REPLY.splitlines()[1],
            ], added


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_RAY_PREFIX = re.compile(r"^\([^)]*pid=\d+[^)]*\)\s?")
# The same record, as Flower's console handler prints it and as other handlers would
_FORMATS = {
    "flwr": re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL)\s*:\s+(?P<msg>.*\S)\s*$"),
    "absl": re.compile(r"^[DIWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+\s+\S+:\d+\]\s+(?P<msg>.*\S)\s*$"),
    "basicConfig": re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL):[\w.]*:(?P<msg>.*\S)\s*$"),
    # Opacus' logging.basicConfig(format="%(asctime)s:%(levelname)s:%(message)s")
    "opacus": re.compile(r"^\d\d/\d\d/\d{4} \d\d:\d\d:\d\d:(DEBUG|INFO|WARNING|ERROR|CRITICAL):(?P<msg>.*\S)\s*$"),
}


def _gc_noise(warning: dict) -> bool:
    """Ray's ``services.py`` opens ``/dev/null`` for its daemons' output and never closes it: the
    ``ResourceWarning`` fires whenever the garbage collector happens to run, attributed to whatever
    code runs then (here an import in ``<frozen importlib._bootstrap_external>``), in Flower's run
    or in ours alike. It says nothing about the strategy, so it is not compared."""
    return warning["category"] == "ResourceWarning" and "name='/dev/null'" in warning["message"]


def _clean(line: str) -> str:
    return _RAY_PREFIX.sub("", _ANSI.sub("", line))


def log_records(output: str) -> list[tuple[str, str]]:
    """(format, message) of every log line in ``output`` in one of :data:`_FORMATS`."""
    out = []
    for raw in output.splitlines():
        line = _clean(raw)
        for name, pattern in _FORMATS.items():
            match = pattern.match(line)
            if match:
                out.append((name, match.group("msg")))
                break
    return out


def _formats_by_message(output: str) -> dict[str, set[str]]:
    formats: dict[str, set[str]] = {}
    for name, message in log_records(output):
        formats.setdefault(message, set()).add(name)
    return formats


def duplicated_records(output: str) -> list[str]:
    """Messages printed in two formats: the same record handled twice (e.g. by a root handler too)."""
    return sorted(_shape(m) for m, names in _formats_by_message(output).items() if len(names) > 1 and len(m) >= 12)


def duplicating_handlers(output: str) -> set[frozenset[str]]:
    """The sets of formats in which one record was printed more than once (one set per extra handler)."""
    return {frozenset(names) for m, names in _formats_by_message(output).items() if len(names) > 1 and len(m) >= 12}


def _shape(message: str) -> str:
    """A message with its numbers and ids blanked, to compare runs."""
    return re.sub(r"\d+(\.\d+)?(e-?\d+)?", "#", message)


# Flower's own, printed or not depending on timing: Ray actors still busy when the run ends
FLOWER_TIMING_DEPENDENT = {"WARNING :   Manually terminating ClientAppActor"}


def noisy_lines(output: str) -> set[str]:
    """The WARNING / ERROR lines of ``output`` (any format), numbers blanked."""
    out = set()
    for raw in output.splitlines():
        line = _clean(raw).strip()
        if line in FLOWER_TIMING_DEPENDENT:
            continue
        if re.match(r"^(WARNING|ERROR|CRITICAL)\b|^[WEF]\d{4} |Traceback|Warning:", line):
            out.add(_shape(line))
    return out


@dataclass
class Run:
    report: dict
    output: str
    returncode: int


_BASELINES: dict[str, Run] = {}


def run_case(app: str, strategy: str, workdir: Path) -> Run:
    """Copy the app to ``workdir``, apply the change, run it in a fresh process; its report and output."""
    app_dir = workdir / APPS[app].folder
    shutil.copytree(EXAMPLES / APPS[app].folder, app_dir, ignore=shutil.ignore_patterns("__pycache__"))
    for path, (_, source) in changed_sources(app, strategy).items():
        (app_dir / path).write_text(source)
    report_path = workdir / "report.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(HERE.parent)  # the checkout: client_mods, flwr_dp_experiments
    proc = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "run_example.py"),
            str(app_dir),
            str(report_path),
            str(NODES),
            json.dumps(APPS[app].run_config),
        ],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    output = proc.stdout + proc.stderr
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    return Run(report, output, proc.returncode)


def baseline(app: str, tmp_path_factory) -> Run:
    """The unmodified example with Flower's FedAvg (run once per session), checked to run to the end."""
    if app not in _BASELINES:
        run = run_case(app, "FedAvg", tmp_path_factory.mktemp(f"baseline-{app}"))
        assert run.returncode == 0, run.output[-4000:]
        assert run.report.get("error") is None, run.output[-4000:]
        [result] = run.report["results"]
        assert sorted(result["train_metrics_clientapp"]) == [str(r) for r in range(1, ROUNDS + 1)], result
        _BASELINES[app] = run
    return _BASELINES[app]


def _as_float(value) -> float:
    return float(value) if not isinstance(value, str) else float(value)  # "inf" / "nan" from the JSON


@pytest.mark.integration
@pytest.mark.parametrize("app,strategy", CASES)
def test_flower_example_with_our_strategy(app, strategy, tmp_path, tmp_path_factory):
    run = run_case(app, strategy, tmp_path)
    tail = run.output[-4000:]
    assert run.returncode == 0, tail
    assert run.report.get("error") is None, tail
    [result] = run.report["results"]  # the app's one strategy.start(...)
    train = result["train_metrics_clientapp"]
    assert sorted(train) == [str(r) for r in range(1, ROUNDS + 1)], train

    for rnd, metrics in train.items():
        assert "privacy/epsilon" in metrics and "privacy/delta" in metrics, (rnd, metrics)
        epsilon = _as_float(metrics["privacy/epsilon"])
        declared = strategy != "AccountedFedAvg" or app == "opacus"
        if declared:  # central DP, or clients that declare their DP-SGD
            assert 0.0 < epsilon < math.inf, (rnd, metrics)
        else:  # plain clients declare nothing: their dense updates are non-private, never epsilon = 0
            assert epsilon == math.inf, (rnd, metrics)
    epsilons = [_as_float(train[str(r)]["privacy/epsilon"]) for r in range(1, ROUNDS + 1)]
    assert epsilons == sorted(epsilons), epsilons  # composition never lowers the spend
    if app == "opacus":  # Flower's example reports one round's epsilon (a fresh PrivacyEngine every round)
        theirs = baseline(app, tmp_path_factory).report["results"][0]["train_metrics_clientapp"]
        per_round = [float(theirs[str(r)]["max_epsilon"]) for r in range(1, ROUNDS + 1)]
        assert per_round == pytest.approx([per_round[0]] * ROUNDS), per_round
        assert epsilons[-1] > epsilons[0], epsilons  # the ledger composes the rounds

    # Quiet: nothing beyond what Flower's own run of the same app prints and warns. Flower's own
    # Opacus example already prints its log lines twice (Opacus' import calls logging.basicConfig):
    # that is its baseline, so the checks are against the unmodified app's run.
    flower = baseline(app, tmp_path_factory)
    if app != "opacus":
        assert flower.report["root_handlers_added"] == [] and duplicated_records(flower.output) == []
    added = set(run.report["root_handlers_added"]) - set(flower.report["root_handlers_added"])
    assert added == set(), added
    if not duplicating_handlers(flower.output):
        assert duplicated_records(run.output) == [], tail
    else:  # Flower's Opacus app: from when Opacus is imported (a race with the first rounds), each line twice
        extra = duplicating_handlers(run.output) - duplicating_handlers(flower.output)
        assert extra == set(), (extra, duplicated_records(run.output), tail)
    ours = {(w["category"], _shape(w["message"])) for w in run.report["warnings"] if not _gc_noise(w)}
    theirs = {(w["category"], _shape(w["message"])) for w in flower.report["warnings"]}
    assert ours - theirs == set(), [
        w for w in run.report["warnings"] if (w["category"], _shape(w["message"])) not in theirs and not _gc_noise(w)
    ]
    assert noisy_lines(run.output) - noisy_lines(flower.output) == set(), tail


IMPORTS = ["flwr_dp_strategies", "client_mods", "client_mods.dp_sgd"]


@pytest.mark.parametrize("module", IMPORTS)
def test_importing_our_package_adds_no_root_log_handler(module):
    """A root handler makes every Flower log line print twice (Flower's logger propagates)."""
    code = (
        "import logging; before = list(logging.getLogger().handlers); import " + module + "; "
        "print([repr(h) for h in logging.getLogger().handlers if h not in before])"
    )
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout


def test_accounting_a_sampled_round_adds_no_root_log_handler():
    """The ledger's epsilon of one Opacus-example round (Poisson q = 1/7, z = 1, 7 steps) leaves logging alone."""
    code = (
        "import logging\n"
        "before = list(logging.getLogger().handlers)\n"
        "from dp_accounting import dp_event as e\n"
        "from flwr_dp_strategies import PrivacyLedger\n"
        "ledger = PrivacyLedger(1e-5)\n"
        "event = e.SelfComposedDpEvent(e.PoissonSampledDpEvent(1 / 7, e.GaussianDpEvent(1.0)), 7)\n"
        "ledger.record(event, server_round=1, client=1, label='opacus round')\n"
        "assert 0 < ledger.metrics()['privacy/epsilon'] < float('inf')\n"
        "print([repr(h) for h in logging.getLogger().handlers if h not in before])\n"
    )
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]", (proc.stdout, proc.stderr[-1000:])
