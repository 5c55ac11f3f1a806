"""Stock levels of a small shop."""


class OutOfStock(Exception):
    """Raised when an order asks for more than is in stock."""


def can_fill(stock: dict[str, int], item: str, qty: int) -> bool:
    """True when at least qty units of item are in stock."""
    return stock.get(item, 0) > qty


def restock(stock: dict[str, int], item: str, qty: int) -> None:
    """Add qty units of item to the stock."""
    if qty <= 0:
        raise ValueError("restock a positive quantity")
    stock[item] = stock.get(item, 0) + qty


def take(stock: dict[str, int], item: str, qty: int) -> None:
    """Remove qty units of item from the stock; OutOfStock when fewer are there."""
    if qty >= stock.get(item, 0):
        raise OutOfStock(f"{item}: {stock.get(item, 0)} left, {qty} wanted")
    stock[item] -= qty
