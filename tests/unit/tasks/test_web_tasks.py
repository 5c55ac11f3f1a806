"""Web tasks without a browser: checks and their reasons, loading and validating task files, {site} filling,
WebVoyager-style rows, and the sites' pure parts (order parsing, catalogue search)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchard.errors import FailedPrecondition, InvalidArgument
from orchard.tasks.web import CheckResult, WebCheck, WebTask, load_tasks
from orchard.tasks.web.catalog import product, search_books
from orchard.tasks.web.pages import parse_items

pytestmark = pytest.mark.timeout(30)

URL = "http://127.0.0.1:8000/forms/contact/sent?name=Ada&topic=billing#top"
CHECK = WebCheck(
    url_path="/forms/contact/sent",
    url_query={"topic": "billing"},
    title_contains="Message",
    text_contains=("Thank you, Ada.",),
    text_absent=("Error",),
)


def test_check_passes_when_every_condition_holds() -> None:
    text = "Message sent\n\n  Thank you,\n Ada.  "  # whitespace runs count as one space
    assert CHECK.evaluate(URL, "Message sent", text) == CheckResult(passed=True, reasons=())


@pytest.mark.parametrize(
    ("url", "title", "text", "reason"),
    [
        (
            "http://h/forms/contact.html?topic=billing",
            "Message",
            "Thank you, Ada.",
            "the URL path is '/forms/contact.html', not '/forms/contact/sent'",
        ),
        (
            "http://h/forms/contact/sent?topic=press",
            "Message",
            "Thank you, Ada.",
            "the URL query has topic='press', not 'billing'",
        ),
        ("http://h/forms/contact/sent", "Message", "Thank you, Ada.", "the URL query lacks topic='billing'"),
        (URL, "Contact us", "Thank you, Ada.", "the title 'Contact us' lacks 'Message'"),
        (URL, "Message", "thank you, ada.", "the page text lacks 'Thank you, Ada.'"),
        (URL, "Message", "Thank you, Ada. Error: try again", "the page text contains 'Error'"),
    ],
)
def test_check_fails_with_one_reason_per_condition(url: str, title: str, text: str, reason: str) -> None:
    assert CHECK.evaluate(url, title, text) == CheckResult(passed=False, reasons=(reason,))


def test_check_lists_every_failed_condition_and_an_empty_check_passes() -> None:
    assert len(CHECK.evaluate("http://h/", "", "Error").reasons) == 5
    assert WebCheck().evaluate("about:blank", "", "").passed


def test_bundled_tasks_cover_each_category_with_solutions() -> None:
    tasks = load_tasks()
    assert 10 <= len(tasks) <= 14
    assert {t.category for t in tasks} == {"form", "search", "shopping", "navigation"}
    for task in tasks:
        assert task.start_url.startswith("{site}/") and task.solution and task.source == "bundled"
        assert task.check != WebCheck(), f"{task.task_id} checks nothing"


def test_site_is_filled_into_the_url_and_every_string_of_the_solution() -> None:
    task = WebTask(
        task_id="t",
        goal="g",
        start_url="{site}/docs/index.html",
        check=WebCheck(),
        solution=(
            {"action": "navigate", "url": "{site}/shop/index.html"},
            {"action": "scroll", "delta_y": 600},
            {"action": "click", "selector": "#{site}"},
        ),
    )
    assert task.url("http://127.0.0.1:9/") == "http://127.0.0.1:9/docs/index.html"
    assert task.actions("http://127.0.0.1:9") == [
        {"action": "navigate", "url": "http://127.0.0.1:9/shop/index.html"},
        {"action": "scroll", "delta_y": 600},
        {"action": "click", "selector": "#http://127.0.0.1:9"},
    ]
    assert task.solution[0]["url"] == "{site}/shop/index.html"  # the task itself is unchanged


def test_ids_select_tasks_in_order_and_unknown_ids_list_the_known_ones() -> None:
    assert [t.task_id for t in load_tasks(ids=["shop-teapots", "form-contact"])] == ["shop-teapots", "form-contact"]
    with pytest.raises(InvalidArgument, match=r"has no tasks \['nope'\]; it has \[.*'form-booking'"):
        load_tasks(ids=["form-booking", "nope"])


def write(tmp_path: Path, *rows: object) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


ROW = {"task_id": "a", "goal": "Do it", "start_url": "{site}/x.html", "check": {"url_path": "/y.html"}}


def test_a_file_of_tasks_loads_with_defaults(tmp_path: Path) -> None:
    [task] = load_tasks(write(tmp_path, ROW, ""))
    assert task == WebTask(task_id="a", goal="Do it", start_url="{site}/x.html", check=WebCheck(url_path="/y.html"))


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ("{not json", "not valid JSON"),
        ([1, 2], "not a valid web task"),
        ({**ROW, "goal": " "}, "goal must not be empty"),
        ({**ROW, "check": {"text_contain": ["x"]}}, "check.text_contain: Unexpected keyword argument"),
        ({**ROW, "check": {"text_contains": "Order"}}, "check.text_contains: Input should be a valid tuple"),
        ({**ROW, "solution": [{"action": "tap", "selector": "#a"}]}, "solution step 1: action 'tap' is not one of"),
        ({**ROW, "solution": [{"action": "click", "css": "#a"}]}, "solution step 1: unknown keys ['css']"),
        (
            {**ROW, "solution": [{"action": "back"}, {"action": "type", "selector": "#q"}]},
            "solution step 2: a 'type' step needs text",
        ),
        ({k: v for k, v in ROW.items() if k != "check"}, "check: Field required"),
    ],
)
def test_malformed_rows_name_the_file_line_and_problem(tmp_path: Path, row: object, problem: str) -> None:
    path = write(tmp_path, ROW | {"task_id": "first"}, row)
    with pytest.raises(InvalidArgument) as err:
        load_tasks(path)
    assert str(err.value).startswith(f"{path}:2: ")
    assert problem in str(err.value)


def test_duplicate_ids_and_missing_files_are_errors(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match=r":2: task id 'a' appears twice"):
        load_tasks(write(tmp_path, ROW, ROW))
    with pytest.raises(InvalidArgument, match="does not exist"):
        load_tasks(tmp_path / "missing.jsonl")


def test_webvoyager_rows_become_tasks_allowed_to_reach_their_site(tmp_path: Path) -> None:
    row = {
        "web_name": "Allrecipes",
        "id": "Allrecipes--3",
        "ques": "Find a vegan lasagna recipe.",
        "web": "https://www.allrecipes.com/",
        "check": {"text_contains": ["Vegan Lasagna"]},
    }
    [task] = load_tasks(write(tmp_path, row))
    assert task == WebTask(
        task_id="Allrecipes--3",
        goal="Find a vegan lasagna recipe.",
        start_url="https://www.allrecipes.com/",
        check=WebCheck(text_contains=("Vegan Lasagna",)),
        allow_hosts=("www.allrecipes.com",),
        category="Allrecipes",
        source="webvoyager",
    )
    assert task.url("http://127.0.0.1:1") == "https://www.allrecipes.com/"
    with pytest.raises(InvalidArgument, match=r":1: .*check: Field required"):
        load_tasks(write(tmp_path, {k: v for k, v in row.items() if k != "check"}))


def test_miniwob_tasks_need_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    # The install puts the package in; pretend it is absent (find_spec finds nothing).
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    with pytest.raises(FailedPrecondition, match=r"pip install --no-deps miniwob==1\.1\.0"):
        load_tasks("miniwob")


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("mug-blue:1,teapot-green:3", [(product("mug-blue"), 1), (product("teapot-green"), 3)]),
        ("", "the cart is empty"),
        ("mug-gold:1", "there is no product 'mug-gold'"),
        ("mug-blue:0", "the quantity of 'mug-blue' must be 1 to 99, not '0'"),
        ("mug-blue", "the quantity of 'mug-blue' must be 1 to 99, not ''"),
    ],
)
def test_order_items_are_parsed_or_rejected_with_a_reason(spec: str, expected: object) -> None:
    assert parse_items(spec) == expected


def test_catalogue_search_matches_every_word_in_title_author_or_subject() -> None:
    assert [b.book_id for b in search_books("ilya BRANDT")] == ["secret-garden-maps", "winter-garden", "rivers-edge"]
    assert "garden-birds" in [b.book_id for b in search_books("garden")]
    assert search_books("  ") == []
