"""Unknown fields named with the known ones they are closest to ("did you mean"): a typo'd field is a mistake the
caller makes once, and pydantic's "Extra inputs are not permitted" does not say which field was meant."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

EXTRA = "extra_forbidden"


def closest(name: str, known: Sequence[str], *, most: int = 3) -> list[str]:
    """The known names nearest `name` (spelling, '-' for '_', case), best first; [] when none is near."""
    wanted = name.replace("-", "_").lower()
    exact = [field for field in known if field.lower() == wanted]
    return exact or difflib.get_close_matches(wanted, list(known), n=most, cutoff=0.5)


def did_you_mean(name: str, known: Sequence[str]) -> str:
    """' (did you mean a, b or c?)', or '' when nothing is near."""
    near = closest(name, known)
    if not near:
        return ""
    listed = near[0] if len(near) == 1 else f"{', '.join(near[:-1])} or {near[-1]}"
    return f" (did you mean {listed}?)"


def _model_at(model: type[BaseModel], path: Sequence[str | int]) -> type[BaseModel] | None:
    """The model whose field `path` leads to (through optional, list and dict fields), or None."""
    current: Any = model
    for part in path:
        if isinstance(part, int) or not (isinstance(current, type) and issubclass(current, BaseModel)):
            if isinstance(part, int):
                continue
            return None
        field = current.model_fields.get(part)
        if field is None:
            return None
        current = _inner_model(field.annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _inner_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, list, dict, tuple):
        for argument in typing.get_args(annotation):
            found = _inner_model(argument)
            if found is not None:
                return found
    return None


def with_suggestions(model: type[BaseModel], error: ValidationError) -> ValidationError:
    """`error`, each unknown field's message naming the closest known fields of the model it was given to."""
    details: list[InitErrorDetails] = []
    for item in error.errors():
        detail: InitErrorDetails = {"type": item["type"], "loc": item["loc"], "input": item["input"]}
        if "ctx" in item:
            detail["ctx"] = item["ctx"]
        if item["type"] == EXTRA and item["loc"]:
            owner = _model_at(model, item["loc"][:-1])
            name = str(item["loc"][-1])
            hint = did_you_mean(name, list(owner.model_fields)) if owner is not None else ""
            detail["type"] = PydanticCustomError(EXTRA, "unknown field {name}{hint}", {"name": name, "hint": hint})
            detail.pop("ctx", None)
        details.append(detail)
    return ValidationError.from_exception_data(error.title, details)
