"""Every package in the tree is in pyproject.toml's package list, with its C files as package data: an installed
(not editable) onnxopt would otherwise lack a stage or a kind's executor."""

from __future__ import annotations

import os

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_package_is_listed():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        tool = tomllib.load(f)["tool"]["setuptools"]
    dirs = {"onnxopt": "onnxopt", **tool["package-dir"]}
    found = set()
    for pkg, folder in dirs.items():
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            if "__init__.py" in files and "__pycache__" not in dirpath:
                rel = os.path.relpath(dirpath, os.path.join(ROOT, folder))
                found.add(pkg if rel == "." else pkg + "." + rel.replace(os.sep, "."))
    assert sorted(found - set(tool["packages"])) == []
    assert tool["package-data"].get("*") == ["*.c", "*.h"]
