"""Mutation testing of the decision core and the transfer checks (``make mutate``).

Cosmic Ray makes each mutant (one small change to one module: ``==`` to ``!=``, ``not`` added or
dropped, a loop that never runs, a number off by one) in the file itself, runs that module's few
test files (``modules.toml``) and restores the file. A mutant no test notices ("survived") is a
behaviour nothing checks, or a change that cannot change behaviour (an equivalent mutant). Every
survivor is reviewed once and listed, by its id, in ``survivors.md``; a run fails when it finds one
that is not listed, so a new gap is seen the week it appears.

Cosmic Ray, not mutmut: mutmut 3 copies the sources into ``mutants/`` and names its mutants after the
file's path (``engine.evaluate.index``), while the tests import ``kvpolicy.evaluate.index`` (``package-dir`` maps
``kvpolicy`` to ``engine/``): none of its mutants would ever be switched on. Cosmic Ray changes the
file in place and runs a command, so any layout works. Never run it in a tree someone is editing.

Usage (``make mutate`` runs every module)::

    python -m tests.mutation.run [MODULE ...] [--minutes N] [--sample PERCENT]
                                 [--retest-survivors [--retest-with TEST ...]] [--list] [--report]

Sessions live in ``build/mutation/`` (``cr-report build/mutation/engine_evaluate_index.sqlite``
shows one; ``--report`` writes the figures and the unreviewed survivors so far, with their diffs,
to ``report.md`` and ``unreviewed-so-far.md`` there, while a run goes on);
a run resumes where the last stopped while the module and the mutation settings are unchanged, and
starts again when either changes. Verdicts outlive a change of the tests: after adding a test, run
with ``--retest-survivors``; delete ``build/mutation/`` to start over.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from cosmic_ray.mutating import mutate_and_test
from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
MODULES = HERE / "modules.toml"
SURVIVORS = HERE / "survivors.md"
WORK = ROOT / "build" / "mutation"

#: Cosmic Ray replaces each binary and comparison operator with every other one (``+`` by ``-``,
#: ``*``, ``/``, ``//``, ``%``, ``**``, ``<<``, ...): ten mutants where one or two find the same gap.
#: These keep, for each operator, the slip a person makes: ``+``/``-``, ``|``/``&``, ``==``/``!=``,
#: ``is``/``is not``, ``<``/``<=`` (the boundary) and ``<``/``>=`` (the negation); ``not`` dropped.
#: Decorators are not removed (``@property``, ``@staticmethod``, ``@dataclass``: every use breaks, or,
#: for ``functools.cache``, nothing does).
EXCLUDED_OPERATORS = [
    r"core/ReplaceBinaryOperator_(?!(Add_Sub|Sub_Add|Mul_Div|Div_Mul|FloorDiv_Div|Mod_FloorDiv|Pow_Mul"
    r"|LShift_RShift|RShift_LShift|BitOr_BitAnd|BitAnd_BitOr|BitXor_BitOr)$)",
    r"core/ReplaceComparisonOperator_(?!(Eq_NotEq|NotEq_Eq|Is_IsNot|IsNot_Is|Lt_LtE|LtE_Lt|Gt_GtE|GtE_Gt"
    r"|Lt_GtE|GtE_Lt|Gt_LtE|LtE_Gt)$)",
    r"core/ReplaceUnaryOperator_(?!(Delete_Not|USub_UAdd)$)",
    r"core/RemoveDecorator",
]

SKIP_ANNOTATION = "skipped: in an annotation (never evaluated under `from __future__ import annotations`)"
SKIP_SAMPLE = "skipped: not in the sample"
SKIP_FUNCTION = "skipped: outside the functions this module is mutated for (modules.toml)"


@dataclass(frozen=True)
class Target:
    """One module to mutate and the test files that exercise it."""

    module: str
    tests: tuple[str, ...]
    timeout_floor: float
    why: str
    functions: tuple[str, ...] = ()
    wider: tuple[str, ...] = ()

    @property
    def stem(self) -> str:
        return self.module.removesuffix(".py").replace("/", "_")

    def command(self, tests: tuple[str, ...] | None = None) -> str:
        # -x: the first failing test kills the mutant; -p no:cacheprovider: no .pytest_cache writes
        # from hundreds of runs; a fixed hypothesis seed: a mutant's verdict does not depend on luck.
        args = [sys.executable, "-m", "pytest", "-x", "-q", "--no-header", "-p", "no:cacheprovider", "--hypothesis-seed=0"]
        return shlex.join(args + list(self.tests if tests is None else tests))


def load_targets() -> dict[str, Target]:
    """The modules of ``modules.toml``, in the order they are listed there."""
    data = tomllib.loads(MODULES.read_text(encoding="utf-8"))
    targets = {}
    for module, spec in data["modules"].items():
        targets[module] = Target(
            module,
            tuple(spec["tests"]),
            float(spec.get("timeout_floor", 20)),
            spec.get("why", ""),
            tuple(spec.get("functions", ())),
            tuple(spec.get("wider", ())),
        )
    return targets


# -- session: init, filters, resume ------------------------------------------------------------


def config_text(target: Target, timeout: float) -> str:
    quoted = ", ".join(f'"{e}"' for e in (p.replace("\\", "\\\\") for p in EXCLUDED_OPERATORS))
    return (
        "[cosmic-ray]\n"
        f'module-path = "{target.module}"\n'
        f"timeout = {timeout:.1f}\n"
        "excluded-modules = []\n"
        f"test-command = {_toml_string(target.command())}\n"
        "\n[cosmic-ray.distributor]\nname = \"local\"\n"
        f"\n[cosmic-ray.filters.operators-filter]\nexclude-operators = [{quoted}]\n"
    )


def _toml_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def fingerprint(target: Target, sample: float | None) -> str:
    """What a session's mutants depend on: the module's text, the operators, the sample and the
    functions. Not the tests: verdicts are kept when tests are added (``--retest-survivors`` gives
    the survivors to them); delete ``build/mutation/`` to start over."""
    digest = hashlib.sha256()
    settings = [*EXCLUDED_OPERATORS, str(sample), *target.functions]
    for part in ((ROOT / target.module).read_bytes(), "\n".join(settings).encode()):
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()


def prepare(target: Target, sample: float | None) -> Path:
    """The session file for ``target``: the last one when still valid, else made afresh."""
    WORK.mkdir(parents=True, exist_ok=True)
    session = WORK / f"{target.stem}.sqlite"
    config = WORK / f"{target.stem}.toml"
    key_file = WORK / f"{target.stem}.key"
    key = fingerprint(target, sample)
    if session.exists() and key_file.exists() and key_file.read_text() == key:
        return session
    config.write_text(config_text(target, 60.0), encoding="utf-8")
    tools = Path(sys.executable).parent
    subprocess.run([tools / "cosmic-ray", "init", "--force", config, session], cwd=ROOT, check=True)
    subprocess.run([tools / "cr-filter-operators", session, config], cwd=ROOT, check=True)
    with use_db(str(session), WorkDB.Mode.open) as db:
        skip_annotations(db, ROOT / target.module)
        if target.functions:
            skip_outside_functions(db, target.functions)
        if sample is not None:
            skip_outside_sample(db, sample)
    key_file.write_text(key)
    return session


def _annotation_spans(path: Path) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    if not any(isinstance(n, ast.ImportFrom) and n.module == "__future__" and any(a.name == "annotations" for a in n.names) for n in tree.body):
        return []
    spans = []
    for node in ast.walk(tree):
        annotations = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            annotations.append(node.returns)
        if isinstance(node, ast.arg) and node.annotation is not None:
            annotations.append(node.annotation)
        if isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
        spans += [((a.lineno, a.col_offset), (a.end_lineno, a.end_col_offset)) for a in annotations]
    return spans


def skip_annotations(db: WorkDB, path: Path) -> None:
    """Mark as skipped the mutants inside annotations: a module that imports ``annotations`` from
    ``__future__`` keeps them as strings nothing here evaluates, so each such mutant is equivalent."""
    spans = _annotation_spans(path)
    for item in db.pending_work_items:
        (mutation,) = item.mutations
        start = tuple(mutation.start_pos)
        if any(low <= start < high for low, high in spans):
            db.set_result(item.job_id, WorkResult(output=SKIP_ANNOTATION, worker_outcome=WorkerOutcome.SKIPPED))


def skip_outside_functions(db: WorkDB, functions: tuple[str, ...]) -> None:
    """Mark as skipped the mutants outside ``functions`` (by the name of the innermost function or
    class around each mutant): a module of which only its checks are mutated."""
    for item in db.pending_work_items:
        (mutation,) = item.mutations
        if mutation.definition_name not in functions:
            db.set_result(item.job_id, WorkResult(output=SKIP_FUNCTION, worker_outcome=WorkerOutcome.SKIPPED))


def skip_outside_sample(db: WorkDB, percent: float) -> None:
    """Keep about ``percent`` % of the pending mutants, chosen by a hash of what each one is (its
    operator and occurrence), so that a rerun samples the same mutants."""
    for item in db.pending_work_items:
        (mutation,) = item.mutations
        if zlib.crc32(f"{mutation.operator_name}:{mutation.occurrence}".encode()) % 10000 >= percent * 100:
            db.set_result(item.job_id, WorkResult(output=SKIP_SAMPLE, worker_outcome=WorkerOutcome.SKIPPED))


# -- running --------------------------------------------------------------------------------------


def baseline(target: Target, tests: tuple[str, ...] | None = None) -> float:
    """Run the test command on the unchanged module; its time, or exit when it fails."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    started = time.monotonic()
    done = subprocess.run(shlex.split(target.command(tests)), cwd=ROOT, env=env, capture_output=True, text=True)
    took = time.monotonic() - started
    if done.returncode != 0:
        sys.stdout.write(done.stdout[-4000:] + done.stderr[-2000:])
        sys.exit(f"mutate: the tests of {target.module} fail without any mutant; fix them first")
    return took


