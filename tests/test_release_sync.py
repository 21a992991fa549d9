"""labs/ is nbgrader's release of solutions/: regenerate it in a temp folder and compare."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs nbgrader generate_assignment per lab: not in `make test-fast`

ROOT = Path(__file__).resolve().parents[1]
LABS = sorted(p.name for p in (ROOT / "solutions").iterdir() if (p / f"{p.name}.ipynb").exists())


def _cells(path: Path):
    nb = json.loads(path.read_text())
    return [(c["cell_type"], "".join(c["source"]), c.get("metadata", {}).get("nbgrader")) for c in nb["cells"]]


@pytest.mark.parametrize("lab", LABS)
def test_labs_release_matches_solutions(lab, tmp_path):
    released = ROOT / "labs" / lab / f"{lab}.ipynb"
    assert released.exists(), f"labs/{lab}/{lab}.ipynb is missing: run `make release`"
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}  # nbgrader runs alembic
    done = subprocess.run([str(bin_dir / "nbgrader"), "generate_assignment", lab, "--force", "--log-level=ERROR",
                           f"--CourseDirectory.release_directory={tmp_path / 'release'}",
                           f"--CourseDirectory.db_url=sqlite:///{tmp_path / 'gradebook.db'}"],
                          cwd=ROOT / "autograder", capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, f"nbgrader generate_assignment failed:\n{done.stdout}\n{done.stderr}"
    fresh = tmp_path / "release" / lab / f"{lab}.ipynb"
    assert _cells(fresh) == _cells(released), (
        f"labs/{lab} is out of date with solutions/{lab}: run `make release` and commit labs/")


@pytest.mark.parametrize("lab", LABS)
def test_release_hides_solutions_and_hidden_tests(lab):
    text = (ROOT / "labs" / lab / f"{lab}.ipynb").read_text()
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"):
        assert marker not in text
    assert "raise NotImplementedError()" in text
