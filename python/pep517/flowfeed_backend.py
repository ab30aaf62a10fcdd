"""The PEP 517 / PEP 660 build backend of flowfeed (pyproject.toml: backend-path python/pep517).

Standard library only, so `pip install --no-build-isolation --no-index .` works offline (Debian
12's pip 23 included): nothing is downloaded, no setuptools or scikit-build is needed. It drives
CMake: configures the repository (Release, FLOWFEED_PYTHON=ON, for the interpreter that runs pip,
`sys.executable`) into a build directory it reuses, builds only the module target
(`flowfeed_python`), and packs `flowfeed<EXT_SUFFIX>` into a wheel tagged for that interpreter.

The build directory: the environment variable FLOWFEED_BUILD_DIR, else the config setting
`build-dir` (`pip install --config-settings build-dir=PATH .`), else `build/pip` in the
repository. An existing build is reused as it is when it was configured for an interpreter of
the same ABI (`cmake --build` then only brings the module up to date); `build/pip` is
reconfigured for this interpreter otherwise, a build named by FLOWFEED_BUILD_DIR or `build-dir`
is left alone and the build fails, naming both interpreters.

Extra CMake arguments: the environment variable CMAKE_ARGS and the config setting `cmake-args`
(shell words). ccache is used when it is on PATH and no launcher is given; a pybind11 that this
interpreter imports (pip's) is passed as pybind11_DIR, else CMake finds the system's. The editable wheel
(`pip install -e .`) holds a .pth file naming the build's python/ folder: rebuild the module
there (`cmake --build build/pip --target flowfeed_python`) and the next `import flowfeed` sees it.
"""
import base64
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import zipfile

NAME = "flowfeed"
TARGET = "flowfeed_python"
# Zip entries get this time (or SOURCE_DATE_EPOCH), so the same module gives the same wheel.
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


class BuildError(RuntimeError):
    pass


# ---- the project's identity ----

def _root():
    """The repository: the hooks run with the source tree as the working directory (PEP 517)."""
    root = os.path.abspath(os.getcwd())
    if not os.path.isfile(os.path.join(root, "CMakeLists.txt")):
        raise BuildError(f"flowfeed build backend: no CMakeLists.txt in {root} "
                         "(run pip on the repository's root folder)")
    return root


def version(root=None):
    """The version of project(flowfeed VERSION x.y.z) in the top CMakeLists.txt."""
    path = os.path.join(root or _root(), "CMakeLists.txt")
    with open(path, encoding="utf-8") as f:
        match = re.search(r"project\s*\(\s*flowfeed\b[^)]*?\bVERSION\s+([0-9][0-9A-Za-z.]*)",
                          f.read())
    if not match:
        raise BuildError(f"{path}: no `project(flowfeed VERSION x.y.z ...)` to take the version from")
    return match.group(1)


def _project_table(root):
    """[project] of pyproject.toml (summary, Python requirement, URLs)."""
    try:
        import tomllib
    except ImportError:  # Python < 3.11: the few keys the metadata needs, by pattern
        with open(os.path.join(root, "pyproject.toml"), encoding="utf-8") as f:
            text = f.read()
        table = {}
        for key in ("description", "requires-python"):
            match = re.search(rf'^{key}\s*=\s*"([^"]*)"', text, re.M)
            if match:
                table[key] = match.group(1)
        return table
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        return tomllib.load(f).get("project", {})


def metadata_text(root):
    project = _project_table(root)
    lines = ["Metadata-Version: 2.1", f"Name: {NAME}", f"Version: {version(root)}"]
    if project.get("description"):
        lines.append(f"Summary: {project['description']}")
    if project.get("requires-python"):
        lines.append(f"Requires-Python: {project['requires-python']}")
    for label, url in project.get("urls", {}).items():
        lines.append(f"Project-URL: {label}, {url}")
    return "\n".join(lines) + "\n"


# ---- the interpreter's wheel tag ----

def wheel_tag():
    """interpreter-abi-platform of the Python running this backend, e.g. cp311-cp311-linux_x86_64:
    the module is built against this interpreter's headers and named with its EXT_SUFFIX."""
    impl = sys.implementation.name
    soabi = sysconfig.get_config_var("SOABI") or ""
    if impl == "cpython":
        interpreter = f"cp{sys.version_info.major}{sys.version_info.minor}"
        # SOABI cpython-311-x86_64-linux-gnu -> cp311; cpython-313t-... (free-threaded) -> cp313t
        parts = soabi.split("-")
        abi = "cp" + parts[1] if len(parts) > 1 and parts[0] == "cpython" else interpreter
    else:
        short = {"pypy": "pp"}.get(impl, impl)
        interpreter = f"{short}{sys.version_info.major}{sys.version_info.minor}"
        abi = "_".join(soabi.split("-")[:2]) or "none"
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{interpreter}-{abi}-{platform}"


