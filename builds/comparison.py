"""Proof that a converted model computes what its source computes: every output compared, with stated tolerances.

Pure numpy. An output passes when every element satisfies |served - source| <= atol + rtol * |source| (the rule of
`numpy.isclose`), with `atol` and `rtol` set by the output's Triton datatype (`DEFAULT_TOLERANCES`) unless the user
accepted another tolerance on rebuild. Integer, boolean and string outputs must be equal, except a classifier's
top-class output (an integer `label` beside a floating `probabilities` output), which is reported as the share of
rows whose top class agrees, and may disagree only on rows whose source probabilities tie within the tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

__all__ = ["DEFAULT_TOLERANCES", "OutputComparison", "Tolerance", "compare_outputs", "tolerance_for"]


@dataclass(frozen=True)
class Tolerance:
    """Absolute (`atol`) and relative (`rtol`) tolerance of one output, in the output's own units."""

    atol: float
    rtol: float

    def describe(self) -> str:
        return f"atol {self.atol:g}, rtol {self.rtol:g}"


#: Per Triton datatype: what float arithmetic in another framework and another kernel may change. FP16 keeps about
#: 3 significant digits, FP32 about 7 (converters reorder sums: 1e-4 leaves room for that), FP64 about 15.
DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "FP16": Tolerance(atol=1e-2, rtol=1e-2),
    "BF16": Tolerance(atol=2e-2, rtol=2e-2),
    "FP32": Tolerance(atol=1e-4, rtol=1e-4),
    "FP64": Tolerance(atol=1e-7, rtol=1e-7),
}
_EXACT = Tolerance(atol=0.0, rtol=0.0)


def tolerance_for(datatype: str, accepted: float | None = None) -> Tolerance:
    """The tolerance of an output of Triton `datatype`; `accepted` (the user's, on rebuild) replaces both atol and
    rtol of a floating output. Non-floating outputs are compared exactly."""
    if datatype not in DEFAULT_TOLERANCES:
        return _EXACT
    if accepted is not None:
        return Tolerance(atol=accepted, rtol=accepted)
    return DEFAULT_TOLERANCES[datatype]


@dataclass(frozen=True)
class OutputComparison:
    """One output's comparison.

    `max_abs` / `max_rel`: the largest absolute and relative difference (relative to |source|, 0 where both are 0;
    infinite, and None in `to_dict`, for an output that could not be compared);
    `agreement`: for a classifier's top-class output, the share of rows (0..1) whose class agrees, else None;
    `problem`: "" when the output passes, else why it does not (shape, datatype, or the figures past the tolerance).
    """

    name: str
    datatype: str
    tolerance: Tolerance
    max_abs: float
    max_rel: float
    agreement: float | None
    problem: str

    def describe(self) -> str:
        """One build-log line: the figures, the tolerance and the verdict."""
        figures = f"max abs diff {self.max_abs:.3g}, max rel diff {self.max_rel:.3g}"
        rule = f"tolerance {self.tolerance.describe()}"
        if self.agreement is not None:
            # the class must be equal; the tolerance only says which rows' source probabilities tie
            figures = f"top class agrees on {self.agreement:.1%} of rows"
            rule = f"exact, except rows whose source probabilities tie within {self.tolerance.describe()}"
        verdict = f"FAILS: {self.problem}" if self.problem else "ok"
        return f"output {self.name} ({self.datatype}): {figures} ({rule}): {verdict}"

    def to_dict(self) -> dict[str, object]:
        return {
            "output": self.name,
            "datatype": self.datatype,
            "atol": self.tolerance.atol,
            "rtol": self.tolerance.rtol,
            # JSON has no Infinity: an output that could not be compared at all (no such output, another shape)
            # has no difference to give.
            "max_abs_diff": self.max_abs if math.isfinite(self.max_abs) else None,
            "max_rel_diff": self.max_rel if math.isfinite(self.max_rel) else None,
            "top_class_agreement": self.agreement,
            "ok": not self.problem,
            "problem": self.problem,
        }


