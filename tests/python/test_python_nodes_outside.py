"""The Python node types from outside a Python program: pipeline_runner's embedded interpreter
running a module function, and the examples of PYTHON.md and README.md, run as written."""
import os
import re
import textwrap


def test_the_runner_embeds_python_for_a_module_function(tmp_path, runner_path):
    import json
    import subprocess
    (tmp_path / "ff_runner_data.py").write_text(textwrap.dedent("""\
        import numpy as np
        def load(i):
            return {"x": np.full((4,), i, np.float32), "y": i}
        def bad(i):
            raise KeyError(i)
        """))
    def run(callable_, *extra):
        config = tmp_path / "python.yaml"
        config.write_text(textwrap.dedent(f"""\
            pipeline: {{ batch_size: 10, epochs: 2, device: host }}
            nodes:
              - {{ name: load, type: python, concurrency: 2, params: {{ callable: "{callable_}", samples: 95 }} }}
              - {{ name: stage, type: host_staging }}
              - {{ name: upload, type: host_upload }}
              - {{ name: train, type: discard }}
            """))
        env = {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
        return subprocess.run([runner_path, str(config), "--quiet", *extra],
                              capture_output=True, text=True, timeout=120, env=env)

    report = tmp_path / "report.json"
    done = run("ff_runner_data:load", "--report", str(report))
    assert (done.returncode, done.stderr) == (0, "")
    r = json.loads(report.read_text())
    assert (r["batches"], r["samples"]) == (20, 190)
    assert [n["type"] for n in r["nodes"]][0] == "python"

    done = run("ff_runner_data:missing")
    assert done.returncode == 2
    assert re.fullmatch(r"\S+python.yaml:3:\d+: nodes\[0\]\.params\.callable: "
                        r"'ff_runner_data:missing': ff_runner_data has no attribute 'missing'\n",
                        done.stderr), done.stderr
    done = run("ff_runner_data:bad")
    assert done.returncode == 1
    assert "error: node 'load' (python, " in done.stderr
    assert "sample 0: KeyError: 0 (at " in done.stderr and "ff_runner_data.py:5 in bad)" in done.stderr


def test_the_python_md_example_runs():
    text = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "PYTHON.md")).read()
    section = text[text.index("## Python in the graph"):]
    code = section[section.index("```python\n") + 10:section.index("```\n", section.index("```python"))]
    scope = {}
    exec(compile(code, "PYTHON.md", "exec"), scope)
    assert scope["p"].report()["samples"] == 1000


def test_the_readme_example_runs():
    text = open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")).read()
    start = text.index("```python\n") + 10
    code = text[start:text.index("```\n", start)]
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)
    report = scope["p"].report()
    assert report["samples"] == 1024 and report["batches"] == 4
