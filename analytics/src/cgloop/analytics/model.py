"""The gaming-flow classifier and its model files.

A model file is a skops archive (never pickle) with one extra member, `cgloop-card.json`: the
model card (format, version, feature list, training-data hash, metrics, and a SHA-256 over
every other member of the archive). Loading refuses a file without a card, a card of an
unknown format, a content hash that does not match (tampered or corrupted), a feature list
this build does not compute, and any type outside a short allow-list.

The card also carries an HMAC-SHA256 under the model key, so a model rewritten with a
recomputed content hash is refused too. The key is `CGLOOP_MODEL_KEY` (the secret itself) or
else the file `CGLOOP_MODEL_KEY_FILE`, by default `$XDG_CONFIG_HOME/cgloop/model.key`
(`~/.config/cgloop/model.key`): the same place for the trainer, the worker, the loop and the
tests, whatever their state folder. Saving creates the file (random, 0600) when it is missing.
Loading refuses an unsigned model, a signed one without a key to check it, and a signature that
does not verify; `CGLOOP_MODEL_ALLOW_UNSIGNED=1` loads the first two with a warning.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import logging
import os
import secrets
import zipfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import skops.io as sio
from cgloop.analytics import decision
from cgloop.analytics.features import CLASSIFIER_FEATURES, FEATURE_NAMES, INDEX
from pydantic import BaseModel, ConfigDict, ValidationError
from sklearn.base import BaseEstimator, ClassifierMixin, OutlierMixin
from sklearn.ensemble import IsolationForest, RandomForestClassifier
from sklearn.model_selection import GroupKFold
from sklearn.utils.validation import check_is_fitted

log = logging.getLogger(__name__)

MODEL_FORMAT = "cgloop.flow-classifier"
# 2: the classifier's fitted decision thresholds are in the file (issue 21); a v1 file has none
# and is refused, so `make setup` retrains it.
FORMAT_VERSION = 2
CARD_MEMBER = "cgloop-card.json"
KEY_ENV = "CGLOOP_MODEL_KEY"
KEY_FILE_ENV = "CGLOOP_MODEL_KEY_FILE"
ALLOW_UNSIGNED_ENV = "CGLOOP_MODEL_ALLOW_UNSIGNED"
# Where the training records came from. A model trained on records of another packet → record
# path (the former Python accumulator: no RTP probation, another burst gap and idle timeout)
# learnt records the probe never exports: refused like a foreign feature list, so set-up retrains.
RECORDS_SOURCE = "cgloop.pcaprecords/1 (the probe's pcap twin)"
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
    records_source: str = ""  # RECORDS_SOURCE of the build that trained it ("" before it existed)
    # per class, the probability at which a label is decided (decision.py; a copy of the
    # classifier's fitted `decision_threshold_`, which the model content holds)
    decision_thresholds: dict[str, float] = {}
    content_sha256: str = ""
    hmac_sha256: str = ""


def _anomaly_space(X) -> np.ndarray:
    # Rates and sizes span orders of magnitude: compare them on a log scale.
    return np.log1p(np.abs(np.asarray(X, dtype=np.float64)))


def _full_rows(X) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != len(FEATURE_NAMES):
        raise ValueError(f"expected (n, {len(FEATURE_NAMES)}) feature rows, got {X.shape}")
    return X


def _select(X, features: tuple[str, ...] | None = None) -> np.ndarray:
    """The classifier's columns (`features`, by default CLASSIFIER_FEATURES) of full rows."""
    return _full_rows(X)[:, [INDEX[n] for n in (features or CLASSIFIER_FEATURES)]]


