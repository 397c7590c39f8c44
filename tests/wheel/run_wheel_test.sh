#!/usr/bin/env bash
# A fresh virtual environment, `pip install` of the source tree (the wheel is built there by scikit-build-core),
# then pytest over test_wheel.py from a directory outside the tree, so `import tandem` is the installed package.
set -euo pipefail
venv="$TANDEM_WHEEL_VENV"
rm -rf "$venv"
"$TANDEM_PYTHON" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "scikit-build-core>=0.9" pytest numpy
# build/wheel configured by another compiler (see CMakeLists.txt: ccache needs this build's) starts afresh
cache="$TANDEM_SOURCE_DIR/build/wheel/CMakeCache.txt"
if [ -n "${CXX:-}" ] && [ -f "$cache" ] && ! grep -qx "CMAKE_CXX_COMPILER:FILEPATH=$CXX" "$cache"; then
  rm -rf "$TANDEM_SOURCE_DIR/build/wheel"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-build-isolation "$TANDEM_SOURCE_DIR"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$TANDEM_SOURCE_DIR/tests/wheel/test_wheel.py" "$work/"
cd "$work"
# only the environment's bin on PATH ahead: `tandem` must come from the wheel
env -u TANDEM_LIBRARY -u TANDEM_CLI PATH="$venv/bin:/usr/bin:/bin" "$venv/bin/python" -m pytest -q -p no:cacheprovider test_wheel.py
