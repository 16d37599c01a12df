"""The gaming-flow classifier and its model files.

A model file is a skops archive (never pickle) with one extra member, `cgloop-card.json`: the
model card (format, version, feature list, training-data hash, metrics, and a SHA-256 over
every other member of the archive). Loading refuses a file without a card, a card of an
unknown format, a content hash that does not match (tampered or corrupted), a feature list
this build does not compute, and any type outside a short allow-list. With CGLOOP_MODEL_KEY
set, the card also carries an HMAC that must verify.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import zipfile
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import skops.io as sio
from cgloop.analytics.features import CLASSIFIER_FEATURES, FEATURE_NAMES, INDEX
from pydantic import BaseModel, ConfigDict, ValidationError
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.ensemble import IsolationForest, RandomForestClassifier

MODEL_FORMAT = "cgloop.flow-classifier"
FORMAT_VERSION = 1
CARD_MEMBER = "cgloop-card.json"
KEY_ENV = "CGLOOP_MODEL_KEY"
# Types a model file may contain besides skops' defaults (numpy, builtins).
TRUSTED_TYPES = [
    "sklearn.ensemble._forest.RandomForestClassifier",
    "sklearn.tree._classes.DecisionTreeClassifier",
    "sklearn.tree._tree.Tree",
    "numpy.ndarray",
    "numpy.dtype",
    "builtins.dict",
    "builtins.list",
    "builtins.str",
]


class ModelError(ValueError):
    """A model file that cannot be trusted or used; the text says why."""


class ModelCard(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: str
    format_version: int
    version: str
    created: str
    features: list[str]
    classes: list[str]
    platforms: list[str]
    training_data_sha256: str
    training_examples: int
    training_captures: list[str]
    synthetic_captures: list[str]
    metrics: dict[str, float | dict[str, float]]
    content_sha256: str = ""
    hmac_sha256: str = ""


def _anomaly_space(X) -> np.ndarray:
    # Rates and sizes span orders of magnitude: compare them on a log scale.
    return np.log1p(np.abs(np.asarray(X, dtype=np.float64)))


class FlowClassifier(ClassifierMixin, BaseEstimator):
    """Cloud gaming vs other traffic classes, plus the gaming platform where known.

    Takes full feature vectors (features.FEATURE_NAMES order) and uses CLASSIFIER_FEATURES.
    """

    def __init__(
        self,
        n_estimators: int = 80,
        max_depth: int | None = 14,
        min_samples_leaf: int = 2,
        random_state: int = 0,
        n_jobs: int = 1,
    ) -> None:
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.min_samples_leaf = min_samples_leaf
        self.random_state = random_state
        self.n_jobs = n_jobs

    def _forest(self) -> RandomForestClassifier:
        return RandomForestClassifier(
            n_estimators=self.n_estimators,
            max_depth=self.max_depth,
            min_samples_leaf=self.min_samples_leaf,
            class_weight="balanced_subsample",  # gaming flows are a few among thousands
            random_state=self.random_state,
            n_jobs=self.n_jobs,
        )

    @staticmethod
    def _select(X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != len(FEATURE_NAMES):
            raise ValueError(f"expected (n, {len(FEATURE_NAMES)}) feature rows, got {X.shape}")
        return X[:, [INDEX[n] for n in CLASSIFIER_FEATURES]]

    def fit(self, X, y, platform=None) -> FlowClassifier:
        Xs = self._select(X)
        y = np.asarray(y)
        self.forest_ = self._forest().fit(Xs, y)
        self.classes_ = self.forest_.classes_
        self.platform_forest_ = None
        if platform is not None:
            platform = np.asarray(platform)
            mask = (y == "cloud_gaming") & (platform != "")
            if len(set(platform[mask])) > 1:
                self.platform_forest_ = self._forest().fit(Xs[mask], platform[mask])
        # Unknown-anomaly model over ALL features (dashboards only, never remediation).
        self.anomaly_ = IsolationForest(
            n_estimators=100, contamination=0.01, random_state=self.random_state
        ).fit(_anomaly_space(X))
        return self

    def anomaly_score(self, X) -> np.ndarray:
        """IsolationForest decision function: negative means anomalous (lower is stranger)."""
        if getattr(self, "anomaly_", None) is None:
            return np.zeros(len(X))
        return self.anomaly_.decision_function(_anomaly_space(X))

    def predict_proba(self, X) -> np.ndarray:
        return self.forest_.predict_proba(self._select(X))

    def predict(self, X) -> np.ndarray:
        return self.classes_[np.argmax(self.predict_proba(X), axis=1)]

    def predict_platform(self, X) -> tuple[np.ndarray, np.ndarray]:
        """(platform, probability) for each row, assuming it is cloud gaming."""
        n = len(X)
        if self.platform_forest_ is None:
            return np.array([""] * n), np.zeros(n)
        p = self.platform_forest_.predict_proba(self._select(X))
        return self.platform_forest_.classes_[p.argmax(1)], p.max(1)


# ---------------------------------------------------------------- model files


def _content_hash(zf: zipfile.ZipFile) -> str:
    h = hashlib.sha256()
    for name in sorted(n for n in zf.namelist() if n != CARD_MEMBER):
        h.update(name.encode() + b"\0")
        h.update(zf.read(name))
    return h.hexdigest()


def _sign(card: ModelCard) -> str:
    key = os.environ.get(KEY_ENV)
    if not key:
        return ""
    body = card.model_dump(exclude={"hmac_sha256"})
    return hmac.new(key.encode(), json.dumps(body, sort_keys=True).encode(), "sha256").hexdigest()


def new_version() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


def save(model: FlowClassifier, card: ModelCard, path: Path | str) -> ModelCard:
    path = Path(path)
    payload = {"forest": model.forest_}
    if model.platform_forest_ is not None:
        payload["platform_forest"] = model.platform_forest_
    if getattr(model, "anomaly_", None) is not None:
        payload["anomaly"] = model.anomaly_
    buf = io.BytesIO(sio.dumps(payload))
    with zipfile.ZipFile(buf, "a") as zf:
        card = card.model_copy(update={"content_sha256": _content_hash(zf)})
        card = card.model_copy(update={"hmac_sha256": _sign(card)})
        zf.writestr(CARD_MEMBER, card.model_dump_json(indent=2))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(buf.getvalue())
    tmp.replace(path)  # readers never see a half-written model
    return card


def read_card(path: Path | str) -> ModelCard:
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as zf:
            if CARD_MEMBER not in zf.namelist():
                raise ModelError(f"{path}: not a cgloop model (no {CARD_MEMBER})")
            raw = zf.read(CARD_MEMBER)
            actual = _content_hash(zf)
    except (zipfile.BadZipFile, OSError, KeyError) as exc:
        raise ModelError(f"{path}: not a readable model file ({exc})") from exc
    try:
        card = ModelCard.model_validate_json(raw)
    except ValidationError as exc:
        raise ModelError(f"{path}: invalid model card: {exc.errors()[0]['msg']}") from exc
    if card.format != MODEL_FORMAT or card.format_version != FORMAT_VERSION:
        raise ModelError(
            f"{path}: unknown model format {card.format!r} v{card.format_version} "
            f"(this build reads {MODEL_FORMAT} v{FORMAT_VERSION})"
        )
    if not hmac.compare_digest(actual, card.content_sha256):
        raise ModelError(f"{path}: content hash mismatch: the model file was modified or corrupted")
    if os.environ.get(KEY_ENV) and (
        not card.hmac_sha256 or not hmac.compare_digest(_sign(card), card.hmac_sha256)
    ):
            raise ModelError(f"{path}: signature does not verify with {KEY_ENV}")
    return card


def load(path: Path | str) -> tuple[FlowClassifier, ModelCard]:
    path = Path(path)
    card = read_card(path)
    if tuple(card.features) != CLASSIFIER_FEATURES:
        raise ModelError(
            f"{path}: model uses features {card.features}, this build computes "
            f"{list(CLASSIFIER_FEATURES)}: retrain with `cgloop train`"
        )
    data = path.read_bytes()
    untrusted = set(sio.get_untrusted_types(data=data)) - set(TRUSTED_TYPES)
    if untrusted:
        raise ModelError(f"{path}: refuses untrusted types {sorted(untrusted)}")
    try:
        payload = sio.loads(data, trusted=TRUSTED_TYPES)
    except Exception as exc:  # skops raises many types on malformed archives
        raise ModelError(f"{path}: cannot load model: {exc}") from exc
    model = FlowClassifier()
    model.forest_ = payload["forest"]
    model.classes_ = model.forest_.classes_
    model.platform_forest_ = payload.get("platform_forest")
    model.anomaly_ = payload.get("anomaly")
    return model, card
