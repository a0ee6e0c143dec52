"""Reading one ``POLITE_*`` value with Scrapy's own getters, a bad value a :class:`SettingsError` that names the
setting, the value and the accepted form (the forms: :mod:`scrapy_polite.settings`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from scrapy.settings import BaseSettings

from ..vocabulary import parse_seconds
from .declaration import DEFAULTS, unknown_settings, unknown_settings_error

_T = TypeVar("_T")


class SettingsError(ValueError):
    """A ``POLITE_*`` setting has a value the pacer cannot use. The message names the setting and the fix;
    ``setting``, when given, is the setting the user wrote (the error says where it was set), else the message's
    first ``POLITE_*`` name is."""

    def __init__(self, message: str, *, setting: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting


# -- reading one value ------------------------------------------------------------------------------------


def as_settings(settings: Any) -> BaseSettings:
    """``settings`` as a Scrapy ``BaseSettings``: itself, or a plain mapping (what unit tests and tools pass)
    copied into one, so every value is read by Scrapy's own getters."""
    if isinstance(settings, BaseSettings):
        return settings
    return BaseSettings(dict(settings))


def _raw(settings: BaseSettings, name: str) -> Any:
    """The value of ``name``; its default when absent or None (``Settings.get`` treats None as absent too)."""
    return settings.get(name, DEFAULTS.get(name))


def _read(settings: BaseSettings, name: str, getter: Callable[[str, Any], _T], form: str) -> _T:
    """``getter(name, default)``, one of Scrapy's ``getbool``, ``getint``, ``getfloat``, ``getlist`` or
    ``getdict`` of ``settings``, with the default of :data:`DEFAULTS`.

    Raises:
        SettingsError: the getter's ``ValueError`` or ``TypeError`` (``OverflowError`` for an infinite
            whole number), naming the setting, the value and ``form``, the accepted form.
    """
    try:
        return getter(name, DEFAULTS.get(name))
    except (TypeError, ValueError, OverflowError):
        raise SettingsError(f"{name} must be {form}, got {_raw(settings, name)!r}") from None


_BOOLEAN = "a boolean (True/False, 1/0, '1'/'0', 'True'/'False' or 'true'/'false')"


def _bool(settings: BaseSettings, name: str) -> bool:
    """A boolean setting, read by Scrapy's ``getbool``.

    Raises:
        SettingsError: a value ``getbool`` refuses (``'yes'``, ``'on'``, a list …).
    """
    return _read(settings, name, settings.getbool, _BOOLEAN)


def polite_enabled(settings: Any) -> bool:
    """``POLITE_ENABLED`` (default True), read by Scrapy's ``getbool``: the one place it is read (the add-on, the
    middlewares, the extension and :meth:`PoliteConfig.from_settings` ask here).

    Args:
        settings: a Scrapy ``Settings`` or a plain mapping.

    Raises:
        SettingsError: not a boolean; the message names the setting and the values accepted.
    """
    return _bool(as_settings(settings), "POLITE_ENABLED")


def check_setting_names(settings: Any) -> None:
    """Refuse a ``POLITE_*`` name that is not a setting (a typo: it would have no effect), with the closest known
    name (:func:`~.declaration.unknown_settings_error`): the one check the add-on (before a crawl) and
    ``scrapy polite`` (before a verb) make.

    Args:
        settings: a Scrapy ``Settings`` or a mapping (its names are read).

    Raises:
        SettingsError: a name that is not a setting; its ``setting`` is the (first) misspelt name, so the error
            says where that was set, not where its close match was.
    """
    unknown = unknown_settings_error(settings)
    if unknown is not None:
        raise SettingsError(unknown, setting=unknown_settings(settings)[0][0])


def _seconds(settings: BaseSettings, name: str) -> float:
    """A duration setting in seconds, read by Scrapy's ``getfloat``, then finite and ``>= 0``
    (:func:`~scrapy_polite.vocabulary.parse_seconds`; ``getfloat`` takes ``'nan'``, ``'inf'`` and ``-1``).

    Raises:
        SettingsError: not a number, not finite, negative, or a bool.
    """
    value = _read(settings, name, settings.getfloat, "a number of seconds")
    if parse_seconds(value) is None or isinstance(_raw(settings, name), bool):  # (getfloat reads True as 1.0)
        raise SettingsError(f"{name} must be a finite number of seconds >= 0, got {_raw(settings, name)!r}")
    return value


def _count(settings: BaseSettings, name: str, *, what: str, minimum: int = 0, fix: str = "") -> int:
    """A whole-number setting ``>= minimum`` (an int, or a string or float of one: ``-s NAME=1000``), read by
    Scrapy's ``getint``; ``what`` says what it counts and ``fix`` what to do instead, for the error message.

    Raises:
        SettingsError: a bool or a fraction (which ``getint`` would truncate), a number below ``minimum``, or
            not a number.
    """
    form = f"a whole number >= {minimum} ({what})"
    value = _read(settings, name, settings.getint, form)
    raw = _raw(settings, name)
    try:
        whole = not isinstance(raw, bool) and float(raw) == value  # getint truncates a fraction
    except (TypeError, ValueError, OverflowError):
        whole = False
    if not whole or value < minimum:
        raise SettingsError(f"{name} must be {form}, got {raw!r}{fix}")
    return value


