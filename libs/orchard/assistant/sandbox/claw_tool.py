"""One assistant tool call against the Claw sandbox's servers: {"tool": name, "args": {...}} on stdin, the result
as JSON on stdout, and {"error": "..."} (exit code 0) when the call fails.

Mail goes out over SMTP (the server files it in Sent) and is read over IMAP; events are CalDAV resources; files
are a directory. The tools mean what `orchard.tasks.assistant.simulate` says (argument handling, result shapes).
"""

from __future__ import annotations

import base64
import http.client
import imaplib
import json
import re
import smtplib
import sys
import xml.etree.ElementTree as ET
from datetime import datetime
from pathlib import Path
from typing import Any

from claw_services import FILES, IMAP_PASSWORD, IMAP_USER, PORTS, WORLD
from claw_state import event_dict, event_ics, message_bytes, message_dict

TOOLS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "send_mail": (("to", "subject", "body"), ("cc",)),
    "search_mail": ((), ("query", "folder", "from_")),
    "read_mail": (("id",), ()),
    "create_event": (("summary", "start", "end"), ("attendees", "location", "description")),
    "update_event": (("uid",), ("summary", "start", "end", "attendees", "location", "description")),
    "delete_event": (("uid",), ()),
    "find_events": ((), ("query", "start", "end")),
    "list_files": ((), ("path",)),
    "read_file": (("path",), ()),
    "write_file": (("path", "content"), ()),
}
"""name -> (required arguments, optional arguments); the same as orchard.tasks.assistant.TOOLS."""
CALENDAR_PATH = "/agent/calendar/"
AUTH = "Basic " + base64.b64encode(b"agent:x").decode()


class ToolError(Exception):
    """A call the tool refuses or cannot do; its message is the result's "error"."""


def _list(value: Any) -> list[str]:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return [str(v) for v in value or []]


def _time(value: str, name: str) -> str:
    try:
        return datetime.fromisoformat(str(value)).replace(tzinfo=None).isoformat(timespec="seconds")
    except ValueError:
        raise ToolError(f"{name} {value!r} is not an ISO time such as 2026-03-04T10:00:00") from None


# Mail ------------------------------------------------------------------------------------------------------------


def _imap() -> imaplib.IMAP4:
    imap = imaplib.IMAP4("127.0.0.1", PORTS["imap"], timeout=20)
    imap.login(IMAP_USER, IMAP_PASSWORD)
    return imap


def _folders(imap: imaplib.IMAP4) -> list[str]:
    names = []
    for line in imap.list()[1]:
        found = re.search(rb'\) (?:"[^"]*"|NIL) "?([^"]*)"?$', line if isinstance(line, bytes) else b"")
        if found:
            names.append(found[1].decode())
    return sorted(names, key=lambda n: (n != "INBOX", n))


def _messages(imap: imaplib.IMAP4, folder: str) -> list[dict[str, Any]]:
    imap.select(f'"{folder}"', readonly=True)
    uids = imap.uid("SEARCH", "ALL")[1][0].split()
    if not uids:
        return []
    data = imap.uid("FETCH", b",".join(uids).decode(), "(BODY.PEEK[])")[1]
    return [message_dict(part[1], folder) for part in data if isinstance(part, tuple)]


def _all_mail(folder: str = "") -> list[dict[str, Any]]:
    imap = _imap()
    try:
        names = _folders(imap)
        return [m for name in names if not folder or name == folder for m in _messages(imap, name)]
    finally:
        imap.logout()


def send_mail(to: Any, subject: str, body: str, cc: Any = None) -> dict[str, str]:
    to, cc = _list(to), _list(cc)
    if not to:
        raise ToolError("send_mail needs at least one address in to")
    user = json.loads(WORLD.read_text())["user"]["email"]
    raw = message_bytes(
        {
            "id": "",
            "from": user,
            "to": to,
            "cc": cc,
            "subject": str(subject),
            "body": str(body),
            "date": datetime.now().isoformat(timespec="seconds"),
        }
    )
    with smtplib.SMTP("127.0.0.1", PORTS["smtp"], timeout=20) as smtp:
        smtp.ehlo()
        smtp.mail(user)
        for address in to + cc:
            code, reply = smtp.rcpt(address)
            if code >= 400:
                raise ToolError(f"the mail server refused {address}: {reply.decode(errors='replace')}")
        code, reply = smtp.data(raw)
    found = re.search(rb"id=(\S+)", reply)
    if code >= 400 or not found:
        raise ToolError(f"the mail server did not accept the message: {code} {reply.decode(errors='replace')}")
    return {"id": found[1].decode()}


