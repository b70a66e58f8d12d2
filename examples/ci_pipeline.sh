#!/usr/bin/env bash
# A CI pipeline's view of Conch, one `conch` command per step: get or register a model, upload a version,
# wait for its build, deploy it, send one inference, read the metrics, and stop the deployment.
#
#   CONCH_URL=… CONCH_TOKEN=… examples/ci_pipeline.sh MODEL.onnx NAME TEAM INPUT=FILE.npy…
#
# Each INPUT=FILE.npy names one input tensor of the model and a .npy file holding it (numpy.save). Run it again
# with the same NAME and another file and it uploads the next version of the same model; with the same file it goes
# on with the version that file already is (`conch upload` says so, `"duplicate": true`). The deployment is named NAME too: the
# script stops at once when TEAM already runs a deployment of that name, and a run that fails after deploying
# stops its deployment, so the next run is not blocked by it.
# A failing step prints Conch's error message (its detail and field) and the script exits with the CLI's exit
# code: 1 usage or input refused, 2 authentication, 3 not found, 4 conflict or quota, 5 build or deployment
# failed, 6 Conch unavailable or timed out (`conch --help`).
set -euo pipefail
usage="usage: ci_pipeline.sh MODEL.onnx NAME TEAM INPUT=FILE.npy…"
# Missing arguments or settings: one clean line on stderr and exit 1 (usage), as the CLI does.
(( $# >= 4 )) || { echo "$usage" >&2; exit 1; }
[[ -n ${CONCH_URL:-} ]] || { echo "error: set CONCH_URL (printed by make demo)" >&2; exit 1; }
[[ -n ${CONCH_TOKEN:-} ]] || { echo "error: set CONCH_TOKEN" >&2; exit 1; }
model_file=$1
name=$2
team=$3
shift 3
[[ -r $model_file ]] || { echo "error: cannot read the model file $model_file" >&2; exit 1; }
inputs=()
for input in "$@"; do inputs+=(--input "$input"); done

# The CLI from PATH, else the one `make venv` installs in this repository's .venv.
if ! command -v conch >/dev/null; then
  repo_bin="$(cd "$(dirname "$0")/.." && pwd)/.venv/bin"
  [[ -x $repo_bin/conch ]] || { echo "error: no conch command: pip install ./cli (or make venv)" >&2; exit 1; }
  PATH="$repo_bin:$PATH"
fi

# field KEY… : read JSON on stdin, print the value at that path (list items by number).
field() {
  python3 -c '
import json, sys
value = json.load(sys.stdin)
for key in sys.argv[1:]:
    value = value[int(key)] if isinstance(value, list) else value[key]
print(json.dumps(value) if isinstance(value, (dict, list)) else value)' "$@"
}

# Before uploading anything: the deployment this run will create must not exist yet (exit 3: it does not).
errors=$(mktemp)
trap 'rm -f "$errors"' EXIT
code=0
running=$(conch status "$name" --team "$team" --json 2>"$errors") || code=$?
case $code in
  0) echo "error: team '$team' already has an active deployment named '$name' (id $(field id <<<"$running"));" \
       "stop it with \`conch stop $name --team $team\` or choose another NAME" >&2
     exit 4 ;;
  3) ;;
  *) cat "$errors" >&2; exit "$code" ;;
esac

# The model is registered by the upload when the team has none of that name, once the file passed conch's local
# check: a file conch refuses (exit 1) leaves no empty model behind.
uploaded=$(conch upload "$name" "$model_file" --team "$team" --create-model --build-option max_batch_size=8 \
  --build-option max_queue_delay_microseconds=1000 --json)
model_id=$(field version model <<<"$uploaded")
if [[ $(field model_created <<<"$uploaded") == True ]]; then echo "model $model_id (created)"; else echo "model $model_id (existing)"; fi
version_id=$(field version id <<<"$uploaded")
version_number=$(field version number <<<"$uploaded")
if [[ $(field duplicate <<<"$uploaded") == True ]]; then
  echo "$model_file already is $name:$version_number (version id $version_id)"
else
  echo "uploaded $name:$version_number (version id $version_id)"
fi
conch builds wait "$version_id" --json >/dev/null
echo "$name:$version_number built (version id $version_id)"

# From here on a failing step stops the deployment it made, so a re-run is not blocked by its name.
stop_on_failure() {
  local code=$?
  rm -f "$errors"
  if (( code != 0 )); then
    echo "stopping deployment $name after the failure" >&2
    conch stop "$name" --team "$team" --wait --json >/dev/null 2>&1 || true
  fi
  exit "$code"
}
trap stop_on_failure EXIT
deployed=$(conch deploy "$model_id:$version_number" --name "$name" --team "$team" --wait --json)
deployment_id=$(field id <<<"$deployed")
echo "deployment $deployment_id ready"

answer=$(conch infer "$deployment_id" "${inputs[@]}" --json)
echo "inference output shape $(field outputs 0 shape <<<"$answer")"
# Metrics come from Conch's periodic scrape of Triton (every few seconds): wait until it has seen the request.
for _ in $(seq 30); do
  metrics=$(conch metrics "$deployment_id" --window 300 --json | field models)
  requests=$(python3 -c 'import json, sys; print(int(sum(m["request_count"] for m in json.loads(sys.argv[1]))))' "$metrics")
  (( requests > 0 )) && break
  sleep 1
done
echo "metrics $metrics"
trap 'rm -f "$errors"' EXIT
conch stop "$deployment_id" --wait --json >/dev/null
echo "deployment $deployment_id stopped"
