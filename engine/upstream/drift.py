"""What differs between a TensorRT-LLM tree and a policy version.

Two kinds of drift, both failing ``kvpolicy upstream check``:

- **rows and fields** the version states: a preference row missing, extra or different from the hook
  the tree's class has; a ``CacheTransceiverConfig`` field the tree has and the version refuses (or the
  reverse); a field's ``Literal`` values or default (the decisions' values and ``omitted``); a checkpoint
  rewrite target added or gone. These the tree says outright, so :mod:`.draft` can write them;
- **the baseline** the version records in ``[upstream]``: environment names and the fingerprints of the
  functions that are the rules. A moved fingerprint says "a person must re-read this function"; it is
  never drafted. A version without a baseline is drift too (nothing about the logic is known), as is a
  file of the tree that could not be read: no drift is claimed for what was not seen.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..read.fields import CACHE_TRANSCEIVER_FIELDS, DATED_FIELDS
from ..read.model import Policy, Row
from .extract import HOOKS, LOGIC, Facts, Where

__all__ = ["Drift", "KINDS", "compare", "version_env", "version_fields"]

#: Every kind of drift: its code (SARIF rule id, JSON), whether ``draft`` writes it, and what it means.
KINDS: dict[str, tuple[str, bool, str]] = {
    "row-missing": ("UPS001", True, "the tree's class prefers a value the version has no row for"),
    "row-extra": ("UPS002", True, "the version has a row the tree's classes do not (no hook, or no such architecture)"),
    "row-changed": ("UPS003", True, "the version's row and the tree's hook give different values"),
    "row-unreadable": ("UPS004", False, "a hook static analysis cannot evaluate, not recorded as read"),
    "field-added": ("UPS010", False, "a config field the tree has and the version refuses"),
    "field-removed": ("UPS011", False, "a config field the version accepts and the tree no longer has"),
    "field-values": ("UPS012", False, "a field's Literal values differ from the decision's values"),
    "field-default": ("UPS013", False, "a field's default differs from what the version says a left-out field requests"),
    "env-added": ("UPS020", False, "an environment name the decision area reads that the version has not reviewed"),
    "env-removed": ("UPS021", False, "an environment name the version knows that the tree no longer names"),
    "checkpoint-added": ("UPS030", False, "the checkpoint loader writes an architecture no checkpoint rule has"),
    "checkpoint-removed": ("UPS031", False, "a checkpoint rule's architecture the loader no longer writes"),
    "logic-changed": ("UPS040", False, "a function that is a rule changed since the version's baseline: re-read it"),
    "logic-missing": ("UPS041", False, "a function the baseline records is not in the tree (renamed or removed)"),
    "logic-added": ("UPS042", False, "a rule-bearing function the baseline does not record"),
    "no-baseline": ("UPS050", False, "the version records no [upstream] baseline: logic and environment unchecked"),
    "unread": ("UPS060", False, "a file kvpolicy could not read or a part of the tree it did not find"),
}


@dataclass(frozen=True)
class Drift:
    kind: str
    subject: str
    message: str
    old: str | None = None
    new: str | None = None
    where: Where | None = None
    """Where in the tree (file:line); None for what the tree lacks."""
    policy_line: int | None = None
    decision: str | None = None
    architecture: str | None = None

    @property
    def code(self) -> str:
        return KINDS[self.kind][0]

    @property
    def draftable(self) -> bool:
        return KINDS[self.kind][1]


def version_fields(policy: Policy) -> set[str]:
    """The ``cache_transceiver_config`` fields the version accepts."""
    tied = {f.config_field for f in policy.features.values() if f.config_field}
    return (set(CACHE_TRANSCEIVER_FIELDS) - set(DATED_FIELDS)) | tied


def version_env(policy: Policy) -> set[str]:
    """Every environment name the version models (features and conditions): what the resolver reads."""
    from ..evaluate.hints import read_env

    return set(read_env(policy))


def compare(facts: Facts, policy: Policy) -> list[Drift]:
    """Every drift between ``facts`` (one tree) and ``policy`` (one version), in a stable order."""
    found: list[Drift] = []
    for where, problem in facts.problems:
        found.append(Drift("unread", where.file, f"{where.file}: {problem}; its facts are unknown, so no drift is claimed for them", where=where))
    found += _rows(facts, policy)
    found += _fields(facts, policy)
    found += _checkpoints(facts, policy)
    found += _baseline(facts, policy)
    return found


def _rows(facts: Facts, policy: Policy) -> list[Drift]:
    found: list[Drift] = []
    baseline = policy.upstream.fingerprints if policy.upstream else {}
    for decision in HOOKS:
        spec = policy.decisions.get(decision)
        rows: dict[str, list[Row]] = {}
        for row in spec.preference.rows if spec and spec.preference else ():
            rows.setdefault(row.architecture, []).append(row)
        for arch, fact in sorted(facts.architectures.items()):
            if fact.unread:
                continue  # one `unread` item names the module and its architectures
            hook = fact.hooks[decision]
            mine = rows.get(arch, [])
            plain = next((r for r in mine if r.model_type is None), None)
            subject = f"{decision}: {arch}"
            if not hook.known:
                logic = facts.logic.get(hook.logic) if hook.logic else None
                if logic is not None and baseline.get(logic.name) == logic.fingerprint:
                    continue  # a person read this hook at this fingerprint; the version's rows stand
                says = ", ".join(_row_text(r) for r in mine) or "no row"
                todo = f"read {hook.logic} ({hook.where}) and record it (kvpolicy upstream draft)" if hook.logic else "read it by hand"
                found.append(
                    Drift(
                        "row-unreadable",
                        subject,
                        f"{arch}: {hook.why}; the version says {says}; {todo}",
                        _rows_value(mine),
                        None,
                        hook.where,
                        _line(mine),
                        decision,
                        arch,
                    )
                )
                continue
            if hook.value is None:
                for row in mine:
                    found.append(
                        Drift(
                            "row-extra",
                            subject,
                            f"{arch}: the version's row {_row_text(row)} has no hook behind it in the tree ({hook.why})",
                            _row_text(row),
                            None,
                            hook.where,
                            row.location.line,
                            decision,
                            arch,
                        )
                    )
                continue
            for row in mine:
                if row.model_type is not None:
                    found.append(
                        Drift(
                            "row-extra",
                            subject,
                            f"{arch}: the version branches on model_type {row.model_type!r}; the tree's hook does not ({hook.why})",
                            _row_text(row),
                            hook.value,
                            hook.where,
                            row.location.line,
                            decision,
                            arch,
                        )
                    )
            if plain is None:
                found.append(
                    Drift(
                        "row-missing",
                        subject,
                        f"{arch} prefers {hook.value} in the tree ({hook.why}); the version has no row",
                        None,
                        hook.value,
                        hook.where,
                        None,
                        decision,
                        arch,
                    )
                )
            elif plain.value != hook.value:
                found.append(
                    Drift(
                        "row-changed",
                        subject,
                        f"{arch}: the version says {plain.value}, the tree {hook.value} ({hook.why})",
                        plain.value,
                        hook.value,
                        hook.where,
                        plain.location.line,
                        decision,
                        arch,
                    )
                )
        for arch in sorted(set(rows) - set(facts.architectures)):
            for row in rows[arch]:
                found.append(
                    Drift(
                        "row-extra",
                        f"{decision}: {arch}",
                        f"{arch} is not registered in the tree (no @register_auto_model, not in _arch_index.py); "
                        f"the version's row {_row_text(row)} has nothing behind it",
                        _row_text(row),
                        None,
                        None,
                        row.location.line,
                        decision,
                        arch,
                    )
                )
    return found


def _row_text(row: Row) -> str:
    return row.value if row.model_type is None else f"{row.value} (model_type {row.model_type})"


def _rows_value(rows: list[Row]) -> str | None:
    return ", ".join(_row_text(r) for r in rows) or None


def _line(rows: list[Row]) -> int | None:
    return rows[0].location.line if rows else None


def _fields(facts: Facts, policy: Policy) -> list[Drift]:
    found: list[Drift] = []
    config = facts.fields.get("CacheTransceiverConfig")
    if config is None:
        return [
            Drift(
                "unread",
                "CacheTransceiverConfig",
                "no class CacheTransceiverConfig in tensorrt_llm/llmapi/: its fields are unknown, so no drift is claimed for them",
            )
        ]
    accepted = version_fields(policy)
    for name in sorted(set(config) - accepted):
        fact = config[name]
        found.append(
            Drift(
                "field-added",
                f"cache_transceiver_config.{name}",
                f"the tree's CacheTransceiverConfig has {name} (default {fact.default}); the version refuses a config that sets it: "
                "tie it to a feature (config_field) if it changes a verdict, else add it to kvpolicy's read/fields.py",
                None,
                name,
                fact.where,
            )
        )
    for name in sorted(accepted - set(config)):
        found.append(
            Drift(
                "field-removed",
                f"cache_transceiver_config.{name}",
                f"the version accepts cache_transceiver_config.{name}; the tree's CacheTransceiverConfig has no such field (upstream now refuses it)",
                name,
                None,
                None,
            )
        )
    for field_name, decision in (("transceiver_runtime", "transceiver_runtime"), ("backend", "backend")):
        literal_fact = config.get(field_name)
        spec = policy.decisions.get(decision)
        if literal_fact is None or spec is None or literal_fact.literals is None:
            continue
        mine = {v.upper() for v in spec.values} | {spec.auto.upper()}
        theirs = {v.upper() for v in literal_fact.literals}
        if mine != theirs:
            found.append(
                Drift(
                    "field-values",
                    f"cache_transceiver_config.{field_name}",
                    f"{field_name} takes {', '.join(sorted(theirs))} in the tree; the version's decision {decision} takes {', '.join(sorted(mine))}",
                    ", ".join(sorted(mine)),
                    ", ".join(sorted(theirs)),
                    literal_fact.where,
                    spec.location.line,
                    decision,
                )
            )
    found += _default(config.get("transceiver_runtime"), policy, "transceiver_runtime", {"auto": None, "null": None})
    kv = facts.fields.get("KvCacheConfig", {}).get("use_kv_cache_manager_v2")
    found += _default(kv, policy, "kv_cache_manager", {"auto": None, "true": "V2", "false": "V1", "null": None})
    return found


def _default(fact, policy: Policy, decision: str, meaning: dict[str, str | None]) -> list[Drift]:
    spec = policy.decisions.get(decision)
    if fact is None or spec is None:
        return []
    theirs = meaning.get(fact.default.lower(), fact.default)
    mine = spec.omitted.value if spec.omitted else None
    if theirs == mine:
        return []
    shown = mine if mine is not None else "the auto resolution (no omitted)"
    return [
        Drift(
            "field-default",
            f"{fact.owner}.{fact.name}",
            f"{fact.owner}.{fact.name} defaults to {fact.default} in the tree; in the version a left-out field requests {shown}",
            mine,
            theirs,
            fact.where,
            spec.location.line,
            decision,
        )
    ]


def _checkpoints(facts: Facts, policy: Policy) -> list[Drift]:
    found: list[Drift] = []
    mine: dict[str, int] = {}
    for rule in policy.checkpoint_rules:
        mine.setdefault(rule.architecture, rule.location.line)
    for arch in sorted(set(facts.checkpoint_targets) - set(mine)):
        where = facts.checkpoint_targets[arch]
        found.append(
            Drift(
                "checkpoint-added",
                arch,
                f"load_pretrained_config writes architectures = [{arch!r}] ({where}); no checkpoint rule loads a checkpoint "
                f"as {arch}: read the branch and add one",
                None,
                arch,
                where,
            )
        )
    for arch in sorted(set(mine) - set(facts.checkpoint_targets)):
        found.append(
            Drift(
                "checkpoint-removed",
                arch,
                f"the version's checkpoint rule loads {arch}; the tree's config_utils.py never writes it",
                arch,
                None,
                None,
                mine[arch],
            )
        )
    return found


def _baseline(facts: Facts, policy: Policy) -> list[Drift]:
    base = policy.upstream
    hooks = {h.logic for a in facts.architectures.values() for h in a.hooks.values() if h.logic}
    if base is None:
        rules = sorted(n for n in facts.logic if n not in hooks)
        return [
            Drift(
                "no-baseline",
                "[upstream]",
                f"version {policy.version} records no [upstream] baseline, so {len(rules)} rule-bearing functions and "
                f"{len(facts.env)} environment names of the tree are unchecked; after reading them, record them (kvpolicy upstream draft)",
                None,
                None,
                None,
                None,
            )
        ]
    found: list[Drift] = []
    line = base.location.line
    for name, fp in sorted(base.fingerprints.items()):
        fact = facts.logic.get(name)
        if fact is None:
            if name in hooks or "." in name and name.rpartition(".")[2].startswith("get_"):
                continue  # a hook no class of the tree reaches any more: its rows say so
            found.append(
                Drift(
                    "logic-missing",
                    name,
                    f"{name} is in the baseline ({LOGIC.get(name, 'a validator')}); the tree defines no such function "
                    "(renamed, moved or removed): find what replaced it and read it",
                    fp,
                    None,
                    None,
                    line,
                )
            )
        elif fact.fingerprint != fp:
            found.append(
                Drift(
                    "logic-changed",
                    name,
                    f"{name} ({fact.where}) changed since the baseline ({fp} -> {fact.fingerprint}): re-read it; what it decides may differ",
                    fp,
                    fact.fingerprint,
                    fact.where,
                    line,
                )
            )
    for name in sorted(set(facts.logic) - set(base.fingerprints) - hooks):
        fact = facts.logic[name]
        found.append(
            Drift(
                "logic-added",
                name,
                f"{name} ({fact.where}) decides part of the start-up path and is not in the baseline: read it",
                None,
                fact.fingerprint,
                fact.where,
                line,
            )
        )
    recorded = set(base.env)
    for name in sorted(set(facts.env) - recorded):
        found.append(
            Drift(
                "env-added",
                name,
                f"{name} is read by the decision area ({facts.env[name]}) and not in the baseline: read what it switches",
                None,
                name,
                facts.env[name],
                line,
            )
        )
    modelled = version_env(policy)
    for name in sorted((recorded | modelled) - set(facts.env)):
        found.append(
            Drift(
                "env-removed",
                name,
                f"{name} is {'modelled' if name in modelled else 'in the baseline'}; the tree's decision area no longer names it",
                name,
                None,
                None,
                line,
            )
        )
    return found