def search_mail(query: str = "", folder: str = "", from_: str = "") -> list[dict[str, str]]:
    """Messages whose subject or body contains `query`, in `folder`, from an address containing `from_`."""
    query, from_ = str(query).lower(), str(from_).lower()
    found = [
        m
        for m in _all_mail(str(folder))
        if query in f"{m['subject']}\n{m['body']}".lower() and from_ in m["from"].lower()
    ]
    return [
        {k: m[k] for k in ("id", "folder", "from", "subject", "date")}
        for m in sorted(found, key=lambda m: (m["date"], m["id"]))
    ]


def read_mail(id: str) -> dict[str, Any]:
    for message in _all_mail():
        if message["id"] == str(id):
            return message
    raise ToolError(f"message {id!r} not found (search_mail lists message ids)")


# Calendar --------------------------------------------------------------------------------------------------------


def _caldav(method: str, path: str, body: str = "", headers: dict[str, str] | None = None) -> tuple[int, str, str]:
    conn = http.client.HTTPConnection("127.0.0.1", PORTS["caldav"], timeout=20)
    try:
        conn.request(method, path, body=body.encode(), headers={"Authorization": AUTH, **(headers or {})})
        response = conn.getresponse()
        return response.status, response.getheader("ETag") or "", response.read().decode(errors="replace")
    finally:
        conn.close()


REPORT = """<?xml version="1.0" encoding="utf-8"?>
<C:calendar-query xmlns:D="DAV:" xmlns:C="urn:ietf:params:xml:ns:caldav">
  <D:prop><D:getetag/><C:calendar-data/></D:prop>
  <C:filter><C:comp-filter name="VCALENDAR"><C:comp-filter name="VEVENT"/></C:comp-filter></C:filter>
</C:calendar-query>"""
NS = {"D": "DAV:", "C": "urn:ietf:params:xml:ns:caldav"}


def _events() -> list[tuple[str, str, dict[str, Any]]]:
    """Every event on the calendar as (href, etag, event)."""
    status, _, text = _caldav(
        "REPORT", CALENDAR_PATH, REPORT, {"Depth": "1", "Content-Type": "application/xml; charset=utf-8"}
    )
    if status != 207:
        raise ToolError(f"the calendar server answered {status} to a calendar query")
    out = []
    for response in ET.fromstring(text).findall("D:response", NS):
        data = response.find(".//C:calendar-data", NS)
        if data is None or not data.text:
            continue
        etag = response.find(".//D:getetag", NS)
        out.append(
            (response.findtext("D:href", "", NS), etag.text or "" if etag is not None else "", event_dict(data.text))
        )
    return sorted(out, key=lambda item: (item[2]["start"], item[2]["uid"]))


def _event(uid: str) -> tuple[str, str, dict[str, Any]]:
    for item in _events():
        if item[2]["uid"] == str(uid):
            return item
    raise ToolError(f"event {uid!r} not found (find_events lists event uids)")


def _put(href: str, event: dict[str, Any], condition: dict[str, str]) -> None:
    status, _, text = _caldav(
        "PUT", href, event_ics(event), {"Content-Type": "text/calendar; charset=utf-8", **condition}
    )
    if status not in (200, 201, 204):
        raise ToolError(f"the calendar server refused the event ({status}): {text[:300]}")


