#!/usr/bin/env bash
# A CI pipeline's view of Conch, with curl only: register a model, upload a version, wait for
# its build, deploy it, send one KServe v2 inference, read the metrics, and stop the deployment.
#
#   CONCH_URL=… CONCH_TOKEN=… examples/ci_pipeline.sh MODEL.onnx NAME TEAM REQUEST.json
#
# REQUEST.json is a KServe v2 / Open Inference Protocol JSON request for the model.
# Exits non-zero (printing Conch's {"detail", "field"} error) as soon as a step fails.
set -euo pipefail
: "${CONCH_URL:?set CONCH_URL (printed by make demo)}" "${CONCH_TOKEN:?set CONCH_TOKEN}"
model_file=${1:?usage: ci_pipeline.sh MODEL.onnx NAME TEAM REQUEST.json}
name=${2:?name}
team=${3:?team}
request=${4:?request json}

auth=(-H "Authorization: Bearer $CONCH_TOKEN")
api() { curl --silent --show-error --fail-with-body "${auth[@]}" "$@"; }
field() { python3 -c "import json, sys; print(json.load(sys.stdin)$1)"; }
wait_for() { # URL STATUS... : poll until the object's status is one of STATUS (10 minutes at most)
  local url=$1; shift
  for _ in $(seq 600); do
    status=$(api "$url" | field "['status']")
    for want in "$@"; do [[ $status == "$want" ]] && { echo "$status"; return; }; done
    sleep 1
  done
  echo "timed out waiting for $url (last status $status)" >&2; return 1
}

model_id=$(api -H 'Content-Type: application/json' -d "{\"name\": \"$name\", \"team\": \"$team\"}" \
  "$CONCH_URL/api/v1/models/" | field "['id']")
echo "model $model_id"
version_id=$(api -F "file=@$model_file" -F max_batch_size=8 -F max_queue_delay_microseconds=1000 \
  "$CONCH_URL/api/v1/models/$model_id/versions/" | field "['id']")
echo "version $version_id uploaded"
status=$(wait_for "$CONCH_URL/api/v1/versions/$version_id/" built failed)
if [[ $status != built ]]; then api "$CONCH_URL/api/v1/versions/$version_id/" | field "['error']" >&2; exit 1; fi
echo "version $version_id built"

deployment_id=$(api -H 'Content-Type: application/json' \
  -d "{\"name\": \"$name\", \"team\": \"$team\", \"model_version\": $version_id, \"runtime\": \"local\", \"instance_count\": 1}" \
  "$CONCH_URL/api/v1/deployments/" | field "['id']")
status=$(wait_for "$CONCH_URL/api/v1/deployments/$deployment_id/" ready failed)
if [[ $status != ready ]]; then api "$CONCH_URL/api/v1/deployments/$deployment_id/" | field "['error']" >&2; exit 1; fi
echo "deployment $deployment_id ready"

api -H 'Content-Type: application/json' -d @"$request" "$CONCH_URL/api/v1/deployments/$deployment_id/infer" \
  | field "['outputs'][0]['shape']" | sed 's/^/inference output shape /'
api "$CONCH_URL/api/v1/deployments/$deployment_id/metrics?window=300" | field "['models']" | sed 's/^/metrics /'
api -X DELETE "$CONCH_URL/api/v1/deployments/$deployment_id/" >/dev/null
wait_for "$CONCH_URL/api/v1/deployments/$deployment_id/" stopped >/dev/null
echo "deployment $deployment_id stopped"