class FlowClassifier(ClassifierMixin, BaseEstimator):
    """Traffic class of a flow window (cloud gaming, video streaming, …): one class-balanced
    random forest.

    Takes full feature vectors (features.FEATURE_NAMES order) and uses `features`: by default
    CLASSIFIER_FEATURES, the only set a model file may hold (another set is for the
    evaluation's ablations). Fitted: `estimator_` (the forest), `classes_`, `n_features_in_`,
    `decision_threshold_` (per class, `classes_` order: the probability at which the top class
    is decided, decision.py) and `threshold_fit_` (what chose the cloud-gaming threshold).

    `fit(X, y, groups=, flow=)` chooses the cloud-gaming threshold on the training data only:
    out-of-fold predictions of `threshold_folds` grouped folds (by capture `groups`), the
    lowest threshold keeping the training flows' (`flow`) false gaming decisions within
    `false_alarm_target`. Without groups it keeps decision.DEFAULT_CONFIDENCE.
    """

    def __init__(
        self,
        n_estimators: int = 80,
        max_depth: int | None = 14,
        min_samples_leaf: int = 2,
        random_state: int = 0,
        n_jobs: int = 1,
        features: tuple[str, ...] | None = None,
        threshold_folds: int = 3,
        false_alarm_target: float = decision.FALSE_ALARM_TARGET,
    ) -> None:
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.min_samples_leaf = min_samples_leaf
        self.random_state = random_state
        self.n_jobs = n_jobs
        self.features = features
        self.threshold_folds = threshold_folds
        self.false_alarm_target = false_alarm_target

    def _forest(self, Xs: np.ndarray, y: np.ndarray) -> RandomForestClassifier:
        return RandomForestClassifier(
            n_estimators=self.n_estimators,
            max_depth=self.max_depth,
            min_samples_leaf=self.min_samples_leaf,
            class_weight="balanced_subsample",  # gaming flows are a few among thousands
            random_state=self.random_state,
            n_jobs=self.n_jobs,
        ).fit(Xs, y)

    def fit(self, X, y, groups=None, flow=None) -> FlowClassifier:
        unknown = set(self.features or ()) - set(INDEX)
        if unknown:
            raise ValueError(f"unknown features {sorted(unknown)}")
        if (groups is None) != (flow is None):
            raise ValueError("the decision threshold needs both groups (captures) and flow ids")
        Xs, y = _select(X, self.features), np.asarray(y)
        self.estimator_ = self._forest(Xs, y)
        self.classes_ = self.estimator_.classes_
        self.n_features_in_ = len(FEATURE_NAMES)
        gaming = decision.DEFAULT_CONFIDENCE
        self.threshold_fit_: dict[str, float] = {}
        if groups is not None and decision.GAMING in self.classes_:
            groups, flow = np.asarray(groups), np.asarray(flow)
            folds = min(self.threshold_folds, len(np.unique(groups)))
            if folds >= 2:
                gaming, self.threshold_fit_ = self._fit_threshold(Xs, y, groups, flow, folds)
        self.decision_threshold_ = decision.thresholds_for(self.classes_, gaming)
        return self

    def _fit_threshold(self, Xs, y, groups, flow, folds) -> tuple[float, dict[str, float]]:
        """The cloud-gaming threshold from out-of-fold predictions on the training captures."""
        proba = np.zeros((len(y), len(self.classes_)))
        for train, test in GroupKFold(n_splits=folds).split(Xs, y, groups):
            forest = self._forest(Xs[train], y[train])
            cols = np.searchsorted(self.classes_, forest.classes_)
            proba[np.ix_(test, cols)] = forest.predict_proba(Xs[test])
        scores = decision.alarm_scores(proba, self.classes_, y, flow)
        t = decision.choose_threshold(scores, self.false_alarm_target)
        return t, {"threshold": t, "folds": float(folds), "negative_flows": float(len(scores)),
                   "false_alarms": float((scores >= t).sum()),
                   "false_alarms_at_default": float(
                       (scores >= decision.DEFAULT_CONFIDENCE).sum())}

    @classmethod
    def from_forest(cls, forest: RandomForestClassifier,
                    thresholds: np.ndarray | None = None) -> FlowClassifier:
        """A fitted classifier around a forest (and its decision thresholds) from a model
        file."""
        est = cls(
            n_estimators=forest.n_estimators,
            max_depth=forest.max_depth,
            min_samples_leaf=forest.min_samples_leaf,
            random_state=forest.random_state,
            n_jobs=forest.n_jobs,
        )
        est.estimator_, est.classes_ = forest, forest.classes_
        est.n_features_in_ = len(FEATURE_NAMES)
        est.threshold_fit_ = {}
        if thresholds is None:
            thresholds = decision.thresholds_for(forest.classes_, decision.DEFAULT_CONFIDENCE)
        est.decision_threshold_ = np.asarray(thresholds, dtype=np.float64)
        if est.decision_threshold_.shape != (len(forest.classes_),):
            raise ValueError(f"{len(est.decision_threshold_)} decision thresholds for "
                             f"{len(forest.classes_)} classes")
        return est

    def thresholds(self) -> dict[str, float]:
        """Class → decision threshold."""
        check_is_fitted(self)
        return {str(c): float(t) for c, t in zip(self.classes_, self.decision_threshold_,
                                                  strict=True)}

    def predict_proba(self, X) -> np.ndarray:
        check_is_fitted(self)
        return self.estimator_.predict_proba(_select(X, self.features))

    def predict(self, X) -> np.ndarray:
        check_is_fitted(self)
        return self.classes_[np.argmax(self.predict_proba(X), axis=1)]


class PlatformClassifier(FlowClassifier):
    """Platform of a cloud-gaming flow (gfn, std, psn, xc): the same kind of forest, trained on
    the gaming windows that carry a platform label."""