def create_event(
    summary: str, start: str, end: str, attendees: Any = None, location: str = "", description: str = ""
) -> dict[str, str]:
    taken, number = {item[2]["uid"] for item in _events()}, 1
    while f"e{number}" in taken:
        number += 1
    event: dict[str, Any] = {
        "uid": f"e{number}",
        "summary": str(summary),
        "start": _time(start, "start"),
        "end": _time(end, "end"),
        "location": str(location or ""),
        "attendees": _list(attendees),
        "description": str(description or ""),
    }
    _put(f"{CALENDAR_PATH}{event['uid']}.ics", event, {"If-None-Match": "*"})
    return {"uid": event["uid"]}


def update_event(uid: str, **changes: Any) -> dict[str, Any]:
    href, etag, event = _event(uid)
    for key, value in changes.items():
        event[key] = (
            _time(value, key) if key in ("start", "end") else _list(value) if key == "attendees" else str(value or "")
        )
    _put(href, event, {"If-Match": etag} if etag else {})
    return event


def delete_event(uid: str) -> dict[str, str]:
    href, etag, _ = _event(uid)
    status, _, text = _caldav("DELETE", href, headers={"If-Match": etag} if etag else {})
    if status not in (200, 204):
        raise ToolError(f"the calendar server did not delete {uid!r} ({status}): {text[:300]}")
    return {"uid": str(uid)}


def find_events(query: str = "", start: str = "", end: str = "") -> list[dict[str, Any]]:
    """Events with `query` in the summary, location or description that overlap [start, end)."""
    low = _time(start, "start") if start else ""
    high = _time(end, "end") if end else ""
    query = str(query).lower()
    return [
        e
        for _, _, e in _events()
        if query in f"{e['summary']}\n{e['location']}\n{e['description']}".lower()
        and (not high or e["start"] < high)
        and (not low or e["end"] > low)
    ]


# Files -----------------------------------------------------------------------------------------------------------


def _path(path: str, *, allow_root: bool = False) -> Path:
    path = str(path)
    parts = path.strip("/").split("/") if path.strip("/") else []
    if path.startswith(("/", "~")) or ".." in parts or (not parts and not allow_root) or "\\" in path:
        raise ToolError(f"path {path!r} is outside the files area: use a relative path such as notes/todo.txt")
    return FILES.joinpath(*parts)


def list_files(path: str = "") -> list[str]:
    _path(path, allow_root=True)
    prefix = str(path).strip("/") + "/" if str(path).strip("/") else ""
    every = (str(p.relative_to(FILES)) for p in FILES.rglob("*") if p.is_file())
    return sorted(p for p in every if p.startswith(prefix))


def read_file(path: str) -> str:
    target = _path(path)
    if not target.is_file():
        raise ToolError(f"file {path!r} not found (list_files lists the files)")
    return target.read_text(errors="replace")


def write_file(path: str, content: str) -> dict[str, Any]:
    target = _path(path)
    if target.is_dir():
        raise ToolError(f"{path!r} is a folder, not a file")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(str(content))
    return {"path": str(path), "bytes": len(str(content).encode())}


def call(tool: str, args: dict[str, Any]) -> Any:
    if tool not in TOOLS:
        raise ToolError(f"unknown tool {tool!r}; the tools are {', '.join(TOOLS)}")
    required, optional = TOOLS[tool]
    bad = sorted(set(args) - set(required) - set(optional)) + [a for a in required if a not in args]
    if bad:
        raise ToolError(f"{tool} takes {', '.join(required + optional)}; check {', '.join(bad)}")
    return globals()[tool](**args)


def main() -> None:
    request: Any = {}
    try:
        request = json.loads(sys.stdin.read())
        if not isinstance(request, dict) or not isinstance(request.get("args", {}), dict):
            raise ToolError('expected {"tool": name, "args": {...}}')
        result = call(str(request.get("tool", "")), request.get("args", {}))
    except ToolError as err:
        result = {"error": str(err)}
    except (OSError, imaplib.IMAP4.error, smtplib.SMTPException, ET.ParseError) as err:
        result = {"error": f"the {request.get('tool', '')} call failed: {type(err).__name__}: {err}"}
    except Exception as err:  # noqa: BLE001 - a tool result, never a traceback: the agent sees what went wrong
        result = {"error": f"{type(err).__name__}: {err}"}
    print(json.dumps(result, ensure_ascii=False))


if __name__ == "__main__":
    main()
