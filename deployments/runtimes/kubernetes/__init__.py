"""The Kubernetes runtime: Triton pods built from pure manifests (`manifests`)."""
