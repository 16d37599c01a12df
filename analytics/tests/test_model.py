"""Model files: skops round trip, and refusal of unknown or tampered files."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest
from cgloop.analytics.model import CARD_MEMBER, KEY_ENV, ModelError, load, read_card, save


def _rewrite(src, dst, edit):
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for name in zin.namelist():
            zout.writestr(name, edit(name, zin.read(name)))


def test_round_trip_keeps_predictions_and_card(small_model, small_examples, tmp_path):
    model, card = small_model
    _, ex = small_examples
    path = tmp_path / "m.skops"
    saved = save(model, card, path)
    loaded, card2 = load(path)
    assert card2 == saved
    assert card2.training_data_sha256 == ex.digest()
    assert card2.features and card2.metrics == card.metrics
    np.testing.assert_array_equal(loaded.predict_proba(ex.X[:50]), model.predict_proba(ex.X[:50]))
    np.testing.assert_array_equal(loaded.anomaly_score(ex.X[:5]), model.anomaly_score(ex.X[:5]))


def test_tampered_model_is_refused(small_model, tmp_path):
    model, card = small_model
    good = tmp_path / "good.skops"
    save(model, card, good)
    bad = tmp_path / "bad.skops"
    victim = next(n for n in zipfile.ZipFile(good).namelist() if n.endswith(".npy"))

    def flip(name, data):
        if name != victim:
            return data
        return data[:-1] + bytes([data[-1] ^ 0xFF])

    _rewrite(good, bad, flip)
    with pytest.raises(ModelError, match="content hash mismatch"):
        load(bad)


def test_card_edits_and_unknown_files_are_refused(small_model, tmp_path):
    model, card = small_model
    good = tmp_path / "good.skops"
    save(model, card, good)

    def edit_card(change):
        def f(name, data):
            if name != CARD_MEMBER:
                return data
            d = json.loads(data)
            change(d)
            return json.dumps(d).encode()
        return f

    fmt = tmp_path / "fmt.skops"
    _rewrite(good, fmt, edit_card(lambda d: d.update(format="someone.else")))
    with pytest.raises(ModelError, match="unknown model format"):
        load(fmt)
    feats = tmp_path / "feats.skops"
    _rewrite(good, feats, edit_card(lambda d: d.update(features=["dn_bps"])))
    with pytest.raises(ModelError, match="features"):
        load(feats)
    junk = tmp_path / "junk.skops"
    junk.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(ModelError, match="not a readable model"):
        load(junk)
    plain = tmp_path / "plain.skops"
    with zipfile.ZipFile(plain, "w") as zf:
        zf.writestr("schema.json", "{}")
    with pytest.raises(ModelError, match="not a cgloop model"):
        load(plain)


def test_signed_model_needs_the_key(small_model, tmp_path, monkeypatch):
    model, card = small_model
    path = tmp_path / "signed.skops"
    monkeypatch.setenv(KEY_ENV, "k1")
    save(model, card, path)
    assert read_card(path).hmac_sha256
    monkeypatch.setenv(KEY_ENV, "k2")
    with pytest.raises(ModelError, match="signature"):
        load(path)
