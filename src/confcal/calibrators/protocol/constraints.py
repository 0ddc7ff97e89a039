"""Declarative constraints on hyper-parameters and fitted parameters.

Every calibrator class declares two tables (class attributes):

* ``hyper_constraints``: ``{name: spec}`` for the ``__init__`` arguments, checked
  by ``fit`` (scikit-learn style: ``__init__`` only stores) and by the manifest
  loader;
* ``fitted_constraints``: a :class:`Fields` spec for the ``parameters`` block of
  its manifest (what ``_get_fitted`` writes), checked by the loader before
  ``_set_fitted`` runs.

A spec checks one JSON value at a *path* and raises a one-line ``ValueError``
``"<where>: <path>: expected <what>, got <value>"``. Shapes are written with
symbols (``"n_classes"``, ``"n_features"``, ...): the first occurrence binds a
symbol, later ones must agree, and the loader binds ``n_classes`` from the
manifest first. Plain real parameters must lie in ``[-MAX_ABS, MAX_ABS]`` and
log-scale ones in ``[-MAX_LOG, MAX_LOG]`` (tighter on the side where ``exp`` of
them multiplies the logits): no fit produces values outside, and beyond them the
maps overflow float64 and return NaN.
"""

from __future__ import annotations

import abc
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

__all__ = ["Spec", "Real", "Int", "Bool", "Choice", "Text", "Nullable", "Array", "Fields", "Pairs", "Opt",
           "AnyJSON", "Rule", "ListOf", "GroupKey", "check_hyperparameters", "check_parameters", "check_manifest_top",
           "MAX_ABS", "MAX_LOG", "TEMPERATURE", "T_BOUNDS", "T_RULE", "NLL", "N_ITER", "SEED", "COMMON_HYPER",
           "optional_value", "without_missing", "GroupsAgree", "group_keys_of"]

#: largest magnitude of a plain real parameter (weights, biases, centroids)
MAX_ABS = 1e100
#: largest magnitude of a log-scale parameter (``exp`` of it stays finite in float64)
MAX_LOG = 700.0

_REPR_LIMIT = 60


def _show(value) -> str:
    text = " ".join(repr(value).split())  # one line: an array's repr spans several
    return text if len(text) <= _REPR_LIMIT else text[:_REPR_LIMIT - 3] + "..."


def _join(path: str, key) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if isinstance(key, str) and key.isidentifier():
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


class _Ctx:
    """Where the check runs (message prefix) and the shape symbols bound so far."""

    def __init__(self, where: str, env: dict[str, int] | None = None):
        self.where = where
        self.env = dict(env or {})

    def fail(self, path: str, what: str, value=None, *, got: str | None = None):
        raise ValueError(f"{self.where}: {path}: expected {what}, got {got if got is not None else _show(value)}")

    def bind(self, symbol: str, n: int, path: str, what: str, got: str | None = None) -> None:
        have = self.env.get(symbol)
        if have is None:
            self.env[symbol] = int(n)
        elif have != n:
            self.fail(path, f"{what} {symbol} = {have}".strip(), got=got if got is not None else str(n))


class Spec(abc.ABC):
    """Base class: ``check(value, path, ctx)`` returns the (unchanged) value or raises."""

    what = "a value"

    @abc.abstractmethod
    def check(self, value, path: str, ctx: _Ctx):
        """``value`` if it meets the spec, else a ``ValueError`` naming ``path``."""


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _bound_text(gt, ge, lt, le) -> str:
    parts = []
    if gt is not None:
        parts.append(f"> {gt:g}")
    if ge is not None:
        parts.append(f">= {ge:g}")
    if lt is not None:
        parts.append(f"< {lt:g}")
    if le is not None:
        parts.append(f"<= {le:g}")
    return " and ".join(parts)


