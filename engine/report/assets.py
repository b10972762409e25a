"""The report page's inline stylesheet and script (see :mod:`kvpolicy.report.page`).

Kept apart so the page's structure reads on its own. Nothing here is fetched: the page carries
both inline. The script only shows one version's matrix at a time and filters rows; without it
every matrix is shown and nothing is lost.
"""

from __future__ import annotations

__all__ = ["SCRIPT", "stylesheet"]

#: Background and accent per runtime value, by its position in the decision's values.
_PALETTE = (("#dbeafe", "#1d4ed8"), ("#fef3c7", "#b45309"), ("#dcfce7", "#15803d"), ("#f3e8ff", "#7e22ce"),
            ("#e0f2fe", "#0369a1"), ("#fce7f3", "#be185d"))


def stylesheet(runtimes: int) -> str:
    """The page's stylesheet, with a colour for each of ``runtimes`` runtime values (class
    ``rt-<position>``; the palette repeats past six, the names in the cells still tell them apart)."""
    colours = "".join(
        f".rt-{i}{{background:{bg};border-left:4px solid {fg}}}.swatch.rt-{i}{{border:2px solid {fg}}}"
        for i in range(max(runtimes, 1))
        for bg, fg in [_PALETTE[i % len(_PALETTE)]]
    )
    return _CSS + colours


