#!/usr/bin/env bash
# GPU checks, for a machine with an NVIDIA GPU and a torch with CUDA (the suite itself never
# needs one). Run from the repository root:
#
#   scripts/gpu-check.sh BIN_DIR OUT_DIR
#
# BIN_DIR holds elasticd, gpu.test (go test -c ./worker/agent/gpu), cmd.test
# (go test -c ./cmd/elasticd) and train (./examples/train), built for this machine, so that it
# needs no Go. PY (default python3) must import torch. Each check is bounded in time, writes its
# log to OUT_DIR and prints one line: PASS or FAIL with the reason; the last lines are a summary.
#
#  1 nvml       the agent's NVML inventory of this host (real libnvidia-ml)
#  2 agent-nccl an in-process job (examples/pytorch/elastic_hvd.py) started by `elasticd agent`
#               on this host: one slot per GPU, CUDA_VISIBLE_DEVICES from the agent, NCCL
#  3 cpu-model  the same script with --no-cuda, two workers: CPU tensors on a GPU host
#  4 restart    restart mode on the GPU (examples/pytorch/train_ddp.py): rank 0 SIGKILLs itself
#               at step 20; the group restarts from the checkpoint saved from CUDA tensors
#  5 pytest     the Python package's tests under this torch (CUDA hidden: gloo)
#  6 go-torch   the Go end-to-end PyTorch tests under this torch, each test in its own process,
#               side by side (GO_TORCH: a regexp of test names, default all)
#  7 nccl-ops   elasticd.torch's collectives on CUDA tensors (NCCL) and CPU tensors (gloo) in one
#               group, under elasticd run
#
# CHECKS (default "nvml agent-nccl cpu-model restart pytest go-torch nccl-ops") picks some.
set -u
CHECKS=" ${CHECKS:-nvml agent-nccl cpu-model restart pytest go-torch nccl-ops} "
want() { [[ $CHECKS == *" $1 "* ]]; }
BIN=$(cd "$1" && pwd) OUT=$(mkdir -p "$2" && cd "$2" && pwd)
PY=${PY:-python3}
PORT=${PORT:-29417}
summary=()
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; }
trap cleanup EXIT

check() { # name rc log [needle]: PASS when rc is 0 and the log has needle
  local name=$1 rc=$2 log=$3 needle=${4:-}
  local line="PASS $name"
  if [[ $rc != 0 ]]; then
    line="FAIL $name: exit $rc (log $log)"
  elif [[ -n $needle ]] && ! grep -Eq -- "$needle" "$OUT/$log"; then
    line="FAIL $name: no \"$needle\" in $log"
  fi
  echo "$line ($(date +%T))"
  summary+=("$line")
}

echo "== machine"
nvidia-smi -L; nproc
"$PY" -c 'import torch, torch.distributed as d; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.device_count(), "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else None, "gloo", d.is_gloo_available())'

if want nvml; then
  timeout 60 "$BIN/gpu.test" -test.run 'TestOpenHost' -test.v > "$OUT/nvml.log" 2>&1
  check nvml $? nvml.log 'GPUs: \[\{Index:0 UUID:GPU-'
fi

# 5 and 6 run beside the GPU checks (CUDA hidden from them).
if want pytest; then
  (cd python && CUDA_VISIBLE_DEVICES= ELASTICD_BIN="$BIN/elasticd" timeout 300 "$PY" -m pytest -q -p no:cacheprovider tests) > "$OUT/pytest.log" 2>&1 &
  pytest_pid=$!; pids+=("$pytest_pid")
