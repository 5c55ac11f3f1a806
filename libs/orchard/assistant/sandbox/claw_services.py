"""The Claw sandbox's servers and state (runs in the `claw` image, as root without capabilities, no network).

    claw_services.py seed STATE.json   write the state's mail (Maildir), events (.ics) and files under /claw/data
    claw_services.py serve             run SMTP, IMAP and CalDAV on 127.0.0.1; print READY once all answer; block
    claw_services.py dump              print the state read back from disk, as JSON
    claw_services.py smtp              (serve's SMTP server) file every accepted message in Sent

Everything lives under /claw/data (docs/design/claw-environment.md): mail/agent is the agent's Maildir (pymap's
maildir backend serves it over IMAP), calendar/ is radicale's storage, files/ the files area, world.json the
user, allowed domains and contacts.
"""

from __future__ import annotations

import json
import mailbox
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

from claw_state import (
    FOLDERS,
    ID_HEADER,
    event_dict,
    event_ics,
    message_bytes,
    message_dict,
)

DATA = Path("/claw/data")
MAIL = DATA / "mail"
MAILDIR = MAIL / "agent"
CALENDAR = DATA / "calendar" / "collection-root" / "agent" / "calendar"
FILES = DATA / "files"
WORLD = DATA / "world.json"
PORTS = {"smtp": 2525, "imap": 1143, "caldav": 5232}
IMAP_USER, IMAP_PASSWORD = "agent", "agent-pw"
READY = "CLAW READY"
RADICALE_CONF = f"""[server]
hosts = 127.0.0.1:{PORTS["caldav"]}
[auth]
type = none
[rights]
type = owner_only
[storage]
filesystem_folder = {DATA / "calendar"}
[web]
type = none
[logging]
level = warning
"""
CALENDAR_PROPS = {"tag": "VCALENDAR", "D:displayname": "Calendar", "C:supported-calendar-component-set": "VEVENT"}


def seed(state_file: str) -> None:
    state = json.loads(Path(state_file).read_text())
    for folder in (MAIL, CALENDAR, FILES, DATA / "tmp"):
        folder.mkdir(parents=True, exist_ok=True)
    WORLD.write_text(json.dumps({k: state[k] for k in ("user", "allowed_domains", "contacts")}))

    from pymap.config import IMAPConfig  # the password hash pymap checks LOGIN against

    (MAIL / "pymap-etc-passwd").write_text(f"{IMAP_USER}:x::::{MAILDIR.name}:\n")
    (MAIL / "pymap-etc-shadow").write_text(
        f"{IMAP_USER}:{IMAPConfig._get_hash_context(None).hash(IMAP_PASSWORD)}:::::::\n"
    )
    inbox = mailbox.Maildir(MAILDIR, create=True)
    folders = {"INBOX": inbox, **{name: inbox.add_folder(name) for name in FOLDERS[1:]}}
    for message in state["mail"]:
        if message["folder"] not in folders:
            folders[message["folder"]] = inbox.add_folder(message["folder"])
        box = folders[message["folder"]]
        stored = mailbox.MaildirMessage(message_bytes(message))
        stored.set_subdir("cur")
        stored.add_flag("S")
        box.add(stored)
    (CALENDAR / ".Radicale.props").write_text(json.dumps(CALENDAR_PROPS))
    for event in state["events"]:
        (CALENDAR / f"{event['uid']}.ics").write_text(event_ics(event))
    for path, text in state["files"].items():
        target = FILES / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    (DATA / "radicale.conf").write_text(RADICALE_CONF)


def dump() -> None:
    state = json.loads(WORLD.read_text())
    inbox = mailbox.Maildir(MAILDIR, create=False)
    mail = []
    for name, folder in [("INBOX", inbox), *((n, inbox.get_folder(n)) for n in sorted(inbox.list_folders()))]:
        for key in folder.iterkeys():
            mail.append(message_dict(folder.get_bytes(key), name))
    state["mail"] = sorted(mail, key=lambda m: (m["date"], m["id"]))
    events = [event_dict(p.read_text()) for p in CALENDAR.glob("*.ics")]
    state["events"] = sorted(events, key=lambda e: (e["start"], e["uid"]))
    state["files"] = {
        str(p.relative_to(FILES)): p.read_text(errors="replace") for p in sorted(FILES.rglob("*")) if p.is_file()
    }
    print(json.dumps(state, ensure_ascii=False))