_CSS = """
:root{color-scheme:light;--fg:#111827;--muted:#4b5563;--line:#d1d5db;--bad:#b91c1c;--chg:#6d28d9}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:var(--fg);margin:0;background:#fff}
header,main,footer{max-width:1500px;margin:0 auto;padding:0 20px}
h1{font-size:22px;margin:16px 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:2px solid var(--line);padding-bottom:4px}
h3{font-size:15px;margin:16px 0 6px}
a{color:#1d4ed8}.skip{position:absolute;left:-999px}.skip:focus{left:8px;top:8px;background:#fff;padding:4px}
nav ul{list-style:none;padding:0;margin:0;display:flex;gap:16px;flex-wrap:wrap}
dl.summary{display:grid;grid-template-columns:repeat(auto-fill,minmax(280px,1fr));gap:6px;margin:0}
dl.summary div{border:1px solid var(--line);border-radius:6px;padding:6px 10px}dt{font-weight:600;color:var(--muted)}dd{margin:0}
.scroll{overflow-x:auto}
.timeline-box{border:1px solid var(--line);border-radius:6px;padding:4px 0}svg.timeline{display:block}
svg.timeline .axis{stroke:#9ca3af;stroke-width:2}svg.timeline .tick{stroke:#9ca3af;stroke-width:1}svg.timeline .dot{fill:#6b7280}
svg.timeline .dot.to{fill:#1d4ed8}svg.timeline .dot.from{fill:#fff;stroke:#1d4ed8;stroke-width:3}
svg.timeline text{font-size:13px;fill:var(--fg)}svg.timeline .v{font-weight:600}svg.timeline .d{fill:var(--muted);font-size:12px}
ol.versions{display:grid;grid-template-columns:repeat(auto-fill,minmax(300px,1fr));gap:8px;padding-left:20px}
ol.versions .src{color:var(--muted)}ol.versions li{min-width:0;overflow-wrap:anywhere}
.controls{display:flex;flex-wrap:wrap;gap:16px;align-items:center;margin:8px 0}
.legend{list-style:none;padding:0;display:flex;flex-wrap:wrap;gap:6px 18px;margin:6px 0 10px}
.swatch{display:inline-block;width:14px;height:14px;vertical-align:-2px;margin-right:4px}
table{border-collapse:collapse}
table.matrix{font-size:12.5px}
table.matrix caption{text-align:left;color:var(--muted);padding:4px 0}
table.matrix th,table.matrix td{border:1px solid var(--line);padding:3px 5px;vertical-align:top}
table.matrix thead th{background:#f3f4f6;font-weight:600}
table.matrix th.env{font-weight:500;font-size:.92em;max-width:130px}
table.matrix tbody th{text-align:left;white-space:nowrap;background:#f9fafb}
td.cell{min-width:92px}
td.cell summary{cursor:pointer;list-style:none}td.cell summary::-webkit-details-marker{display:none}
td.cell .rt{font-weight:700}td.cell .kvm{margin-left:4px}td.cell .eff{display:block;color:var(--muted);font-size:.92em}
td.cell.fails{background-image:repeating-linear-gradient(135deg,transparent 0 7px,rgba(185,28,28,.13) 7px 9px);outline:2px solid var(--bad);outline-offset:-2px}
td.cell.changed{box-shadow:inset 0 0 0 3px var(--chg)}td.cell.touched{box-shadow:inset 0 0 0 1px var(--chg)}
.mark{display:inline-block;white-space:nowrap;font-size:.88em;font-weight:700;border-radius:3px;padding:0 3px;margin:1px 0}
.mark.fail{color:#fff;background:var(--bad)}.mark.chg{color:#fff;background:var(--chg)}
.mark.chg-minor{color:var(--chg);background:#fff;border:1px solid var(--chg);font-weight:600}
ul.why{margin:4px 0 0;padding-left:16px;font-size:.92em;min-width:260px}ul.why .err{color:var(--bad)}ul.why .chg{color:var(--chg)}
details.rules{margin:8px 0;overflow-x:auto}details.rules table{font-size:12px}details.rules td{overflow-wrap:anywhere}
details.rules td,details.rules th,table.impact td,table.impact th{border:1px solid var(--line);padding:3px 6px;text-align:left;vertical-align:top}
.entry{border:1px solid var(--line);border-left:4px solid var(--chg);border-radius:4px;padding:4px 12px;margin:10px 0}
pre{white-space:pre-wrap;overflow-wrap:anywhere}pre.edit{background:#f9fafb;border-left:3px solid #6366f1;padding:8px 10px;margin:8px 0;font-size:12.5px}pre.where{white-space:pre-wrap;font-size:12px;background:#f9fafb;padding:6px;margin:4px 0}
.note{color:var(--muted)}.headline{font-weight:600}
ul.groups li{margin:2px 0}
table.impact{font-size:12.5px;width:100%;table-layout:fixed}table.impact td,table.impact th{overflow-wrap:anywhere}
table.impact col.c-config{width:22%}table.impact col.c-side{width:8em}table.impact col.c-version{width:10em}
table.impact col.c-status{width:11em}
details.unchanged{margin:10px 0}details.unchanged summary{cursor:pointer;color:var(--muted);font-weight:600}
td.status{font-weight:700}td.status.bad{color:var(--bad)}td.status.warn{color:#92400e}td.status.good{color:#15803d}td.status.same{color:var(--muted)}
td.status.bad::before{content:"✖ "}td.status.warn::before{content:"▲ "}td.status.good::before{content:"✔ "}
footer{color:var(--muted);margin:30px auto 20px}
[hidden]{display:none!important}
@media print{
 .controls,nav,.skip{display:none}
 body{font-size:10px}*{-webkit-print-color-adjust:exact;print-color-adjust:exact}
 @page{size:landscape;margin:10mm}
 .scroll{overflow:visible}table.matrix{font-size:7.5pt;width:100%}td.cell{min-width:0}table.matrix th.env{max-width:none}
 table.matrix tbody th{white-space:normal}ul.why{display:none}svg.timeline{max-width:100%;height:auto}
 h2{break-after:avoid}tr,.entry{break-inside:avoid}a{color:inherit;text-decoration:none}
}
"""

SCRIPT = """
(function () {
  var select = document.getElementById('version-select');
  var filter = document.getElementById('arch-filter');
  var changed = document.getElementById('only-changed');
  var failing = document.getElementById('only-failing');
  if (!select) { return; }
  function apply() {
    var query = filter.value.trim().toLowerCase();
    document.querySelectorAll('.version-matrix').forEach(function (box) {
      box.hidden = box.getAttribute('data-key') !== select.value;
      box.querySelectorAll('table.matrix > tbody > tr').forEach(function (row) {
        var keep = (!query || row.getAttribute('data-arch').toLowerCase().indexOf(query) >= 0) &&
          (!changed.checked || row.getAttribute('data-changed') === '1') &&
          (!failing.checked || row.getAttribute('data-fails') === '1');
        row.hidden = !keep;
      });
    });
  }
  [select, filter, changed, failing].forEach(function (el) {
    el.addEventListener('input', apply);
    el.addEventListener('change', apply);
  });
  document.querySelectorAll('[data-show]').forEach(function (a) {
    a.addEventListener('click', function () { select.value = a.getAttribute('data-show'); apply(); });
  });
  apply();
})();
"""
