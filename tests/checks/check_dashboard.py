#!/usr/bin/env python3
"""deploy/grafana/weightbeam.json queries only series that exist:

1. the file is a Grafana dashboard (JSON, panels with unique ids, each with PromQL targets);
2. every `weightbeam_*` series in a target's expression is in docs/metrics.md's table (a
   histogram's `_bucket` / `_sum` / `_count` only when the table says histogram);
3. every label it groups by, filters on or prints (`by (...)`, `{label=...}`, `{{label}}`) is
   that series' documented label or one Prometheus adds (`instance`, `job`, `le`);
4. every series in the dashboard is also exported by the daemons' sources (a name in
   docs/metrics.md that no code registers fails too).

Run by ./wb test (tests/run_extra.sh); prints each offence, exits 1 if any.
"""
import json
import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DASHBOARD = "deploy/grafana/weightbeam.json"
SERIES = re.compile(r"\bweightbeam_[a-z0-9_]+\b")
PROMETHEUS_LABELS = {"instance", "job", "le"}


def documented():
    """{series: (type, {labels})} from docs/metrics.md's table."""
    table = {}
    with open(os.path.join(ROOT, "docs/metrics.md")) as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) < 4 or not cells[0].startswith("`weightbeam_"):
                continue
            labels = set(re.findall(r"`([a-z_]+)`", cells[2]))
            for name in re.findall(r"`(weightbeam_[a-z0-9_]+)`", cells[0]):
                table[name] = (cells[1], labels)
    return table


def exported_in_sources(name):
    out = subprocess.run(["git", "grep", "-lF", f'"{name}"', "--", "*.cc", "*.h"], cwd=ROOT,
                         capture_output=True, text=True)
    return bool(out.stdout.strip())


def main():
    errors = []
    with open(os.path.join(ROOT, DASHBOARD)) as f:
        dash = json.load(f)
    docs = documented()
    if not docs:
        errors.append("docs/metrics.md: no series table found")
    panels = dash.get("panels", [])
    ids = [p.get("id") for p in panels]
    if not panels or len(set(ids)) != len(ids):
        errors.append(f"{DASHBOARD}: panels missing or ids not unique: {ids}")
    queried = set()
    for p in panels:
        targets = p.get("targets", [])
        if not targets:
            errors.append(f"{DASHBOARD}: panel '{p.get('title')}' has no targets")
        for t in targets:
            expr = t.get("expr", "")
            names = SERIES.findall(expr)
            if not names:
                errors.append(f"{DASHBOARD}: '{p.get('title')}': no weightbeam series in {expr}")
            labels = set()
            for group in re.findall(r"\bby\s*\(([^)]*)\)", expr):
                labels |= {s.strip() for s in group.split(",") if s.strip()}
            labels |= set(re.findall(r"([a-z_]+)\s*=~?\s*\"", expr))
            labels |= set(re.findall(r"\{\{\s*([a-z_]+)\s*\}\}", t.get("legendFormat", "")))
            allowed = set(PROMETHEUS_LABELS)
            for name in names:
                base = name
                if name not in docs:
                    for suffix in ("_bucket", "_sum", "_count"):
                        if name.endswith(suffix) and name[: -len(suffix)] in docs:
                            base = name[: -len(suffix)]
                    if base == name:
                        errors.append(f"{DASHBOARD}: '{p.get('title')}': {name} is not in "
                                      "docs/metrics.md")
                        continue
                    if docs[base][0] != "histogram":
                        errors.append(f"{DASHBOARD}: '{p.get('title')}': {name}: {base} is a "
                                      f"{docs[base][0]}, not a histogram")
                queried.add(base)
                allowed |= docs[base][1]
            for label in sorted(labels - allowed):
                errors.append(f"{DASHBOARD}: '{p.get('title')}': label '{label}' is not "
                              f"documented for {', '.join(names)}")
    for name in sorted(queried):
        if not exported_in_sources(name):
            errors.append(f"docs/metrics.md: {name} (in the dashboard) is in no C++ source")
    for e in errors:
        print(e, file=sys.stderr)
    if not errors:
        print(f"dashboard: {len(panels)} panels query {len(queried)} of the {len(docs)} "
              "documented series, with documented labels only")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
