"""The check of decision-index data read back from the cache, before anything is built from it.

An index stored by :mod:`kvpolicy.read.cache` is untrusted input from disk: the cache checks an
entry's header and digest, not what the data says. :func:`check_index` accepts only the shape and
types :func:`kvpolicy.evaluate.index.build_index` gives: message templates with plain ``{name}``
placeholders only, known decision names and severities, every rule, row and condition as built.
What passes can be used as a freshly built index is (:mod:`kvpolicy.evaluate.compiler` never puts a
string from it into code).
"""

from __future__ import annotations

from _string import formatter_parser  # what string.Formatter().parse calls

from .index import FORMAT

TYPE_CHECKING = False  # typing itself costs a cold start milliseconds
if TYPE_CHECKING:
    from typing import Any

__all__ = ["check_index"]


class _Bad(Exception):
    pass


def _expect(ok: bool) -> None:
    if not ok:
        raise _Bad


def _strs(value: Any) -> None:
    _expect(type(value) is list and all(type(v) is str for v in value))


def _opt_str(value: Any) -> None:
    _expect(value is None or type(value) is str)


def _check_condition(c: Any) -> None:
    _expect(type(c) is dict and set(c) == {"subjects", "requested", "timeout", "features", "env"})
    for key in ("subjects", "requested", "env"):
        _expect(type(c[key]) is list)
        for item in c[key]:
            _expect(type(item) is list and len(item) == 3 and type(item[0]) is str and type(item[2]) is bool)
            _strs(item[1])
            _expect(bool(item[1]))
    _expect(c["timeout"] in (None, "finite", "null"))
    _expect(type(c["features"]) is list)
    for item in c["features"]:
        _expect(type(item) is list and len(item) == 2 and type(item[0]) is str and type(item[1]) is bool)
    for item in c["subjects"]:
        _expect(item[0] in ("architecture", "model_type", "backend", "transceiver_runtime", "kv_cache_manager"))


#: Names a message may use in ``{...}`` (as the loader's ``PLACEHOLDERS``).
_PLACEHOLDERS = frozenset({"backend", "transceiver_runtime", "kv_cache_manager", "architecture", "model_type", "kv_transfer_timeout_ms", "preferred"})


def _check_template(text: Any) -> None:
    """A message template as the loader accepts them: plain ``{name}`` placeholders only (a
    format spec such as ``{x:>99999999}`` would write 100 MB)."""
    _expect(type(text) is str)
    try:
        parsed = list(formatter_parser(text))
    except ValueError:
        raise _Bad from None
    for _, field, spec, conversion in parsed:
        _expect(field is None or (field in _PLACEHOLDERS and not spec and not conversion))


def _check_notice(n: Any) -> None:
    _expect(n is None or (type(n) is list and len(n) == 4 and all(type(v) is str for v in n)))
    if n is not None:
        _expect(n[1] in ("error", "warning", "info"))
        _check_template(n[3])


def _check_rule(r: Any) -> None:
    _expect(type(r) is dict and set(r) == {"id", "value", "when", "text", "reason", "location", "notice"})
    for key in ("id", "value", "text", "location"):
        _expect(type(r[key]) is str)
    _opt_str(r["reason"])
    _check_condition(r["when"])
    _check_notice(r["notice"])


def check_index(data: Any) -> None:
    """Raise ValueError unless ``data`` has the shape and types :func:`build_index` gives."""
    try:
        _check(data)
    except (_Bad, KeyError, TypeError, AttributeError):
        raise ValueError("not a kvpolicy decision index") from None


def _check(d: Any) -> None:
    _expect(type(d) is dict and d.get("format") == FORMAT)
    for key in ("version", "digest"):
        _expect(type(d[key]) is str)
    for key in ("features", "architectures"):
        _strs(d[key])
    _expect(type(d["checkpoint_rules"]) is list)
    for rule in d["checkpoint_rules"]:
        _expect(type(rule) is list and len(rule) == 5 and type(rule[0]) is str and type(rule[3]) is str and type(rule[4]) is str)
        _strs(rule[1])
        _expect(rule[2] is None or type(rule[2]) is bool)
    for key in ("env_features", "flag_features", "known_env"):
        _expect(type(d[key]) is list)
        for item in d[key]:
            _expect(type(item) is list and len(item) == 2 and type(item[0]) is str)
    for _, name in d["env_features"] + d["flag_features"]:
        _expect(type(name) is str)
    for _, values in d["known_env"]:
        _strs(values)
    _expect(type(d["decisions"]) is list and bool(d["decisions"]))
    names = [decision["name"] for decision in d["decisions"]]
    _expect(len(set(names)) == len(names) and set(names) <= {"backend", "transceiver_runtime", "kv_cache_manager"})
    for decision in d["decisions"]:
        _expect(type(decision["name"]) is str and type(decision["auto"]) is str and type(decision["null_decides"]) is bool)
        _expect(type(decision["omitted"]) is str and (decision["omitted"] == decision["auto"] or decision["omitted"] in decision["values"]))
        _opt_str(decision["omitted_source"])
        _strs(decision["values"])
        _opt_str(decision["null"])
        for key in ("requirements", "conditionals", "adjustments"):
            _expect(type(decision[key]) is list)
            for rule in decision[key]:
                _check_rule(rule)
        _check_rule(decision["default"])
        rows = decision["rows"]
        if rows is None:
            _expect(decision["adopt"] is None and decision["on_not_adopted"] is None)
        else:
            _expect(type(rows) is dict and type(rows["plain"]) is dict and type(rows["qualified"]) is list)
            for row in rows["plain"].values():
                _expect(type(row) is list and len(row) == 2 and type(row[0]) is str and type(row[1]) is str)
            for row in rows["qualified"]:
                _expect(type(row) is list and len(row) == 4 and all(type(v) is str for v in row))
            _check_condition(decision["adopt"])
            _check_notice(decision["on_not_adopted"])
    _expect(type(d["constraints"]) is list)
    for c in d["constraints"]:
        _expect(type(c) is dict)
        for key in ("id", "location"):
            _expect(type(c[key]) is str)
        _check_template(c["message"])
        _check_template(c["fix"])
        _expect(c["severity"] in ("warning", "error"))
        _expect(c["decision"] is None or c["decision"] in names)
        _check_condition(c["when"])
