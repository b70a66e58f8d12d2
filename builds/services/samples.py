"""Sample requests of a built version, for whoever must run it once (a deployment warming a version up)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from builds.inspection import ModelSignature
from builds.services import state
from builds.verification import make_sample_inputs
from builds.verify_step import load_samples
from models_registry.storage import get_object_store
from tritonserving.config import ModelConfig

if TYPE_CHECKING:
    from models_registry.models import ModelVersion


def make_version_sample(*, version: ModelVersion, config: ModelConfig) -> dict[str, np.ndarray]:
    """One valid request's inputs (input name -> array, as a client sends them) for `config`, a configuration of
    `version` (e.g. a deployment's, with its overrides): built as the verify step built its first sample, from the
    samples the user uploaded with the version, else generated (`builds.verification.make_sample_inputs`).

    Raises InvalidInput when the stored samples do not fit `config`, Unavailable (object store).
    """
    signature = ModelSignature.from_dict(version.signature) if version.signature else None
    samples = load_samples(get_object_store(), state.current_options(version))
    return make_sample_inputs(config, signature=signature, samples=samples)