@dataclass(frozen=True)
class Real(Spec):
    """A finite real number (int or float, never bool) within the given bounds.

    ``log=True`` marks a log-scale parameter (magnitude <= :data:`MAX_LOG`);
    otherwise the magnitude is at most ``max_abs`` (default :data:`MAX_ABS`). Bounds may be a number or a
    callable of the context's symbols (e.g. ``lambda env: 1 / env["n_classes"]``).
    """

    gt: Any = None
    ge: Any = None
    lt: Any = None
    le: Any = None
    log: bool = False
    max_abs: float | None = None

    def _bounds(self, ctx):
        ev = lambda b: b(ctx.env) if callable(b) else b  # noqa: E731
        return ev(self.gt), ev(self.ge), ev(self.lt), ev(self.le)

    def describe(self, ctx) -> str:
        text = _bound_text(*self._bounds(ctx))
        return "a finite number" + (f" {text}" if text else "")

    def check(self, value, path, ctx):
        if not _is_real(value):
            ctx.fail(path, self.describe(ctx), value)
        self.check_array(_as_float64([value]), path, ctx, scalar=True, raw=value)
        return value

    def check_array(self, a: np.ndarray, path: str, ctx: _Ctx, *, scalar: bool = False, raw=None) -> None:
        gt, ge, lt, le = self._bounds(ctx)
        cap = MAX_LOG if self.log else (MAX_ABS if self.max_abs is None else self.max_abs)
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(a) & (np.abs(a) <= cap)
            if gt is not None:
                ok &= a > gt
            if ge is not None:
                ok &= a >= ge
            if lt is not None:
                ok &= a < lt
            if le is not None:
                ok &= a <= le
        if ok.all():
            return
        i = np.unravel_index(int(np.flatnonzero(~ok.ravel())[0]), a.shape)
        where = path if scalar else path + "".join(f"[{j}]" for j in i)
        what = self.describe(ctx)
        if math.isfinite(cap) and (not (gt is not None or ge is not None or lt is not None or le is not None)
                                   or abs(a[i]) > cap):
            what += f" of magnitude <= {cap:g}"
        ctx.fail(where, what, raw if scalar else a[i].item())


@dataclass(frozen=True)
class Int(Spec):
    """An integer (Python or numpy int; never bool or float) in ``[ge, le]``.

    ``bind``: a shape symbol this value defines (or must equal, when already bound).
    """

    ge: int | None = None
    le: int | None = None
    bind: str | None = None

    def describe(self) -> str:
        text = _bound_text(None, self.ge, None, self.le)
        return "an integer" + (f" {text}" if text else "")

    def check(self, value, path, ctx):
        if (not _is_int(value) or (self.ge is not None and value < self.ge)
                or (self.le is not None and value > self.le)):
            ctx.fail(path, self.describe(), value)
        if self.bind:
            ctx.bind(self.bind, int(value), path, "the value")
        return value


@dataclass(frozen=True)
class Bool(Spec):
    def check(self, value, path, ctx):
        if not isinstance(value, (bool, np.bool_)):
            ctx.fail(path, "true or false", value)
        return value


@dataclass(frozen=True)
class Choice(Spec):
    values: tuple

    def __init__(self, *values):
        object.__setattr__(self, "values", tuple(values))

    def check(self, value, path, ctx):
        if not any(value == v and type(value) is type(v) for v in self.values):
            ctx.fail(path, "one of " + ", ".join(repr(v) for v in self.values), value)
        return value


@dataclass(frozen=True)
class Text(Spec):
    def check(self, value, path, ctx):
        if not isinstance(value, str):
            ctx.fail(path, "a string", value)
        return value


@dataclass(frozen=True)
class AnyJSON(Spec):
    """Any value (free-form records such as the fit record's contents)."""

    def check(self, value, path, ctx):
        return value


def reg_grid_pairs(grid, path: str = "reg_grid", ctx: "_Ctx | None" = None) -> list[tuple[float, float]]:
    """ODIR's ``reg_grid`` (lambda values, ``mu = lambda``, or ``[lambda, mu]`` pairs; a list, tuple or
    array of shape ``(n,)`` or ``(n, 2)``) as ``(lambda, mu)`` float pairs, strongest first (sorted by
    lambda, then mu, descending) and each point once: the cross-validation path warm-starts from the
    strongest penalty down and stops after points worse than the best, which a repeat would be.

    Raises ValueError naming ``path`` (and the entry) for anything else: a scalar, a string, a
    generator, an empty grid, a pair of other than 2 numbers, a bool, NaN, a negative value or one
    above :data:`MAX_ABS` (a manifest could not hold the fitted penalty)."""
    def fail(where, what, value):
        if ctx is not None:  # inside a hyper-parameter check: its prefix ("ms: ", "manifest: ...")
            ctx.fail(where, what, value)
        raise ValueError(f"{where}: expected {what}, got {_show(value)}")

    lists = (list, tuple, np.ndarray)
    want = "a non-empty list of lambda values or [lambda, mu] pairs"
    if not isinstance(grid, lists) or (isinstance(grid, np.ndarray) and grid.ndim == 0) or len(grid) == 0:
        fail(path, want, grid)
    pairs = []
    for i, g in enumerate(grid):
        flat = isinstance(g, (list, tuple)) or (isinstance(g, np.ndarray) and g.ndim == 1)
        items = [g, g] if _is_real(g) else (list(g) if flat else None)
        if items is None or len(items) != 2:
            fail(_join(path, i), "a lambda value or a [lambda, mu] pair", g)
        for j, v in enumerate(items):
            if not _is_real(v) or not 0 <= v <= MAX_ABS:  # NaN, inf and a 400-digit int fail the comparison
                where = _join(path, i) if _is_real(g) else _join(_join(path, i), j)
                fail(where, f"a number in [0, {MAX_ABS:g}]", v)
        pairs.append((float(items[0]), float(items[1])))
    return sorted(set(pairs), reverse=True)


