"""Fixture worlds for generated assistant tasks: small built-in pools of names, subjects and places, and `World`,
which builds a seeded state (contacts, filler mail, events and files) that a template adds its own items to."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

DOMAIN = "acme.test"
"""The only domain mail may go to."""
WEEK = tuple(date(2026, 3, 2) + timedelta(days=i) for i in range(5))
"""Monday 2 to Friday 6 March 2026, the week every calendar lives in."""
DAY_START, DAY_END = 9.0, 17.0
"""Working hours, as hours of the day."""

FIRST_NAMES = (
    "Priya",
    "Sam",
    "Jordan",
    "Mei",
    "Lucas",
    "Amara",
    "Noah",
    "Elena",
    "Kenji",
    "Fatima",
    "Oliver",
    "Zara",
    "Diego",
    "Hannah",
    "Ravi",
    "Ingrid",
    "Tomasz",
    "Leila",
    "Marcus",
    "Chloe",
)
LAST_NAMES = (
    "Shah",
    "Lee",
    "Ortiz",
    "Chen",
    "Novak",
    "Okafor",
    "Rossi",
    "Kim",
    "Haddad",
    "Berg",
    "Silva",
    "Tanaka",
    "Walsh",
    "Patel",
    "Moreau",
    "Jensen",
)
USERS = ("Alex Doe", "Robin Hale", "Casey Moore", "Morgan Reid", "Jamie Fox")
OUTSIDE_DOMAINS = ("gmail.com", "outlook.com", "proton.me", "acme-audit.net", "acme.test.example.org")
"""Domains outside the allowed one; the last one tricks a suffix check that forgets the dot."""
ROOMS = ("Room 1", "Room 2", "Orchid", "Maple", "Lab 3", "Video call")
TOPICS = (
    "Q2 roadmap",
    "hiring plan",
    "launch retro",
    "pricing update",
    "security audit",
    "partner onboarding",
    "data migration",
    "support rota",
    "board deck",
    "mobile release",
    "budget forecast",
    "brand refresh",
)
"""Topics of template items; filler mail and events never mention them."""
FILLER_MAIL = (
    ("Lunch on Friday?", "A few of us are going to the noodle place on Friday at 12:30. Want to join?"),
    ("Travel receipts", "I've uploaded my receipts from the Berlin trip. Let me know if anything is missing."),
    ("Printer on floor 3", "The printer on floor 3 is jammed again; facilities are on it."),
    ("Security training reminder", "The annual security training is due by the end of the month."),
    ("Team offsite ideas", "Please add your ideas for the offsite to the shared list before Thursday."),
    ("Parking permits", "New parking permits are available from reception from Monday."),
    ("New starter next week", "We have a new engineer starting next week; please say hello."),
    ("Customer feedback", "The pilot customer sent positive feedback on the new dashboard."),
    ("Release checklist", "The release checklist is updated; please tick off your items."),
    ("Coffee machine", "The coffee machine on floor 2 is fixed."),
    ("Holiday dates", "Please enter your Easter holiday dates in the team calendar."),
    ("Weekly sync notes", "Notes from this week's sync are in the team folder."),
)
FILLER_EVENTS = (
    "Standup",
    "Design critique",
    "Customer call",
    "Sprint planning",
    "Interview",
    "Vendor demo",
    "All-hands",
    "Coffee chat",
    "Team lunch",
    "Ops handover",
)
TODO_ITEMS = (
    "Book travel for the offsite",
    "Renew parking permit",
    "Update the team wiki",
    "Order a new badge",
    "Review the expense report",
    "Clean up the shared drive",
    "Reply to the facilities survey",
)
REGIONS = ("North", "South", "East", "West", "Central")


@dataclass(frozen=True)
class Person:
    """Someone with a name and a mail address."""

    name: str
    email: str

    @property
    def first(self) -> str:
        return self.name.split()[0]

    @property
    def last(self) -> str:
        return self.name.split()[-1]


def person(first: str, last: str, domain: str = DOMAIN) -> Person:
    """first.last@domain."""
    return Person(f"{first} {last}", f"{first}.{last}@{domain}".lower())


def at(day: date, hour: float) -> str:
    """An ISO time: at(WEEK[2], 9.5) == "2026-03-04T09:30:00"."""
    return (datetime(day.year, day.month, day.day) + timedelta(hours=hour)).isoformat()


def clock(hour: float) -> str:
    """ "09:30" for 9.5."""
    return f"{int(hour):02d}:{round(hour % 1 * 60):02d}"


def day_text(day: date) -> str:
    """ "Wednesday 4 March 2026"."""
    return f"{day:%A} {day.day} {day:%B %Y}"


def date_variants(day: date) -> tuple[str, ...]:
    """Ways an answer may give a date: "2026-03-04", "March 4", "4 March", "Mar 4", "4th of March", ..."""
    nth = f"{day.day}{'th' if 10 <= day.day % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(day.day % 10, 'th')}"
    return (
        day.isoformat(),
        f"{day:%B} {day.day}",
        f"{day.day} {day:%B}",
        f"{day:%b} {day.day}",
        f"{day.day} {day:%b}",
        f"{nth} {day:%B}",
        f"{nth} of {day:%B}",
    )


def time_variants(hour: float) -> tuple[str, ...]:
    """Ways an answer may give a time: "14:00", "2 pm", "2pm", "2:00 pm", "2 p.m.", ... ("9:00" too in the morning)."""
    h, m = int(hour), round(hour % 1 * 60)
    h12, half = (h - 1) % 12 + 1, "am" if h < 12 else "pm"
    dotted = f"{half[0]}.m."
    found = [f"{h:02d}:{m:02d}", f"{h12}:{m:02d} {half}", f"{h12}:{m:02d}{half}", f"{h12}:{m:02d} {dotted}"]
    if h < 12:
        found.append(f"{h}:{m:02d}")
    if not m:
        found += [f"{h12} {half}", f"{h12}{half}", f"{h12} {dotted}"]
    return tuple(dict.fromkeys(found))


class World:
    """A seeded state under construction: a user, 6-8 contacts, and filler mail, events and files."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        first, last = rng.choice(USERS).split()
        self.user = Person(f"{first} {last}", f"{first.lower()}@{DOMAIN}")
        firsts = rng.sample([f for f in FIRST_NAMES if f != first], rng.randint(6, 8))
        self.contacts = [person(f, rng.choice(LAST_NAMES)) for f in firsts]
        self.mail: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.files: dict[str, str] = {}
        self._codes: set[str] = set()
        self._events_made = 0
        for subject, text in rng.sample(FILLER_MAIL, rng.randint(5, 7)):
            self.add_mail(rng.choice(self.contacts), subject, text)
        for summary in rng.sample(FILLER_EVENTS, rng.randint(3, 4)):
            day, hours = rng.choice(WEEK), rng.choice((0.5, 1.0, 1.5))
            starts = self.free_starts(day, hours, step=0.5)
            if starts:
                self.add_event(
                    summary,
                    day,
                    rng.choice(starts),
                    hours,
                    attendees=rng.sample(self.contacts, rng.randint(1, 2)),
                    location=rng.choice(ROOMS),
                )
        for path in rng.sample(("notes/todo.txt", "notes/agenda.txt", "reports/q1.csv", "notes/ideas.md"), 2):
            self.ensure_file(path)

    def person(self, exclude: Sequence[Person] = ()) -> Person:
        """A random contact, not one of `exclude`."""
        return self.rng.choice([c for c in self.contacts if c not in exclude])

    def stranger(self) -> Person:
        """Someone not in the contacts, whose first name no contact (nor the user) shares."""
        taken = {c.first for c in [*self.contacts, self.user]}
        return person(self.rng.choice([f for f in FIRST_NAMES if f not in taken]), self.rng.choice(LAST_NAMES))

    def code(self, prefix: str = "", digits: int = 4) -> str:
        """A fresh random code such as "PO-4821"; no two codes in a world are equal."""
        while True:
            code = f"{prefix}{self.rng.randrange(10 ** (digits - 1), 10**digits)}"
            if code not in self._codes:
                self._codes.add(code)
                return code

    def letter(self, sender: Person, text: str) -> str:
        """A short mail body from `sender` to the user."""
        return f"Hi {self.user.first},\n\n{text}\n\n{sender.first}"

    def add_mail(self, sender: Person | str, subject: str, text: str, *, raw: bool = False) -> str:
        """File a message from `sender` (a contact, or an address) in the inbox; `text` is wrapped in a greeting
        and signature unless `raw`. Returns its id."""
        message_id = f"m{len(self.mail) + 1}"
        sent = datetime(2026, 2, 23, 8) + timedelta(days=self.rng.randrange(7), minutes=self.rng.randrange(0, 600, 5))
        body = text if raw or isinstance(sender, str) else self.letter(sender, text)
        self.mail.append(
            {
                "id": message_id,
                "folder": "INBOX",
                "from": sender if isinstance(sender, str) else sender.email,
                "to": [self.user.email],
                "cc": [],
                "subject": subject,
                "body": body,
                "date": sent.isoformat(),
            }
        )
        return message_id

    def add_event(
        self,
        summary: str,
        day: date,
        start: float,
        hours: float,
        *,
        attendees: Sequence[Person] = (),
        location: str = "",
    ) -> str:
        """Put an event in the calendar; returns its uid."""
        self._events_made += 1
        uid = f"e{self._events_made}"
        self.events.append(
            {
                "uid": uid,
                "summary": summary,
                "start": at(day, start),
                "end": at(day, start + hours),
                "location": location,
                "attendees": [p.email for p in attendees],
                "description": "",
            }
        )
        return uid

    def events_on(self, day: date) -> list[dict[str, Any]]:
        return [e for e in self.events if e["start"].startswith(day.isoformat())]

    def is_free(self, day: date, start: float, hours: float) -> bool:
        """Whether [start, start + hours) on `day` overlaps no event."""
        low, high = at(day, start), at(day, start + hours)
        return all(e["end"] <= low or e["start"] >= high for e in self.events_on(day))

    def free_starts(self, day: date, hours: float, step: float = 1.0) -> list[float]:
        """Start hours, every `step` in working hours, at which a `hours`-long event fits on `day`."""
        starts = [DAY_START + i * step for i in range(int((DAY_END - DAY_START - hours) / step) + 1)]
        return [s for s in starts if self.is_free(day, s, hours)]

    def clear_day(self, day: date) -> None:
        """Remove every event on `day` (templates that need a calendar day to be just so)."""
        self.events = [e for e in self.events if e not in self.events_on(day)]

    def ensure_file(self, path: str) -> str:
        """Create one of the standard files (notes/todo.txt, notes/agenda.txt, reports/q1.csv, notes/ideas.md)
        unless it exists; returns its text."""
        if path not in self.files:
            rng = self.rng
            self.files[path] = {
                "notes/todo.txt": lambda: "".join(f"- {t}\n" for t in rng.sample(TODO_ITEMS, 4)),
                "notes/agenda.txt": lambda: (
                    f"Agenda: {rng.choice(TOPICS)}\n1. Status\n"
                    f"2. Risks, led by {rng.choice(self.contacts).first}\n3. Next steps\n"
                ),
                "reports/q1.csv": lambda: "region,revenue\n"
                + "".join(f"{r},{rng.randrange(10000, 90000)}\n" for r in rng.sample(REGIONS, 4)),
                "notes/ideas.md": lambda: "# Offsite ideas\n- Boat trip\n- Cooking class\n- Hike and picnic\n",
            }[path]()
        return self.files[path]

    def state(self) -> dict[str, Any]:
        """The world as a state: mail in date order, events in time order."""
        return {
            "user": {"name": self.user.name, "email": self.user.email},
            "allowed_domains": [DOMAIN],
            "contacts": [{"name": c.name, "email": c.email} for c in self.contacts],
            "mail": sorted(self.mail, key=lambda m: m["date"]),
            "events": sorted(self.events, key=lambda e: e["start"]),
            "files": dict(sorted(self.files.items())),
        }
