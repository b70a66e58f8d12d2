"""Small API flows that many tests share (through the REST API, with on-commit tasks run inline)."""

from __future__ import annotations


def deploy_ready(caller, capture, version_id: int, name: str = "web", **extra) -> dict:
    """POST a local deployment of `version_id` as `caller`, run its start task, and return it, asserting `ready`."""
    body = {"name": name, "team": caller.team.slug, "model_version": version_id, "runtime": "local", **extra}
    with capture(execute=True):
        response = caller.client.post("/api/v1/deployments/", body, format="json")
    assert response.status_code == 201, response.content
    deployment = caller.client.get(f"/api/v1/deployments/{response.json()['id']}/").json()
    assert deployment["status"] == "ready", deployment["error"]
    return deployment