@dataclass(frozen=True)
class RegGrid(Spec):
    """ODIR's ``reg_grid``: see :func:`reg_grid_pairs`."""

    def check(self, value, path, ctx):
        reg_grid_pairs(value, path, ctx)
        return value


@dataclass(frozen=True)
class Nullable(Spec):
    inner: Spec

    def check(self, value, path, ctx):
        return None if value is None else self.inner.check(value, path, ctx)


@dataclass(frozen=True)
class Opt:
    """Marks a key of :class:`Fields` that may be missing (older manifests, optional diagnostics)."""

    spec: Spec


def _nested_shape(value, path: str, ctx: _Ctx, what: str) -> tuple[int, ...]:
    """Shape of a rectangular nested list of numbers; fails naming the first ragged/odd entry."""
    if isinstance(value, np.ndarray):
        return value.shape
    if not isinstance(value, (list, tuple)):
        return ()
    if not value:
        return (0,)
    shapes = [_nested_shape(v, _join(path, i), ctx, what) for i, v in enumerate(value)]
    for i, s in enumerate(shapes):
        if s != shapes[0]:
            ctx.fail(path, what, got=f"a ragged array ({_join(path, 0)} has shape {shapes[0]}, "
                                     f"{_join(path, i)} has shape {s})")
    return (len(value),) + shapes[0]


def _as_float64(value) -> np.ndarray:
    """``value`` (nested lists of numbers) as float64, a JSON integer beyond float64 (10**400) as +-inf,
    so that the range check names it instead of the conversion raising."""
    try:
        return np.asarray(value, dtype=np.float64)
    except OverflowError:
        def clamp(v):
            if isinstance(v, (list, tuple)):
                return [clamp(u) for u in v]
            try:
                return float(v)
            except OverflowError:
                return math.inf if v > 0 else -math.inf
        return np.asarray(clamp(value), dtype=np.float64)


def _first_bad_leaf(value, path: str, ok: Callable[[Any], bool]):
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found = _first_bad_leaf(v, _join(path, i), ok)
            if found is not None:
                return found
        return None
    return None if ok(value) else (path, value)


