"""Test inference from the console: the form made from the signature, image preprocessing on the server, and the
answer made readable (top-k with softmax), through the same `infer` service on a real local Triton."""

from __future__ import annotations

import io
import json

import numpy as np
import onnxruntime
import pytest
from PIL import Image

from conch.errors import InvalidInput
from deployments.models import Deployment
from deployments.services.trial import (
    Preprocessing,
    are_probabilities,
    inference_form,
    parse_preprocessing,
    preprocess_image,
    run_trial_inference,
    top_classes,
)
from tests import real_models
from tests.flows import deploy_ready

pytestmark = pytest.mark.django_db


def _png(width: int, height: int, seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def test_the_form_offers_an_image_for_the_classifier_s_nchw_input(alice, built_classifier):
    # given
    deployment = Deployment(team=alice.team, name="web", model_version=built_classifier)
    # when
    form = inference_form(deployment)
    # then
    [field] = form["inputs"]
    assert (field.name, field.datatype, field.image_layout) == ("x", "FP32", "NCHW")
    assert (field.height, field.width) == (224, 224)
    assert field.shape == (1, 3, 224, 224)
    assert field.dims_text == "[?, 3, 224, 224]"  # as the page shows it: the batch axis sized per request
    assert field.example == []  # too large to write out as zeros
    assert form["image_input"] == "x"
    assert form["outputs"] == [{"name": "fetch_name_0", "datatype": "FP32", "dims": [-1, 4]}]


def test_preprocessing_resizes_scales_normalizes_and_lays_out(alice):
    # given a 2x1 image: one red pixel, one white
    buffer = io.BytesIO()
    Image.fromarray(np.array([[[255, 0, 0], [255, 255, 255]]], dtype=np.uint8)).save(buffer, format="PNG")
    steps = Preprocessing(layout="NCHW", height=1, width=2, scale=1 / 255, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    # when
    nchw = preprocess_image(buffer.getvalue(), steps)
    nhwc = preprocess_image(buffer.getvalue(), Preprocessing(layout="NHWC", height=1, width=2))
    # then
    assert nchw.shape == (1, 3, 1, 2) and nchw.dtype == np.float32
    np.testing.assert_allclose(nchw[0, :, 0, 0], [1.0, -1.0, -1.0])
    np.testing.assert_allclose(nchw[0, :, 0, 1], [1.0, 1.0, 1.0])
    assert nhwc.shape == (1, 1, 2, 3)
    np.testing.assert_allclose(nhwc[0, 0, 0], [1.0, 0.0, 0.0])


def test_preprocessing_fields_at_fault_are_named(alice, built_classifier):
    field = inference_form(Deployment(team=alice.team, name="web", model_version=built_classifier))["inputs"][0]
    cases = {
        "layout": {"layout": "CHW"},
        "height": {"height": "100"},
        "scale": {"scale": "1/0"},
        "mean": {"mean": "0.1, 0.2"},
        "std": {"std": "0"},
    }
    for name, fields in cases.items():
        with pytest.raises(InvalidInput) as refused:
            parse_preprocessing(fields, default=field)
        assert refused.value.field == name, name
    parsed = parse_preprocessing({"scale": "1/255", "mean": "0.485, 0.456 0.406", "std": "0.2"}, default=field)
    assert parsed.mean == (0.485, 0.456, 0.406) and parsed.std == (0.2, 0.2, 0.2)
    assert parsed.scale == pytest.approx(1 / 255)


def test_a_file_that_is_no_image_is_refused_naming_image():
    with pytest.raises(InvalidInput) as refused:
        preprocess_image(b"not an image", Preprocessing(layout="NCHW", height=2, width=2))
    assert refused.value.field == "image"
    assert "PNG, JPEG" in refused.value.detail


def test_top_classes_take_softmax_of_scores_and_keep_probabilities():
    # when
    scores = top_classes([1.0, 3.0, 2.0, 0.0], 2)
    kept = top_classes([0.1, 0.7, 0.2], 1)
    # then
    expected = np.exp([3.0, 2.0]) / np.exp([1.0, 3.0, 2.0, 0.0]).sum()
    assert [row["index"] for row in scores] == [1, 2]
    np.testing.assert_allclose([row["probability"] for row in scores], expected)
    assert kept == [{"index": 1, "score": 0.7, "probability": 0.7}]
    assert are_probabilities([0.1, 0.7, 0.2]) and not are_probabilities([1.0, 3.0, 2.0, 0.0])


@pytest.mark.triton
def test_an_image_test_inference_gives_onnxruntime_s_top_class(
    alice, built_classifier, eager_tasks, django_capture_on_commit_callbacks
):
    # given the demo classifier deployed on a local Triton, and an image
    created = deploy_ready(alice, django_capture_on_commit_callbacks, built_classifier.pk)
    deployment = Deployment.objects.get(pk=created["id"])
    image = _png(320, 200, seed=7)
    fields = {"scale": "1/255", "mean": "0.485, 0.456, 0.406", "std": "0.229, 0.224, 0.225"}
    # when
    result = run_trial_inference(user=alice.user, deployment=deployment, image=image, preprocessing_fields=fields)
    # then it equals onnxruntime on the same image with the same preprocessing, done here by hand
    rgb = np.asarray(Image.open(io.BytesIO(image)).convert("RGB").resize((224, 224), Image.Resampling.BILINEAR))
    x = ((rgb.astype(np.float32) / 255 - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]).astype(np.float32)
    x = x.transpose(2, 0, 1)[np.newaxis]
    session = onnxruntime.InferenceSession(str(real_models.classifier()), providers=["CPUExecutionProvider"])
    [scores] = session.run(None, {"x": x})
    [output] = result.outputs
    assert output["name"] == "fetch_name_0" and output["shape"] == [1, 4]
    assert output["top"][0]["index"] == int(np.argmax(scores[0]))
    np.testing.assert_allclose(
        sorted(row["score"] for row in output["top"]), sorted(scores[0].tolist()), rtol=1e-4, atol=1e-5
    )
    assert result.request == [{"name": "x", "shape": [1, 3, 224, 224], "datatype": "FP32"}]

    # when the JSON editor's request is sent, and a malformed one
    request = json.dumps({"inputs": [{"name": "x", "shape": [1, 3, 224, 224], "datatype": "FP32", "data": x.tolist()}]})
    answer = run_trial_inference(user=alice.user, deployment=deployment, request_json=request)
    with pytest.raises(InvalidInput) as refused:
        run_trial_inference(user=alice.user, deployment=deployment, request_json='{"inputs": [')
    # then
    assert answer.outputs[0]["top"][0]["index"] == int(np.argmax(scores[0]))
    assert refused.value.field == "request"