@contextmanager
def restored(module: str) -> Iterator[None]:
    """Put ``module`` back as it was on the way out. Cosmic Ray restores the file after each
    mutant; this guards against an interruption (Ctrl-C, CI's SIGTERM) between its write and its
    restore."""
    path = ROOT / module
    original = path.read_bytes()
    try:
        yield
    finally:
        if path.read_bytes() != original:
            path.write_bytes(original)


def execute(target: Target, session: Path, timeout: float, deadline: float | None) -> None:
    """Run the pending mutants (in Cosmic Ray's random order) until none is left or ``deadline``."""
    with use_db(str(session), WorkDB.Mode.open) as db, restored(target.module):
        pending = db.pending_work_items
        total = len(pending)
        for number, item in enumerate(pending, 1):
            if deadline is not None and time.monotonic() > deadline:
                print(f"  time is up: {total - number + 1} mutants of {target.module} left pending (a later run resumes)")
                break
            started = time.monotonic()
            result = mutate_and_test(item.mutations, target.command(), timeout)
            db.set_result(item.job_id, result)
            (mutation,) = item.mutations
            verdict = "timeout" if result.output == "timeout" else (result.test_outcome or result.worker_outcome).value
            print(
                f"  [{number}/{total}] {verdict:<11} {mutation.operator_name.removeprefix('core/')} "
                f"{target.module}:{mutation.start_pos[0]} ({time.monotonic() - started:.1f} s)",
                flush=True,
            )


