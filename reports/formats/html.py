"""A self-contained HTML report: one file, inline CSS, no scripts, no external assets.

Every string that came from a run (messages, impl paths, specs) goes through
``html.escape``; nothing is inserted raw. Sections: verdict and counts,
implementations, finding buckets, coverage (ops x kinds, and ops x case
features when summary.json has them), shards of a merged run, and per-bucket
detail with expected vs actual mismatches and the replay command.
"""

from __future__ import annotations

import html
import json
from typing import Any, Iterable, Mapping

from mlafuzz.reports.findings import Finding, Kind
from mlafuzz.reports.formats.text import bundle_text, finding_facts, one_line, xor_bits
from mlafuzz.reports.model import NOT_APPLICABLE, Bucket, RunReport, plural, shard_label

MAX_DETAILED_BUCKETS = 200
MAX_MEMBERS_LISTED = 25
DOT = "\u00b7"  # a zero cell

CSS = """
:root{--fg:#1f2328;--muted:#59636e;--line:#d1d9e0;--bg:#f6f8fa;--red:#cf222e;--redbg:#ffebe9;
--green:#1a7f37;--greenbg:#dafbe1;--amber:#9a6700;--amberbg:#fff8c5;--blue:#0969da;--bluebg:#ddf4ff}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 -apple-system,BlinkMacSystemFont,"Segoe UI",Helvetica,Arial,sans-serif;color:var(--fg);
background:#fff}
main{max-width:1200px;margin:0 auto;padding:24px 28px 64px}
h1{font-size:24px;margin:0 0 4px}h2{font-size:18px;margin:32px 0 10px;padding-bottom:6px;
border-bottom:1px solid var(--line)}h3{font-size:15px;margin:0}
code,pre,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}
pre{background:var(--bg);border:1px solid var(--line);border-radius:6px;padding:10px 12px;margin:6px 0 10px;
white-space:pre-wrap;word-break:break-all}
.meta{color:var(--muted)}.meta code{color:var(--fg)}
.verdict{display:flex;align-items:center;gap:14px;margin:14px 0;padding:14px 18px;border-radius:8px;
font-size:16px;font-weight:600}
.verdict.failed{background:var(--redbg);color:var(--red);border:1px solid #ffcecb}
.verdict.passed{background:var(--greenbg);color:var(--green);border:1px solid #aceebb}
.verdict.incomplete,.verdict.stopped{background:var(--amberbg);color:var(--amber);border:1px solid #f5d48c}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(130px,1fr));gap:10px}
.card{border:1px solid var(--line);border-radius:8px;padding:10px 12px}
.card .n{font-size:22px;font-weight:600}.card .l{color:var(--muted);font-size:12px}
.card.bad .n{color:var(--red)}
table{border-collapse:collapse;width:100%;margin:6px 0}
th,td{border:1px solid var(--line);padding:5px 8px;text-align:left;vertical-align:top}
th{background:var(--bg);font-weight:600;font-size:12.5px}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
td.msg{max-width:420px;word-break:break-word}
td.impl{max-width:260px;word-break:break-all}
.pill{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:600;white-space:nowrap}
.pill.failure,.pill.failed{background:var(--redbg);color:var(--red)}
.pill.expected,.pill.incomplete,.pill.stopped{background:var(--amberbg);color:var(--amber)}
.pill.info{background:var(--bluebg);color:var(--blue)}
.pill.passed{background:var(--greenbg);color:var(--green)}
.matrix th.k{font-size:11px;min-width:56px;text-align:center}
table.compact{width:auto;min-width:50%}
.matrix td{text-align:center;font-variant-numeric:tabular-nums}
.matrix td.z{color:#b0b7be}.matrix td.h1{background:#ffebe9}.matrix td.h2{background:#ffcecb}
.matrix td.h3{background:#ff8182;color:#fff;font-weight:600}
.matrix.feat{width:auto;min-width:60%}.matrix.feat td:first-child{text-align:left}
.matrix td.cov{position:relative;min-width:160px;text-align:left}.matrix td.cov span{position:relative;z-index:1}
.matrix td .bar{position:absolute;left:0;top:0;bottom:0;background:#ddf4ff}
.scroll{overflow-x:auto}
.bucket{border:1px solid var(--line);border-radius:8px;margin:14px 0;overflow:hidden}
.bucket>header{display:flex;gap:10px;align-items:center;flex-wrap:wrap;padding:10px 14px;background:var(--bg);
border-bottom:1px solid var(--line)}
.bucket>div{padding:10px 14px}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:6px 0 10px}
dl.facts dt{color:var(--muted)}dl.facts dd{margin:0;word-break:break-all}
.note{background:var(--amberbg);border:1px solid #eed888;border-radius:6px;padding:8px 12px;margin:8px 0}
details>summary{cursor:pointer;color:var(--blue)}
a{color:var(--blue)}
"""


