"""The model-name rule of the registry: a name is a Triton repository folder and part of Kubernetes names."""

from __future__ import annotations

import re
import unicodedata

from conch.errors import InvalidInput

__all__ = ["MODEL_NAME_MAX_LENGTH", "suggest_model_name", "validate_model_name"]

_NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
#: A DNS label's limit (RFC 1123), which Kubernetes object names and label values share.
MODEL_NAME_MAX_LENGTH = 63
_NAME_MAX_LENGTH = MODEL_NAME_MAX_LENGTH


def validate_model_name(name: str, *, what: str = "model") -> None:
    """Check a model name (or, with `what="deployment"`, a deployment's) against the rule Triton repositories and
    Kubernetes objects share.

    Rule: a lowercase RFC 1123 DNS label, `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters. The name is a
    folder in the model repository (Triton "Model Repository" -> "Repository Layout"), part of inference URLs
    (`/v2/models/<name>`), and of Kubernetes object names and labels.

    Raises:
        InvalidInput: field "name", stating the rule and, when possible, a valid suggestion.
    """
    rule = (
        f"a {what} name must be 1 to 63 characters of lowercase letters a-z, digits and hyphens, and start and end "
        "with a letter or digit (a DNS label, shared by Triton repository folders and Kubernetes names)"
    )
    if not isinstance(name, str) or not name:
        raise InvalidInput(f"A name is required: {rule}.", field="name")
    if len(name) <= _NAME_MAX_LENGTH and _NAME_RE.fullmatch(name):
        return
    problem = f"it is {len(name)} characters long" if len(name) > _NAME_MAX_LENGTH else "it does not fit"
    suggestion = suggest_model_name(name)
    hint = f" For example: {suggestion!r}." if suggestion else ""
    raise InvalidInput(f"{name!r} is not a valid {what} name ({problem}): {rule}.{hint}", field="name")


def suggest_model_name(name: str) -> str:
    """The valid model name closest to `name` (`validate_model_name`'s rule): accents dropped, lower case, every run
    of other characters one hyphen, cut to 63 characters ("Text_Detection v2" -> "text-detection-v2"); `name`
    itself when valid; "" when nothing of it is left."""
    if len(name) <= _NAME_MAX_LENGTH and _NAME_RE.fullmatch(name):
        return name
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode("ascii")
    suggestion = re.sub(r"[^a-z0-9]+", "-", ascii_name.lower()).strip("-")[:_NAME_MAX_LENGTH].strip("-")
    return suggestion if suggestion and _NAME_RE.fullmatch(suggestion) else ""
