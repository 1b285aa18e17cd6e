"""The wheel an operator installs holds every module, every data file (the `.tcss` styles the
screens load, the Prometheus pack `cosmictui export` prints) and the licence: a package-data glob
that misses a file breaks only installed copies, never the editable checkout the other tests run
from."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("relay", "cosmictui")


def _source_files(src: Path) -> set[str]:
    """Every file the two packages ship, as wheel paths (caches excluded)."""
    return {
        p.relative_to(src).as_posix()
        for pkg in PACKAGES
        for p in (src / pkg).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


def test_the_wheel_holds_every_module_data_file_and_the_licence(tmp_path: Path) -> None:
    # Build from a copy, so the shared checkout gets no build/ or egg-info from this test.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path / "wheel"
    # Offline: the build backend installed in this environment (the test extra pins it), no index.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(out),
            str(src),
        ],
        check=True,
        timeout=240,
        capture_output=True,
    )
    (wheel,) = out.glob("cosmictui-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        metadata = z.read(f"{dist_info}/METADATA").decode()
        licence = z.read(f"{dist_info}/licenses/LICENSE")

    expected = _source_files(src)  # the copy the wheel was built from
    assert any(n.endswith(".tcss") for n in expected), "no .tcss files found in the source tree"
    missing = sorted(expected - names)
    assert missing == [], f"files the wheel lacks (add them to [tool.setuptools.package-data]): {missing}"
    assert licence == (src / "LICENSE").read_bytes()
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
