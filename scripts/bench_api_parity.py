#!/usr/bin/env python
"""MODELED: the current (``nki``) vs the legacy NKI API on trn2, batch by batch, from the JSON
files of the benchmark scripts run with ``--api both``.

Reads the ``--json`` output of scripts/bench_paged_attention.py (scheduled rows: target ``trn2``
/ ``trn2-lnc2`` on the current API, ``trn2-legacy`` / ``trn2-lnc2-legacy`` on legacy),
bench_variants.py, bench_mla.py, bench_cache_write.py and bench_block_copy.py, pairs every trn2
row of the current API with the same batch on the legacy API and prints one Markdown table:
modeled us per API and the ratio current / legacy (< 1: the current API is faster). Rows
without both APIs are left out (and counted). Nothing is simulated here; every time is the
benchmark's MODELED figure (nki_sim.cost).

    python scripts/bench_paged_attention.py --targets trn2 --api both --json pa.json
    python scripts/bench_variants.py --targets trn2 --api both --json variants.json
    python scripts/bench_api_parity.py pa.json variants.json [--markdown FILE]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _pa_pairs(doc: dict):
    for r in doc["rows"]:
        t = r["target"]
        if r["kernel"] != "scheduled" or not t.startswith("trn2"):
            continue
        lnc = f", LNC {r['lnc']}" if r.get("lnc", 1) != 1 else ""
        batch = f"{r['workload']}, B={r['block_size']}{lnc}"
        yield "paged attention (scheduled)", batch, r["api"], r["modeled_us"]


def _variant_pairs(doc: dict):
    for r in doc["rows"]:
        if r["target"] == "trn2":
            batch = f"{r['workload']} (S={r['S']}, H={r['H']}, Hkv={r['Hkv']})"
            yield "attention variants", batch, r["api"], r["modeled_us"]


def _mla_pairs(doc: dict):
    for r in doc["rows"]:
        if r["target"] == "trn2":
            batch = f"{r['workload']}, H={r['H']}, entry {r['entry_size']}"
            yield "MLA decode", batch, r["api"], r["modeled_us"]


def _cache_write_pairs(doc: dict):
    for r in doc["rows"]:
        if r.get("api") and r.get("modeled_us_trn2") is not None and r["variant"].startswith("nki"):
            batch = f"{r['workload']}, {r['variant']}"
            yield "KV-cache write", batch, r["api"], r["modeled_us_trn2"]


def _block_copy_pairs(doc: dict):
    for r in doc["rows"]:
        if r["variant"].startswith("coalesced") and r.get("modeled_us_trn2") is not None:
            batch = f"{r['variant']}, {r['groups']} group(s), L={r['layers']}, {r['blocks']} blocks"
            yield "block copy", batch, r["api"], r["modeled_us_trn2"]


READERS = {"bench_variants.py": _variant_pairs, "bench_mla.py": _mla_pairs,
           "bench_cache_write.py": _cache_write_pairs, "bench_block_copy.py": _block_copy_pairs}


def reader(doc: dict, name: str):
    """The row reader of a benchmark's JSON document (ValueError for an unknown document)."""
    if doc.get("script") in READERS:
        return READERS[doc["script"]]
    if "bench_paged_attention.py" in doc.get("command", ""):
        return _pa_pairs
    raise ValueError(f"{name}: not the JSON of a benchmark with an --api axis (script "
                     f"{doc.get('script')!r}, command {doc.get('command')!r})")


def pair_rows(docs: list, names: list) -> tuple[list, int]:
    """([(family, batch, legacy us, current us)], number of trn2 rows without the other API)."""
    seen, order = {}, []
    for doc, name in zip(docs, names):
        for family, batch, api, us in reader(doc, name)(doc):
            key = (family, batch)
            if key not in seen:
                seen[key] = {}
                order.append(key)
            seen[key][api] = us
    pairs = [(f, b, seen[(f, b)]["legacy"], seen[(f, b)]["nki"]) for f, b in order
             if {"legacy", "nki"} <= set(seen[(f, b)])]
    return pairs, len(order) - len(pairs)


def markdown(pairs: list, unpaired: int) -> str:
    lines = ["| family | batch (trn2) | legacy us | current us | current / legacy |",
             "|---|---|---:|---:|---:|"]
    for family, batch, leg, cur in pairs:
        lines.append(f"| {family} | {batch} | {leg:.1f} | {cur:.1f} | {cur / leg:.3f} |")
    ratios = [cur / leg for *_, leg, cur in pairs]
    if ratios:
        worse = sum(x > 1.0 for x in ratios)
        lines += ["", f"MODELED. {len(ratios)} batches on both APIs: current / legacy "
                  f"{min(ratios):.3f} - {max(ratios):.3f}; the current API is slower on "
                  f"{worse} of them." + (f" ({unpaired} row(s) ran on one API only.)" if unpaired
                                         else "")]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", nargs="+", type=Path, help="--json files of the benchmarks")
    ap.add_argument("--markdown", type=Path, metavar="FILE", help="also write the table to FILE")
    a = ap.parse_args(argv)
    try:
        docs = [json.loads(p.read_text()) for p in a.json]
        pairs, unpaired = pair_rows(docs, [str(p) for p in a.json])
    except (OSError, ValueError) as exc:
        ap.error(str(exc))
    if not pairs:
        ap.error("no trn2 batch ran on both APIs (run the benchmarks with --api both)")
    text = markdown(pairs, unpaired)
    print(text)
    if a.markdown is not None:
        a.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
