"""The two model-scale examples of issue 40 (examples/resnet-dp, examples/lora-dp): their pyprojects, their
full sizes, and two rounds of each at the reduced size, run in process with the real ServerApp ``main`` and
ClientApp over tests/loopback.py's grid (3 clients, every client sampled, seeded noise).

What a run must show: every client's record-level DP-SGD events and the server's client-level central releases
are booked in the strategy's one ledger; the ledger's ε and both separated figures (client level: central
releases only; record level: each node's own DP-SGD events only) are finite, positive and grow; the model
changes; the LoRA example moves the adapters' B matrices only (A frozen, base frozen, neither sent)."""

from __future__ import annotations

import importlib
import json
import math
import sys
import tomllib
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")

from flwr.app import Context, RecordDict  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = {"resnet-dp": "resnetdp_app", "lora-dp": "loradp_app"}
CLIENTS = 3
ROUNDS = 2


def app_module(example: str, name: str):
    """``<package>.<name>`` of an example (its folder first on the path; the checkout for flwr_dp_experiments)."""
    for folder in (str(ROOT), str(ROOT / "examples" / example)):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    return importlib.import_module(f"{EXAMPLES[example]}.{name}")


def pyproject(example: str) -> dict:
    return tomllib.loads((ROOT / "examples" / example / "pyproject.toml").read_text())


# ---------------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_the_pyproject_is_a_flower_app_with_the_defaults(example):
    project = pyproject(example)
    flwr = project["tool"]["flwr"]
    package = EXAMPLES[example]
    assert flwr["app"]["components"] == {
        "serverapp": f"{package}.server_app:app",
        "clientapp": f"{package}.client_app:app",
    }
    assert flwr["app"]["config"] == app_module(example, "config").DEFAULTS
    assert "flwr[simulation]>=1.41,<1.44" in project["project"]["dependencies"]
    assert "federations" not in flwr  # Flower >= 1.41 would migrate it and rewrite this file
    try:
        from flwr.cli.config_utils import load_and_validate
    except ImportError:  # pragma: no cover - another Flower layout
        return
    _, errors_or_warnings = load_and_validate(ROOT / "examples" / example / "pyproject.toml", check_module=False)
    assert not errors_or_warnings


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_the_federations_declare_gpu_client_resources(example):
    table = pyproject(example)["tool"]["flwr-dp-strategies"]["federations"]
    assert table["default"] == "local-gpu"
    gpus = {
        name: fed["options"]["backend"]["client-resources"]["num-gpus"]
        for name, fed in table.items()
        if name != "default"
    }
    assert gpus == {"local-gpu": 0.25, "local-cpu": 0.0}
    try:
        from flwr.cli.flower_config import parse_superlink_connection
    except ImportError:  # pragma: no cover - another Flower layout
        return
    for name, fed in table.items():
        if name == "default":
            continue
        connection = parse_superlink_connection({"address": ":local:", **fed}, name)
        assert connection.options.backend.client_resources.num_gpus == gpus[name]
        assert connection.options.num_supernodes == 10


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_run_demo_reads_the_federation(example):
    spec = importlib.util.spec_from_file_location(f"run_demo_{example}", ROOT / "examples" / example / "run_demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    assert demo.federation("local-gpu") == {"name": "local-gpu", "num-supernodes": 10, "num-cpus": 2, "num-gpus": 0.25}
    assert demo.federation("local-cpu")["num-gpus"] == 0.0
    args = demo.parse_args(["--size", "reduced", "--set", "lr=0.5", "--set", "freeze-a=false"])
    settings = demo.settings_from(args, 4)
    assert settings["size"] == "reduced" and settings["num-partitions"] == 4 and settings["lr"] == 0.5
    assert settings["freeze-a"] is False
    assert set(settings) - {"freeze-a"} <= set(pyproject(example)["tool"]["flwr"]["app"]["config"])


def test_full_sizes():
    resnet = app_module("resnet-dp", "task")
    assert resnet.count_parameters(resnet.build_model("full")) == 11_173_962  # ResNet-18 (GroupNorm, CIFAR stem)
    lora = app_module("lora-dp", "task")
    full = lora.build_model("full")
    counts = lora.count_parameters(full)
    assert counts == {"trainable": 73_808, "frozen": 3_510_282, "total": 3_584_090}
    assert all(key.endswith("lora_B.weight") for key in full.state_dict())
    plain = lora.count_parameters(lora.build_model("full", freeze_a=False))
    assert plain["trainable"] == 149_584 and plain["total"] == counts["total"]


# ---------------------------------------------------------------------------------------------------- rounds


def run_example(example: str, tmp_path: Path, monkeypatch, **overrides):
    """Two rounds of the example's ServerApp ``main`` over its ClientApp on a loopback grid; returns
    (grid, the strategy, the results JSON)."""
    from loopback import LoopbackGrid

    server_app = app_module(example, "server_app")
    client_app = app_module(example, "client_app")
    built = []
    build = server_app.build_strategy
    monkeypatch.setattr(server_app, "build_strategy", lambda config: built.append(build(config)) or built[-1])
    grid = LoopbackGrid.of(CLIENTS, client_app.app)
    for index, node in enumerate(grid.node_ids):
        grid.contexts[node] = Context(
            run_id=1,
            node_id=node,
            node_config={"partition-id": index, "num-partitions": CLIENTS},
            state=RecordDict(),
            run_config={},
        )
    run_config = {
        "size": "reduced",
        "num-server-rounds": ROUNDS,
        "num-partitions": CLIENTS,
        "clients-per-round": CLIENTS,
        "examples-per-client": 128,
        "batch-size": 16,  # = sample-rate (0.125) x examples-per-client
        "lr": 2.0,
        "client-noise-multiplier": 0.5,  # a finite epsilon of a few units: quick to account
        "test-examples": 200,
        "noise-seed": 1,
        "server-seed": 2,
        "results-dir": str(tmp_path),
        **overrides,
    }
    defaults = app_module(example, "config").DEFAULTS
    server_app.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))
    assert grid.errors == []
    [strategy] = built
    return grid, strategy, json.loads((tmp_path / "results.json").read_text()), {**defaults, **run_config}