def compare_outputs(
    source: Mapping[str, np.ndarray],
    served: Mapping[str, np.ndarray],
    datatypes: Mapping[str, str],
    *,
    accepted: float | None = None,
) -> list[OutputComparison]:
    """Compare the source framework's outputs with the served model's, output by output.

    `source` and `served`: output name -> array for the same inputs; `datatypes`: output name -> Triton datatype
    (the served model's). Every output the served model gives is compared; one the source did not give, or of
    another shape, is a problem. `accepted`: the user's tolerance for floating outputs (`tolerance_for`).
    """
    results = []
    probabilities = _probabilities(served, datatypes)
    for name in sorted(served):
        datatype = datatypes.get(name, "")
        tolerance = tolerance_for(datatype, accepted)
        got = np.asarray(served[name])
        if name not in source:
            results.append(_problem(name, datatype, tolerance, "the source framework gives no output of this name"))
            continue
        expected = np.asarray(source[name])
        if expected.size == got.size and expected.shape != got.shape:
            expected = expected.reshape(got.shape)  # e.g. [N] from the framework, [N, 1] from the converted model
        if expected.shape != got.shape:
            results.append(
                _problem(name, datatype, tolerance, f"shape {list(got.shape)} served, {list(expected.shape)} at source")
            )
            continue
        if datatype == "BYTES" or got.dtype.kind in "OSU":
            equal = bool(np.array_equal(_texts(expected), _texts(got)))
            results.append(
                OutputComparison(
                    name,
                    datatype,
                    tolerance,
                    0.0 if equal else float("inf"),
                    0.0,
                    None,
                    "" if equal else "the served strings differ from the source's",
                )
            )
            continue
        source_values = expected.astype(np.float64)
        served_values = got.astype(np.float64)
        difference = np.abs(served_values - source_values)
        scale = np.abs(source_values)
        with np.errstate(divide="ignore", invalid="ignore"):
            relative = np.where(difference == 0, 0.0, difference / scale)
        max_abs = float(difference.max()) if difference.size else 0.0
        max_rel = float(relative.max()) if relative.size else 0.0
        rows = probabilities[1].shape[0] if probabilities is not None else -1
        if got.dtype.kind in "iub" and got.size == rows and got.ndim <= 2:
            # a classifier's top class: [N] or [N, 1] (Triton's dims for one value per row)
            top = _top_class(
                name, datatype, expected.reshape(-1), got.reshape(-1), source.get(probabilities[0]), accepted
            )
            results.append(top)
            continue
        bad = difference > tolerance.atol + tolerance.rtol * scale
        bad |= np.isnan(served_values) != np.isnan(source_values)
        problem = ""
        if bad.any():
            where = np.unravel_index(int(np.argmax(np.where(bad, difference, -1.0))), bad.shape)
            problem = (
                f"{int(bad.sum())} of {bad.size} values differ beyond the tolerance, the largest at index "
                f"{list(map(int, where))}: {served_values[where]:.9g} served, {source_values[where]:.9g} at source"
            )
        results.append(OutputComparison(name, datatype, tolerance, max_abs, max_rel, None, problem))
    return results


def _probabilities(served: Mapping[str, np.ndarray], datatypes: Mapping[str, str]) -> tuple[str, np.ndarray] | None:
    """The classifier's probabilities output (a floating [N, classes] output named `probabilities`), if any."""
    for name, array in served.items():
        if name.lower() in ("probabilities", "probability", "probs") and datatypes.get(name) in DEFAULT_TOLERANCES:
            array = np.asarray(array)
            if array.ndim == 2:
                return name, array
    return None


def _top_class(
    name: str,
    datatype: str,
    expected: np.ndarray,
    got: np.ndarray,
    source_probabilities: np.ndarray | None,
    accepted: float | None,
) -> OutputComparison:
    tolerance = tolerance_for("FP32", accepted)
    differs = expected != got
    max_abs = float(np.abs(expected.astype(np.float64) - got.astype(np.float64)).max()) if got.size else 0.0
    agreement = 1.0 - float(differs.mean()) if differs.size else 1.0
    if differs.any() and source_probabilities is not None and np.asarray(source_probabilities).ndim == 2:
        ranked = np.sort(np.asarray(source_probabilities, dtype=np.float64), axis=1)
        margin = ranked[:, -1] - (ranked[:, -2] if ranked.shape[1] > 1 else 0.0)
        tied = margin <= tolerance.atol + tolerance.rtol * ranked[:, -1]
        differs &= ~tied
    problem = ""
    if differs.any():
        row = int(np.argmax(differs))
        problem = (
            f"the top class differs on {int(differs.sum())} of {differs.size} rows whose source probabilities do not "
            f"tie, first at row {row}: {int(got[row])} served, {int(expected[row])} at source"
        )
    return OutputComparison(name, datatype, tolerance, max_abs, 0.0, agreement, problem)


def _texts(array: np.ndarray) -> np.ndarray:
    """Strings and bytes alike as text (Triton gives BYTES as bytes, a framework its classes as str)."""
    return np.vectorize(lambda v: v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v), otypes=[object])(
        array
    )


def _problem(name: str, datatype: str, tolerance: Tolerance, problem: str) -> OutputComparison:
    return OutputComparison(name, datatype, tolerance, float("inf"), float("inf"), None, problem)