class FlowAnomalyDetector(OutlierMixin, BaseEstimator):
    """Unknown-anomaly scores over ALL features (dashboards only, never remediation): an
    IsolationForest on log-scaled features. Fitted: `estimator_`, `n_features_in_`."""

    def __init__(
        self, n_estimators: int = 100, contamination: float = 0.01, random_state: int = 0
    ) -> None:
        self.n_estimators = n_estimators
        self.contamination = contamination
        self.random_state = random_state

    def fit(self, X, y=None) -> FlowAnomalyDetector:
        self.estimator_ = IsolationForest(
            n_estimators=self.n_estimators,
            contamination=self.contamination,
            random_state=self.random_state,
        ).fit(_anomaly_space(_full_rows(X)))
        self.n_features_in_ = len(FEATURE_NAMES)
        return self

    @classmethod
    def from_forest(cls, forest: IsolationForest) -> FlowAnomalyDetector:
        est = cls(forest.n_estimators, forest.contamination, forest.random_state)
        est.estimator_, est.n_features_in_ = forest, len(FEATURE_NAMES)
        return est

    def decision_function(self, X) -> np.ndarray:
        """Negative means anomalous (lower is stranger)."""
        check_is_fitted(self)
        return self.estimator_.decision_function(_anomaly_space(_full_rows(X)))

    def predict(self, X) -> np.ndarray:
        return np.where(self.decision_function(X) < 0, -1, 1)


@dataclass
class FlowModel:
    """What a model file holds and the engine runs: the class, the platform of gaming flows
    (None when the training data named fewer than two) and the anomaly score."""

    classifier: FlowClassifier
    platform: PlatformClassifier | None = None
    anomaly: FlowAnomalyDetector | None = None

    @classmethod
    def fit(cls, X, y, platform=None, groups=None, flow=None, **params) -> FlowModel:
        """Train all three on full feature rows; `params` go to both forests; `groups`
        (captures) and `flow` (flow ids) let the classifier choose its cloud-gaming decision
        threshold on the training data (FlowClassifier.fit)."""
        y = np.asarray(y)
        model = cls(FlowClassifier(**params).fit(X, y, groups=groups, flow=flow))
        if platform is not None:
            platform = np.asarray(platform)
            mask = (y == "cloud_gaming") & (platform != "")
            if len(set(platform[mask])) > 1:
                model.platform = PlatformClassifier(**params).fit(np.asarray(X)[mask],
                                                                  platform[mask])
        model.anomaly = FlowAnomalyDetector(random_state=model.classifier.random_state).fit(X)
        return model

    @property
    def classes_(self) -> np.ndarray:
        return self.classifier.classes_

    def predict_proba(self, X) -> np.ndarray:
        return self.classifier.predict_proba(X)

    def predict(self, X) -> np.ndarray:
        return self.classifier.predict(X)

    @property
    def decision_threshold_(self) -> np.ndarray:
        return self.classifier.decision_threshold_

    def predict_platform(self, X) -> tuple[np.ndarray, np.ndarray]:
        """(platform, probability) for each row, assuming it is cloud gaming."""
        n = len(X)
        if self.platform is None:
            return np.array([""] * n), np.zeros(n)
        p = self.platform.predict_proba(X)
        return self.platform.classes_[p.argmax(1)], p.max(1)

    def anomaly_score(self, X) -> np.ndarray:
        if self.anomaly is None:
            return np.zeros(len(X))
        return self.anomaly.decision_function(X)


# ---------------------------------------------------------------- model files


def _content_hash(zf: zipfile.ZipFile) -> str:
    h = hashlib.sha256()
    for name in sorted(n for n in zf.namelist() if n != CARD_MEMBER):
        h.update(name.encode() + b"\0")
        h.update(zf.read(name))
    return h.hexdigest()


def key_path() -> Path:
    """Where the model key lives (CGLOOP_MODEL_KEY_FILE, else the user's cgloop config folder)."""
    if os.environ.get(KEY_FILE_ENV):
        return Path(os.environ[KEY_FILE_ENV])
    config = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(config) / "cgloop" / "model.key"


def ensure_key() -> Path:
    """Create the model key file (random, mode 0600) unless it exists; return its path."""
    path = key_path()
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    try:
        os.link(tmp, path)  # atomic and never overwrites: of two first trainers, one key wins
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return path


