"""What pyproject.toml promises about the package: Textual capped below its next major (the
screens and their SVG snapshots are Textual 8's), the installed Textual inside that range, and the
Python versions the classifiers name allowed by requires-python."""

from __future__ import annotations

import tomllib
from importlib.metadata import version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

PROJECT = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text("utf-8"))["project"]


def test_textual_is_capped_below_its_next_major_and_the_installed_one_is_inside() -> None:
    (textual,) = [Requirement(r) for r in PROJECT["dependencies"] if Requirement(r).name == "textual"]
    caps = [s for s in textual.specifier if s.operator == "<"]
    assert caps, f"textual has no upper bound: {textual}"
    installed = version("textual")
    assert textual.specifier.contains(installed), (installed, str(textual.specifier))
    assert int(caps[0].version.split(".")[0]) == int(installed.split(".")[0]) + 1, (installed, str(textual))


def test_classifiers_name_only_pythons_that_requires_python_allows() -> None:
    allowed = SpecifierSet(PROJECT["requires-python"])
    named = [
        c.rsplit(" :: ", 1)[1] for c in PROJECT["classifiers"] if c.startswith("Programming Language :: Python :: 3.")
    ]
    assert named and all(allowed.contains(f"{v}.0") for v in named), (named, str(allowed))
    assert all(u.startswith("https://") for u in PROJECT["urls"].values()), PROJECT["urls"]
