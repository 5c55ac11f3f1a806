"""The bundled sites' server-rendered pages: shop products and order confirmation, library search and book pages,
and the forms' confirmation pages. Everything a page shows comes from the request, so any number of agents can
share one server."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from html import escape

from orchard.tasks.web.catalog import (
    PRODUCTS,
    Product,
    book,
    money,
    product,
    search_books,
)

MAX_QUANTITY = 99
"""The most of one product an order may hold."""


def layout(title: str, body: str, site_name: str = "", home: str = "/") -> str:
    """A whole page: the shared stylesheet, a header linking the site's home, and `body` in <main>."""
    header = f'<header><a href="{escape(home)}">{escape(site_name)}</a></header>' if site_name else ""
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f'<link rel="stylesheet" href="/static/site.css"></head>\n<body>{header}<main>\n{body}\n</main></body></html>\n'
    )


def rows(pairs: Iterable[tuple[str, str]]) -> str:
    """Label/value lines as a definition list, each shown as "Label: value"."""
    return "<dl>" + "".join(f"<div><dt>{escape(k)}:</dt> <dd>{escape(v)}</dd></div>" for k, v in pairs) + "</dl>"


def sites_index() -> str:
    """The server's home page: links to each site."""
    return layout(
        "Practice sites",
        """<h1>Practice sites</h1><ul>
<li><a href="/shop/index.html">Teacup shop</a></li>
<li><a href="/library/index.html">City library catalogue</a></li>
<li><a href="/forms/contact.html">Contact form</a></li>
<li><a href="/forms/booking.html">Table booking</a></li>
<li><a href="/forms/signup.html">Sign-up form</a></li>
<li><a href="/docs/index.html">Lantern documentation</a></li></ul>""",
    )


# --- shop -------------------------------------------------------------------------------------------------------


def shop_index() -> str:
    """The product list, each with an "Add to cart" button (cart.js keeps the cart)."""
    items = "".join(
        f"<li><h2>{escape(p.name)}</h2><p>{escape(p.blurb)}</p><p>Price: {money(p.price_cents)}</p>"
        f'<button type="button" id="add-{p.product_id}" data-id="{p.product_id}" data-name="{escape(p.name)}" '
        f'data-price="{p.price_cents}" aria-label="Add {escape(p.name)} to cart">Add to cart</button></li>'
        for p in PRODUCTS
    )
    body = (
        '<nav><a id="cart-link" href="/shop/cart.html">Cart (0)</a></nav><h1>Products</h1>'
        f'<p id="added" role="status"></p><ul class="cards">{items}</ul>'
        '<script src="/shop/cart.js"></script><script>Cart.bindAddButtons();</script>'
    )
    return layout("Teacup shop", body, "Teacup shop", "/shop/index.html")


def parse_items(spec: str) -> list[tuple[Product, int]] | str:
    """The order's "id:quantity,id:quantity" spec as (product, quantity) pairs, or what is wrong with it."""
    items: list[tuple[Product, int]] = []
    for part in filter(None, spec.split(",")):
        product_id, _, count = part.partition(":")
        found = product(product_id)
        if found is None:
            return f"there is no product {product_id!r}"
        if not count.isdigit() or not 1 <= int(count) <= MAX_QUANTITY:
            return f"the quantity of {product_id!r} must be 1 to {MAX_QUANTITY}, not {count!r}"
        items.append((found, int(count)))
    return items or "the cart is empty"