def _next_id(taken: set[str]) -> str:
    number = 1
    while f"m{number}" in taken:
        number += 1
    return f"m{number}"


def smtp() -> None:
    """SMTP on 127.0.0.1: every accepted message is filed in Sent with a fresh X-Claw-Id (the 250 reply names it),
    and a copy goes to INBOX when it is addressed to the user."""
    import asyncio

    from aiosmtpd.smtp import SMTP

    user = json.loads(WORLD.read_text())["user"]["email"].lower()

    class Handler:
        async def handle_DATA(self, server: object, session: object, envelope: object) -> str:
            inbox = mailbox.Maildir(MAILDIR, create=False)
            taken = set()
            for folder in [inbox, *(inbox.get_folder(n) for n in inbox.list_folders())]:
                for key in folder.iterkeys():
                    try:  # pymap renames files as it sets flags
                        head = re.split(rb"\r?\n\r?\n", folder.get_bytes(key), maxsplit=1)[0]
                    except KeyError:
                        continue
                    found = re.search(rb"^X-Claw-Id: *(\S+)", head, re.MULTILINE | re.IGNORECASE)
                    if found:
                        taken.add(found[1].decode())
            message_id = _next_id(taken)
            raw = envelope.original_content or envelope.content  # type: ignore[attr-defined]
            raw = f"{ID_HEADER}: {message_id}\r\n".encode() + raw
            sent = mailbox.MaildirMessage(raw)
            sent.set_subdir("cur")
            sent.add_flag("S")
            inbox.get_folder("Sent").add(sent)
            if user in {r.lower() for r in envelope.rcpt_tos}:  # type: ignore[attr-defined]
                inbox.add(mailbox.MaildirMessage(raw))
            return f"250 OK id={message_id}"

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: SMTP(Handler(), enable_SMTPUTF8=True), "127.0.0.1", PORTS["smtp"])
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


def serve() -> None:
    env = {**os.environ, "TMPDIR": str(DATA / "tmp"), "PYTHONPATH": str(Path(__file__).parent)}
    py = sys.executable
    pymap = "import sys; from pymap.main import main; sys.argv[0] = 'pymap'; sys.exit(main())"
    commands = {
        "smtp": [py, __file__, "smtp"],
        "imap": [
            py,
            "-c",
            pymap,
            "--no-tls",
            "--host",
            "127.0.0.1",
            "--port",
            str(PORTS["imap"]),
            "maildir",
            str(MAIL),
        ],
        "caldav": [py, "-m", "radicale", "--config", str(DATA / "radicale.conf")],
    }
    children = {name: subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL) for name, argv in commands.items()}
    deadline = time.monotonic() + 60
    waiting = set(PORTS)
    while waiting:
        for name, child in children.items():
            if child.poll() is not None:
                print(f"CLAW FAILED: the {name} server exited with {child.returncode}", flush=True)
                sys.exit(1)
        waiting = {name for name in waiting if not _answers(PORTS[name])}
        if time.monotonic() > deadline:
            print(f"CLAW FAILED: no answer on {', '.join(sorted(waiting))} after 60 s", flush=True)
            sys.exit(1)
        time.sleep(0.05)
    print(READY, flush=True)
    while True:
        for name, child in children.items():
            if child.poll() is not None:
                print(f"CLAW FAILED: the {name} server exited with {child.returncode}", flush=True)
                sys.exit(1)
        time.sleep(0.5)


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "seed" and len(sys.argv) == 3:
        seed(sys.argv[2])
    elif command in ("serve", "dump", "smtp") and len(sys.argv) == 2:
        {"serve": serve, "dump": dump, "smtp": smtp}[command]()
    else:
        sys.exit(__doc__)