def e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _link(text: str) -> str:
    """An http(s) reference as a link (no other scheme: a ledger could hold javascript:), else escaped text."""
    if text.startswith(("https://", "http://")) and not any(c.isspace() for c in text):
        return f'<a href="{e(text)}">{e(text)}</a>'
    return e(text)


def _pill(status: str) -> str:
    return f'<span class="pill {e(status)}">{e(status)}</span>'


def _table(header: Iterable[str], rows: Iterable[Iterable[str]], *, cls: str = "", num: Iterable[int] = ()) -> str:
    """Header cells are plain text (escaped); row cells are already-built HTML."""
    num = set(num)
    head = "".join(f"<th{' class=num' if i in num else ''}>{e(h)}</th>" for i, h in enumerate(header))
    body = "".join(
        "<tr>" + "".join(f"<td{' class=num' if i in num else ''}>{c}</td>" for i, c in enumerate(r)) + "</tr>"
        for r in rows
    )
    return (
        f'<div class="scroll"><table class="{e(cls)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'
    )


def _cards(report: RunReport) -> str:
    s = report.summary
    cards = [
        ("cases", s.get("cases", "?"), False),
        ("skipped cases", s.get("skipped", "?"), False),
        ("failing buckets", len(report.failures), bool(report.failures)),
        ("failing findings", report.count("failure"), bool(report.failures)),
        ("expected buckets", len(report.buckets_with("expected")), False),
        ("info buckets", len(report.buckets_with("info")), False),
        ("seconds", s.get("seconds", "?"), False),
        ("cases / s", s.get("cases_per_second", "?"), False),
    ]
    return (
        '<div class="cards">'
        + "".join(
            f'<div class="card{" bad" if bad else ""}"><div class="n">{e(n)}</div><div class="l">{e(label)}</div></div>'
            for label, n, bad in cards
        )
        + "</div>"
    )


def _testcases(report: RunReport) -> str:
    rows = [
        [
            _pill(t.status),
            f"<code>{e(t.op)}</code>",
            f"<code>{e(t.impl)}</code>",
            e(t.cases if t.cases is not None else "?"),
            e(len(t.failures)),
            e(sum(b.count for b in t.buckets)),
            e(f"{t.seconds:.1f}"),
        ]
        for t in report.testcases
    ]
    return _table(["status", "op", "impl", "cases", "failing buckets", "findings", "seconds"], rows, num=(3, 4, 5, 6))


def _buckets(report: RunReport) -> str:
    rows = [
        [
            _pill(b.status),
            f"<code>{e(b.kind)}</code>",
            f"<code>{e(b.op)}</code>",
            f'<code class="impl">{e(one_line(b.impl, 80))}</code>',
            f"<code>{e(b.cause or '-')}</code>",
            e(b.count),
            e(b.max_ulp if b.max_ulp is not None else "-"),
            f'{e(one_line(b.first.message, 200))} <a href="#{e(b.slug)}">details</a>',
        ]
        for b in report.buckets
    ]
    return _table(["status", "kind", "op", "impl", "cause", "findings", "max ulp", "first message"], rows, num=(5, 6))


def _heat(n: int, top: int) -> str:
    if n == 0:
        return "z"
    level = 1 + min(2, int(3 * n / (top + 1)))
    return f"h{level}"


def _ops(report: RunReport) -> list[str]:
    per_op = report.summary.get("per_op") if isinstance(report.summary.get("per_op"), Mapping) else {}
    return sorted({t.op for t in report.testcases} | set(per_op))


def _kind_matrix(report: RunReport) -> str:
    per_op = report.summary.get("per_op") if isinstance(report.summary.get("per_op"), Mapping) else {}
    counts: dict[tuple[str, str], int] = {}
    for f in report.findings:
        counts[(f.op, f.kind.value)] = counts.get((f.op, f.kind.value), 0) + 1
    top = max(counts.values(), default=0)
    kinds = [k.value for k in Kind]
    head = "<th>op</th><th class=num>cases</th>" + "".join(
        f'<th class="k">{e(k).replace("_", "_<wbr>")}</th>' for k in kinds
    )
    rows = []
    for op in _ops(report):
        cells = "".join(
            f'<td class="{_heat(counts.get((op, k), 0), top)}">{counts.get((op, k), 0) or DOT}</td>' for k in kinds
        )
        rows.append(f"<tr><td><code>{e(op)}</code></td><td class=num>{e(per_op.get(op, '?'))}</td>{cells}</tr>")
    return (
        f'<div class="scroll"><table class="matrix"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}'
        '</tbody></table></div><p class="meta">Findings lines in findings.jsonl per op and kind'
        " (a bucket keeps at most 50 lines).</p>"
    )