def _module_file_name():
    return NAME + (sysconfig.get_config_var("EXT_SUFFIX") or ".so")


# ---- CMake ----

def _setting(config_settings, key):
    value = (config_settings or {}).get(key)
    if isinstance(value, list):  # given more than once
        value = " ".join(value)
    return value


def build_dir(root, config_settings):
    """(folder, chosen): chosen is True when the user named it (FLOWFEED_BUILD_DIR, build-dir)."""
    named = os.environ.get("FLOWFEED_BUILD_DIR") or _setting(config_settings, "build-dir")
    if named:
        return os.path.abspath(os.path.join(root, named)), True
    return os.path.join(root, "build", "pip"), False


def _cache_value(cache, key):
    try:
        with open(cache, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return line.split("=", 1)[1].rstrip("\n")
    except OSError:
        pass
    return None


def _ext_suffix_of(python):
    """EXT_SUFFIX of another interpreter, or None when it cannot be run."""
    if not python:
        return None
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        return sysconfig.get_config_var("EXT_SUFFIX")
    try:
        out = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))"],
                             capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _run(command, log):
    print("flowfeed build backend: " + " ".join(shlex.quote(c) for c in command), file=log, flush=True)
    try:
        result = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT)
    except OSError as e:
        raise BuildError(f"flowfeed build backend: cannot run {command[0]}: {e.strerror} "
                         "(CMake 3.25 or later is needed; Debian: cmake)") from e
    if result.returncode != 0:
        raise BuildError(f"flowfeed build backend: `{' '.join(command)}` exited with "
                         f"{result.returncode} (its output is above)")


def _cmake_args(config_settings):
    args = shlex.split(os.environ.get("CMAKE_ARGS", ""))
    args += shlex.split(_setting(config_settings, "cmake-args") or "")
    if shutil.which("ccache") and not any("COMPILER_LAUNCHER" in a for a in args):
        args += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache", "-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache"]
    if not any(a.startswith("-Dpybind11_DIR") for a in args):
        try:  # a pybind11 installed with pip (visible without build isolation)
            import pybind11
            args.append(f"-Dpybind11_DIR={pybind11.get_cmake_dir()}")
        except (ImportError, AttributeError):
            pass  # the system's (Debian pybind11-dev), found by CMake
    return args


def _configure_needed(folder, chosen):
    """False when the build in `folder` can be used as it is; raises for a named build made for
    another interpreter; True when `folder` must be (re)configured."""
    cache = os.path.join(folder, "CMakeCache.txt")
    if not os.path.isfile(cache):
        return True
    # Given (-D, or FlowfeedPython.cmake's /usr/bin/python3), else what FindPython3 chose.
    python = _cache_value(cache, "Python3_EXECUTABLE") or _cache_value(cache, "_Python3_EXECUTABLE")
    module_on = (_cache_value(cache, "FLOWFEED_PYTHON") or "AUTO").upper() != "OFF"
    same_abi = _ext_suffix_of(python) == sysconfig.get_config_var("EXT_SUFFIX")
    if module_on and same_abi:
        return False
    if chosen:
        why = ("FLOWFEED_PYTHON is OFF there" if not module_on else
               f"it was configured for {python or 'no Python'}, "
               f"not for {sys.executable} (EXT_SUFFIX {sysconfig.get_config_var('EXT_SUFFIX')})")
        raise BuildError(f"flowfeed build backend: cannot use the build in {folder}: {why}; "
                         "leave FLOWFEED_BUILD_DIR and build-dir unset to build in build/pip, "
                         f"or reconfigure it: cmake {folder} -DFLOWFEED_PYTHON=ON "
                         f"-DPython3_EXECUTABLE={sys.executable}")
    return True


def build_module(config_settings=None, log=None):
    """Configures when needed, builds the module target; returns the module's path."""
    root = _root()
    folder, chosen = build_dir(root, config_settings)
    log = log or sys.stderr
    if _configure_needed(folder, chosen):
        command = ["cmake", "-S", root, "-B", folder, "-DCMAKE_BUILD_TYPE=Release",
                   "-DFLOWFEED_PYTHON=ON", f"-DPython3_EXECUTABLE={sys.executable}",
                   "-DFLOWFEED_BUILD_TESTS=OFF", "-DFLOWFEED_BUILD_APPS=OFF"]
        if shutil.which("ninja") and not os.path.isfile(os.path.join(folder, "CMakeCache.txt")):
            command += ["-G", "Ninja"]
        _run(command + _cmake_args(config_settings), log)
    _run(["cmake", "--build", folder, "--target", TARGET], log)
    module = os.path.join(folder, "python", _module_file_name())
    if not os.path.isfile(module):
        present = sorted(n for n in os.listdir(os.path.dirname(module)) if n.startswith(NAME)) \
            if os.path.isdir(os.path.dirname(module)) else []
        raise BuildError(f"flowfeed build backend: the build did not produce {module} "
                         f"(found: {', '.join(present) or 'nothing'}); the module must be built "
                         f"for {sys.executable}")
    return module


