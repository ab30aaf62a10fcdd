"""The pip build backend (python/pep517/flowfeed_backend.py) without pip: the wheel tag pip must
accept, the version, refusals of a named build that does not fit, the source archive.
tests/python/pip_install_test.sh (ctest python_pip_install) runs pip itself."""
import os
import subprocess
import sys
import tarfile
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python", "pep517"))
import flowfeed_backend  # noqa: E402


@pytest.fixture
def in_repo(monkeypatch):
    monkeypatch.chdir(ROOT)  # PEP 517: hooks run in the source tree
    monkeypatch.delenv("FLOWFEED_BUILD_DIR", raising=False)


def test_the_wheel_tag_is_one_this_interpreter_installs():
    try:
        from packaging import tags
    except ImportError:  # pip's own copy
        from pip._vendor.packaging import tags
    supported = {str(t) for t in tags.sys_tags()}
    tag = flowfeed_backend.wheel_tag()
    assert tag in supported
    assert tag.split("-")[2].startswith("linux") or sys.platform != "linux"


def test_version_is_the_cmake_projects(in_repo):
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        line = next(l for l in f if l.startswith("project(flowfeed"))
    assert f"VERSION {flowfeed_backend.version()} " in line
    metadata = flowfeed_backend.metadata_text(ROOT)
    assert metadata.startswith(f"Metadata-Version: 2.1\nName: flowfeed\nVersion: {flowfeed_backend.version()}\n")


def test_every_hook_needs_nothing_from_an_index():
    for hook in ("wheel", "editable", "sdist"):
        assert getattr(flowfeed_backend, f"get_requires_for_build_{hook}")({}) == []


def fake_build(folder, python, module="ON", key="Python3_EXECUTABLE"):
    folder.mkdir(exist_ok=True)
    (folder / "CMakeCache.txt").write_text(textwrap.dedent(f"""\
        FLOWFEED_PYTHON:STRING={module}
        {key}:FILEPATH={python}
        """))
    return folder


def test_a_named_build_without_the_module_is_refused_and_left_alone(in_repo, tmp_path, monkeypatch):
    folder = fake_build(tmp_path / "b", sys.executable, module="OFF")
    before = (folder / "CMakeCache.txt").read_text()
    monkeypatch.setenv("FLOWFEED_BUILD_DIR", str(folder))
    with pytest.raises(flowfeed_backend.BuildError) as error:
        flowfeed_backend.build_wheel(str(tmp_path / "wheels"))
    assert str(error.value) == (
        f"flowfeed build backend: cannot use the build in {folder}: FLOWFEED_PYTHON is OFF there; "
        "leave FLOWFEED_BUILD_DIR and build-dir unset to build in build/pip, or reconfigure it: "
        f"cmake {folder} -DFLOWFEED_PYTHON=ON -DPython3_EXECUTABLE={sys.executable}")
    assert sorted(os.listdir(folder)) == ["CMakeCache.txt"]
    assert (folder / "CMakeCache.txt").read_text() == before
    assert not (tmp_path / "wheels").exists()


@pytest.mark.parametrize("key", ["Python3_EXECUTABLE", "_Python3_EXECUTABLE"])
def test_a_named_build_for_another_interpreter_is_refused(in_repo, tmp_path, key):
    other = tmp_path / "python9"
    other.write_text("#!/bin/sh\necho .cpython-99-x86_64-linux-gnu.so\n")
    other.chmod(0o755)
    folder = fake_build(tmp_path / "b", other, key=key)
    with pytest.raises(flowfeed_backend.BuildError) as error:
        flowfeed_backend.build_wheel(str(tmp_path / "wheels"), {"build-dir": str(folder)})
    import sysconfig
    assert str(error.value) == (
        f"flowfeed build backend: cannot use the build in {folder}: it was configured for {other}, "
        f"not for {sys.executable} (EXT_SUFFIX {sysconfig.get_config_var('EXT_SUFFIX')}); "
        "leave FLOWFEED_BUILD_DIR and build-dir unset to build in build/pip, or reconfigure it: "
        f"cmake {folder} -DFLOWFEED_PYTHON=ON -DPython3_EXECUTABLE={sys.executable}")


def test_the_source_archive_holds_the_tracked_files_and_pkg_info(in_repo, tmp_path):
    if subprocess.run(["git", "-C", ROOT, "rev-parse"], capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    name = flowfeed_backend.build_sdist(str(tmp_path))
    base = f"flowfeed-{flowfeed_backend.version()}"
    assert name == base + ".tar.gz" and os.listdir(tmp_path) == [name]
    with tarfile.open(tmp_path / name) as tar:
        names = set(tar.getnames())
        pkg_info = tar.extractfile(f"{base}/PKG-INFO").read().decode()
    tracked = subprocess.run(["git", "-C", ROOT, "ls-files"], capture_output=True, text=True,
                             check=True).stdout.split()
    assert {f"{base}/{n}" for n in tracked if os.path.isfile(os.path.join(ROOT, n))} | {
        f"{base}/PKG-INFO"} == names
    assert f"{base}/pyproject.toml" in names and f"{base}/python/pep517/flowfeed_backend.py" in names
    assert not any(n.startswith(f"{base}/build/") for n in names)
    assert pkg_info == flowfeed_backend.metadata_text(ROOT)


def test_without_cmake_the_build_says_so(in_repo, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no cmake, no ccache, no ninja
    monkeypatch.setenv("FLOWFEED_BUILD_DIR", str(tmp_path / "b"))
    with pytest.raises(flowfeed_backend.BuildError) as error:
        flowfeed_backend.build_wheel(str(tmp_path / "wheels"))
    assert str(error.value) == ("flowfeed build backend: cannot run cmake: No such file or "
                                "directory (CMake 3.25 or later is needed; Debian: cmake)")
    assert not (tmp_path / "wheels").exists()