def _finding_features(findings: Iterable[Finding]) -> dict[tuple[str, str], int]:
    """(op, feature) -> findings whose case has the feature (the harness records each finding's
    case features in ``extra["features"]``)."""
    hits: dict[tuple[str, str], int] = {}
    for f in findings:
        feats = f.extra.get("features") if isinstance(f.extra, Mapping) else None
        for feat in feats if isinstance(feats, list) else ():
            hits[(f.op, str(feat))] = hits.get((f.op, str(feat)), 0) + 1
    return hits


def _feature_table(report: RunReport) -> dict[str, Mapping[str, Any]]:
    """Row label -> feature -> cases, from summary.json's ``coverage`` (feature -> n) or ``features``
    (op -> feature -> n). A flat count is one row: the op when the run had one, else 'all ops'."""
    for key in ("features", "coverage"):
        raw = report.summary.get(key)
        if not isinstance(raw, Mapping) or not raw:
            continue
        nested = {op: v for op, v in raw.items() if isinstance(v, Mapping)}
        if nested:
            return nested
        ops = _ops(report)
        return {ops[0] if len(ops) == 1 else "all ops": raw}
    return {}


def _feature_matrix(report: RunReport) -> str:
    """Case features x ops: cases that visited each feature, and findings whose spec has it.

    Features are rows (there are many; ops are few), so the table never runs off the page.
    """
    table = _feature_table(report)
    if not table:
        return ""
    feats = sorted({feat for v in table.values() for feat in v})
    hits = _finding_features(report.findings)
    labels = list(table)
    top = max((n for v in table.values() for n in v.values() if isinstance(n, int)), default=0) or 1
    head = "<th>feature</th>" + "".join(f"<th>cases: <code>{e(label)}</code></th>" for label in labels)
    head += "<th class=num>findings with it</th>"
    rows = []
    for feat in feats:
        cells = []
        for label in labels:
            n = table[label].get(feat, 0)
            n = n if isinstance(n, int) else 0
            bar = f'<div class="bar" style="width:{100 * n // top}%"></div>' if n else ""
            cells.append(f'<td class="{"z" if not n else "cov"}"><span>{n or DOT}</span>{bar}</td>')
        hit = sum(v for (_op, f), v in hits.items() if f == feat)
        cells.append(f'<td class="{"h2" if hit else "z"}">{hit or DOT}</td>')
        rows.append(f"<tr><td><code>{e(feat)}</code></td>{''.join(cells)}</tr>")
    return (
        "<h3>Case features</h3>"
        f'<div class="scroll"><table class="matrix feat"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}'
        "</tbody></table></div>"
        '<p class="meta">Cases that visited each feature (summary.json coverage); findings lines whose spec'
        " has the feature.</p>"
    )


def _shards(report: RunReport) -> str:
    if not report.shards:
        return ""
    rows = [
        [
            e(i),
            f"<code>{e(s.get('dir', '?'))}</code>",
            e(shard_label(s.get("shard")) or "-"),
            e(s.get("cases", "?")),
            e(s.get("findings", "?")),
            e(s.get("seconds", "?")),
        ]
        for i, s in enumerate(report.shards)
    ]
    return "<h2>Shards</h2>" + _table(
        ["#", "run directory", "shard", "cases", "findings", "seconds"], rows, num=(0, 3, 4, 5)
    )


def _mismatches(f: Finding) -> str:
    if not f.mismatches:
        return ""
    rows = [
        [
            f"<code>{e(list(m.index))}</code>",
            f"<code>{e(m.expected)}</code>",
            f"<code>{e(m.actual)}</code>",
            f"<code>{e(xor_bits(m.expected, m.actual) or '-')}</code>",
        ]
        for m in f.mismatches
    ]
    return "<h3>Expected vs actual (first mismatches)</h3>" + _table(
        ["index", "expected", "actual", "xor (differing bits)"], rows, cls="compact"
    )


