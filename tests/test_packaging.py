"""Ready to publish: the sdist and wheel build, pass ``twine check``, hold the library only, and install.

The wheel is built (from a copy of the checkout) from the sdist (``python -m build``, without build isolation: the test
environment has setuptools and nothing is downloaded), installed with ``--no-deps`` into a
fresh venv that sees this environment's packages after its own (a ``.pth`` file naming them:
``--system-site-packages`` would name the base interpreter's, not this venv's), and both
packages are imported from that venv's copy, with ``__version__`` equal to the metadata's.
"""

import os
import shutil
import site
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LIBRARY = {"flwr_dp_strategies", "client_mods"}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    # Built from a copy: in the live checkout, a .pyc that another test process writes (a temporary
    # file, then renamed) can vanish while setuptools lists the files (ENOENT), and the build's
    # egg-info and build/ stay out of the checkout.
    source = tmp_path_factory.mktemp("source") / "flwr-dp-strategies"
    shutil.copytree(
        REPO,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "__pycache__", "*.egg-info", "build", "dist", "site", ".pytest_cache", ".hypothesis"
        ),
    )
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(source)],
        check=False,
        capture_output=True,
        text=True,
        cwd=source,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return out


def _one(dist: Path, pattern: str) -> Path:
    (path,) = dist.glob(pattern)
    return path


def test_twine_check_passes(dist):
    proc = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, sorted(dist.iterdir()))],
        check=False,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("PASSED") == 2


def test_wheel_holds_the_library_only(dist):
    import flwr_dp_strategies

    wheel = _one(dist, "*.whl")
    assert wheel.name == f"flwr_dp_strategies-{flwr_dp_strategies.__version__}-py3-none-any.whl"
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == LIBRARY | {f"flwr_dp_strategies-{flwr_dp_strategies.__version__}.dist-info"}
    # every module of the library is in it (nothing dropped by the package list)
    for package in LIBRARY:
        for source in (REPO / package).rglob("*.py"):
            assert source.relative_to(REPO).as_posix() in names
    with tarfile.open(_one(dist, "*.tar.gz")) as sdist:
        sdist_tops = {Path(name).parts[1] for name in sdist.getnames() if len(Path(name).parts) > 1}
    assert LIBRARY <= sdist_tops and not {"examples", "flwr_dp_benchmarks", "flwr_dp_experiments"} & sdist_tops


def test_the_license_ships_in_the_sdist_and_the_wheel(dist):
    """Issue 38 item 3: the Apache-2.0 text itself, not only the SPDX string, in both distributions."""
    import flwr_dp_strategies

    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0" in text
    wheel = zipfile.ZipFile(_one(dist, "*.whl"))
    info = f"flwr_dp_strategies-{flwr_dp_strategies.__version__}.dist-info"
    assert wheel.read(f"{info}/licenses/LICENSE").decode() == text
    with tarfile.open(_one(dist, "*.tar.gz")) as sdist:
        [member] = [m for m in sdist.getmembers() if Path(m.name).parts[1:] == ("LICENSE",)]
        assert sdist.extractfile(member).read().decode() == text


def test_wheel_installs_and_imports(dist, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    (own,) = venv.glob("lib/python*/site-packages")
    # this environment's packages (flwr, torch, pip, ...) behind the venv's own; plain path lines, so
    # the editable install's finder there is not loaded
    (own / "_test_env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(_one(dist, "*.whl"))],
        check=True,
        env=env,
        capture_output=True,
    )
    code = (
        "import importlib.metadata as md, importlib.util, sys\n"
        "import client_mods, flwr_dp_strategies\n"
        "from flwr_dp_strategies import AccountedFedAvg, PrivacyLedger\n"
        "from client_mods import LocalUpdateNoiseMod\n"
        "for module in (client_mods, flwr_dp_strategies):\n"
        "    assert module.__file__.startswith(sys.prefix), module.__file__\n"
        "assert flwr_dp_strategies.__version__ == md.version('flwr-dp-strategies'), flwr_dp_strategies.__version__\n"
        "assert importlib.util.find_spec('flwr_dp_experiments') is None\n"
        "print(flwr_dp_strategies.__version__)\n"
    )
    proc = subprocess.run([str(python), "-c", code], check=False, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    import flwr_dp_strategies

    assert proc.stdout.strip() == flwr_dp_strategies.__version__


HEAVY = ("torch", "opacus", "sklearn", "ray", "pandas")
"""What a server-only user must not have to install or import (issue 38 item 3): they come with extras."""


def test_the_metadata_keeps_torch_opacus_sklearn_and_ray_in_extras(dist):
    """Issue 38 item 3: the wheel's core requirements are Flower (without its simulation extra), numpy, scipy,
    dp-accounting, threadpoolctl and cryptography; torch/Opacus, scikit-learn and Ray are extras."""
    import re

    with zipfile.ZipFile(_one(dist, "*.whl")) as wheel:
        (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = wheel.read(name).decode()
    core = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    core = [req for req in core if "extra ==" not in req]
    names = {re.split(r"[\[<>=!~; ]", req, maxsplit=1)[0].lower() for req in core}
    assert names == {"flwr", "numpy", "scipy", "dp-accounting", "threadpoolctl", "cryptography"}, core
    assert not any("[simulation]" in req for req in core), core
    extras = {line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Provides-Extra:")}
    assert {"torch", "clustering", "simulation", "examples", "dev"} <= extras


@pytest.mark.integration
def test_a_core_install_imports_every_strategy_without_the_heavy_packages(dist, tmp_path):
    """A fresh venv gets the wheel with its core dependencies only (from the package index, as a user's ``pip install``
    would) and imports every strategy, the privacy core and the client mods: none of torch, Opacus, scikit-learn,
    Ray or pandas is installed there, nor imported."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(_one(dist, "*.whl"))],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    code = (
        "import importlib.util, sys\n"
        "import flwr_dp_strategies as fds\n"
        "strategies = [getattr(fds, name) for name in fds._STRATEGIES]\n"
        "import flwr_dp_strategies.privacy, flwr_dp_strategies.federated_pca, flwr_dp_strategies.layer_shuffler\n"
        "import flwr_dp_strategies.audit, flwr_dp_strategies.cli, client_mods\n"
        "from client_mods import LocalUpdateNoiseMod, LaplaceInferenceMod, distributed_dp_mod, signds_mod\n"
        "from flwr.serverapp.strategy import FedAvg\n"
        "fds.AccountedServerSideFixedClipping(FedAvg(), 1.0, 1.0, 2)\n"
        f"heavy = {HEAVY!r}\n"
        "print(len(strategies), [h for h in heavy if importlib.util.find_spec(h) is not None],"
        " sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))\n"
    )
    proc = subprocess.run([str(python), "-c", code], check=False, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    import flwr_dp_strategies

    assert proc.stdout.split() == [str(len(flwr_dp_strategies._STRATEGIES)), "[]", "[]"], proc.stdout
