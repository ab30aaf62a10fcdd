#!/usr/bin/env bash
# `pip install .` and `pip install -e .` as docs/PYTHON.md shows them, in a fresh virtual
# environment, offline (--no-build-isolation --no-index): the wheel's files and RECORD, the
# import from outside the source tree, a small pipeline, and an uninstall that leaves nothing.
# The build backend reuses the test build (FLOWFEED_BUILD_DIR), so no second build is made.
#   pip_install_test.sh SOURCE_DIR BUILD_DIR PYTHON
set -euo pipefail
src=$1 build=$2 python=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
export FLOWFEED_BUILD_DIR=$build
unset PYTHONPATH
# --system-site-packages: NumPy and Debian's pip come from the system; --without-pip: that pip,
# run by the environment's interpreter, installs into the environment (and saves seconds).
"$python" -m venv --system-site-packages --without-pip "$work/venv"
venv_python=$work/venv/bin/python
site=$("$venv_python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
pip=("$venv_python" -m pip)

fail() { echo "FAIL: $*" >&2; exit 1; }

# Imports flowfeed from $work, checks where it came from, its version, and runs a pipeline.
check_import() {
  local expected_dir=$1
  (cd "$work" && "$venv_python" - "$expected_dir" "$version" <<'EOF'
import importlib.metadata
import os
import sys

import numpy as np

import flowfeed

expected = os.path.realpath(sys.argv[1])
where = os.path.realpath(os.path.dirname(flowfeed.__file__))
assert where == expected, f"flowfeed imported from {where}, expected {expected}"
assert importlib.metadata.version("flowfeed") == sys.argv[2], importlib.metadata.version("flowfeed")
config = """
pipeline: { mode: pull, epochs: 2, batch_size: 16, prefetch_depth: 2, device: host }
sampler: { shuffle: true, seed: 5 }
nodes:
  - { name: load, type: synthetic, params: { samples: 100, sample_shape: [3] } }
  - { name: stage, type: host_staging }
  - { name: upload, type: host_upload }
"""
with flowfeed.Pipeline(config) as pipeline:
    for epoch in range(pipeline.epochs):
        seen = []
        for batch in pipeline.epoch():
            with batch:
                x = np.from_dlpack(batch["x"])
                assert x.shape == (batch.rows, 3), x.shape
                seen += list(batch.samples)
                del x
        assert sorted(seen) == list(range(100)), seen
print("flowfeed", flowfeed.__file__, "ran 2 epochs of 100 samples")
EOF
  ) || fail "import and run after: $2"
}

version=$(sed -n 's/^project(flowfeed VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
[[ -n $version ]] || fail "no project(flowfeed VERSION ...) in $src/CMakeLists.txt"

# 1. pip install .
(cd "$src" && "${pip[@]}" install --no-build-isolation --no-index .) >"$work/pip.log" 2>&1 ||
  { cat "$work/pip.log"; fail "pip install --no-build-isolation --no-index ."; }
module=$(cd "$site" && ls flowfeed.*.so) || fail "no flowfeed.*.so in $site"
[[ $module == flowfeed$("$venv_python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))') ]] ||
  fail "installed $module, not named for this interpreter"
cmp -s "$site/$module" "$build/python/$module" || fail "the installed module is not the build's"
# Every file the wheel installed is in RECORD with its hash and size, as pip show lists it.
"$venv_python" - "$site" <<'EOF' || fail "RECORD"
import base64, csv, hashlib, os, sys
site = sys.argv[1]
info = [d for d in os.listdir(site) if d.startswith("flowfeed-") and d.endswith(".dist-info")]
assert len(info) == 1, info
rows = list(csv.reader(open(os.path.join(site, info[0], "RECORD"))))
listed = {path for path, _, _ in rows}
for path, digest, size in rows:
    if not digest:
        continue
    data = open(os.path.join(site, path), "rb").read()
    want = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    assert digest == want and int(size) == len(data), (path, digest, want, size, len(data))
so = [p for p in listed if p.startswith("flowfeed.") and p.endswith(".so")]
assert len(so) == 1, listed
wheel = open(os.path.join(site, info[0], "WHEEL")).read()
assert "Root-Is-Purelib: false" in wheel, wheel
EOF
check_import "$site" "pip install ."

# 2. pip uninstall leaves nothing behind.
"${pip[@]}" uninstall -y flowfeed >"$work/pip.log" 2>&1 || { cat "$work/pip.log"; fail "pip uninstall"; }
if compgen -G "$site/flowfeed*" >/dev/null; then fail "left after uninstall: $(ls -d "$site"/flowfeed*)"; fi
(cd "$work" && "$venv_python" -c 'import flowfeed' 2>/dev/null) && fail "flowfeed still imports after uninstall"

# 3. pip install -e .: a .pth naming the build's python/ folder.
(cd "$src" && "${pip[@]}" install --no-build-isolation --no-index -e .) >"$work/pip.log" 2>&1 ||
  { cat "$work/pip.log"; fail "pip install --no-build-isolation --no-index -e ."; }
compgen -G "$site/flowfeed.*.so" >/dev/null && fail "the editable install copied the module"
check_import "$build/python" "pip install -e ."
"${pip[@]}" uninstall -y flowfeed >"$work/pip.log" 2>&1 || { cat "$work/pip.log"; fail "pip uninstall -e"; }
echo "pip install . and -e . in a fresh venv: passed"
