"""``kvpolicy report``: the page's structure checked with an HTML parser against what ``table``,
``diff --format json`` and ``impact --format json`` print for the same versions."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

import kvpolicy
from kvpolicy.analyse.matrix import columns_of, decision_matrix, rows_of
from kvpolicy.read.model import as_json
from kvpolicy.report.page import _STATUSES
from tests.report.conftest import FLIP_ABSOLUTE, REPO

VERSIONS = kvpolicy.load().versions()
PAIRS = [*zip(VERSIONS, VERSIONS[1:]), (VERSIONS[0], VERSIONS[-1])]
LIMIT = 2 * 1024 * 1024


def current_matrix(root):
    return root.find("div", "version-matrix", data_current="1")


def cell_key(td):
    row = td.parent
    return (row.attrs["data-arch"], row.attrs["data-model-type"], td.attrs["data-backend"], td.attrs["data-env"])


@pytest.mark.parametrize("version", VERSIONS)
def test_matrix_of_every_version_matches_kvpolicy_table(report, cli_json, version):
    code, _, root = report("--to", version, "--from", "none")
    assert code == 0
    box = current_matrix(root)
    assert box.attrs["data-version"] == version
    table = cli_json("table", "--version", version, "--format", "json")
    plain_rows = [tr for tr in box.find_all("tr") if "data-arch" in tr.attrs and not tr.attrs["data-model-type"]]
    assert len(plain_rows) == len(table["rows"])
    for tr, row in zip(plain_rows, table["rows"]):
        assert tr.attrs["data-arch"] == (row["architecture"] or "any other architecture")
        cells = {td.attrs["data-backend"]: td for td in tr.find_all("td", "cell") if td.attrs["data-env"] == ""}
        assert set(cells) == set(row["backends"])
        for backend, expected in row["backends"].items():
            td = cells[backend]
            assert td.attrs["data-d-transceiver_runtime"] == expected["transceiver_runtime"]
            assert td.attrs["data-d-kv_cache_manager"] == expected["kv_cache_manager"]
            assert td.attrs["data-d-backend"] == expected["backend"]
            assert td.attrs["data-errors"].split() == expected["errors"]
            # The label is text, not only colour; a cell that cannot start says so in words.
            summary = td.find("summary").text()
            assert expected["transceiver_runtime"] in summary
            assert ("fails" in summary) == bool(expected["errors"])
            assert expected["decided_by"] in td.attrs["title"]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_cell_of_every_matrix_is_present(shared_report, version):
    # The page of each adjacent pair (the same pages the diff tests read); the first version alone.
    index = VERSIONS.index(version)
    code, _, root = shared_report("--from", VERSIONS[index - 1] if index else "none", "--to", version)
    assert code == 0
    for box in root.find_all("div", "version-matrix"):
        policy_set = kvpolicy.load(version=box.attrs["data-version"])
        rows, columns = rows_of(policy_set.policy), columns_of(policy_set.policy)
        body = box.find("tbody")
        trs = body.find_all("tr")
        assert len(trs) == len(rows)
        for tr in trs:
            tds = tr.find_all("td", "cell")
            assert [(td.attrs["data-backend"], td.attrs["data-env"]) for td in tds] == [(c.backend, c.env_label) for c in columns]
        head = box.find("thead")
        labels = [th.text() for th in head.find_all("th", "env")]
        assert len(labels) == sum(1 for c in columns if c.backend == columns[0].backend)
        assert all(th.attrs.get("scope") in ("col", "colgroup") for th in head.find_all("th"))
        assert all(tr.find("th").attrs.get("scope") == "row" for tr in trs)


def test_default_columns_follow_the_backend_decisions_environment_routes():
    policy = kvpolicy.load(version=VERSIONS[-1]).policy
    backend = policy.decisions["backend"]
    routes = [rule for rule in backend.conditionals if rule.when.env]
    columns = columns_of(policy)
    assert columns[0].backend == backend.auto and not columns[0].env
    env_columns = [c for c in columns if c.env]
    assert [c.route for c in env_columns] == [rule.id for rule in routes]
    assert {c.backend for c in columns if not c.env} == {backend.auto, *backend.values}
    # Each route's column resolves the backend through that route.
    matrix = decision_matrix(kvpolicy.load(version=VERSIONS[-1]))
    for index, column in enumerate(matrix.columns):
        if column.route:
            assert matrix.cell(len(matrix.rows) - 1, index).resolution.decided_by["backend"] == column.route


@pytest.mark.parametrize(("old", "new"), PAIRS)
def test_diff_groups_and_counts_equal_kvpolicy_diff_json(shared_report, shared_json, old, new):
    code, _, root = shared_report("--from", old, "--to", new)
    assert code == 0
    expected = shared_json("diff", old, new, "--format", "json")
    section = root.by_id("diff")
    groups = [(int(li.attrs["data-group"]), int(li.attrs["data-count"])) for li in section.find_all("li") if "data-group" in li.attrs]
    assert sorted(groups) == [(g["group"], g["count"]) for g in expected["groups"]]
    entries = section.find_all("article", "entry")
    assert [int(a.attrs["data-count"]) for a in entries] == [s["count"] for s in expected["sections"]]
    for article, entry in zip(entries, expected["sections"]):
        listed = sorted(int(li.attrs["data-group"]) for li in article.find_all("li") if "data-group" in li.attrs)
        assert listed == sorted(entry["groups"])
        assert entry["summary"][0] in article.find("h3").text()
    headline = section.find("p", "headline").text()
    if expected["changed"]:
        assert f"{expected['changed']:,} of {expected['total']:,}" in headline
    else:  # an edit that changes no context says so, as `kvpolicy diff` does
        assert "no context resolves differently" in headline


@pytest.mark.parametrize(("old", "new"), PAIRS[:1] + PAIRS[-1:])
def test_diff_entries_read_exactly_as_kvpolicy_diff_prints_them(shared_report, capsys, old, new):
    from kvpolicy.cli import main

    code, _, root = shared_report("--from", old, "--to", new)
    assert code == 0
    main(["diff", old, new])
    text = capsys.readouterr().out.split("\n", 1)[1]  # after the line naming the policies used
    shown = [root.by_id("diff").find("p", "headline").text()]
    for edit in root.by_id("diff").find_all("pre", "edit"):
        shown += edit.text().split("\n")
    shown.append(root.by_id("diff").find("p", "note").text())
    for article in root.by_id("diff").find_all("article", "entry"):
        shown += ["", article.find("h3").text(), *article.find("pre").text().split("\n")]
    assert "\n".join(shown) + "\n" == text


@pytest.mark.parametrize(("old", "new"), PAIRS)
def test_changed_cells_name_their_diff_group(shared_report, old, new):
    code, _, root = shared_report("--from", old, "--to", new)
    assert code == 0
    box = current_matrix(root)
    base = {cell_key(td): td for td in root.find("div", "version-matrix", data_version=old).find_all("td", "cell")}
    groups = {li.attrs["data-group"] for li in root.by_id("diff").find_all("li") if "data-group" in li.attrs}
    changed = 0
    for td in box.find_all("td", "cell"):
        # A cell is in a diff group exactly when it is marked as changed.
        assert ("data-change" in td.attrs) == ("data-group" in td.attrs), cell_key(td)
        if "data-group" in td.attrs:
            assert td.attrs["data-group"] in groups
            changed += 1
        before = base.get(cell_key(td))
        if before is not None:
            seen = [td.attrs[k] for k in sorted(td.attrs) if k.startswith("data-d-") or k == "data-errors"]
            was = [before.attrs.get(k) for k in sorted(td.attrs) if k.startswith("data-d-") or k == "data-errors"]
            if seen != was:  # a visible difference is always marked
                assert "data-change" in td.attrs, cell_key(td)
    # Every pair changes some cell, except a change the matrix's contexts (auto runtime, default
    # timeout, no features) cannot show: #15727's pipelined-transfer rules (2026.09.02) still have
    # groups; #15780 (2026.09.16) only adds fields that no rule reads, so nothing resolves differently.
    assert changed > 0 or (new == "2026.09.02" and groups) or (new == "2026.09.16" and not groups) or (
        # #17495 changes what a left-out field requests; the matrix writes auto out, so only new rows differ.
        new == "2026.10.22" and groups
    )


def test_issue_command_writes_one_offline_page_under_2_mb(tmp_path):
    out = tmp_path / "r.html"
    done = subprocess.run(
        [sys.executable, "-m", "kvpolicy", "report", "--from", "2026.08.11", "--to", "2026.08.24",
         "--configs", "examples/configs", "-o", str(out)],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    assert f"wrote {out}" in done.stdout
    text = out.read_text(encoding="utf-8")
    assert len(text.encode()) < LIMIT
    from tests.report.page import parse

    root = parse(text)
    for section in ("summary", "matrix", "timeline", "diff", "impact"):
        assert root.by_id(section).tag == "section"
    # Self-contained: nothing is fetched, no framework.
    assert not root.find_all("link") and not [n for n in root.iter() if "src" in n.attrs]
    # Links out of the page (never loaded) only where a policy's upstream source names a URL.
    sources = " ".join(as_json(kvpolicy.load(version=v).policy) for v in VERSIONS)
    hrefs = [n.attrs["href"] for n in root.iter() if "href" in n.attrs]
    assert all(h in sources for h in hrefs if re.match(r"[a-z]+://", h))
    assert "url(" not in root.find("style").text() and "@import" not in root.find("style").text()
    assert root.find("html").attrs["lang"] == "en"


#: The whole history with the example configs: the largest page the shipped versions make.
WHOLE = ("--from", VERSIONS[0], "--to", VERSIONS[-1], "--configs", "examples/configs",
         "--arch-map", "examples/configs/arch-map.yaml")


def test_page_for_every_shipped_version_stays_under_2_mb(shared_report):
    code, text, root = shared_report(*WHOLE)
    assert code == 0
    assert len(text.encode()) < LIMIT
    assert [box.attrs["data-version"] for box in root.find_all("div", "version-matrix")] == VERSIONS


def test_timeline_lists_every_version_with_its_upstream_change(shared_report):
    code, _, root = shared_report(*WHOLE)
    assert code == 0
    timeline = root.by_id("timeline")
    items = timeline.find("ol").find_all("li")
    assert len(items) == len(VERSIONS)
    for item, version in zip(items, VERSIONS):
        policy = kvpolicy.load(version=version).policy
        assert version in item.text() and policy.source in item.text() and policy.summary in item.text()
        assert item.find("time").attrs["datetime"] == version.replace(".", "-")
    svg = timeline.find("svg")
    assert svg.attrs["role"] == "img" and svg.find("title").text()
    assert len(svg.find_all("circle")) == len(VERSIONS)


def test_impact_table_matches_kvpolicy_impact_and_links_file_and_line(shared_report, cli_json):
    code, _, root = shared_report(*FLIP_ABSOLUTE)
    assert code == 0
    expected = cli_json("impact", *FLIP_ABSOLUTE, "--format", "json")
    rows = [tr for tr in root.by_id("impact").find_all("tr") if "data-status" in tr.attrs]
    sections = {(c["path"], s["line"]): s for c in expected["configs"] for s in c["sections"]}
    assert len(rows) == len(sections)
    seen = set()
    for row in rows:
        href = row.find("td").find("a").attrs["href"]
        file, _, line = href.partition("#L")
        path = row.attrs["data-config"]
        section = sections[(path, int(line))]
        seen.add((path, int(line)))
        assert row.attrs["data-status"] == section["status"]
        assert row.find("td", "status").text() == section["status"]
        assert (shared_report.folder / file).resolve() == (REPO / path).resolve()
    assert seen == set(sections)


def _configs_in_order(node):
    """The configs of an impact table (its ``data-config``), in the order the page shows them."""
    order = []
    for tr in node.find_all("tr"):
        if "data-config" in tr.attrs and tr.attrs["data-config"] not in order:
            order.append(tr.attrs["data-config"])
    return order


def test_impact_shows_configs_worst_first_and_folds_the_unchanged_ones_last(shared_report, cli_json):
    code, _, root = shared_report(*FLIP_ABSOLUTE)
    assert code == 0
    status = {c["path"]: c["status"] for c in cli_json("impact", *FLIP_ABSOLUTE, "--format", "json")["configs"]}
    severity = [s for s, _ in _STATUSES]
    section = root.by_id("impact")
    shown = _configs_in_order(section)
    assert sorted(shown) == sorted(status)
    ranks = [severity.index(status[path]) for path in shown]
    assert ranks == sorted(ranks), [status[p] for p in shown]
    assert status[shown[0]] == "starts failing"
    # The unchanged configs sit in one closed <details> after the table of the others, and nowhere else.
    folded = section.by_id("impact-unchanged")
    unchanged = [p for p in shown if status[p] == "unchanged"]
    assert folded.tag == "details" and "open" not in folded.attrs
    assert _configs_in_order(folded) == unchanged == shown[-len(unchanged):]
    assert folded.find("summary").text().startswith(f"{len(unchanged)} unchanged configs")
    first_table = section.find("table", "impact")
    assert "unchanged" not in {tr.attrs.get("data-status") for tr in first_table.find_all("tr")}
    assert first_table.parent.parent is section  # the table of what changes is not folded away


def test_paths_show_relative_to_the_working_directory_with_the_full_path_on_hover(shared_report):
    code, _, root = shared_report(*FLIP_ABSOLUTE)
    assert code == 0
    heads = root.by_id("impact").find_all("th", "config")
    assert heads
    for th in heads:
        link = th.find("a")
        full = link.attrs["title"]
        assert full.startswith("/") and (REPO / link.text()).resolve() == REPO / full  # same file, shorter
        assert not link.text().startswith("/")
    for section in ("summary", "impact"):
        assert str(REPO) not in root.by_id(section).text(), section


def test_paths_outside_the_root_stay_whole():
    from kvpolicy.report.page import _relative, _shorten

    assert _relative("/repo/deploy/a.yaml", "/repo") == "deploy/a.yaml"
    assert _relative("/elsewhere/a.yaml", "/repo") == "/elsewhere/a.yaml"  # never ../../elsewhere
    assert _relative("/repository/a.yaml", "/repo") == "/repository/a.yaml"
    assert _relative("deploy/a.yaml", "/repo") == "deploy/a.yaml"
    assert _relative("/repo/a.yaml", None) == "/repo/a.yaml"
    assert _shorten("arch-map (/repo/map.yaml (*x*))", "/repo/") == "arch-map (map.yaml (*x*))"
    assert _shorten("/etc/a.yaml", "/") == "/etc/a.yaml"  # a root of / shortens nothing


def test_upstream_urls_in_sources_become_links():
    from kvpolicy.report.page import _source

    html = _source("TensorRT-LLM PR https://github.com/NVIDIA/TensorRT-LLM/pull/1234, merged <2026-08-24>.")
    assert '<a href="https://github.com/NVIDIA/TensorRT-LLM/pull/1234" rel="noreferrer">' in html
    assert html.endswith(", merged &lt;2026-08-24&gt;.")


def test_link_base_points_at_the_repository(report):
    # Any pair with configs has an impact table; an early, small pair keeps the diff cheap.
    code, _, root = report("--from", VERSIONS[0], "--to", VERSIONS[1], "--configs", "examples/configs",
                           "--link-base", "https://example.invalid/o/r/blob/abc/")
    assert code == 0
    hrefs = [a.attrs["href"] for a in root.by_id("impact").find_all("a")]
    assert hrefs and all(h.startswith("https://example.invalid/o/r/blob/abc/examples/configs/") for h in hrefs)
    assert any(re.search(r"\.yaml#L\d+$", h) for h in hrefs)


def test_controls_are_labelled_and_the_page_prints(shared_report):
    code, text, root = shared_report(*WHOLE)
    assert code == 0
    for control in root.find_all("input") + root.find_all("select"):
        node = control.parent
        while node is not None and node.tag != "label":
            node = node.parent
        assert node is not None, control.attrs
    assert "@media print" in text
    for box in root.find_all("div", "version-matrix"):
        assert box.find("caption").text()


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--to", "1999.01.01"], "--to: "),
        (["--from", "1999.01.01"], "--from: "),
        (["--from", "none", "--configs", "examples/configs"], "--configs needs a version to compare with"),
        (["--from", "2026.08.11", "--configs", "no/such/folder"], "--configs: no such file or folder"),
    ],
)
def test_bad_input_is_a_usage_error(capsys, tmp_path, argv, fragment):
    from kvpolicy.cli import main

    code = main(["report", *argv, "-o", str(tmp_path / "r.html")])
    err = capsys.readouterr().err
    assert code == 2
    assert fragment in err and "Traceback" not in err
    assert not (tmp_path / "r.html").exists()


def test_unwritable_output_is_a_usage_error(capsys, tmp_path):
    from kvpolicy.cli import main

    code = main(["report", "-o", str(tmp_path / "missing" / "r.html")])
    assert code == 2
    assert "cannot write" in capsys.readouterr().err


def test_report_command_never_imports_torch_or_nixl(tmp_path):
    probe = (
        "import sys; from kvpolicy.cli import main; code = main(sys.argv[1:]); "
        "heavy = [m for m in ('torch', 'nixl', 'zmq', 'numpy', 'transformers') if m in sys.modules]; "
        "print(heavy)"
    )
    # Every module the command imports is imported whichever pair it compares: a small one.
    argv = ["report", "--from", VERSIONS[0], "--to", VERSIONS[1], "--configs", "examples/configs", "-o", str(tmp_path / "r.html")]
    done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_a_folder_of_other_versions_gets_its_own_columns_and_timeline(report, tmp_path):
    base = (REPO / "tests/lint/fixtures/clean.toml").read_text()
    folder = tmp_path / "policies"
    folder.mkdir()
    (folder / "a.toml").write_text(base)
    changed = base.replace('version = "2030.01.01"', 'version = "2030.02.01"').replace(
        'values = ["NIXL", "UCX"]', 'values = ["NIXL", "UCX", "MPI"]'
    ).replace(
        "[decisions.transceiver_runtime]",
        '[[decisions.backend.conditional]]\nid = "backend-env-mpi"\nwhen = { env.TRTLLM_USE_MPI_KVCACHE = "1" }\n'
        'value = "MPI"\nreason = "r"\nsource = "fixture 2030-02-01"\n\n[decisions.transceiver_runtime]',
    ).replace(
        '  { architecture = "GptOssForCausalLM"',
        '  { architecture = "LlamaForCausalLM", value = "PYTHON", reason = "r", source = "s" },\n  { architecture = "GptOssForCausalLM"',
    )
    (folder / "b.toml").write_text(changed)
    code, _, root = report("--to", str(folder))
    assert code == 0
    box = current_matrix(root)
    assert box.attrs["data-version"] == "2030.02.01"
    tds = box.find("tbody").find("tr").find_all("td", "cell")
    assert [(td.attrs["data-backend"], td.attrs["data-env"]) for td in tds] == [
        ("DEFAULT", ""), ("DEFAULT", "TRTLLM_USE_UCX_KVCACHE=1"), ("DEFAULT", "TRTLLM_USE_MPI_KVCACHE=1"),
        ("UCX", ""), ("MPI", ""), ("NIXL", ""),
    ]
    assert [tr.attrs["data-arch"] for tr in box.find("tbody").find_all("tr")] == [
        "GptOssForCausalLM", "LlamaForCausalLM", "any other architecture"]
    # --from defaults to the version before --to in its folder.
    assert "2030.01.01 → 2030.02.01" in root.find("h1").text()
    llama_nixl = box.find("tr", data_arch="LlamaForCausalLM").find("td", data_backend="NIXL")
    assert llama_nixl.attrs["data-d-transceiver_runtime"] == "PYTHON" and llama_nixl.attrs["data-change"] == "value"
    assert [li.find("strong").text() for li in root.by_id("timeline").find("ol").find_all("li")] == ["2030.01.01", "2030.02.01"]


def test_dash_writes_the_page_to_stdout(capsys):
    from kvpolicy.cli import main

    code = main(["report", "--to", "2026.08.24", "--from", "none", "-o", "-"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("<!doctype html>") and out.rstrip().endswith("</html>")
    assert 'id="diff"' not in out  # nothing compared: no diff section


@pytest.mark.parametrize("version", VERSIONS)
def test_every_deciding_rule_has_its_upstream_source(version):
    matrix = decision_matrix(kvpolicy.load(version=version))
    for cell in matrix.cells.values():
        for decision, provenance in cell.provenance.items():
            if provenance.kind == "explicit":
                assert cell.column.backend != matrix.columns[0].backend or decision != "backend"
                continue
            assert provenance.kind != "other", provenance
            assert provenance.source and provenance.location, provenance


def test_over_budget_the_versions_not_compared_are_shown_compact():
    from kvpolicy.report.page import ReportInput, render_report
    from tests.report.page import parse

    sets = [kvpolicy.load(version=v) for v in VERSIONS]
    data = ReportInput(sets, sets[2], sets[1])
    full = render_report(data, budget=1 << 40)  # never compact, whatever the shipped history weighs
    small = render_report(data, budget=len(full.encode()) - 1)
    assert len(small) < len(full)
    root = parse(small)
    compact = {box.attrs["data-version"]: box.attrs["data-compact"] for box in root.find_all("div", "version-matrix")}
    # Only the two versions compared keep their rule lists.
    assert compact == {v: "0" if v in (VERSIONS[1], VERSIONS[2]) else "1" for v in VERSIONS}
    for box in root.find_all("div", "version-matrix"):
        for td in box.find_all("td", "cell"):
            assert td.attrs["title"] and td.attrs["data-d-transceiver_runtime"] in td.text()
            assert bool(td.find_all("ul", "why")) == (box.attrs["data-compact"] == "0")


def test_far_over_budget_compact_cells_drop_their_hover_text_but_the_compared_ones_keep_it():
    from kvpolicy.report.page import ReportInput, render_report
    from tests.report.page import parse

    sets = [kvpolicy.load(version=v) for v in VERSIONS]
    data = ReportInput(sets, sets[2], sets[1])
    compact = render_report(data, budget=len(render_report(data, budget=1 << 40).encode()) - 1)
    smallest = render_report(data, budget=len(compact.encode()) - 1)
    assert len(smallest) < len(compact)
    root = parse(smallest)
    for box in root.find_all("div", "version-matrix"):
        kept = box.attrs["data-compact"] == "0"
        assert kept == (box.attrs["data-version"] in (VERSIONS[1], VERSIONS[2]))
        for td in box.find_all("td", "cell"):
            assert ("title" in td.attrs) == kept  # the rules table under each matrix still names every rule
        assert box.find("details", "rules") is not None
        if not kept:
            assert "the table below lists the rules behind these cells" in box.find("caption").text()
