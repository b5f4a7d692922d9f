"""The worker image runs with exactly the files its Containerfile copies.

The image holds no sandbox and no benchmarks: a top-level import of either in the worker or
the CLI makes ``tideplane worker`` fail in production while every other test passes. This
copies the Containerfile's COPY sources into an empty directory, as the image build does, and
runs the worker's commands with only that directory and the installed third-party packages on
the path (``-S``: no .pth files, so the checkout's editable install cannot leak in).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path, PurePosixPath

import pytest

REPO = Path(__file__).resolve().parents[3]
CONTAINERFILE = REPO / "infra" / "k8s" / "Containerfile"


def copied_files(containerfile: Path) -> list[tuple[str, PurePosixPath, bool]]:
    """(source in the build context, absolute destination, whether the destination is a folder) per COPY source."""
    workdir = PurePosixPath("/")
    copies = []
    for line in containerfile.read_text().replace("\\\n", " ").splitlines():  # join continued lines
        words = shlex.split(line, comments=True)
        if words[:1] == ["WORKDIR"]:
            workdir = workdir / words[1]
        elif words[:1] == ["COPY"]:
            assert not any(word.startswith("--") for word in words), f"COPY flags are not understood here: {line}"
            *sources, dest = words[1:]
            copies += [(source, workdir / dest, dest.endswith("/")) for source in sources]
    return copies


@pytest.fixture(scope="module")
def image_src(tmp_path_factory) -> Path:
    """The image's /src, built from the Containerfile's COPY lines: what `pip install .` sees."""
    root = tmp_path_factory.mktemp("image")
    for source, dest, into_folder in copied_files(CONTAINERFILE):
        origin, target = REPO / source, root / dest.relative_to("/")
        if origin.is_dir():  # a folder's contents land in the destination, as in a build
            shutil.copytree(origin, target, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
        else:
            target = target / origin.name if into_folder else target
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, target)
    return root / "src"


def run_in_image(image_src: Path, *args: str) -> subprocess.CompletedProcess:
    """Runs this venv's python with the image's files and the installed dependencies only."""
    path = os.pathsep.join([str(image_src), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    env = {"PATH": os.environ["PATH"], "HOME": str(image_src.parent), "PYTHONPATH": path}
    return subprocess.run(
        [sys.executable, "-S", "-P", *args], cwd=image_src.parent, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_containerfile_copies_the_worker_and_not_the_sandbox_or_benchmarks(image_src):
    """The environment below is a faithful stand-in for the image only if it lacks what the image lacks."""
    copied = {path.name for path in image_src.iterdir()}
    assert {"pyproject.toml", "workflows", "activities", "workers"} <= copied
    probe = run_in_image(
        image_src, "-c", "import importlib.util as u; print([u.find_spec(m) is None for m in ('benchmarks', 'infra', 'workers')])"
    )
    assert probe.stdout.strip() == "[True, True, False]", probe.stderr


def test_worker_help_runs_in_the_image(image_src):
    done = run_in_image(image_src, "-m", "workers.cli", "worker", "--help")
    assert done.returncode == 0, done.stderr
    assert "usage: tideplane worker" in done.stdout


def test_the_worker_loads_in_the_image(image_src):
    """`tideplane worker` imports workers.worker (every workflow, activity and client) before connecting."""
    done = run_in_image(image_src, "-c", "import workers.worker")
    assert done.returncode == 0, done.stderr