def model_key() -> tuple[bytes | None, str]:
    """(key, where it came from); no key when neither the variable nor the file exists."""
    if os.environ.get(KEY_ENV):
        return os.environ[KEY_ENV].encode(), KEY_ENV
    path = key_path()
    try:
        key = path.read_bytes().strip()
    except FileNotFoundError:
        return None, str(path)
    except OSError as exc:
        raise ModelError(f"model key {path}: {exc.strerror or exc}") from None
    if not key:
        raise ModelError(f"model key {path} is empty")
    return key, str(path)


def _sign(card: ModelCard, key: bytes) -> str:
    body = card.model_dump(exclude={"hmac_sha256"})
    return hmac.new(key, json.dumps(body, sort_keys=True).encode(), "sha256").hexdigest()


def _unsigned_allowed(path: Path, why: str) -> None:
    if os.environ.get(ALLOW_UNSIGNED_ENV) == "1":
        log.warning("%s: %s; loaded anyway because %s=1", path, why, ALLOW_UNSIGNED_ENV)
        return
    raise ModelError(
        f"{path}: {why}: refused (retrain with `cgloop train`, which signs it, or set "
        f"{ALLOW_UNSIGNED_ENV}=1 to load it anyway)"
    )


def new_version() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


def save(model: FlowModel, card: ModelCard, path: Path | str) -> ModelCard:
    path = Path(path)
    # The file holds the sklearn forests themselves (the allow-listed types), as it always has.
    check_is_fitted(model.classifier)
    payload = {"forest": model.classifier.estimator_,
               "decision_thresholds": np.asarray(model.classifier.decision_threshold_)}
    card = card.model_copy(update={"decision_thresholds": model.classifier.thresholds()})
    if model.platform is not None:
        payload["platform_forest"] = model.platform.estimator_
    if model.anomaly is not None:
        payload["anomaly"] = model.anomaly.estimator_
    buf = io.BytesIO(sio.dumps(payload))
    if not os.environ.get(KEY_ENV):
        ensure_key()  # the first model trained on a machine makes its key
    key, where = model_key()
    if key is None:
        raise ModelError(f"no model key at {where} to sign {path} with")
    with zipfile.ZipFile(buf, "a") as zf:
        card = card.model_copy(update={"content_sha256": _content_hash(zf)})
        card = card.model_copy(update={"hmac_sha256": _sign(card, key)})
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
            f"(this build reads {MODEL_FORMAT} v{FORMAT_VERSION}): retrain with `cgloop train`"
        )
    if not hmac.compare_digest(actual, card.content_sha256):
        raise ModelError(f"{path}: content hash mismatch: the model file was modified or corrupted")
    key, where = model_key()
    if not card.hmac_sha256:
        _unsigned_allowed(path, "unsigned model")
    elif key is None:
        _unsigned_allowed(path, f"signed, but there is no model key to check it ({where})")
    elif not hmac.compare_digest(_sign(card, key), card.hmac_sha256):
        # Never loadable: the content was rewritten and re-hashed, or signed with another key.
        raise ModelError(
            f"{path}: signature does not verify with the model key ({where}): the file was "
            "rewritten or signed with another key; retrain with `cgloop train`"
        )
    return card


def load(path: Path | str) -> tuple[FlowModel, ModelCard]:
    path = Path(path)
    card = read_card(path)
    if tuple(card.features) != CLASSIFIER_FEATURES:
        raise ModelError(
            f"{path}: model uses features {card.features}, this build computes "
            f"{list(CLASSIFIER_FEATURES)}: retrain with `cgloop train`"
        )
    if card.records_source != RECORDS_SOURCE:
        source = card.records_source or "the former Python packet accumulator"
        raise ModelError(
            f"{path}: trained on records from {source}, this build's come from "
            f"{RECORDS_SOURCE}: retrain with `cgloop train`"
        )
    data = path.read_bytes()
    untrusted = set(sio.get_untrusted_types(data=data)) - set(TRUSTED_TYPES)
    if untrusted:
        raise ModelError(f"{path}: refuses untrusted types {sorted(untrusted)}")
    try:
        payload = sio.loads(data, trusted=TRUSTED_TYPES)
    except Exception as exc:  # skops raises many types on malformed archives
        raise ModelError(f"{path}: cannot load model: {exc}") from exc
    platform, anomaly = payload.get("platform_forest"), payload.get("anomaly")
    if "decision_thresholds" not in payload:
        raise ModelError(f"{path}: no decision thresholds in the model: retrain with "
                         "`cgloop train`")
    try:
        classifier = FlowClassifier.from_forest(payload["forest"], payload["decision_thresholds"])
    except ValueError as exc:
        raise ModelError(f"{path}: {exc}") from exc
    model = FlowModel(
        classifier,
        None if platform is None else PlatformClassifier.from_forest(platform),
        None if anomaly is None else FlowAnomalyDetector.from_forest(anomaly),
    )
    return model, card
