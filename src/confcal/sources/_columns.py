"""The class order of a column group (``logit_*`` or ``a,b,c``): one rule for every reader.

A column group is stacked into ``(n, K)`` with column ``j`` as class ``j``. Files often keep
their columns in lexicographic order (``logit_0, logit_1, logit_10, logit_2, ...``), so file
order would silently permute the classes. The rule:

* every name is ``PREFIX`` + an integer suffix, with one common ``PREFIX``: the columns are
  ordered by the suffix, which must form a run of consecutive integers without repeats
  (``logit_1 .. logit_10`` is fine; ``logit_0, logit_2`` misses a class and is refused);
* otherwise a glob is refused (its order would be the file's); an explicit list of names
  without such suffixes is taken in the order typed (the user stated the order).
"""

from __future__ import annotations

import re

__all__ = ["order_column_group"]

_SUFFIX = re.compile(r"^(.*?)(\d+)$")


def order_column_group(columns, *, spec: str, name: str = "array", where: str = "",
                       explicit: bool = False) -> list[str]:
    """``columns`` (the names a group spec matched) in class order, by the rule of the module docstring.

    Parameters
    ----------
    columns : sequence of str
        The matched column names, in file order (a glob) or as typed (``explicit=True``).
    spec : str
        The user's spec, for the message (``"logit_*"``).
    name, where : str
        The argument (``"logits"``) and the file, for the message.
    explicit : bool
        True for a comma list: names without a common prefix + integer suffix keep their order.

    Raises
    ------
    ValueError
        One line naming ``name``, the spec and the file when the order is ambiguous: names
        without a common prefix + integer suffix (glob only), a suffix repeated
        (``logit_1``, ``logit_01``) or missing from the run (``logit_0, logit_2``).

    Examples
    --------
    >>> names = sorted(f"logit_{j}" for j in range(11))  # file order: logit_0, logit_1, logit_10, ...
    >>> order_column_group(names, spec="logit_*")[-3:]
    ['logit_8', 'logit_9', 'logit_10']
    >>> order_column_group(["b", "a"], spec="b,a", explicit=True)
    ['b', 'a']
    """
    columns = [str(c) for c in columns]
    if len(columns) < 2:
        return columns
    where = f" of {where}" if where else ""
    parsed = [_SUFFIX.match(c) for c in columns]
    prefixes = {m.group(1) for m in parsed if m}
    if not all(parsed) or len(prefixes) != 1:
        if explicit:
            return columns
        odd = [c for c, m in zip(columns, parsed) if not m][:3] or sorted(prefixes)[:3]
        raise ValueError(f"{name}: the columns {spec!r} matches{where} do not name their class order "
                         f"(expected one prefix and a number, e.g. logit_0, logit_1, ...; got {odd}); "
                         "list the columns in class order as a,b,c")
    numbers = [int(m.group(2)) for m in parsed]
    if len(set(numbers)) != len(numbers):
        dup = sorted({c for c, k in zip(columns, numbers) if numbers.count(k) > 1})[:4]
        raise ValueError(f"{name}: the columns {spec!r} matches{where} repeat a class number ({dup}); "
                         "the class order is ambiguous")
    lo, hi = min(numbers), max(numbers)
    if hi - lo + 1 != len(numbers):
        missing = sorted(set(range(lo, hi + 1)) - set(numbers))[:4]
        prefix = next(iter(prefixes))
        raise ValueError(f"{name}: the columns {spec!r} matches{where} skip class number(s) "
                         f"{[f'{prefix}{k}' for k in missing]}; every class needs its column")
    return [c for _, c in sorted(zip(numbers, columns))]
