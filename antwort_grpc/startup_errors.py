"""Startup failures as one line that names the setting to change.

A person who mistyped a flag or started a second gateway needs the setting, not a traceback; the
traceback is still there with `--log-level DEBUG`. `describe` is pure: it maps an exception to the
line to print, or None when it does not know the exception (the caller then prints a generic line).
"""

from __future__ import annotations

import re
import socket
from collections.abc import Collection

from pydantic import BaseModel, ValidationError
from pydantic_settings import BaseSettings, SettingsError

_BIND_FAILED = "Failed to bind to address"


class StartupError(Exception):
    """A failure the user fixes by changing a setting; the message names it."""


def setting_names(settings_class: type[BaseSettings], field: str, flags: Collection[str] = ()) -> str:
    """`--max-turns / ANTWORT_MAX_TURNS` for a settings field; just the variable when it has no flag."""
    variable = f"{settings_class.model_config.get('env_prefix', '')}{field.upper()}"
    return f"--{field.replace('_', '-')} / {variable}" if field in flags else variable


# pydantic-settings' words for a variable it could not decode (JSON of a dict or list setting).
_UNPARSABLE = re.compile(r'error parsing value for field "(\w+)" from source "(\w+)"')


def settings_error(
    settings_class: type[BaseModel], error: ValidationError | SettingsError, flags: Collection[str] = ()
) -> StartupError:
    """The first invalid value of a settings class, as one line. `flags`: the fields that have one."""
    if isinstance(error, SettingsError):
        return _unparsable(settings_class, error, flags)
    first = error.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or "?"
    if issubclass(settings_class, BaseSettings) and first["loc"]:
        name = setting_names(settings_class, str(first["loc"][0]), flags)
    else:
        name = field
    value = first.get("input")
    shown = f" {value!r}" if isinstance(value, str | int | float) else ""
    more = f" (and {len(error.errors()) - 1} more)" if len(error.errors()) > 1 else ""
    return StartupError(f"{name}:{shown} {first['msg'][0].lower()}{first['msg'][1:]}{more}")


def _unparsable(settings_class: type[BaseModel], error: SettingsError, flags: Collection[str]) -> StartupError:
    """A variable whose text is not the JSON its setting needs (`ANTWORT_BACKEND_HEADERS='{bad'`)."""
    found = _UNPARSABLE.search(str(error))
    if found is None or not issubclass(settings_class, BaseSettings):
        return StartupError(str(error))
    field = found.group(1)
    cause = f" ({error.__cause__})" if error.__cause__ is not None else ""
    info = settings_class.model_fields.get(field)
    wanted = 'a JSON object, e.g. \'{"name": "value"}\'' if info and "dict" in str(info.annotation) else "JSON"
    return StartupError(f"{setting_names(settings_class, field, flags)}: not valid JSON{cause}; expected {wanted}")


def bind_error(listen: str, setting: str) -> StartupError:
    return StartupError(f"cannot listen on {listen}: the address is in use or not local; choose another with {setting}")


def is_bind_failure(error: BaseException) -> bool:
    """grpcio reports a port it cannot bind as a RuntimeError with this text."""
    return isinstance(error, RuntimeError) and _BIND_FAILED in str(error)


def describe(error: BaseException) -> str | None:
    """The one line for a known startup failure, else None."""
    if isinstance(error, StartupError):
        return str(error)
    return None


def check_listen(listen: str, setting: str) -> None:
    """Fail early, in one line, when the address cannot be bound: grpcio's own failure also
    writes a core log line to stderr. (A race with another process is still caught afterwards.)"""
    host, _, port_text = listen.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    if not port_text.isdigit():
        raise StartupError(f"{setting}: {listen!r} is not host:port")
    try:
        infos = socket.getaddrinfo(host, int(port_text), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as error:
        raise StartupError(f"{setting}: cannot resolve {host!r} ({error})") from error
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as error:
            raise StartupError(
                f"cannot listen on {listen} ({error.strerror}): choose another address with {setting}"
            ) from error