WIDER_KILLED = "killed by the wider tests"
WIDER_SURVIVED = "survived the wider tests too"
RETEST_KILLED = "killed when tested again"


def execute_survivors(target: Target, session: Path, tests: tuple[str, ...], timeout: float, deadline: float | None, *, wider: bool) -> None:
    """Give the survivors to ``tests`` again: the module's wider tests (slower files that also
    exercise it, ``wider``), or its tests after new ones were added (``--retest-survivors``). A
    mutant either kills is killed; the fast tests stay what most mutants cost."""
    command = target.command(tests)
    label, killed_by, survived = ("wider", WIDER_KILLED, WIDER_SURVIVED) if wider else ("again", RETEST_KILLED, "")
    with use_db(str(session), WorkDB.Mode.open) as db, restored(target.module):
        todo = [
            (item, result)
            for item, result in db.completed_work_items
            if result.test_outcome == TestOutcome.SURVIVED
            and result.worker_outcome == WorkerOutcome.NORMAL
            and not (wider and (result.output or "").startswith(WIDER_SURVIVED))
        ]
        for number, (item, first) in enumerate(todo, 1):
            if deadline is not None and time.monotonic() > deadline:
                print(f"  time is up: {len(todo) - number + 1} survivors of {target.module} not tested {label}")
                break
            started = time.monotonic()
            result = mutate_and_test(item.mutations, command, timeout)
            (mutation,) = item.mutations
            if result.worker_outcome == WorkerOutcome.NORMAL and result.test_outcome == TestOutcome.KILLED:
                db.set_result(item.job_id, WorkResult(WorkerOutcome.NORMAL, f"{killed_by}\n{result.output}", TestOutcome.KILLED, first.diff))
                verdict = "killed"
            else:
                db.set_result(item.job_id, WorkResult(WorkerOutcome.NORMAL, f"{survived}\n{result.output}", TestOutcome.SURVIVED, first.diff))
                verdict = "survived"
            print(
                f"  {label} [{number}/{len(todo)}] {verdict:<9} {mutation.operator_name.removeprefix('core/')} "
                f"{target.module}:{mutation.start_pos[0]} ({time.monotonic() - started:.1f} s)",
                flush=True,
            )