@dataclass(frozen=True)
class Array(Spec):
    """A nested list (or numpy array) of the given shape whose entries satisfy ``elem``.

    ``shape`` entries: an int, a symbol (bound on first use, see module docstring) or
    ``None`` (any length). Every dimension must be at least 1.
    """

    shape: tuple
    elem: Spec = Real()

    def check(self, value, path, ctx):
        sym = "(" + ", ".join(str(s) if s is not None else "n" for s in self.shape) + \
              ("," if len(self.shape) == 1 else "") + ")"
        what = f"an array of shape {sym}"
        if not isinstance(value, (list, tuple, np.ndarray)) and self.shape:
            ctx.fail(path, what, value)
        shape = _nested_shape(value, path, ctx, what)
        if len(shape) != len(self.shape) or 0 in shape:
            ctx.fail(path, what, got=f"shape {shape}")
        for n, s in zip(shape, self.shape):
            if isinstance(s, int) and n != s:
                ctx.fail(path, what, got=f"shape {shape}")
            if isinstance(s, str):
                ctx.bind(s, n, path, f"{what} with", got=f"shape {shape}")
        elem = self.elem
        if isinstance(value, np.ndarray):
            ok_type = {Real: lambda a: np.issubdtype(a.dtype, np.number) and a.dtype != bool,
                       Int: lambda a: np.issubdtype(a.dtype, np.integer),
                       Bool: lambda a: a.dtype == bool}.get(type(elem), lambda a: True)
            if not ok_type(value):
                ctx.fail(path, f"{what} of numbers", got=f"dtype {value.dtype}")
            leaves_ok = True
        else:
            test = {Real: _is_real, Int: _is_int, Bool: lambda v: isinstance(v, bool)}.get(type(elem))
            leaves_ok = test is None
            if test is not None:
                bad = _first_bad_leaf(value, path, test)
                if bad is not None:
                    kind = {Real: "a number", Int: "an integer", Bool: "true or false"}[type(elem)]
                    ctx.fail(bad[0], kind, bad[1])
        if isinstance(elem, Real):
            elem.check_array(_as_float64(value), path, ctx)
        elif isinstance(elem, Int) and (elem.ge is not None or elem.le is not None):
            a = np.asarray(value)
            ok = np.ones(a.shape, dtype=bool)
            if elem.ge is not None:
                ok &= a >= elem.ge
            if elem.le is not None:
                ok &= a <= elem.le
            if not ok.all():
                i = np.unravel_index(int(np.flatnonzero(~ok.ravel())[0]), a.shape)
                ctx.fail(path + "".join(f"[{j}]" for j in i), elem.describe(), a[i].item())
        elif leaves_ok and not isinstance(elem, (Real, Int, Bool)):
            for idx in np.ndindex(*shape):
                v = value
                for j in idx:
                    v = v[j]
                elem.check(v, path + "".join(f"[{j}]" for j in idx), ctx)
        return value


@dataclass(frozen=True)
class Pairs(Spec):
    """A list of ``[key, value]`` pairs (a JSON-safe dict with non-string keys); keys unique."""

    key: Spec
    value: Spec
    nonempty: bool = False

    def check(self, value, path, ctx):
        if not isinstance(value, (list, tuple)):
            ctx.fail(path, "a list of [key, value] pairs", value)
        if self.nonempty and not value:
            ctx.fail(path, "at least one [key, value] pair", value)
        seen = set()
        for i, pair in enumerate(value):
            p = _join(path, i)
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                ctx.fail(p, "a [key, value] pair", pair)
            self.key.check(pair[0], _join(p, 0), ctx)
            k = repr(pair[0])
            if k in seen:
                ctx.fail(_join(p, 0), "a key not used before", pair[0])
            seen.add(k)
            self.value.check(pair[1], _join(p, 1), ctx)
        return value


@dataclass(frozen=True)
class ListOf(Spec):
    """A list whose items all satisfy ``item``: any length, or ``length`` (an int or a callable of the
    context's symbols, e.g. :func:`per_class_maps`)."""

    item: Spec
    length: Any = None

    def check(self, value, path, ctx):
        if not isinstance(value, (list, tuple)):
            ctx.fail(path, "a list", value)
        if self.length is not None:
            want = self.length(ctx.env) if callable(self.length) else self.length
            if want is not None and len(value) != want:
                ctx.fail(path, f"a list of {want} entries"
                         + (f" (n_classes = {ctx.env['n_classes']})" if "n_classes" in ctx.env else ""),
                         got=f"{len(value)} entries")
        if type(self.item) is Real and len(value) > 64 and all(_is_real(v) for v in value):
            # a long list of numbers (a 10,000-bin map: 1.8 -> 0.2 s to load 10 of them) in one array check;
            # on a refusal the item loop below names the first bad item as it always did
            try:
                self.item.check_array(_as_float64(value), path, ctx)
                return value
            except ValueError:
                pass
        for i, v in enumerate(value):
            self.item.check(v, _join(path, i), ctx)
        return value


def per_class_maps(env) -> int | None:
    """How many one-vs-rest maps a manifest holds: one per class, one for 2 classes (the positive class)."""
    k = env.get("n_classes")
    return None if k is None else (1 if k == 2 else k)


@dataclass(frozen=True)
class GroupKey(Spec):
    """A group key: an int or string id, or a list of them (a crossed group)."""

    def check(self, value, path, ctx):
        parts = value if isinstance(value, list) else [value]
        for i, v in enumerate(parts):
            if not (isinstance(v, str) or _is_int(v)):
                ctx.fail(_join(path, i) if isinstance(value, list) else path, "an int or string id", v)
        return value