def order_page(form: Mapping[str, str]) -> tuple[int, str]:
    """The order confirmation for a checkout form (items, name, address), or a 400 page saying what is missing.

    Prices come from the catalogue, never from the browser."""
    items = parse_items(form.get("items", ""))
    missing = [label for key, label in (("name", "Full name"), ("address", "Address")) if not form.get(key, "").strip()]
    if isinstance(items, str) or missing:
        problem = items if isinstance(items, str) else f"please fill in: {', '.join(missing)}"
        return 400, layout(
            "Order not placed",
            f'<h1>Order not placed</h1><p>{escape(problem)}.</p><p><a href="/shop/cart.html">Back to the cart</a></p>',
            "Teacup shop",
            "/shop/index.html",
        )
    lines = "".join(f"<li>{count} x {escape(p.name)}: {money(p.price_cents * count)}</li>" for p, count in items)
    total = sum(p.price_cents * count for p, count in items)
    body = (
        f"<h1>Order confirmed</h1><p>Thank you, {escape(form['name'].strip())}.</p><ul>{lines}</ul>"
        f"<p>Total: {money(total)}</p>"
        + rows([("Ship to", form["address"].strip())])
        + '<p><a href="/shop/index.html">Continue shopping</a></p>'
        "<script>localStorage.removeItem('cart');</script>"
    )
    return 200, layout("Order confirmed", body, "Teacup shop", "/shop/index.html")


# --- library ----------------------------------------------------------------------------------------------------

SEARCH_FORM = (
    '<form action="/library/search" method="get" role="search"><label for="q">Search the catalogue</label> '
    '<input id="q" name="q" type="search" value="{q}"> <button type="submit">Search</button></form>'
)


def library_search(query: str) -> str:
    """The search results for `query`, linking each book's page."""
    found = search_books(query)
    if found:
        items = "".join(
            f'<li><a href="/library/book/{b.book_id}">{escape(b.title)}</a> by {escape(b.author)}, '
            f"{money(b.price_cents)}</li>"
            for b in found
        )
        plural = "s" if len(found) > 1 else ""
        listing = f'<p>{len(found)} result{plural} for "{escape(query)}"</p><ol id="results">{items}</ol>'
    else:
        listing = f'<p id="results">No books match "{escape(query)}".</p>'
    body = "<h1>Search results</h1>" + SEARCH_FORM.format(q=escape(query)) + listing
    return layout(f"Search: {query}", body, "City library", "/library/index.html")


def library_book(book_id: str) -> tuple[int, str]:
    """A book's page (author, year, subject, price), or a 404 page."""
    b = book(book_id)
    if b is None:
        return 404, layout("Not found", "<h1>Book not found</h1>", "City library", "/library/index.html")
    details = rows(
        [("Author", b.author), ("Published", str(b.year)), ("Subject", b.subject), ("Price", money(b.price_cents))]
    )
    return 200, layout(
        b.title,
        f"<h1>{escape(b.title)}</h1>{details}" + SEARCH_FORM.format(q=""),
        "City library",
        "/library/index.html",
    )


# --- forms ------------------------------------------------------------------------------------------------------


def contact_sent(query: Mapping[str, str]) -> str:
    """The contact form's confirmation, echoing the GET query."""
    body = (
        f"<h1>Message sent</h1><p>Thank you, {escape(query.get('name', ''))}. We will reply within two days.</p>"
        + rows(
            [
                ("Reply to", query.get("email", "")),
                ("Topic", query.get("topic", "")),
                ("Message", query.get("message", "")),
            ]
        )
    )
    return layout("Message sent", body, "Contact us", "/forms/contact.html")


def booking_confirmed(form: Mapping[str, str]) -> str:
    """The booking form's confirmation, echoing the POSTed fields."""
    body = "<h1>Booking confirmed</h1>" + rows(
        [
            ("Name", form.get("name", "")),
            ("Guests", form.get("guests", "")),
            ("Time", form.get("time", "")),
            ("Outdoor seating", "yes" if form.get("outdoor") else "no"),
        ]
    )
    return layout("Booking confirmed", body, "Table booking", "/forms/booking.html")


def signup_done(form: Mapping[str, str]) -> str:
    """The sign-up form's welcome page, echoing the POSTed fields."""
    body = f"<h1>Welcome, {escape(form.get('username', ''))}!</h1><p>Your account is ready.</p>" + rows(
        [
            ("Email", form.get("email", "")),
            ("Plan", form.get("plan", "")),
            ("Newsletter", "yes" if form.get("newsletter") else "no"),
        ]
    )
    return layout("Account created", body, "Sign up", "/forms/signup.html")
