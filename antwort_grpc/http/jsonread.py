"""Reading a client's JSON: each value checked for its type, a wrong one a RequestError naming the
parameter by its JSON path (`input[2].content[0].type`), as the spec's error object carries it."""

from __future__ import annotations

from typing import Any, NoReturn

from antwort_grpc.errors import FieldViolation, RequestError, invalid_argument

JSON = dict[str, Any]


def bad(param: str, description: str) -> RequestError:
    return invalid_argument([FieldViolation(param, description)])


def fail(param: str, description: str) -> NoReturn:
    raise bad(param, description)


def kind_of(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def obj(value: object, param: str) -> JSON:
    if not isinstance(value, dict):
        fail(param, f"must be an object, not {kind_of(value)}")
    return value


def array(value: object, param: str) -> list[Any]:
    if not isinstance(value, list):
        fail(param, f"must be an array, not {kind_of(value)}")
    return value


def string(value: object, param: str) -> str:
    if not isinstance(value, str):
        fail(param, f"must be a string, not {kind_of(value)}")
    return value


def boolean(value: object, param: str) -> bool:
    if not isinstance(value, bool):
        fail(param, f"must be a boolean, not {kind_of(value)}")
    return value


def number(value: object, param: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        fail(param, f"must be a number, not {kind_of(value)}")
    return float(value)


def integer(value: object, param: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        fail(param, f"must be an integer, not {kind_of(value)}")
    if not -(2**31) <= value < 2**31:
        fail(param, "out of range")
    return value


def one_of(value: object, param: str, choices: dict[str, Any]) -> Any:
    text = string(value, param)
    if text not in choices:
        fail(param, f"must be one of {', '.join(repr(c) for c in choices)}, not {text[:64]!r}")
    return choices[text]


def optional_string(body: JSON, key: str, param: str) -> str | None:
    value = body.get(key)
    return None if value is None else string(value, param)
