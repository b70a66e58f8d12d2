"""Tiny gradient-boosted tree models for tests and benchmarks (development tooling), trained with fixed seeds and
saved in their frameworks' own formats: LightGBM text (`Booster.save_model`) and XGBoost JSON / UBJSON.

Each returns the path it wrote. Features are 5 FP32 columns drawn from a seeded normal distribution; the labels
are simple functions of them, so every model has real splits.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

FEATURES = 5


def training_rows(rows: int = 300, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(features [rows, FEATURES] FP32, binary labels, 3-class labels, a regression target)."""
    generator = np.random.default_rng(seed)
    features = generator.normal(size=(rows, FEATURES)).astype(np.float32)
    binary = (features[:, 0] + features[:, 1] > 0).astype(np.int64)
    three = (features[:, 2] > 0.5).astype(np.int64) + (features[:, 3] > 0).astype(np.int64)
    target = 2.0 * features[:, 0] - features[:, 4] + 0.1 * features[:, 2] ** 2
    return features, binary, three, target


def lightgbm_model(path: Path, objective: str = "binary") -> Path:
    """A LightGBM text model trained with `objective` ("binary", "multiclass", "regression", "lambdarank"…)."""
    import lightgbm

    features, binary, three, target = training_rows()
    labels = {"binary": binary, "multiclass": three}.get(objective, target)
    params: dict[str, object] = {"objective": objective, "verbose": -1, "seed": 0, "num_leaves": 7, "num_threads": 1}
    if objective == "multiclass":
        params["num_class"] = 3
    dataset = lightgbm.Dataset(features, labels)
    if objective == "lambdarank":
        dataset = lightgbm.Dataset(features, (target > 0).astype(np.int64), group=[30] * 10)
    booster = lightgbm.train(params, dataset, num_boost_round=8)
    booster.save_model(str(path))
    return path


def xgboost_model(path: Path, objective: str = "binary:logistic", booster_kind: str = "gbtree") -> Path:
    """An XGBoost model trained with `objective`, saved as JSON or UBJSON by `path`'s ending."""
    import xgboost

    features, binary, three, target = training_rows()
    labels = {"binary": binary, "multi": three}.get(objective.split(":")[0], target)
    params: dict[str, object] = {"objective": objective, "seed": 0, "max_depth": 3, "nthread": 1}
    params["booster"] = booster_kind
    if objective.startswith("multi:"):
        params["num_class"] = 3
    booster = xgboost.train(params, xgboost.DMatrix(features, labels), num_boost_round=8)
    booster.save_model(str(path))
    return path


def sklearn_model(path: Path, kind: str = "pipeline") -> Path:
    """A fitted scikit-learn model pickled with joblib: "pipeline" (StandardScaler + LogisticRegression, 3 integer
    classes), "text-classes" (LogisticRegression whose classes are strings), "regressor" (a small random forest)."""
    import joblib
    from sklearn.ensemble import RandomForestRegressor
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    features, binary, three, target = training_rows()
    if kind == "pipeline":
        model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(features, three)
    elif kind == "text-classes":
        model = LogisticRegression(max_iter=500).fit(features, np.where(binary == 1, "churn", "stay"))
    elif kind == "regressor":
        model = RandomForestRegressor(n_estimators=5, max_depth=4, random_state=0).fit(features, target)
    else:
        raise ValueError(f"unknown kind {kind!r}")
    joblib.dump(model, path)
    return path
