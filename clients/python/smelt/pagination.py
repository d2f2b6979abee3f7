"""Pages of smeltd's lists (``{"object": "list", "data", "has_more"}``) that fetch the
next page on demand: iterate a Page to walk every item of every page."""
from typing import Any, Callable, Dict, Generic, Iterator, List, Optional, TypeVar

__all__ = ["Page"]

T = TypeVar("T")


class Page(Generic[T]):
    """One page of a list. ``data`` holds its items, ``has_more`` says whether more follow;
    ``next_page()`` fetches the next (None at the end) and iterating the page yields the
    items of this page and every page after it (``auto_paging_iter``)."""

    def __init__(self, data: List[T], has_more: bool, fetch: Optional[Callable[[str], "Page[T]"]],
                 cursor: Callable[[T], Optional[str]], raw: Optional[Dict[str, Any]] = None) -> None:
        self.data = data
        self.has_more = has_more
        self.raw: Dict[str, Any] = raw or {}
        self._fetch = fetch
        self._cursor = cursor

    @property
    def next_cursor(self) -> Optional[str]:
        """The ``after`` value of the next page, None when this is the last."""
        if not self.has_more or not self.data:
            return None
        return self._cursor(self.data[-1])

    def has_next_page(self) -> bool:
        """True when another page follows."""
        return self.next_cursor is not None and self._fetch is not None

    def next_page(self) -> "Optional[Page[T]]":
        """The next page, or None after the last."""
        cursor = self.next_cursor
        if cursor is None or self._fetch is None:
            return None
        return self._fetch(cursor)

    def auto_paging_iter(self) -> Iterator[T]:
        """Every item of this page and the pages after it, fetching them as needed."""
        page: Optional[Page[T]] = self
        while page is not None:
            yield from page.data
            page = page.next_page()

    def __iter__(self) -> Iterator[T]:
        return self.auto_paging_iter()

    def __len__(self) -> int:
        return len(self.data)

    def __repr__(self) -> str:
        return "Page(%d items, has_more=%s)" % (len(self.data), self.has_more)
