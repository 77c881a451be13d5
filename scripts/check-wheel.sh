#!/usr/bin/env bash
# Build the sdist and wheel, check them, and use the wheel as a user would: in a clean venv,
# from a folder outside the checkout (so the checkout is not importable).
#
#   1. python -m build; twine check --strict; the wheel holds py.typed and every non-.py
#      file under consensus_lease/ in git.
#   2. base install: nothing but the package (no celery, redis, opentelemetry, tooz);
#      `import consensus_lease` loads no rich, tenacity, grpc or kazoo; the command
#      without rich prints the install line.
#   3. [etcd]: an etcd store works (a claim against a local etcd when /usr/bin/etcd is
#      there, else the backend loads and an unreachable server is BackendUnavailable).
#   4. [otel]: opentelemetry-api and nothing more (no SDK, celery, redis); the observer
#      runs on the API's no-op providers; consensus_lease.celery names the celery extra.
#   5. [cli]: consensus-lease demo.
#   6. [cli,testing,metrics,sql]: the unit tests, from a copy of tests/.
#
# Usage: scripts/check-wheel.sh            (PYTHON: an interpreter with build and twine,
#                                           default .venv/bin/python; BASE_PYTHON: the one
#                                           the clean venv is made from, default python3)
set -euo pipefail
unset PYTHONPATH  # the clean venv must not see the checkout
cd "$(dirname "$0")/.."
checkout=$PWD
PYTHON=${PYTHON:-$checkout/.venv/bin/python}
BASE_PYTHON=${BASE_PYTHON:-python3}
start=$(date +%s)
step() { echo "check-wheel: [$(( $(date +%s) - start )) s] $*"; }