@dataclass(frozen=True)
class GroupsAgree:
    """The group lists of a grouped fit describe the same groups (a rule of :class:`Fields`).

    ``groups`` (``[[key, map], ...]``: the groups with their own map), ``fallback_groups`` (groups seen at
    fit time that use the pooled map) and ``group_counts`` (``[[key, n], ...]``: one count per group seen
    at fit time) are written by one fit (:func:`confcal.calibrators.grouping.fit_groups`): a fallback group
    is listed once and has no map of its own, and the counts name exactly the groups of the other two
    lists. A count naming another group would make :func:`~confcal.calibrators.grouping.route_groups`
    take rows of an unseen group for seen ones (no warning). Either list may be missing (older manifests);
    then only what is there is compared.
    """

    groups: str = "groups"
    fallback: str = "fallback_groups"
    counts: str = "group_counts"

    def check(self, obj: dict, path: str, ctx: _Ctx) -> None:
        at = (lambda name: _join(path, name))  # noqa: E731
        pairs = obj.get(self.groups) or []
        own = [repr(p[0]) for p in pairs if isinstance(p, (list, tuple)) and len(p) == 2]
        fallback = obj.get(self.fallback)
        if isinstance(fallback, (list, tuple)):
            seen: set = set()
            for i, key in enumerate(fallback):
                if repr(key) in seen:
                    ctx.fail(_join(at(self.fallback), i), "a group not listed before", key)
                if repr(key) in own:
                    ctx.fail(_join(at(self.fallback), i), f"a group without its own map in {at(self.groups)} "
                             "(a group fitted on its own rows does not fall back)", key)
                seen.add(repr(key))
        counts = obj.get(self.counts)
        if not isinstance(counts, (list, tuple)):
            return
        listed = own + [repr(k) for k in (fallback if isinstance(fallback, (list, tuple)) else [])]
        keys = [repr(p[0]) for p in counts if isinstance(p, (list, tuple)) and len(p) == 2]
        for i, key in enumerate(keys):
            if key not in listed:
                ctx.fail(_join(_join(at(self.counts), i), 0), f"a group of {at(self.groups)} or "
                         f"{at(self.fallback)} (the counts are of the groups seen at fit time)", got=key)
        missing = [key for key in listed if key not in keys]
        if missing:
            ctx.fail(at(self.counts), f"one count per group of {at(self.groups)} and {at(self.fallback)} "
                     f"({len(own)} + {len(listed) - len(own)} = {len(listed)} entries)",
                     got=f"{len(keys)} entries, none for {missing[0]}")


@dataclass(frozen=True)
class Rule:
    """A relation between fields: ``test(values) -> bool``, ``message`` says what was expected.

    ``names`` are keys of the same :class:`Fields` dict; the rule is skipped when any is
    missing or null.
    """

    names: tuple[str, ...]
    test: Callable[..., bool]
    message: str
    #: ``show(*values) -> str``: what the refusal says it got (default: the values' reprs, cut short)
    show: Callable[..., str] | None = None
    #: ``message`` may name another field by its full path as ``{at}.name`` (``{at}``: the dict's path), so
    #: a refusal names every field that may be the wrong one

    def check(self, obj: dict, path: str, ctx: _Ctx) -> None:
        vals = [obj.get(n) for n in self.names]
        if any(v is None for v in vals):
            return
        if not self.test(*vals):
            shown = (self.show(*vals) if self.show is not None
                     else ", ".join(f"{n}={_show(v)}" for n, v in zip(self.names, vals)))
            message = self.message.replace("{at}.", f"{path}." if path else "") if "{at}." in self.message else self.message
            ctx.fail(_join(path, self.names[0]), message, got=shown)


