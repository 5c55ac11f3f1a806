"""State <-> on-disk formats for the Claw sandbox, stdlib only (it runs in the sandbox and is unit-tested on the
host): a state's mail as RFC 5322 messages and its events as iCalendar text, and back.

Messages carry their state id in an `X-Claw-Id` header and their body base64-encoded, so the text round-trips
exactly. Times are naive ISO "YYYY-MM-DDTHH:MM:SS": a Date header in -0000, floating iCalendar times.
"""

from __future__ import annotations

import email
import email.policy
import re
from datetime import datetime
from email.header import Header
from email.mime.text import MIMEText
from email.utils import format_datetime, formataddr, getaddresses, parsedate_to_datetime
from typing import Any

ID_HEADER = "X-Claw-Id"
FOLDERS = ("INBOX", "Sent")
"""The mail folders: INBOX is the Maildir root, the others Maildir++ subfolders."""


def _header(value: str) -> str | Header:
    return value if value.isascii() else Header(value, "utf-8")


def _address_header(values: list[str]) -> str:
    """Addresses for a header: display names encoded when they are not ASCII, the addresses left as they are."""
    return ", ".join(formataddr((name, addr), "utf-8") for name, addr in getaddresses(values))


def _display(name: str, addr: str) -> str:
    if not name:
        return addr
    if re.search(r'[()<>@,;:\\".\[\]]', name):
        name = '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return f"{name} <{addr}>"


def _addresses(value: str | None) -> list[str]:
    return [_display(name, addr) for name, addr in getaddresses([value])] if value else []


def message_bytes(message: dict[str, Any]) -> bytes:
    """A state message as an RFC 5322 message (the folder is where it is stored, not in the text)."""
    out = MIMEText(message.get("body", ""), "plain", "utf-8")  # base64: the body comes back byte for byte
    out["From"] = _address_header([message["from"]])
    out["To"] = _address_header(message.get("to", []))
    if message.get("cc"):
        out["Cc"] = _address_header(message["cc"])
    out["Subject"] = _header(message.get("subject", ""))  # type: ignore[assignment]  # a Header is allowed
    out["Date"] = format_datetime(datetime.fromisoformat(message["date"]).replace(tzinfo=None))
    if message.get("id"):  # a message to send gets its id from the SMTP server
        out[ID_HEADER] = message["id"]
    return out.as_bytes()


def message_dict(raw: bytes, folder: str) -> dict[str, Any]:
    """A stored message as a state message."""
    parsed = email.message_from_bytes(raw, policy=email.policy.default)
    part = parsed.get_body(("plain",)) or parsed
    payload = part.get_payload(decode=True) or b""
    assert isinstance(payload, bytes)  # decode=True on a non-multipart part
    body = payload.decode(part.get_content_charset() or "utf-8", "replace").replace("\r\n", "\n")
    try:
        date = parsedate_to_datetime(str(parsed["date"])).replace(tzinfo=None).isoformat(timespec="seconds")
    except (TypeError, ValueError):
        date = ""
    return {
        "id": str(parsed[ID_HEADER] or ""),
        "folder": folder,
        "from": (_addresses(str(parsed["from"] or "")) or [""])[0],
        "to": _addresses(str(parsed["to"] or "")),
        "cc": _addresses(str(parsed["cc"] or "")),
        "subject": str(parsed["subject"] or ""),
        "body": body,
        "date": date,
    }


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace(";", "\\;").replace(",", "\\,").replace("\r\n", "\n").replace("\n", "\\n")


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m[1] in "nN" else m[1], text)


def _fold(line: str) -> str:
    """Fold a content line at 74 octets (RFC 5545 3.1), never inside a UTF-8 sequence."""
    out, chunk = [], ""
    for char in line:
        if len((chunk + char).encode()) > 74:
            out.append(chunk)
            chunk = " "
        chunk += char
    return "\r\n".join([*out, chunk])


def _ical_time(value: str) -> str:
    return datetime.fromisoformat(value).replace(tzinfo=None).strftime("%Y%m%dT%H%M%S")


def event_ics(event: dict[str, Any]) -> str:
    """A state event as an iCalendar object with one VEVENT (floating times)."""
    lines = [
        "BEGIN:VCALENDAR",
        "VERSION:2.0",
        "PRODID:-//Orchard//Claw//EN",
        "BEGIN:VEVENT",
        f"UID:{event['uid']}",
        "DTSTAMP:20260101T000000Z",
        f"DTSTART:{_ical_time(event['start'])}",
        f"DTEND:{_ical_time(event['end'])}",
        f"SUMMARY:{_escape(event.get('summary', ''))}",
    ]
    if event.get("location"):
        lines.append(f"LOCATION:{_escape(event['location'])}")
    if event.get("description"):
        lines.append(f"DESCRIPTION:{_escape(event['description'])}")
    lines += [f"ATTENDEE:mailto:{a}" for a in event.get("attendees", [])]
    lines += ["END:VEVENT", "END:VCALENDAR"]
    return "".join(_fold(line) + "\r\n" for line in lines)


def _iso(value: str) -> str:
    value = value.rstrip("Z")
    if "T" not in value:
        value += "T000000"
    return datetime.strptime(value, "%Y%m%dT%H%M%S").isoformat(timespec="seconds")


def event_dict(ics: str) -> dict[str, Any]:
    """The first VEVENT of an iCalendar object as a state event (time zones are dropped: times stay as written)."""
    lines = re.sub(r"\r?\n[ \t]", "", ics).splitlines()
    event: dict[str, Any] = {
        "uid": "",
        "summary": "",
        "start": "",
        "end": "",
        "location": "",
        "attendees": [],
        "description": "",
    }
    inside = False
    for line in lines:
        if line == "BEGIN:VEVENT":
            inside = True
        elif line == "END:VEVENT":
            break
        elif inside and ":" in line:
            name_params, value = line.split(":", 1)
            name = name_params.split(";", 1)[0].upper()
            if name == "UID":
                event["uid"] = value
            elif name in ("SUMMARY", "LOCATION", "DESCRIPTION"):
                event[name.lower()] = _unescape(value)
            elif name == "DTSTART":
                event["start"] = _iso(value)
            elif name == "DTEND":
                event["end"] = _iso(value)
            elif name == "ATTENDEE":
                event["attendees"].append(value[len("mailto:") :] if value.lower().startswith("mailto:") else value)
    return event
