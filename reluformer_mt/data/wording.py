"""Counts in messages and summaries: "1 document", "2 documents"."""


def counted(n: int, noun: str, plural: str = "") -> str:
    """``n`` and ``noun``, the noun in the plural unless ``n`` is 1 (``plural``, else noun + s),
    with thousands separators: ``counted(1, "document")`` -> "1 document"."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"