fi
gotorch=()
if want go-torch; then
  for t in $(cd cmd/elasticd && ELASTICD_TEST_BIN="$BIN/elasticd" ELASTICD_TEST_TRAIN="$BIN/train" "$BIN/cmd.test" -test.list "${GO_TORCH:-PyTorch}"); do
    (cd cmd/elasticd && CUDA_VISIBLE_DEVICES= ELASTICD_TEST_PYTHON=$(command -v "$PY") ELASTICD_TEST_BIN="$BIN/elasticd" \
      ELASTICD_TEST_TRAIN="$BIN/train" timeout 300 "$BIN/cmd.test" -test.run "^$t\$" -test.v -test.timeout 290s) > "$OUT/go-torch-$t.log" 2>&1 &
    gotorch+=("$t:$!"); pids+=("$!")
  done
fi

secret=$(mktemp); echo "c2VjcmV0LXNoYXJlZC1ieS1kcml2ZXItYW5kLWFnZW50cw==" > "$secret"
if want agent-nccl; then
  NCCL_DEBUG=INFO "$BIN/elasticd" agent --driver "http://127.0.0.1:$PORT" --agent-secret-file "$secret" \
    --metadata none --addr 127.0.0.1 --host-id gpu-host > "$OUT/agent.log" 2>&1 &
  agent=$!; pids+=("$agent")
  timeout 150 "$BIN/elasticd" run -np 1 --min-np 1 --launcher agent --agent-secret-file "$secret" \
    --listen "127.0.0.1:$PORT" -- "$PY" examples/pytorch/elastic_hvd.py --epochs 2 --samples 2048 > "$OUT/agent-nccl.log" 2>&1
  rc=$?
  kill "$agent"; wait "$agent" 2>/dev/null
  check agent-nccl $rc agent-nccl.log 'done step'
  grep -E 'agent registered' "$OUT/agent-nccl.log" | head -1
fi
rm -f "$secret"

if want nccl-ops; then
  ops=$(mktemp --suffix .py)
  cat > "$ops" <<'EOF'
import torch
import elasticd.torch as hvd
hvd.init()
torch.cuda.set_device(hvd.local_rank())
t = hvd.allreduce(torch.arange(4, dtype=torch.float32, device="cuda"), op=hvd.Sum)
assert t.is_cuda and torch.equal(t.cpu(), torch.arange(4, dtype=torch.float32)), t
c = hvd.allreduce(torch.ones(3), op=hvd.Sum)
assert not c.is_cuda and torch.equal(c, torch.ones(3)), c
assert hvd.join() == 0
assert hvd.broadcast_object({"k": 1}, 0) == {"k": 1}
print("nccl-ops ok: backend", torch.distributed.get_backend(), "nccl", torch.cuda.nccl.version(), flush=True)
EOF
  NCCL_DEBUG=INFO timeout 120 "$BIN/elasticd" run -np 1 --min-np 1 -- "$PY" "$ops" > "$OUT/nccl-ops.log" 2>&1
  check nccl-ops $? nccl-ops.log 'nccl-ops ok'
  grep -hE 'nccl-ops ok|NCCL INFO (Init COMPLETE|comm 0x)' "$OUT/nccl-ops.log" | head -3
  rm -f "$ops"
fi

if want cpu-model; then
  timeout 150 "$BIN/elasticd" run -np 2 --min-np 1 -- "$PY" examples/pytorch/elastic_hvd.py --epochs 1 --no-cuda > "$OUT/cpu-model.log" 2>&1
  check cpu-model $? cpu-model.log 'done step'
fi

if want restart; then
  ck=$(mktemp -u --suffix .pt)
  timeout 150 "$BIN/elasticd" run -np 1 --min-np 1 -- "$PY" examples/pytorch/train_ddp.py --steps 40 \
    --checkpoint "$ck" --checkpoint-every 5 --die-at-step 21 --die-rank 0 > "$OUT/restart.log" 2>&1
  check restart $? restart.log 'resumed from step 20'
  rm -f "$ck"
fi

if want pytest; then
  wait "$pytest_pid"; check pytest $? pytest.log
fi
for tp in "${gotorch[@]}"; do
  wait "${tp#*:}"; check "go-torch ${tp%%:*}" $? "go-torch-${tp%%:*}.log"
done

echo "== summary"
printf '%s\n' "${summary[@]}"