@dataclass(frozen=True)
class Fields(Spec):
    """A dict with exactly these keys (``Opt`` ones may be missing); unknown keys are refused.

    ``tag`` / ``variants``: the dict's other keys depend on the value of the field ``tag``
    (e.g. a logit map's config and state depend on the map's name).
    """

    fields: dict
    rules: tuple = ()
    tag: str | None = None
    variants: dict = field(default_factory=dict)
    extra_ok: bool = False

    def _table(self, value) -> dict:
        table = dict(self.fields)
        if self.tag is not None:
            table.update(self.variants.get(value.get(self.tag), {}))
        return table

    def check(self, value, path, ctx):
        if not isinstance(value, dict):
            ctx.fail(path or "value", "a JSON object (dict)", value)
        if self.tag is not None:
            self.fields[self.tag].check(value.get(self.tag), _join(path, self.tag), ctx)
        table = self._table(value)
        for key in value:
            if key not in table and not self.extra_ok:
                known = ", ".join(sorted(table))
                ctx.fail(_join(path, str(key)), f"no such key (known: {known})", got="an unknown key")
        for key, spec in table.items():
            if key not in value:
                if isinstance(spec, Opt):
                    continue
                ctx.fail(_join(path, key), "this key to be present", got="nothing (missing)")
            (spec.spec if isinstance(spec, Opt) else spec).check(value[key], _join(path, key), ctx)
        for rule in self.rules:
            rule.check(value, path, ctx)
        return value


# ------------------------------------------------------------------ common entries
TEMPERATURE = Real(gt=0)
T_BOUNDS = {"t_min": Real(gt=0), "t_max": Real(gt=0)}
T_RULE = Rule(("t_min", "t_max"), lambda lo, hi: lo < hi, "t_min < t_max")
#: a fitted objective kept for the record (never used to predict): any finite value, however large
#: (logits of magnitude 1e150 give one of 1e150 and must still load)
NLL = Opt(Real(ge=-1e-9, max_abs=math.inf))  # a mean negative log-likelihood: >= 0 up to rounding (T34)
N_ITER = Opt(Int(ge=0))
SEED = Nullable(Int(ge=0, le=2 ** 32 - 1))


# ------------------------------------------------------------------ optional diagnostics
# The fitted objective (``nll``, ``base_nll``), the optimiser's ``n_iter`` / ``converged``, ``at_bound``,
# ``fallback`` and ``tie_rate`` describe a fit and are never used to predict. Their absence is allowed
# (``Opt`` in the tables): format_version 1 is the only manifest version, so it cannot tell a manifest
# written before a method recorded one of them from a later one, and hand-written manifests of version 1
# carry the map alone. A value that is present is checked (range, type); one that is absent stays absent:
# loading gives ``None`` (not 0, False or NaN, which would read as a fact about the fit) and writing the
# calibrator again leaves the key out.
def optional_value(params: dict, key: str, conv: Callable[[Any], Any]):
    """``conv(params[key])``, or ``None`` when the manifest has no ``key`` (see the comment above)."""
    value = params.get(key)
    return None if value is None else conv(value)


def without_missing(values: dict) -> dict:
    """``values`` less the entries that are ``None`` (optional diagnostics a loaded manifest lacked)."""
    return {k: v for k, v in values.items() if v is not None}
#: hyper-parameters every calibrator may have (added by the base class)
COMMON_HYPER = {"input_kind": Choice("logits", "probs")}


def _hyper_table(cls) -> dict:
    return {**COMMON_HYPER, **getattr(cls, "hyper_constraints", {})}


def check_hyperparameters(cls, params: dict, *, where: str | None = None, env: dict | None = None,
                          path: str = "") -> dict:
    """Check ``params`` (``{name: value}``) against ``cls``'s table; returns the bound shape symbols.

    ``path`` prefixes the names in messages (``"hyperparameters"`` in a manifest).
    Names missing from the table are not checked here (a test requires every
    ``__init__`` argument of every registered method to have an entry).
    """
    where = where or (getattr(cls, "method", "") or cls.__name__)
    ctx = _Ctx(where, env)
    table = _hyper_table(cls)
    for name, value in params.items():
        spec = table.get(name)
        if spec is not None:
            (spec.spec if isinstance(spec, Opt) else spec).check(value, _join(path, name), ctx)
    for rule in getattr(cls, "hyper_rules", ()):
        rule.check(params, path, ctx)
    return ctx.env


def check_parameters(cls, params, *, env: dict, where: str = "manifest", path: str = "parameters",
                     hyper: dict | None = None) -> None:
    """Check a manifest's fitted ``parameters`` block against ``cls.fitted_constraints``.

    A class whose parameter layout depends on its hyper-parameters (a composition such as
    ``GroupedCalibrator(base=...)``) gives its table by ``cls.fitted_spec(hyper)`` instead.
    """
    spec = getattr(cls, "fitted_constraints", None)
    if spec is None and hyper is not None and hasattr(cls, "fitted_spec"):
        spec = cls.fitted_spec(hyper, where=where)
    if spec is None:
        raise ValueError(f"{where}: method {cls.method!r} declares no fitted_constraints; it cannot be "
                         "loaded safely")
    spec.check(params, path, _Ctx(where, env))
    for rule in getattr(cls, "hyper_parameter_rules", ()):  # fitted values against the manifest's own limits
        msg = rule(hyper or {}, params)
        if msg:
            raise ValueError(f"{where}: {path}.{msg}")


