"""Comparing a converted model's outputs with its source framework's (`builds.comparison`): pure checks."""

from __future__ import annotations

import numpy as np
import pytest

from builds.comparison import DEFAULT_TOLERANCES, compare_outputs, tolerance_for
from builds.model_config import parse_build_options, parse_tolerance
from conch.errors import InvalidInput


def test_outputs_within_the_datatype_tolerance_pass_with_their_figures():
    source = {"y": np.array([[1.0, 2.0, 3.0]], dtype=np.float64)}
    served = {"y": np.array([[1.00001, 2.0, 3.0]], dtype=np.float32)}
    [result] = compare_outputs(source, served, {"y": "FP32"})
    assert result.problem == ""
    assert result.max_abs == pytest.approx(1e-5, rel=0.1)
    assert result.tolerance == DEFAULT_TOLERANCES["FP32"]
    assert result.describe().startswith("output y (FP32): max abs diff 1e-05")
    assert result.describe().endswith("(tolerance atol 0.0001, rtol 0.0001): ok")


def test_an_output_beyond_the_tolerance_fails_naming_where_and_the_values():
    source = {"y": np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)}
    served = {"y": np.array([[1.0, 2.0], [3.0, 4.5]], dtype=np.float32)}
    [result] = compare_outputs(source, served, {"y": "FP32"})
    assert result.problem == (
        "1 of 4 values differ beyond the tolerance, the largest at index [1, 1]: 4.5 served, 4 at source"
    )
    assert result.to_dict()["ok"] is False and result.to_dict()["max_abs_diff"] == 0.5
    # and a tolerance the user accepted replaces the default
    [looser] = compare_outputs(source, served, {"y": "FP32"}, accepted=0.2)
    assert looser.problem == "" and looser.tolerance.atol == 0.2


def test_a_shape_from_the_framework_that_only_differs_by_unit_axes_is_compared_and_another_is_refused():
    [same] = compare_outputs({"v": np.arange(4.0)}, {"v": np.arange(4.0).reshape(4, 1)}, {"v": "FP32"})
    assert same.problem == ""
    [other] = compare_outputs({"v": np.arange(4.0)}, {"v": np.arange(6.0)}, {"v": "FP32"})
    assert other.problem == "shape [6] served, [4] at source"
    [missing] = compare_outputs({}, {"v": np.arange(6.0)}, {"v": "FP32"})
    assert missing.problem == "the source framework gives no output of this name"


def test_integer_outputs_are_exact_and_a_classifiers_label_is_its_top_class_agreement():
    probabilities = np.array([[0.9, 0.1], [0.2, 0.8], [0.50001, 0.49999]], dtype=np.float32)
    source = {"label": np.array([0, 1, 0]), "probabilities": probabilities}
    # a label that flips on a tie of the source probabilities (within the tolerance) is agreed with
    served = {"label": np.array([0, 1, 1]), "probabilities": probabilities}
    results = {r.name: r for r in compare_outputs(source, served, {"label": "INT64", "probabilities": "FP32"})}
    assert results["label"].problem == ""
    assert results["label"].agreement == pytest.approx(2 / 3)
    assert results["label"].describe() == (
        "output label (INT64): top class agrees on 66.7% of rows (exact, except rows whose source probabilities tie "
        "within atol 0.0001, rtol 0.0001): ok"
    )
    # but one that flips where the source is sure is a failure
    served = {"label": np.array([1, 1, 0]), "probabilities": probabilities}
    results = {r.name: r for r in compare_outputs(source, served, {"label": "INT64", "probabilities": "FP32"})}
    assert results["label"].problem.startswith("the top class differs on 1 of 3 rows whose source probabilities")
    # and an integer output of another model is compared exactly
    [counts] = compare_outputs({"n": np.array([1, 2])}, {"n": np.array([1, 3])}, {"n": "INT32"})
    assert counts.problem.startswith("1 of 2 values differ beyond the tolerance")
    assert tolerance_for("INT32", accepted=0.1).atol == 0


def test_nan_where_the_source_has_a_number_fails():
    [result] = compare_outputs({"y": np.array([1.0, 2.0])}, {"y": np.array([1.0, np.nan])}, {"y": "FP32"})
    assert "1 of 2 values differ" in result.problem


@pytest.mark.parametrize("raw", ["0", "-1", "0.9", "abc", "nan", True, [1]])
def test_the_tolerance_option_is_refused_outside_its_range_naming_the_field(raw):
    with pytest.raises(InvalidInput) as raised:
        parse_tolerance(raw)
    assert raised.value.field == "tolerance"
    assert "greater than 0 and at most 0.5" in raised.value.detail


def test_the_tolerance_option_parses_and_is_kept_with_the_options():
    assert parse_tolerance(" 1e-3 ") == 0.001 and parse_tolerance("") is None and parse_tolerance(None) is None
    options = parse_build_options({"tolerance": "0.01"})
    assert options.tolerance == 0.01 and options.to_dict()["tolerance"] == 0.01
    assert "tolerance" not in parse_build_options({}).to_dict()