# ---- wheels ----

def _dist_info():
    return f"{NAME}-{version()}.dist-info"


def _wheel_text(tag):
    return (f"Wheel-Version: 1.0\nGenerator: flowfeed_backend {version()}\n"
            f"Root-Is-Purelib: false\nTag: {tag}\n")


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def _zip_time():
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch and epoch.isdigit():
        import time
        t = time.gmtime(max(int(epoch), 315532800))  # zip cannot hold times before 1980
        return t[:6]
    return ZIP_EPOCH


def _write_wheel(wheel_directory, files):
    """files: [(arcname, bytes, mode)]; adds the dist-info and RECORD, returns the wheel's name."""
    tag = wheel_tag()
    info = _dist_info()
    root = _root()
    files = list(files) + [(f"{info}/METADATA", metadata_text(root).encode(), 0o644),
                           (f"{info}/WHEEL", _wheel_text(tag).encode(), 0o644),
                           (f"{info}/top_level.txt", f"{NAME}\n".encode(), 0o644)]
    record = [_record_line(name, data) for name, data, _ in files] + [f"{info}/RECORD,,"]
    files.append((f"{info}/RECORD", ("\n".join(record) + "\n").encode(), 0o644))
    wheel_name = f"{NAME}-{version()}-{tag}.whl"
    os.makedirs(wheel_directory, exist_ok=True)
    path = os.path.join(wheel_directory, wheel_name)
    partial = path + ".part"
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data, mode in files:
            entry = zipfile.ZipInfo(name, date_time=_zip_time())
            entry.external_attr = (0o100000 | mode) << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(entry, data)
    os.replace(partial, path)
    return wheel_name


def _prepare_metadata(metadata_directory):
    folder = os.path.join(metadata_directory, _dist_info())
    os.makedirs(folder, exist_ok=True)
    for name, text in (("METADATA", metadata_text(_root())), ("WHEEL", _wheel_text(wheel_tag())),
                       ("top_level.txt", f"{NAME}\n")):
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            f.write(text)
    return _dist_info()


# ---- the PEP 517 and PEP 660 hooks ----

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _prepare_metadata(metadata_directory)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    return _prepare_metadata(metadata_directory)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    """A wheel holding the module built for this interpreter."""
    module = build_module(config_settings)
    with open(module, "rb") as f:
        data = f.read()
    return _write_wheel(wheel_directory, [(os.path.basename(module), data, 0o755)])


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """A wheel holding a .pth that puts the build's python/ folder on sys.path: the module is
    imported from the build, so rebuilding it there is enough."""
    module = build_module(config_settings)
    pth = (os.path.dirname(module) + "\n").encode()
    return _write_wheel(wheel_directory, [(f"__editable__.{NAME}-{version()}.pth", pth, 0o644)])


def build_sdist(sdist_directory, config_settings=None):
    """flowfeed-x.y.z.tar.gz: the files git tracks (every file but build outputs without git),
    with PKG-INFO."""
    import io
    import tarfile
    root = _root()
    base = f"{NAME}-{version(root)}"
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True,
                                check=True).stdout.decode().split("\0")
        names = [n for n in listed if n and os.path.isfile(os.path.join(root, n))]
    except (OSError, subprocess.CalledProcessError):
        names = []
        for folder, dirs, files in os.walk(root):
            rel = os.path.relpath(folder, root)
            dirs[:] = [d for d in dirs if not (rel == "." and (d.startswith("build") or d.startswith(".")))]
            names += [os.path.normpath(os.path.join(rel, f)) for f in files]
    os.makedirs(sdist_directory, exist_ok=True)
    path = os.path.join(sdist_directory, base + ".tar.gz")
    with tarfile.open(path + ".part", "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(names):
            tar.add(os.path.join(root, name), arcname=f"{base}/{name}", recursive=False)
        info = metadata_text(root).encode()
        entry = tarfile.TarInfo(f"{base}/PKG-INFO")
        entry.size, entry.mode = len(info), 0o644
        tar.addfile(entry, io.BytesIO(info))
    os.replace(path + ".part", path)
    return base + ".tar.gz"
