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
