"""The wheel ships the product only: durable, approvals, dashboard and api, with the dashboard's
templates and static files; the project (config/), the examples and the tests run from a
checkout and stay out of it.

Builds the wheel once (``pip wheel --no-deps``, about 10 s) from a copy of the checkout,
so the build leaves nothing behind in the working tree.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = {"durable", "approvals", "dashboard", "api"}


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "var", "build", "*.egg-info", "__pycache__", "*.pyc", ".*_cache"
        ),
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(tmp / "dist"),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=240,
    )
    (wheel,) = (tmp / "dist").glob("durable-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def test_pyproject_packages_only_the_product():
    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert {name.rstrip("*") for name in found["packages"]["find"]["include"]} == PRODUCT


def test_the_demo_tools_are_an_extra_not_a_dependency():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    demo = {dep.split(">")[0] for dep in project["optional-dependencies"]["demo"]}
    assert {"honcho", "aiosmtpd"} <= demo
    assert not {dep.split(">")[0] for dep in project["dependencies"]} & demo


def test_wheel_holds_the_product_packages_only(wheel_names):
    top = {name.split("/", 1)[0] for name in wheel_names}
    assert {name for name in top if not name.endswith(".dist-info")} == PRODUCT


def test_wheel_holds_the_dashboard_templates_and_static_files(wheel_names):
    for folder, suffix in [("templates/dashboard", ".html"), ("static/dashboard", "")]:
        shipped = {name for name in wheel_names if name.startswith(f"dashboard/{folder}/")}
        on_disk = {
            f"dashboard/{path.relative_to(ROOT / 'dashboard').as_posix()}"
            for path in (ROOT / "dashboard" / folder).rglob(f"*{suffix}")
            if path.is_file()
        }
        assert on_disk and shipped == on_disk
    assert "durable/static/durable/admin.css" in wheel_names