# -- results ----------------------------------------------------------------------------------


def change_text(diff: str, width: int = 48) -> str:
    """A survivor's change in one line for survivors.md: ``before`` → ``after``, each cut to about
    ``width`` characters around where they differ."""
    before = next((d[1:].strip() for d in diff.splitlines() if d[:1] == "-" and d[:3] != "---"), "")
    after = next((d[1:].strip() for d in diff.splitlines() if d[:1] == "+" and d[:3] != "+++"), "")
    start = next((i for i, (x, y) in enumerate(zip(before, after)) if x != y), min(len(before), len(after)))
    low = max(0, start - width // 2)

    def cut(text: str) -> str:
        piece = text[low : low + width]
        return ("…" if low else "") + piece.replace("|", "\\|") + ("…" if low + width < len(text) else "")

    return f"`{cut(before)}` → `{cut(after)}`"


def survivor_id(module: str, operator: str, diff: str) -> str:
    """A survivor's id: its module, operator, changed lines and the unchanged lines around them
    (not their numbers, which move). The lines around tell apart the same change in two places
    (``continue`` to ``break`` in two loops): a verdict on one must not cover the other."""
    lines = [line[1:].strip() for line in diff.splitlines() if line[:1] in "+- " and line[:3] not in ("+++", "---")]
    text = "\n".join([module, operator, *lines])
    return "m-" + hashlib.sha256(text.encode()).hexdigest()[:8]


@dataclass
class Figures:
    module: str
    mutants: int = 0
    killed: int = 0
    by_wider: int = 0
    by_new: int = 0
    timeouts: int = 0
    survived: int = 0
    incompetent: int = 0
    skipped: int = 0
    pending: int = 0

    @property
    def run(self) -> int:
        return self.killed + self.survived

    @property
    def rate(self) -> str:
        return f"{100 * self.killed / self.run:.1f}%" if self.run else "-"


def results(target: Target, session: Path) -> tuple[Figures, list[tuple[str, str, int, str]]]:
    """Counts for ``target`` and its survivors as (id, operator, line, diff)."""
    figures = Figures(target.module)
    survivors = []
    with use_db(str(session), WorkDB.Mode.open) as db:
        figures.mutants = db.num_work_items
        figures.pending = len(db.pending_work_items)
        for item, result in db.completed_work_items:
            (mutation,) = item.mutations
            if result.worker_outcome == WorkerOutcome.SKIPPED:
                figures.skipped += 1
            elif result.worker_outcome != WorkerOutcome.NORMAL or result.test_outcome == TestOutcome.INCOMPETENT:
                figures.incompetent += 1
            elif result.test_outcome == TestOutcome.SURVIVED:
                figures.survived += 1
                diff = result.diff or ""
                survivors.append((survivor_id(target.module, mutation.operator_name, diff), mutation.operator_name, mutation.start_pos[0], diff))
            else:
                figures.killed += 1
                figures.timeouts += result.output == "timeout"
                figures.by_wider += (result.output or "").startswith(WIDER_KILLED)
                figures.by_new += (result.output or "").startswith(RETEST_KILLED)
    return figures, sorted(survivors, key=lambda s: s[2])


def reviewed_ids() -> set[str]:
    return set(re.findall(r"\bm-[0-9a-f]{8}\b", SURVIVORS.read_text(encoding="utf-8"))) if SURVIVORS.exists() else set()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make mutate", description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help="modules to mutate (default: every one in modules.toml)")
    parser.add_argument("--minutes", type=float, default=None, help="time for each module; the rest stays pending for a later run")
    parser.add_argument("--sample", type=float, default=None, help="run only about this percentage of each module's mutants")
    parser.add_argument("--retest-survivors", action="store_true", help="first test every survivor again (after adding tests)")
    parser.add_argument(
        "--retest-with", nargs="+", metavar="TEST", default=None, help="with --retest-survivors: only these tests (the new ones; the rest were run)"
    )
    parser.add_argument("--list", action="store_true", help="list the modules and their test commands, run nothing")
    parser.add_argument(
        "--report", action="store_true", help="run nothing: the figures and unreviewed survivors of the sessions so far (a run in progress included)"
    )
    args = parser.parse_args(argv)

    targets = load_targets()
    unknown = [m for m in args.modules if m not in targets]
    if unknown:
        parser.error(f"not in {MODULES.relative_to(ROOT)}: {', '.join(unknown)}")
    chosen = [targets[m] for m in args.modules] if args.modules else list(targets.values())
    if args.list:
        for target in chosen:
            print(f"{target.module}: {target.command()}")
        return 0

    # A SIGTERM (CI cancelling the job) unwinds like Ctrl-C, so the mutated file is restored.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    reviewed = reviewed_ids()
    table: list[tuple[Figures, float]] = []
    unreviewed: list[tuple[Target, tuple[str, str, int, str]]] = []
    for target in chosen:
        started = time.monotonic()
        if args.report:
            session = WORK / f"{target.stem}.sqlite"
            if session.exists():
                figures, survivors = results(target, session)
                table.append((figures, 0.0))
                unreviewed += [(target, s) for s in survivors if s[0] not in reviewed]
            continue
        session = prepare(target, args.sample)
        # A re-test with chosen tests needs only those to pass unchanged.
        took = baseline(target, tuple(args.retest_with) if args.retest_survivors and args.retest_with else None)
        timeout = max(target.timeout_floor, 3 * took)
        print(f"{target.module}: tests pass unchanged in {took:.1f} s; a mutant gets {timeout:.0f} s", flush=True)
        deadline = started + 60 * args.minutes if args.minutes is not None else None  # 0: only the re-test
        if args.retest_survivors:
            # Not bound by --minutes: there are only so many survivors, and they are what was asked for.
            execute_survivors(target, session, tuple(args.retest_with or target.tests), timeout, None, wider=False)
        execute(target, session, timeout, deadline)
        if target.wider:
            # The wider tests get half as long again: they run only on what the fast tests missed.
            took = baseline(target, target.wider)
            later = None if deadline is None else max(deadline, time.monotonic()) + 30 * args.minutes
            execute_survivors(target, session, target.wider, max(target.timeout_floor, 3 * took), later, wider=True)
        figures, survivors = results(target, session)
        table.append((figures, time.monotonic() - started))
        unreviewed += [(target, s) for s in survivors if s[0] not in reviewed]

    lines = [
        "| module | mutants | skipped | run | killed | by the wider tests | when tested again | timeouts | survived | kill rate | pending | time |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for f, took in table:
        lines.append(
            f"| {f.module} | {f.mutants} | {f.skipped} | {f.run} | {f.killed} | {f.by_wider} | {f.by_new} | {f.timeouts} "
            f"| {f.survived} | {f.rate} | {f.pending} | {took / 60:.1f} min |"
        )
    summary = "\n".join(lines)
    print("\n" + summary)
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / ("report.md" if args.report else "summary.md")).write_text(summary + "\n", encoding="utf-8")

    # New survivors, ready to be reviewed into survivors.md (with a reason, or a test that kills them).
    listing = WORK / ("unreviewed-so-far.md" if args.report else "unreviewed.md")
    with open(listing, "w", encoding="utf-8") as out:
        for target, (sid, operator, line, diff) in unreviewed:
            diff = "\n".join(d for d in diff.strip().splitlines() if d != "--- mutation diff ---")
            out.write(f"- **{sid}** `{target.module}:{line}` {operator.removeprefix('core/')}\n\n```diff\n{diff}\n```\n\n")
            # The row survivors.md wants, with the verdict left to write.
            out.write(f"  `| {sid} | {line} | {operator.removeprefix('core/')} | {change_text(diff)} | **?**: |`\n\n")
    if unreviewed:
        print(f"\n{len(unreviewed)} survivors not in {SURVIVORS.relative_to(ROOT)}; each, with its diff: {listing.relative_to(ROOT)}")
        for target, (sid, operator, line, _) in unreviewed:
            print(f"  {sid} {target.module}:{line} {operator.removeprefix('core/')}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
