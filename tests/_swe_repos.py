"""Git repositories with real fixes in their history, built in the test, and the tiny test
dependency they install from a local wheel directory (`--no-index --find-links`: nothing is
downloaded). Used by tests/integration/test_swe_real_repos.py and tests/e2e/test_swe_mine.py.

- `geom`: `src/` layout, pyproject metadata with a `test` extra (`approxeq`, the local wheel),
  a pytest config that turns UserWarning into errors. History: initial; "Fix area() ..." (code +
  test: FAIL_TO_PASS test_area); a README change; a perimeter refactor with a new test that
  passes before and after (no FAIL_TO_PASS: not a task).
- `shapes`: plain layout, no project metadata, `requirements-test.txt`; one fix.
- `acme-tools`: the namespace package `acme.tools` (no `acme/__init__.py`), flat layout; one fix,
  made on a branch and merged as a pull request (`--no-ff`).
- `broken`: a `test` extra no index has, so its environment cannot be built.
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import zipfile
from pathlib import Path
from typing import Any

BUILD = '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n'
# The test dependency: `close()` and, through a pytest11 entry point, the fixture `tolerance`.
APPROXEQ = {
    "approxeq.py": "def close(a, b, tol=1e-6):\n    return abs(a - b) <= tol\n",
    "approxeq_plugin.py": "import pytest\n\n\n@pytest.fixture\ndef tolerance():\n    return 1e-6\n",
}
APPROXEQ_ENTRY_POINTS = "[pytest11]\napproxeq = approxeq_plugin\n"

GEOM_PYPROJECT = BUILD + (
    '\n[project]\nname = "geom"\nversion = "0.1"\n\n[project.optional-dependencies]\n'
    'test = ["approxeq>=1.0"]\n\n[tool.setuptools.packages.find]\nwhere = ["src"]\n\n'
    '[tool.pytest.ini_options]\nfilterwarnings = ["error::UserWarning"]\n'
)
GEOM_INIT = "from geom.core import area, perimeter\n"
GEOM_CORE = "def area(w, h):\n    return w + h\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n"
GEOM_FIXED = GEOM_CORE.replace("w + h\n\n\n", "w * h\n\n\n")
GEOM_TESTS = (
    "import warnings\n\nimport pytest\nfrom approxeq import close\n\nfrom geom import area, "
    "perimeter\n\n\ndef test_perimeter(tolerance):\n"
    "    assert close(perimeter(2, 3), 10, tolerance)\n\n\n"
    "def test_warnings_are_errors():\n    # passes only under the repository's own pytest "
    "config (filterwarnings = error)\n    with pytest.raises(UserWarning):\n"
    '        warnings.warn("careful", UserWarning)\n'
)
GEOM_AREA_TEST = "\n\ndef test_area(tolerance):\n    assert close(area(2, 3), 6, tolerance)\n"
GEOM_SQUARE_TEST = "\n\ndef test_square_perimeter():\n    assert close(perimeter(4, 4), 16)\n"

SHAPES_CODE = "def circumference(r):\n    return 3.14159 * r\n"
SHAPES_TESTS = (
    "from approxeq import close\n\nfrom shapes.circle import circumference\n\n\n"
    "def test_zero():\n    assert close(circumference(0), 0)\n"
)
SHAPES_FIX_TEST = "\n\ndef test_unit():\n    assert close(circumference(1), 6.28318)\n"

# The project's own pytest11 plugin would deselect every test: grading must not load it.
ACME_PYPROJECT = BUILD + (
    '\n[project]\nname = "acme-tools"\nversion = "1.0"\n\n'
    '[project.entry-points.pytest11]\nacme = "acme.tools.plugin"\n\n'
    '[tool.setuptools.packages.find]\ninclude = ["acme*"]\n'
)
ACME_PLUGIN = "def pytest_collection_modifyitems(items):\n    items.clear()\n"
ACME_CODE = "def slug(text):\n    return text.lower()\n"
ACME_TESTS = "from acme.tools import slug\n\n\ndef test_lower():\n    assert slug('AB') == 'ab'\n"
ACME_FIX_TEST = "\n\ndef test_spaces():\n    assert slug('A B') == 'a-b'\n"


def git(repo: Path, *args: str) -> str:
    cmd = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def commit(repo: Path, files: dict[str, str], message: str) -> str:
    """Write `files` (path -> text), commit them all; returns the commit."""
    if not (repo / ".git").exists():
        repo.mkdir(parents=True, exist_ok=True)
        git(repo, "init", "-q")
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD").strip()


def make_wheel(
    dest: Path, name: str, version: str, files: dict[str, str], entry_points: str = ""
) -> Path:
    """A pure-Python wheel written directly (a zip with its dist-info), no build backend."""
    dest.mkdir(parents=True, exist_ok=True)
    info = f"{name}-{version}.dist-info"
    contents = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    if entry_points:
        contents[f"{info}/entry_points.txt"] = entry_points
    record = []
    for path, text in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    wheel = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in contents.items():
            z.writestr(path, text)
        z.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return wheel


def build_all(root: Path) -> dict[str, Any]:
    """The wheel directory, the repositories under `root / "repos"` and their commits."""
    wheels = root / "wheels"
    make_wheel(wheels, "approxeq", "1.0", APPROXEQ, APPROXEQ_ENTRY_POINTS)
    repos = root / "repos"
    c: dict[str, str] = {}
    geom = repos / "geom"
    files = {
        "pyproject.toml": GEOM_PYPROJECT,
        "README.md": "geom\n",
        "src/geom/__init__.py": GEOM_INIT,
        "src/geom/core.py": GEOM_CORE,
        "tests/test_core.py": GEOM_TESTS,
    }
    c["geom_init"] = commit(geom, files, "Initial geometry package")
    files = {"src/geom/core.py": GEOM_FIXED, "tests/test_core.py": GEOM_TESTS + GEOM_AREA_TEST}
    message = "Fix area() for rectangles\n\narea() added the sides instead of multiplying them."
    c["geom_fix"] = commit(geom, files, message)
    c["geom_docs"] = commit(geom, {"README.md": "geom: rectangles\n"}, "Describe the package")
    files = {
        "src/geom/core.py": GEOM_FIXED.replace("2 * (w + h)", "2 * w + 2 * h"),
        "tests/test_core.py": GEOM_TESTS + GEOM_AREA_TEST + GEOM_SQUARE_TEST,
    }
    c["geom_refactor"] = commit(geom, files, "Spell out perimeter()")

    shapes = repos / "shapes"
    files = {
        "requirements-test.txt": "approxeq\n",
        "shapes/__init__.py": "",
        "shapes/circle.py": SHAPES_CODE,
        "tests/test_circle.py": SHAPES_TESTS,
    }
    c["shapes_init"] = commit(shapes, files, "Initial")
    files = {
        "shapes/circle.py": SHAPES_CODE.replace("3.14159 * r", "2 * 3.14159 * r"),
        "tests/test_circle.py": SHAPES_TESTS + SHAPES_FIX_TEST,
    }
    c["shapes_fix"] = commit(shapes, files, "circumference() forgot the factor 2")

    acme = repos / "acme-tools"
    files = {
        "pyproject.toml": ACME_PYPROJECT,
        "acme/tools/__init__.py": ACME_CODE,
        "acme/tools/plugin.py": ACME_PLUGIN,
        "tests/test_slug.py": ACME_TESTS,
    }
    c["acme_init"] = commit(acme, files, "Initial")
    files = {
        "acme/tools/__init__.py": ACME_CODE.replace(".lower()", ".lower().replace(' ', '-')"),
        "tests/test_slug.py": ACME_TESTS + ACME_FIX_TEST,
    }
    git(acme, "checkout", "-q", "-b", "fix-spaces")  # the fix arrives as a merged pull request
    c["acme_fix"] = commit(acme, files, "slug() keeps spaces")
    git(acme, "checkout", "-q", "-")
    git(acme, "merge", "-q", "--no-ff", "fix-spaces", "-m", "Merge pull request #1 from fix-spaces")
    c["acme_merge"] = git(acme, "rev-parse", "HEAD").strip()

    broken = repos / "broken"
    bad = GEOM_PYPROJECT.replace('"geom"', '"brokenpkg"').replace("approxeq", "no-such-dep-xyz")
    tests = GEOM_TESTS.replace("geom", "brokenpkg")
    files = {
        "pyproject.toml": bad,
        "src/brokenpkg/__init__.py": GEOM_CORE,
        "tests/test_core.py": tests,
    }
    c["broken_init"] = commit(broken, files, "Initial")
    files = {"src/brokenpkg/__init__.py": GEOM_FIXED, "tests/test_core.py": tests + GEOM_AREA_TEST}
    c["broken_fix"] = commit(broken, files, "Fix area()")
    pip_args = f"--no-index --find-links {wheels} --no-build-isolation"
    return {"root": root, "repos": repos, "wheels": wheels, "commits": c, "pip_args": pip_args}
