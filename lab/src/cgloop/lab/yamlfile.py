"""Reading the lab's YAML files into pydantic models, with errors that name the file."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


def load_yaml_model(model: type[M], path: Path | None, default: str, what: str) -> M:
    """`model` from the YAML file `path`, or from the shipped `cgloop/lab/data/<default>`."""
    if path is None:
        where = f"<default {default}>"
        text = resources.files("cgloop.lab.data").joinpath(default).read_text()
    else:
        where = str(path)
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ValueError(f"{where}: cannot read {what}: {exc.strerror}") from exc
    try:
        return model.model_validate(yaml.safe_load(text))
    except yaml.YAMLError as exc:
        raise ValueError(f"{where}: not valid YAML: {exc}") from exc
    except ValidationError as exc:
        raise ValueError(f"{where}: invalid {what}: {exc}") from exc
