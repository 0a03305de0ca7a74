"""The CI entry point's own Python (the library report before the suite) runs on this tree.

`.ci/run` prints the library state with an inline script before pytest starts; a module it
names that no longer exists fails CI before any test runs, so the script is run here too.
"""

import pathlib
import re
import subprocess
import sys

CI_RUN = pathlib.Path(__file__).resolve().parents[2] / ".ci" / "run"


def _inline_python(text):
    scripts = re.findall(r"python - <<'PY'\n(.*?)\nPY\n", text, flags=re.S)
    assert scripts, "no inline python block found in .ci/run"
    return scripts


def test_ci_run_inline_python_executes():
    for script in _inline_python(CI_RUN.read_text()):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              timeout=300, cwd=CI_RUN.parents[1])
        assert done.returncode == 0, done.stderr[-2000:]
        assert "jaxcnn library:" in done.stdout
