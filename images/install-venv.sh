#!/bin/sh
# install-venv.sh EXTRAS [TORCH_INDEX]: the Dockerfile's venv stages run this to install the mlless wheel from /wheels,
# with the comma-separated EXTRAS (empty: the core install only), into a fresh virtualenv /opt/mlless.
# One script, so the worker, operator and full images are installed, trimmed and checked the same way.
# With the `torch` extra and a TORCH_INDEX (e.g. https://download.pytorch.org/whl/cpu), that extra's packages come
# from that index alone, first; the wheel's install then finds them there.
set -eu
extras=$(printf '%s' "${1:-}" | tr ',' '\n' | sed '/^$/d' | paste -sd, -)
torch_index=${2:-}
wheel=$(ls /wheels/mlless-*.whl)
python3 -m venv /opt/mlless
if [ -n "$torch_index" ] && printf ',%s,' "$extras" | grep -q ',torch,'; then
    requirements=$(/opt/mlless/bin/python "$(dirname "$0")/extra-requirements.py" "$wheel" torch)
    # shellcheck disable=SC2086 # one requirement a word: `torch>=2.9 torchvision>=0.24`
    /opt/mlless/bin/pip install --index-url "$torch_index" $requirements
fi
# A resolver hint: botocore (from s3fs) needs python-dateutil<3 while the newest kubernetes client needs >=3, and
# without the hint pip backtracks through aiobotocore for many minutes. It costs nothing where neither is installed.
printf 'python-dateutil<3\n' > /tmp/constraints.txt
/opt/mlless/bin/pip install --constraint /tmp/constraints.txt "$wheel${extras:+[$extras]}"
# Cython's generated C and C++ sources end up in the wheel as package data; the runtime does not need them.
package=$(/opt/mlless/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/mlless
find "$package" \( -name '*.c' -o -name '*.cpp' \) -delete
find "$package" -name '*.so' -exec strip --strip-unneeded {} +
# A broken compile fails the build here rather than in a pod.
/opt/mlless/bin/python "$(dirname "$0")/import-extensions.py" mlless
