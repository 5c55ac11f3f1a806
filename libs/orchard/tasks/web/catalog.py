"""The bundled sites' fixed data: the shop's products and the library's books (the server renders pages from it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Product:
    """One item in the shop."""

    product_id: str
    name: str
    price_cents: int
    blurb: str


@dataclass(frozen=True)
class Book:
    """One book in the library catalogue."""

    book_id: str
    title: str
    author: str
    year: int
    price_cents: int
    subject: str


PRODUCTS = (
    Product("mug-red", "Red Mug", 1400, "A 350 ml stoneware mug."),
    Product("mug-blue", "Blue Mug", 1200, "A 350 ml stoneware mug."),
    Product("mug-travel", "Travel Mug", 1900, "Keeps coffee hot for 4 hours."),
    Product("mug-mini", "Mini Mug", 900, "An espresso-sized 120 ml mug."),
    Product("teapot-green", "Green Teapot", 3400, "A 1 litre glazed teapot."),
    Product("towel", "Tea Towel", 600, "Linen, 50 x 70 cm."),
    Product("honey", "Honey Jar", 850, "Wildflower honey, 340 g."),
)
"""The shop's products, in the order the product list shows them (the cheapest mug is not first)."""

BOOKS = (
    Book("silent-orchard", "The Silent Orchard", "Mara Quill", 2011, 1850, "fiction"),
    Book("orchard-keeper", "The Orchard Keeper's Almanac", "Tomas Reyes", 2004, 2400, "gardening"),
    Book("garden-planning", "Garden Planning for Small Yards", "Lena Ostrova", 2019, 2200, "gardening"),
    Book("secret-garden-maps", "Maps of the Secret Garden", "Ilya Brandt", 1994, 1600, "fiction"),
    Book("winter-garden", "The Winter Garden", "Ilya Brandt", 1998, 1300, "fiction"),
    Book("garden-birds", "Birds of the Garden", "Priya Natarajan", 2015, 1150, "nature"),
    Book("cold-frames", "Cold Frames and Cloches: a Garden Handbook", "Sam Whitlock", 2008, 1750, "gardening"),
    Book("rivers-edge", "At the River's Edge", "Ilya Brandt", 2003, 1400, "fiction"),
    Book("quiet-machines", "Quiet Machines", "Mara Quill", 2016, 2100, "fiction"),
    Book("bees-at-work", "Bees at Work", "Priya Natarajan", 2009, 1500, "nature"),
    Book("soil-notes", "Notes on Soil", "Tomas Reyes", 1998, 1900, "gardening"),
)
"""The library's books, in the order search results list them."""


def product(product_id: str) -> Product | None:
    """The product with this id, or None."""
    return next((p for p in PRODUCTS if p.product_id == product_id), None)


def book(book_id: str) -> Book | None:
    """The book with this id, or None."""
    return next((b for b in BOOKS if b.book_id == book_id), None)


def search_books(query: str) -> list[Book]:
    """Books whose title, author or subject contains every word of the query (case-insensitive)."""
    words = query.lower().split()
    if not words:
        return []
    return [b for b in BOOKS if all(w in f"{b.title} {b.author} {b.subject}".lower() for w in words)]


def money(cents: int) -> str:
    """Cents as "$12.00"."""
    return f"${cents // 100}.{cents % 100:02d}"