work=$(mktemp -d "${TMPDIR:-/tmp}/check-wheel.XXXXXX")
etcd_pid=""
cleanup() {
    if [ -n "$etcd_pid" ]; then kill "$etcd_pid" 2>/dev/null || true; wait "$etcd_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

step "building sdist and wheel"
"$PYTHON" -m build --outdir "$work/dist" "$checkout" >"$work/build.log" 2>&1 || {
    cat "$work/build.log"; exit 1; }
"$PYTHON" -m twine check --strict "$work"/dist/*
wheel=$(echo "$work"/dist/consensus_lease-*.whl)
sdist=$(echo "$work"/dist/consensus_lease-*.tar.gz)
[ -f "$wheel" ] && [ -f "$sdist" ] || { echo "check-wheel: no wheel or sdist built"; exit 1; }

step "checking the wheel's files"
"$PYTHON" - "$wheel" "$checkout" <<'EOF'
import subprocess, sys, zipfile
wheel, checkout = sys.argv[1:]
names = set(zipfile.ZipFile(wheel).namelist())
tracked = subprocess.run(["git", "-C", checkout, "ls-files", "consensus_lease"],
                         capture_output=True, text=True, check=True).stdout.split()
missing = sorted(set(tracked) - names)
assert not missing, f"files under consensus_lease/ missing from the wheel: {missing}"
assert "consensus_lease/py.typed" in names
stray = sorted(n for n in names if n.endswith((".pyc", ".pyo")) or "__pycache__" in n
               or n.startswith(("tests/", "benchmarks/", "docker/")))
assert not stray, f"files that must not ship: {stray}"
data = sorted(n for n in names if n.startswith("consensus_lease/") and not n.endswith(".py"))
print(f"  {len(names)} files; non-.py package files: {', '.join(data)}")
# The tooz driver: tooz only behind an extra, the tooz.backends entry points declared.
info = next(n for n in names if n.endswith(".dist-info/METADATA"))
meta = zipfile.ZipFile(wheel).read(info).decode()
requires = [line for line in meta.splitlines() if line.startswith("Requires-Dist:")]
bare = [r for r in requires if "extra ==" not in r]
assert not bare, f"the base install requires {bare}"
assert any(r.startswith("Requires-Dist: tooz") and 'extra == "tooz"' in r for r in requires)
points = zipfile.ZipFile(wheel).read(info.replace("METADATA", "entry_points.txt")).decode()
assert "[tooz.backends]" in points and "consensus-lease+etcd" in points, points
print(f"  {len(requires)} requirements, each behind an extra; tooz.backends declared")
EOF

venv="$work/venv"
run="$work/run"       # the folder the user works in: no consensus_lease/ next to it
mkdir -p "$run"
cd "$run"
step "clean venv, base install"
"$BASE_PYTHON" -m venv "$venv"
pip() { "$venv/bin/python" -m pip --quiet --disable-pip-version-check "$@"; }
pip install "$wheel"
"$venv/bin/python" - <<'EOF'
import importlib.metadata as md, sys
import consensus_lease
assert "/venv/" in consensus_lease.__file__, f"imported from {consensus_lease.__file__}"
optional = ("rich", "tenacity", "grpc", "kazoo", "pyetcd", "sqlalchemy", "prometheus_client",
            "opentelemetry", "celery", "kombu", "redis", "tooz")
loaded = [name for name in optional if name in sys.modules]
assert not loaded, f"import consensus_lease loaded {loaded}"
installed = sorted(d.metadata["Name"].lower() for d in md.distributions())
extra = set(installed) - {"consensus_lease", "consensus-lease", "pip", "setuptools"}
assert not extra, f"the base install pulled in {sorted(extra)}"
print(f"  base install: {installed}; import loaded none of {', '.join(optional)}")
EOF
status=0
"$venv/bin/consensus-lease" demo >"$work/norich.out" 2>&1 || status=$?
grep -q "pip install 'consensus_lease\[cli\]'" "$work/norich.out" && [ "$status" = 2 ] \
    && ! grep -q Traceback "$work/norich.out" || {
    echo "check-wheel: without rich the command should name the cli extra:"; cat "$work/norich.out"; exit 1; }

step "installing [etcd]"
pip install "$wheel[etcd]"
etcd_url=""
if [ -x /usr/bin/etcd ] || command -v etcd >/dev/null; then
    read -r client peer < <("$venv/bin/python" -c '
import socket
ports = []
for _ in range(2):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    ports.append(s)
print(*[s.getsockname()[1] for s in ports])')
    etcd --name check-wheel --data-dir "$work/etcd" \
        --listen-client-urls "http://127.0.0.1:$client" --advertise-client-urls "http://127.0.0.1:$client" \
        --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
        --initial-cluster "check-wheel=http://127.0.0.1:$peer" >"$work/etcd.log" 2>&1 &
    etcd_pid=$!
    etcd_url="etcd://127.0.0.1:$client/check-wheel"
fi
"$venv/bin/python" - "$etcd_url" <<'EOF'
import sys, time
from consensus_lease import BackendUnavailable, open_store
from consensus_lease.backends.etcd import EtcdBackend
url = sys.argv[1]
if not url:
    try:
        open_store("etcd://127.0.0.1:9/check-wheel", connect_timeout_s=0.5)
    except BackendUnavailable:
        print("  etcd backend loads (no etcd binary here: an unreachable server is BackendUnavailable)")
        sys.exit(0)
    raise AssertionError("open_store reached a server on port 9")
deadline = time.monotonic() + 30
while True:
    try:
        store = open_store(url, connect_timeout_s=1.0)
        break
    except BackendUnavailable:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.2)
with store, store.session(ttl_s=5) as session:
    assert isinstance(store.backend, EtcdBackend)
    lease = session.claim("check-wheel-job", wait_s=10)
    lease.ensure_held()
    lease.complete(b"done")
    print(f"  etcd store works: claimed generation {lease.generation} and completed it")
EOF
if [ -n "$etcd_pid" ]; then kill "$etcd_pid"; wait "$etcd_pid" 2>/dev/null || true; etcd_pid=""; fi

step "installing [otel]: the OpenTelemetry API only, no SDK, no celery"
pip install "$wheel[otel]"
"$venv/bin/python" - <<'EOF'
import importlib.metadata as md
installed = {d.metadata["Name"].lower().replace("_", "-") for d in md.distributions()}
assert "opentelemetry-api" in installed, sorted(installed)
unwanted = sorted(installed & {"opentelemetry-sdk", "celery", "kombu", "redis", "tooz"})
assert not unwanted, f"the otel extra pulled in {unwanted}"
from consensus_lease import open_store
from consensus_lease.otel import OTelObserver
# No SDK: the API's no-op providers; the observer runs and records nothing.
with open_store("memory://", observer=OTelObserver()) as store, store.session() as session:
    session.claim("otel-job").complete(b"")
try:
    import consensus_lease.celery  # noqa: F401
except ImportError as exc:
    assert "consensus_lease[celery]" in str(exc), exc
else:
    raise AssertionError("consensus_lease.celery imported without celery installed")
print("  [otel]: opentelemetry-api only; consensus_lease.celery names its extra")
EOF

step "installing [cli], running the demo"
pip install "$wheel[cli]"
"$venv/bin/consensus-lease" demo >"$work/demo.out" 2>&1 || { cat "$work/demo.out"; exit 1; }
tail -n 1 "$work/demo.out"

step "installing [cli,testing,metrics,sql], running the unit tests from a copy of tests/"
pip install "$wheel[cli,testing,metrics,sql]"
cp -r "$checkout/tests" "$run/tests"
# The checkout's pytest settings (markers, timeout), without the rest of pyproject.toml.
"$venv/bin/python" - "$checkout/pyproject.toml" >"$run/pytest.ini" <<'EOF'
import sys, tomllib
options = tomllib.load(open(sys.argv[1], "rb"))["tool"]["pytest"]["ini_options"]
print("[pytest]")
for key, value in options.items():
    if key == "testpaths":
        continue
    if isinstance(value, list):
        print(f"{key} =", *("\n    " + item for item in value), sep="")
    else:
        print(f"{key} = {value}")
EOF
# test_docs_api.py checks the documentation sources of a checkout (mkdocs.yml, docs/),
# which the wheel does not carry; `make docs` and the checkout's own run cover it. The
# model check's exhaustive search to the CI bound (about a minute of pure Python, the
# same on a wheel as on the checkout) runs once, in the checkout's run; the mutations
# still run here against the wheel's copy of the model.
"$venv/bin/python" -m pytest -p no:cacheprovider -q tests/unit -m "not containers" \
    --ignore=tests/unit/test_docs_api.py \
    --deselect tests/unit/test_model.py::test_no_violation_up_to_the_ci_bound
step "passed"
