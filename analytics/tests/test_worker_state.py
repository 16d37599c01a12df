"""The worker's state file is one worker's: a second worker of the group given the same file
would overwrite the first's offsets, so it is refused, naming the file and the option."""

from __future__ import annotations

import pytest
from cgloop.analytics.worker import StateFile
from cgloop.errors import CgloopError


def test_a_state_file_in_use_is_refused_until_released(tmp_path) -> None:
    path = tmp_path / "analytics" / "worker-g.json"
    first = StateFile(path)
    with pytest.raises(CgloopError, match=r"worker-g\.json is in use .* \(--state\)"):
        StateFile(path)
    StateFile(tmp_path / "analytics" / "worker-g-2.json").release()  # another file: fine
    first.offsets["cgloop.flows.v1:0"] = 7
    first.save()
    first.release()
    again = StateFile(path)
    assert again.offsets == {"cgloop.flows.v1:0": 7}
    again.release()
