"""Browser actions in domain terms: what Act asks for, checked before it reaches the page; and PNG sizes.
Pure functions, no I/O."""

from __future__ import annotations

import enum
import math
import struct
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

from orchard.errors import InvalidArgument
from orchard.services.env.browser_policy import NAVIGABLE_SCHEMES, url_target

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class ActionKind(enum.Enum):
    CLICK = "click"
    DOUBLE_CLICK = "double_click"
    TYPE = "type"
    KEY_PRESS = "key_press"
    SCROLL = "scroll"
    NAVIGATE = "navigate"
    BACK = "back"
    WAIT = "wait"


@dataclass(frozen=True)
class Action:
    """One Act request; zero values mean "not set" (x = y = 0 means no coordinates)."""

    kind: ActionKind | None
    x: float = 0.0
    y: float = 0.0
    selector: str = ""
    text: str = ""
    key: str = ""
    delta_x: float = 0.0
    delta_y: float = 0.0
    url: str = ""
    timeout_s: float = 0.0
    """0 = the service default; check_action fills it in."""
    screenshot: bool = False

    @property
    def has_point(self) -> bool:
        return (self.x, self.y) != (0.0, 0.0)

    def describe(self) -> str:
        """E.g. "click on selector '#go'", for error messages."""
        name = self.kind.value if self.kind else "action"
        if self.selector:
            return f"{name} on selector {self.selector!r}"
        if self.kind in (ActionKind.CLICK, ActionKind.DOUBLE_CLICK):
            return f"{name} at ({self.x:g}, {self.y:g})"
        if self.kind is ActionKind.NAVIGATE:
            return f"navigate to {self.url!r}"
        return name


def check_action(action: Action, default_timeout_s: float, max_timeout_s: float) -> Action:
    """The action with its timeout filled in (the default when 0, at most max_timeout_s); raises InvalidArgument
    naming the field at fault."""
    kind = action.kind
    if kind is None:
        raise InvalidArgument("action is required: one of " + ", ".join(k.value for k in ActionKind), field="action")
    for name in ("x", "y", "delta_x", "delta_y"):
        if not math.isfinite(getattr(action, name)):
            raise InvalidArgument(f"{name} must be a finite number", field=name)
    if action.x < 0 or action.y < 0:
        raise InvalidArgument(
            "x and y must not be negative (CSS pixels from the viewport's top left)", field="x" if action.x < 0 else "y"
        )
    if "\x00" in action.selector + action.text + action.key + action.url:
        raise InvalidArgument("selector, text, key and url must not contain a NUL byte", field="text")
    if kind in (ActionKind.CLICK, ActionKind.DOUBLE_CLICK) and not (action.selector or action.has_point):
        raise InvalidArgument(
            f"{kind.value} needs a selector or coordinates x, y (x = y = 0 counts as none)", field="selector"
        )
    if kind is ActionKind.TYPE and not action.text:
        raise InvalidArgument("type needs text", field="text")
    if kind is ActionKind.KEY_PRESS and not action.key:
        raise InvalidArgument("key_press needs a key, e.g. 'Enter' or 'Control+A'", field="key")
    if kind is ActionKind.SCROLL and action.delta_x == 0 and action.delta_y == 0:
        raise InvalidArgument(
            "scroll needs a non-zero delta_x or delta_y (pixels; positive scrolls down/right)", field="delta_y"
        )
    if kind is ActionKind.NAVIGATE:
        check_url(action.url)
    if kind is ActionKind.WAIT and not action.selector and action.timeout_s <= 0:
        raise InvalidArgument("wait needs a selector to wait for or a timeout to sleep", field="selector")
    timeout_s = min(action.timeout_s or default_timeout_s, max_timeout_s)
    return replace(action, timeout_s=timeout_s)


def check_url(url: str) -> None:
    """Raise InvalidArgument unless url is an http, https, about or data URL (with a host for http/https)."""
    if not url:
        raise InvalidArgument("navigate needs a url, e.g. 'https://example.com/'", field="url")
    try:
        scheme = urlsplit(url).scheme.lower()
        if scheme not in NAVIGABLE_SCHEMES:
            raise ValueError(f"scheme {scheme or '(none)'!r} is not one of http, https, about or data")
        url_target(url)
    except ValueError as err:
        raise InvalidArgument(f"url {url!r} cannot be navigated to: {err}", field="url") from None


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk; raises ValueError for anything else."""
    if len(png) < 24 or not png.startswith(PNG_SIGNATURE) or png[12:16] != b"IHDR":
        raise ValueError("not a PNG image")
    width, height = struct.unpack(">II", png[16:24])
    return int(width), int(height)
