"""The wheel holds the product only: the koord package, none of the test support."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_has_no_test_support(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "wheel"), str(source)], check=True, timeout=300)
    [wheel] = (tmp_path / "wheel").glob("koord_runtime-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    packages = {name.split("/")[0] for name in names if not name.startswith("koord_runtime-")}
    assert packages == {"koord"}
    assert "koord/koordlet/cli.py" in names and "koord/py.typed" in names
    assert not [n for n in names if "testing" in n or "demo" in n]