def _list_form(what: str, example: Sequence[Any]) -> str:
    csv = ",".join(map(str, example))
    return (f"{what}: a list such as {list(example)!r}, a comma-separated string such as {csv!r} "
            f"or a JSON list such as {json.dumps(list(example))!r}")


def _list(settings: BaseSettings, name: str, *, what: str, example: Sequence[Any]) -> list[Any]:
    """A list setting, read by Scrapy's ``getlist`` (see :func:`parse_list_setting` for the forms)."""
    raw = _raw(settings, name)
    form = _list_form(what, example)
    if isinstance(raw, str) and raw.strip().startswith("["):
        try:
            return list(json.loads(raw))  # valid JSON that starts with "[" is a list; getlist would split it
        except ValueError:
            pass  # not JSON: comma-separated after all, e.g. the nameserver "[::1]:53"
    items = _read(settings, name, settings.getlist, form)
    if raw is not None and not isinstance(raw, (str, list, tuple, set, frozenset)):
        raise SettingsError(f"{name} must be {form}, got {raw!r}")  # getlist takes a dict's keys, 0 as []
    if isinstance(raw, str):
        return [item.strip() for item in items if item.strip()]
    return items


def parse_list_setting(name: str, value: Any, *, what: str, example: Sequence[str]) -> list[Any]:
    """The items of a list setting, in the forms Scrapy users pass, read as Scrapy's ``getlist`` reads them.

    Accepted: a list, tuple or set (its items, unchanged); a JSON list string (``'[]'``,
    ``'["127.0.0.0/8"]'``); any other string is comma-separated, as ``getlist`` reads it, with items
    stripped and empty ones dropped (``''`` is the empty list). A string that starts with ``[`` but is not
    valid JSON is comma-separated too, so ``'[::1]:53'`` is one item; malformed JSON such as
    ``'[127.0.0.0/8]'`` then gives an item the caller's validation refuses, with the accepted forms. None is
    the empty list. The items are not validated here.

    Args:
        name: the setting's name, for the error message.
        value: the raw value.
        what: what the setting holds, e.g. ``"a list of CIDR networks"``.
        example: example items, e.g. ``["127.0.0.0/8", "::1/128"]``, for the error message.

    Returns:
        a new list of the items.

    Raises:
        SettingsError: a value of another type (a number, a dict); the message names the setting, the
            value and the accepted forms.

    >>> parse_list_setting("POLITE_ALLOWED_NETWORKS", "127.0.0.0/8, ::1/128", what="CIDR networks",
    ...                    example=["127.0.0.0/8"])
    ['127.0.0.0/8', '::1/128']
    """
    return _list(BaseSettings({name: value}), name, what=what, example=example)


def _dict_form(what: str, example: Mapping[str, Any]) -> str:
    return f"{what}: a dict such as {dict(example)!r} or a JSON object such as {json.dumps(dict(example))!r}"


def _dict(settings: BaseSettings, name: str, *, what: str, example: Mapping[str, Any]) -> dict[Any, Any]:
    """A dict setting, read by Scrapy's ``getdict`` (see :func:`parse_dict_setting` for the forms)."""
    raw = _raw(settings, name)
    form = _dict_form(what, example)
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    try:
        value = settings.getdict(name, DEFAULTS.get(name))
    except json.JSONDecodeError as exc:
        raise SettingsError(f"{name} is not valid JSON ({exc}), got {raw!r}; it must be {form}") from None
    except (TypeError, ValueError):
        raise SettingsError(f"{name} must be {form}, got {raw!r}") from None
    # getdict also takes a list of pairs, and a JSON list of them: not the forms this setting documents.
    if not isinstance(raw, (str, Mapping)) or (isinstance(raw, str) and not raw.strip().startswith("{")):
        raise SettingsError(f"{name} must be {form}, got {raw!r}")
    return value


def parse_dict_setting(name: str, value: Any, *, what: str, example: Mapping[str, Any]) -> dict[Any, Any]:
    """The entries of a dict setting, in the forms Scrapy users pass, read as Scrapy's ``getdict`` reads them.

    Accepted: a mapping (a dict, or a Scrapy ``BaseSettings``); a JSON object string. None and ``''`` are
    the empty dict. The entries are not validated here.

    Args:
        name: the setting's name, for the error message.
        value: the raw value.
        what: what the setting holds, e.g. ``"a dict of host -> seconds"``.
        example: an example value, for the error message.

    Returns:
        a new dict of the entries.

    Raises:
        SettingsError: malformed JSON, JSON that is not an object, or a value of another type (a list of
            pairs, which ``getdict`` would take, included); the message names the setting, the value and the
            accepted forms.
    """
    return _dict(BaseSettings({name: value}), name, what=what, example=example)
