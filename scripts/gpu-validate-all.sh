#!/usr/bin/env bash
# Runs every GPU validation of memprobe in one go, on a machine with an
# NVIDIA GPU and PyTorch, from artifacts built beforehand (no Rust needed):
#
#   make gpu-validation-bundle            # on the build machine: build/gpu-bundle
#   scripts/gpu-validate-all.sh OUTDIR    # on the GPU machine, in the source tree
#
# Each part runs under its own time limit, and a part that fails or runs out
# of time never stops the others; the whole run keeps to --budget seconds
# (default 540: 9 minutes of a 10-minute device lease). It exits 0 only when every part named in --parts
# passed: a part skipped (the budget spent) or timed out fails the run. OUTDIR receives gpu-validation.json (every
# part's status, time and report), gpu-validation.md (the summary table) and
# gpu-validation.log (every part's output).
#
# Options (before OUTDIR):
#   --bundle DIR   the artifacts (default build/gpu-bundle): bin/memprobe,
#                  bin/nvml_latency, lib/libmemprobe.so, lib/libmemprobe_interpose.so
#   --budget S     seconds for the whole run (default 540)
#   --parts LIST   comma-separated subset, in this order by default:
#                  env,torch,interpose,run,oom,nvml,cpp,origins,attribution
#                  (expected on an H100: env 5 s, torch 60, interpose 90,
#                  run 30, oom 45, nvml 25, cpp 70 with its build, origins 40,
#                  attribution 60: about 7 minutes)
#   --part-limit S at most S seconds for any one part (default: each part's own)
#   --dry-run      no GPU: run every part's checks against the fake driver,
#                  NVML, nvidia-smi and torch.cuda of the test suite (what
#                  `make test` does so that this script cannot rot); see
#                  scripts/gpu-validate-dry-run.py
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUNDLE=$ROOT/build/gpu-bundle
BUDGET=540
PARTS=env,torch,interpose,run,oom,nvml,cpp,origins,attribution
DRY=0
PART_LIMIT=0
while [ $# -gt 0 ]; do
    case $1 in
        --bundle) BUNDLE=$(cd "$2" && pwd) || exit 2; shift 2 ;;
        --budget) BUDGET=$2; shift 2 ;;
        --parts) PARTS=$2; shift 2 ;;
        --part-limit) PART_LIMIT=$2; shift 2 ;;
        --dry-run) DRY=1; shift ;;
        -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
        -*) echo "gpu-validate-all: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) break ;;
    esac
done
[ $# -eq 1 ] || { echo "usage: gpu-validate-all.sh [--bundle DIR] [--budget S] [--parts LIST] [--part-limit S] [--dry-run] OUTDIR" >&2; exit 2; }
case $BUDGET in ''|*[!0-9]*) echo "gpu-validate-all: --budget takes whole seconds, not '$BUDGET'" >&2; exit 2 ;; esac
case $PART_LIMIT in ''|*[!0-9]*) echo "gpu-validate-all: --part-limit takes whole seconds, not '$PART_LIMIT'" >&2; exit 2 ;; esac
OUTDIR=$1
mkdir -p "$OUTDIR/parts" || exit 2
OUTDIR=$(cd "$OUTDIR" && pwd)
PY=${PYTHON:-python3}

for f in bin/memprobe bin/nvml_latency lib/libmemprobe.so lib/libmemprobe_interpose.so; do
    [ -e "$BUNDLE/$f" ] || { echo "gpu-validate-all: $BUNDLE/$f is missing: run 'make gpu-validation-bundle' first" >&2; exit 2; }
done

# The Python binding from the source tree, over the bundle's library.
export PYTHONPATH="$ROOT/bindings/python${PYTHONPATH:+:$PYTHONPATH}"
export MEMPROBE_LIBRARY="$BUNDLE/lib/libmemprobe.so"
export MEMPROBE_INTERPOSE_LIBRARY="$BUNDLE/lib/libmemprobe_interpose.so"
export PYTHONUNBUFFERED=1

start=$(date +%s)
deadline=$((start + BUDGET))
: > "$OUTDIR/gpu-validation.log"

# run_part NAME CAP_SECONDS COMMAND...: the command's output goes to
# parts/NAME.log, its status to parts/NAME.status (rc seconds limit).
run_part() {
    local name=$1 cap=$2; shift 2
    case ",$PARTS," in *",$name,"*) ;; *) return 0 ;; esac
    local now left limit t0 rc
    now=$(date +%s); left=$((deadline - now))
    if [ "$left" -lt 10 ]; then
        echo "skipped: the run's budget of ${BUDGET}s was spent" > "$OUTDIR/parts/$name.log"
        echo "skipped 0 0" > "$OUTDIR/parts/$name.status"
        echo "== $name: skipped (budget spent)"
        return 0
    fi
    [ "$PART_LIMIT" -gt 0 ] && [ "$PART_LIMIT" -lt "$cap" ] && cap=$PART_LIMIT
    limit=$(( cap < left ? cap : left ))
    echo "== $name (limit ${limit}s)"
    t0=$(date +%s)
    timeout -k 5 "$limit" "$@" > "$OUTDIR/parts/$name.log" 2>&1
    rc=$?
    echo "$rc $(( $(date +%s) - t0 )) $limit" > "$OUTDIR/parts/$name.status"
    tail -n 4 "$OUTDIR/parts/$name.log" | sed 's/^/   /'
    { echo "===== $name: rc $rc, $(( $(date +%s) - t0 ))s of ${limit}s"; cat "$OUTDIR/parts/$name.log"; } >> "$OUTDIR/gpu-validation.log"
}

P=$OUTDIR/parts
S=$ROOT/scripts
if [ "$DRY" = 1 ]; then
    # No GPU: each part's script runs over the test suite's fakes.
    for part in env torch interpose run oom nvml cpp origins attribution; do
        run_part "$part" 120 "$PY" "$S/gpu-validate-dry-run.py" "$part" --bundle "$BUNDLE" --out "$P/$part.json"
    done
else
    run_part env 30 "$PY" "$S/gpu-validate-env.py" --out "$P/env.json"
    run_part torch 100 "$PY" "$S/gpu-validate-torch.py" --no-cpp --out "$P/torch.json"
    run_part interpose 130 "$PY" "$S/gpu-validate-interpose.py" "$BUNDLE/lib/libmemprobe_interpose.so" --out "$P/interpose.json"
    run_part run 60 "$PY" "$S/gpu-validate-run.py" "$BUNDLE/bin/memprobe" --out "$P/run.json"
    run_part oom 80 "$PY" "$S/gpu-validate-oom.py" "$BUNDLE/lib/libmemprobe_interpose.so" --out "$P/oom.json"
    run_part nvml 45 "$PY" "$S/gpu-validate.py" "$BUNDLE/bin/memprobe" "$BUNDLE/bin/nvml_latency" --out "$P/nvml.json"
    run_part cpp 120 "$PY" "$S/gpu-validate-torch.py" --cpp-only --cpp-tries 20 --memprobe-prefix "$BUNDLE" --out "$P/cpp.json"
    run_part origins 90 "$PY" "$S/gpu-validate-origins.py" "$BUNDLE/bin/memprobe" --out "$P/origins.json"
    run_part attribution 100 "$PY" "$S/gpu-validate-attribution.py" --out "$P/attribution.json"
fi

dry_flag=()
[ "$DRY" = 1 ] && dry_flag=(--dry-run)
"$PY" "$S/gpu-validate-summary.py" "$OUTDIR" --parts "$PARTS" --budget "$BUDGET" \
    --elapsed $(( $(date +%s) - start )) "${dry_flag[@]}"