def _bucket_detail(b: Bucket, report: RunReport) -> str:
    f = b.first
    bundle = bundle_text(report.bundle_for(b))
    facts = "".join(
        f"<dt>{e(k)}</dt><dd><code>{e(v)}</code></dd>"
        for k, v in finding_facts(f) + ([("repro bundle", bundle)] if bundle else [])
    )
    waiver = (
        f'<div class="note">Expected per ledger <code>{e(b.waiver.label())}</code>: {_link(b.waiver.issue)}'
        f"{' &mdash; ' + e(b.waiver.note) if b.waiver.note else ''}</div>"
        if b.waiver is not None
        else ""
    )
    replay = report.replay(f)
    replay_html = (
        f"<h3>Replay</h3><pre>{e(replay)}</pre>"
        if replay
        else '<p class="meta">No repro bundle recorded for this finding.</p>'
    )
    spec = (
        f"<details><summary>spec</summary><pre>{e(json.dumps(f.spec, indent=1, sort_keys=True))}</pre></details>"
        if f.spec is not None
        else ""
    )
    members = ""
    if len(b.findings) > 1:
        rows = [
            [f"<code>{e(g.case_id)}</code>", e(one_line(g.message, 240))]
            for g in b.findings[1 : MAX_MEMBERS_LISTED + 1]
        ]
        more = len(b.findings) - 1 - MAX_MEMBERS_LISTED
        members = (
            f"<details><summary>{plural(b.count - 1, 'more finding')} in this bucket"
            f"{f' ({len(b.findings)} recorded in findings.jsonl)' if b.count > len(b.findings) else ''}"
            "</summary>"
            + _table(["case", "message"], rows)
            + (f'<p class="meta">{more} more not listed.</p>' if more > 0 else "")
            + "</details>"
        )
    return (
        f'<section class="bucket" id="{e(b.slug)}"><header>{_pill(b.status)}<h3>{e(b.kind)}</h3>'
        f'<code>{e(b.op)}={e(b.impl)}</code><span class="meta">cause <code>{e(b.cause or "-")}</code>'
        f" &middot; {plural(b.count, 'finding')}</span></header><div>{waiver}"
        f'<p class="mono">{e(f.message)}</p><dl class="facts">{facts}</dl>{_mismatches(f)}{replay_html}'
        f"{spec}{members}</div></section>"
    )


def render_html(report: RunReport) -> str:
    run = report.run
    meta = " &middot; ".join(
        [f"run directory <code>{e(report.run_dir)}</code>"]
        + [f"{e(k)} <code>{e(run[k])}</code>" for k in ("seed", "device", "shard") if k in run]
    )
    status = report.status
    notes = "".join(f'<div class="note">{e(n)}</div>' for n in report.notes)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>mlafuzz report: {e(status)}</title><style>{CSS}</style></head><body><main>",
        f'<h1>mlafuzz report</h1><p class="meta">{meta}</p>',
        f'<div class="verdict {status}">{_pill(status)}<span>{e(report.headline())}</span></div>',
        _cards(report),
        notes,
        "<h2>Implementations</h2>",
        _testcases(report),
        "<h2>Finding buckets</h2>",
        _buckets(report) if report.buckets else '<p class="meta">No findings.</p>',
        "<h2>Coverage</h2>",
        _kind_matrix(report),
        _feature_matrix(report),
        _shards(report),
    ]
    if report.stale:
        parts += [
            "<h2>Stale ledger entries</h2><p>These matched no finding; remove them if the bug is fixed.</p>",
            _table(["entry", "issue"], [[f"<code>{e(x.label())}</code>", _link(x.issue)] for x in report.stale]),
        ]
    if report.not_applicable:
        parts += [
            f"<h2>Ledger entries not applicable to this run</h2><p>These are {e(NOT_APPLICABLE)}.</p>",
            _table(
                ["entry", "issue"], [[f"<code>{e(x.label())}</code>", _link(x.issue)] for x in report.not_applicable]
            ),
        ]
    if report.buckets:
        parts.append("<h2>Details</h2>")
        parts += [_bucket_detail(b, report) for b in report.buckets[:MAX_DETAILED_BUCKETS]]
        if len(report.buckets) > MAX_DETAILED_BUCKETS:
            parts.append(
                f'<p class="meta">{len(report.buckets) - MAX_DETAILED_BUCKETS} more buckets: see the JSON report.</p>'
            )
    parts.append("</main></body></html>\n")
    return "\n".join(p for p in parts if p)