def temperature_within_bounds(hyper: dict, params: dict) -> str | None:
    """``temperature`` inside ``[t_min, t_max]`` of the same manifest (a fit never leaves them;
    relative slack 1e-9 for the round trip through JSON)."""
    t, lo, hi = params.get("temperature"), hyper.get("t_min"), hyper.get("t_max")
    if not all(_is_real(v) for v in (t, lo, hi)):
        return None
    if not lo * (1 - 1e-9) <= t <= hi * (1 + 1e-9):
        return f"temperature: expected a number in [t_min, t_max] = [{lo:g}, {hi:g}], got {_show(t)}"
    return None


def group_keys_of(parts, what: str) -> Callable[[dict, dict], str | None]:
    """A ``hyper_parameter_rules`` entry: every group key of ``parameters`` (``groups[i][0]``,
    ``group_counts[i][0]``, ``fallback_groups[i]``) has the form the hyper-parameters give it.

    ``parts(hyper, params)`` is None for a plain id (one grouping column) or ``n``: a list of ``n`` ids (the
    columns crossed; ``n = 0``: no groups); ``what`` says why, in the message. A key of another form names
    no group the fit made, so its rows would silently take the pooled map."""
    def rule(hyper: dict, params: dict) -> str | None:
        n = parts(hyper, params)
        lists = [("groups", [p[0] if isinstance(p, (list, tuple)) and p else None for p in params.get("groups") or []]),
                 ("group_counts", [p[0] if isinstance(p, (list, tuple)) and p else None
                                   for p in params.get("group_counts") or []]),
                 ("fallback_groups", list(params.get("fallback_groups") or []))]
        for name, keys in lists:
            for i, key in enumerate(keys):
                ok = not isinstance(key, list) if n is None else isinstance(key, list) and len(key) == n
                if not ok:
                    at = f"{name}[{i}][0]" if name != "fallback_groups" else f"{name}[{i}]"
                    form = "a single id" if n is None else f"a list of {n} id(s)"
                    return f"{at}: expected a group key of {form} ({what(hyper, params)}), got {_show(key)}"
        return None

    return rule


def increasing_slopes(hyper: dict, params: dict) -> str | None:
    """With ``increasing`` (the default), every Platt slope ``a`` (pooled and per group) is >= 0:
    a negative one would reverse the detector's ranking."""
    if not hyper.get("increasing", True):
        return None
    maps = [("pooled", params.get("pooled"))]
    for i, item in enumerate(params.get("groups") or []):
        if isinstance(item, (list, tuple)) and len(item) == 2:
            maps.append((f"groups[{i}][1]", item[1]))
    for where, m in maps:
        if isinstance(m, dict) and _is_real(m.get("a")) and m["a"] < 0:
            return (f"{where}.a: expected a slope >= 0 (hyper-parameter increasing=true keeps the ranking), "
                    f"got {_show(m['a'])}")
    return None


_TOP = Fields({
    "format": Text(),
    "format_version": Int(ge=1),
    "method": Text(),
    "hyperparameters": Fields({}, extra_ok=True),
    "parameters": Fields({}, extra_ok=True),
    "n_classes": Int(ge=2),  # a one-logit binary head counts as 2 classes
    "fit": Opt(Nullable(Fields({}, extra_ok=True))),
})


def check_manifest_top(manifest, *, fmt: str, version: int) -> None:
    """Top level of a manifest: the agreed keys only, with the right types."""
    ctx = _Ctx("manifest")
    if not isinstance(manifest, dict):
        raise ValueError(f"manifest: expected a JSON object (dict), got {type(manifest).__name__}")
    _TOP.check(manifest, "", ctx)
    if manifest["format"] != fmt:
        ctx.fail("format", repr(fmt), manifest["format"])
    if manifest["format_version"] > version:
        ctx.fail("format_version", f"1..{version} (this confcal reads up to {version}; the file is newer)",
                 manifest["format_version"])
