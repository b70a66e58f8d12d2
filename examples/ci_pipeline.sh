#!/usr/bin/env bash
# A CI pipeline's view of Conch, with curl only: get or register a model, upload a version, wait for
# its build, deploy it, send one KServe v2 inference, read the metrics, and stop the deployment.
#
#   CONCH_URL=… CONCH_TOKEN=… examples/ci_pipeline.sh MODEL.onnx NAME TEAM REQUEST.json
#
# REQUEST.json is a KServe v2 / Open Inference Protocol JSON request for the model. Run it again
# with the same NAME and it uploads the next version of the same model. The deployment is named
# NAME too: the script stops at once when TEAM already runs a deployment of that name, and a run that
# fails after deploying stops its deployment, so the next run is not blocked by it.
# Exits non-zero as soon as a step fails, printing Conch's error message (its {"detail", "field"}).
set -euo pipefail
: "${CONCH_URL:?set CONCH_URL (printed by make demo)}" "${CONCH_TOKEN:?set CONCH_TOKEN}"
model_file=${1:?usage: ci_pipeline.sh MODEL.onnx NAME TEAM REQUEST.json}
name=${2:?name}
team=${3:?team}
request=${4:?request json}
[[ -r $model_file ]] || { echo "error: cannot read the model file $model_file" >&2; exit 1; }
[[ -r $request ]] || { echo "error: cannot read the request file $request" >&2; exit 1; }
CONCH_URL=${CONCH_URL%/}