def assert_both_levels_booked(strategy, results, run_config):
    from dp_accounting.dp_event import GaussianDpEvent, PoissonSampledDpEvent, SelfComposedDpEvent

    ledger = strategy.ledger
    central = ledger.events()
    assert [r for r, _, _ in central] == list(range(1, ROUNDS + 1))
    q_clients = run_config["clients-per-round"] / run_config["num-partitions"]
    z_c = float(run_config["client-noise-multiplier"])
    assert all(event == PoissonSampledDpEvent(q_clients, GaussianDpEvent(z_c)) for _, event, _ in central)
    assert sorted(ledger.clients) == [str(n) for n in range(101, 101 + CLIENTS)]
    q_records = float(run_config["sample-rate"])
    steps = int(run_config["local-epochs"]) * int(1 / q_records)
    z_r = float(run_config["noise-multiplier"])
    expected = SelfComposedDpEvent(PoissonSampledDpEvent(q_records, GaussianDpEvent(z_r)), steps)
    for node in ledger.clients:
        own = ledger.events(node)
        assert [r for r, _, _ in own] == list(range(1, ROUNDS + 1))
        assert all(event == expected and label.startswith("dp-sgd") for _, event, label in own)
    rows = results["rounds"]
    assert [row["round"] for row in rows] == list(range(1, ROUNDS + 1))
    for key in ("epsilon_ledger", "epsilon_client_level", "epsilon_record_level"):
        values = [row[key] for row in rows]
        assert all(v is not None and math.isfinite(v) and v > 0 for v in values), (key, values)
        assert values[1] > values[0], (key, values)
    for row in rows:  # the ledger's figure composes both: at least either one
        assert row["epsilon_ledger"] >= max(row["epsilon_client_level"], row["epsilon_record_level"]) - 1e-9
    # the figures are the library's, published in the strategy's train metrics (no example code computes them)
    assert all(ledger.units(node) == {"record": ROUNDS, "client": 0} for node in ledger.clients)
    privacy = results["privacy"]
    assert privacy["keys"] == {
        "epsilon_client_level": "privacy/epsilon-client-level",
        "epsilon_record_level": "privacy/epsilon-record-level",
        "epsilon_ledger": "privacy/epsilon",
    }
    assert privacy["combined"] == pytest.approx(ledger.epsilon()) == pytest.approx(rows[-1]["epsilon_ledger"])
    assert privacy["record_level"] == pytest.approx(ledger.record_level_report().epsilon)
    assert privacy["client_level"] == pytest.approx(ledger.client_level_report(central_covers_replies=True).epsilon)
    only_central = type(ledger)(ledger.target_delta)  # the client-level figure: the central releases alone
    for server_round, event, _ in central:
        only_central.record(event, server_round=server_round)
    assert privacy["client_level"] == pytest.approx(only_central.epsilon())


def assert_model_changed(grid):
    """The global model sent in round 2 differs from the one sent in round 1."""
    first, second = grid.sent[0].content["arrays"], grid.sent[CLIENTS].content["arrays"]
    assert first.keys() == second.keys()
    moved = sum(float((second[k].numpy() != first[k].numpy()).sum()) for k in first.keys())
    assert moved > 0


def assert_replies_are_public(grid):
    """Each reply: the public weight 1.0 (not the shard's size) and one declared DP-SGD release."""
    for reply in grid.received:
        assert reply.content["metrics"]["num-examples"] == 1.0


@pytest.mark.slow
def test_resnet_example_books_record_and_client_level_releases(tmp_path, monkeypatch, task_identity):
    grid, strategy, results, run_config = run_example("resnet-dp", tmp_path, monkeypatch)
    assert_both_levels_booked(strategy, results, run_config)
    assert_model_changed(grid)
    assert_replies_are_public(grid)
    task = app_module("resnet-dp", "task")
    keys = set(task.build_model("reduced").state_dict())
    assert all(set(m.content["arrays"].keys()) == keys for m in grid.sent + grid.received)
    assert (tmp_path / "results.png").exists()


@pytest.mark.slow
def test_lora_example_sends_and_averages_only_the_adapters(tmp_path, monkeypatch, task_identity):
    grid, strategy, results, run_config = run_example("lora-dp", tmp_path, monkeypatch)
    assert_both_levels_booked(strategy, results, run_config)
    assert_model_changed(grid)
    assert_replies_are_public(grid)
    task = app_module("lora-dp", "task")
    model = task.build_model("reduced")
    adapters = set(model.state_dict())
    assert adapters and all(key.endswith("lora_B.weight") for key in adapters)
    for message in grid.sent + grid.received:  # both ways: B only; no base weight, no A
        assert set(message.content["arrays"].keys()) == adapters
    # A stays at its public initialisation: every party rebuilds the same A from base-seed
    again = task.build_model("reduced")
    for (name, a), (_, b) in zip(model.named_buffers(), again.named_buffers()):
        assert torch.equal(a, b), name
    assert results["parameters"]["trainable"] == sum(v.numel() for v in model.state_dict().values())