# api METHOD PATH|URL [curl options…]: print the response body; on an HTTP error print the API's
# message to stderr and exit 1 (inside $(…) that fails the assignment, and `set -e` stops the script).
api() {
  local method=$1 target=$2 body status
  shift 2
  [[ $target == http* ]] || target=$CONCH_URL$target
  body=$(mktemp)
  if ! status=$(curl --silent --show-error --output "$body" --write-out '%{http_code}' \
      -X "$method" -H "Authorization: Bearer $CONCH_TOKEN" "$@" "$target"); then
    rm -f "$body"
    echo "error: $method $target: Conch did not answer (is it running at $CONCH_URL?)" >&2
    exit 1
  fi
  if (( status >= 400 )); then
    python3 - "$body" "$method $target" "$status" >&2 <<'EOF'
import json, sys
path, call, status = sys.argv[1:]
text = open(path, encoding="utf-8", errors="replace").read()
try:
    error = json.loads(text)
    detail, field = error.get("detail", text), error.get("field")
except (ValueError, AttributeError):
    detail, field = text.strip()[:500], None
print(f"error: {detail}" + (f" (field: {field})" if field else "") + f" [HTTP {status} from {call}]")
EOF
    rm -f "$body"
    exit 1
  fi
  cat "$body"
  rm -f "$body"
}
# field KEY… : read JSON on stdin, print the value at that path (list items by number).
field() {
  python3 -c '
import json, sys
value = json.load(sys.stdin)
for key in sys.argv[1:]:
    value = value[int(key)] if isinstance(value, list) else value[key]
print(json.dumps(value) if isinstance(value, (dict, list)) else value)' "$@"
}
# json_at PATH KEY… : GET PATH and print the value at KEY… (an API error stops the script).
json_at() {
  local body
  body=$(api GET "$1") || exit 1
  shift
  field "$@" <<<"$body"
}
# wait_for PATH STATUS… : poll until the object's status is one of STATUS (10 minutes at most).
wait_for() {
  local path=$1 status=""
  shift
  for _ in $(seq 600); do
    status=$(json_at "$path" status) || exit 1
    for want in "$@"; do [[ $status == "$want" ]] && { echo "$status"; return; }; done
    sleep 1
  done
  echo "error: timed out waiting for $path (last status $status)" >&2
  exit 1
}
# find_model: print the id of model $name in team $team, or nothing (follows the list's pages).
find_model() {
  local page=/api/v1/models/ listing found
  while [[ -n $page ]]; do
    listing=$(api GET "$page") || exit 1
    found=$(python3 -c '
import json, sys
listing = json.load(sys.stdin)
ids = [m["id"] for m in listing["results"] if m["name"] == sys.argv[1] and m["team"] == sys.argv[2]]
print("id %s" % ids[0] if ids else "next " + (listing["next"] or ""))' "$name" "$team" <<<"$listing")
    if [[ $found == id\ * ]]; then echo "${found#id }"; return; fi
    page=${found#next}
    page=${page# }
  done
}

# active_deployment: print the id of a deployment named $name in $team that is not stopped, or nothing.
active_deployment() {
  local page=/api/v1/deployments/ listing found
  while [[ -n $page ]]; do
    listing=$(api GET "$page") || exit 1
    found=$(python3 -c '
import json, sys
listing = json.load(sys.stdin)
ids = [d["id"] for d in listing["results"]
       if d["name"] == sys.argv[1] and d["team"] == sys.argv[2] and d["status"] != "stopped"]
print("id %s" % ids[0] if ids else "next " + (listing["next"] or ""))' "$name" "$team" <<<"$listing")
    if [[ $found == id\ * ]]; then echo "${found#id }"; return; fi
    page=${found#next}
    page=${page# }
  done
}

# Before uploading anything: the deployment this run will create must not exist yet.
running=$(active_deployment) || exit 1
if [[ -n $running ]]; then
  echo "error: team '$team' already has an active deployment named '$name' (id $running); stop it with" \
    "DELETE $CONCH_URL/api/v1/deployments/$running/ or choose another NAME" >&2
  exit 1
fi

model_id=$(find_model) || exit 1
if [[ -n $model_id ]]; then
  echo "model $model_id (existing)"
else
  created=$(api POST /api/v1/models/ -H 'Content-Type: application/json' \
    -d "{\"name\": \"$name\", \"team\": \"$team\"}")
  model_id=$(field id <<<"$created")
  echo "model $model_id (created)"
fi

uploaded=$(api POST "/api/v1/models/$model_id/versions/" \
  -F "file=@$model_file" -F max_batch_size=8 -F max_queue_delay_microseconds=1000)
version_id=$(field id <<<"$uploaded")
echo "version $version_id (number $(field number <<<"$uploaded")) uploaded"
status=$(wait_for "/api/v1/versions/$version_id/" built failed)
if [[ $status != built ]]; then
  echo "error: the build failed: $(json_at "/api/v1/versions/$version_id/" error)" >&2
  exit 1
fi
echo "version $version_id built"

deployed=$(api POST /api/v1/deployments/ -H 'Content-Type: application/json' \
  -d "{\"name\": \"$name\", \"team\": \"$team\", \"model_version\": $version_id, \"runtime\": \"local\", \"instance_count\": 1}")
deployment_id=$(field id <<<"$deployed")
# From here on a failing step stops the deployment it made, so a re-run is not blocked by its name.
stop_on_failure() {
  local code=$?
  if (( code != 0 )); then
    echo "stopping deployment $deployment_id after the failure" >&2
    api DELETE "/api/v1/deployments/$deployment_id/" >/dev/null && wait_for "/api/v1/deployments/$deployment_id/" stopped >/dev/null
  fi
}
trap stop_on_failure EXIT
status=$(wait_for "/api/v1/deployments/$deployment_id/" ready failed)
if [[ $status != ready ]]; then
  echo "error: the deployment failed: $(json_at "/api/v1/deployments/$deployment_id/" error)" >&2
  exit 1
fi
echo "deployment $deployment_id ready"

answer=$(api POST "/api/v1/deployments/$deployment_id/infer" -H 'Content-Type: application/json' -d @"$request")
shape=$(field outputs 0 shape <<<"$answer")
echo "inference output shape $shape"
# Metrics come from Conch's periodic scrape of Triton (every few seconds): wait until it has seen the request.
for _ in $(seq 30); do
  metrics=$(json_at "/api/v1/deployments/$deployment_id/metrics?window=300" models)
  requests=$(python3 -c 'import json, sys; print(int(sum(m["request_count"] for m in json.loads(sys.argv[1]))))' "$metrics")
  (( requests > 0 )) && break
  sleep 1
done
echo "metrics $metrics"
trap - EXIT
api DELETE "/api/v1/deployments/$deployment_id/" >/dev/null
wait_for "/api/v1/deployments/$deployment_id/" stopped >/dev/null
echo "deployment $deployment_id stopped"
